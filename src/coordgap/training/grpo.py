"""The ``torch`` GRPO trainer: ART's own math, our optimizer loop.

What is ART's here: ``art.preprocessing`` computes the group advantages (population standard
deviation, zero-advantage trajectories dropped), tokenizes every history (its trainable
positions and their sampler log-probs as the old policy's), normalises token weights and
advantages over the whole step, and packs one history per row; ``art.loss.loss_fn`` gives each
row's loss (CISPO by default, or PPO). What is ours is the loop around them, mirroring ART
0.5.18's ``LocalBackend``: a transformers + peft LoRA model and one AdamW step per row, with
ART's constant learning rate, betas, weight decay and gradient-norm clip, and ART's warm-up.

**The policy differentiated is the one that acted.** A free decision is trained as ART trains
any completion, token by token: log pi_theta(t) of each sampled token, at the rollout
temperature T (the sampler recorded its log-probs at T too). A constrained decision was drawn
from mu = softmax(S / T) over the allowed calls, S_j = sum_t log pi(c_j,t | prompt), so it is
one trainable position (``trajectories.DecisionChoice``) whose log-prob is

    log mu_theta(k) = S_k / T - logsumexp_j(S_j / T),

computed by one forward pass over the prompt and every candidate (the sampler's
tree packing, with gradients). ART's loss then works on the decision: the ratio is
mu_theta(k) / mu_old(k), and for CISPO the row's loss is -clip(ratio) * A * w * log mu_theta(k)
(A the normalised advantage, w the normalised weight, which ART now spreads over a trajectory's
decisions instead of its tokens). Training the raw token log-probs of the chosen call instead
would mostly train log P(all calls), the mass on the tokens every call shares, which the
sampler renormalises away.

Departures from ART's loop (README, "GRPO training", lists them with whether each is an option):

* The base model multiplies its matrices in its configured dtype (bf16 by default, everything
  between the products in float32: ``coordgap.policies.local.load_weights``); ART loads it in
  4 bits.
* AdamW keeps its moments in float32 (ART's ``paged_adamw_8bit`` needs bitsandbytes on a GPU).
* The output layer runs in float32, and only where a trained position is predicted.
* The model, and so the rollouts, attend with PyTorch's SDPA, as every evaluation cell does;
  the update's forward and backward passes attend eagerly (faster backwards on a CPU under the
  candidates' 4D mask; the two differ by rounding only). ART uses Unsloth's kernels.
* With ``compile_update``, the update's decoder layers run compiled by ``torch.compile`` on a
  CPU (``_CompiledLayers``); the rollouts always decide eagerly.
* Each row runs at its own length instead of padded to a multiple of 2048 tokens: the padding
  is masked out of the loss, and causal attention never lets a token see what follows it.
* ART's warm-up (one optimizer step at learning rate 1e-9 on the first row, which seeds Adam's
  moments) runs once per fresh optimizer rather than once per process: a resumed run restores
  the moments instead (ART keeps none), so it continues exactly as if never stopped.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoTokenizer, DynamicCache

from coordgap import preemption
from coordgap.env.protocols import RIGHT_REACHES
from coordgap.policies.base import BatchSlot
from coordgap.policies.local import (
    LocalChatModel,
    additive_mask,
    candidate_columns,
    candidate_log_probs,
    candidate_row,
    load_weights,
    matmul_dtype,
    packed_layout,
    resolve_device,
)
from coordgap.training._art import art
from coordgap.training.trajectories import DecisionChoice

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from art.loss import Loss
    from art.preprocessing.inputs import TrainInputs
    from art.preprocessing.pack import PackedTensors
    from art.preprocessing.tokenize import TokenizedResult
    from openai.types.chat.chat_completion import Choice

    from coordgap.config.training import TrainingRunConfig
    from coordgap.env.protocols import Tool

logger = logging.getLogger(__name__)

# Padding of ART's packed rows: never a token id, so a row's length is where it starts.
_PAD = -100

# Rows of an accumulated optimizer step that run through the model in one batch, after their
# shared prefix (``TorchGRPOTrainer.accumulate``). The batch's activations, kept for its
# backward pass, are what an accumulated update's memory peaks at: about 11 GB of resident
# memory at 8 rows of the CPU study's (N = 5, eager attention over a 4D mask), so 4, which
# updated as fast on 2 cores (31.6 s against 29.7 s for 30 rows, 16 rows 44 s).
_UPDATE_BATCH = 4


@dataclass(frozen=True, slots=True)
class UpdateStats:
    """What one GRPO update did.

    Attributes:
        groups: Groups given: every group the step played (one whose rewards are all equal
            is given without trajectories, ``coordgap.training.trajectories``).
        groups_trainable: Groups with at least one trajectory left after ART dropped the
            zero-advantage ones.
        trajectories: Trajectories trained on.
        rows: Rows (one LLM call each).
        optimizer_steps: AdamW steps taken: one per row, or one per
            ``grad_accumulation_sequences`` rows.
        tokens: Tokens run through the model, over all rows (a constrained row runs its
            prompt and every candidate).
        trained_tokens: Trained positions: a free decision's sampled tokens, one per
            constrained decision.
        loss: Mean row loss (NaN without rows).
        grad_norm: Mean gradient norm of an optimizer step before clipping (NaN without rows).
        clipped_share: Share of optimizer steps whose gradient norm exceeded
            ``max_grad_norm``, so that their step was cut to that size (NaN without rows).
        ratio_log_mean: Mean |log importance ratio| over the trained positions, each taken
            when its optimizer step is computed (earlier steps of the update have moved the
            policy by then).
        ratio_log_first: The same over the first row only: the policy that sampled, so this is
            the numerical disagreement between sampler and trainer.
        ascent_cosine: The cosine between the update's change of the adapter's weights and its
            policy-gradient estimate: minus the unclipped gradient of the mean loss over all
            the update's trained positions, at the weights it started from. Near 1 the step
            follows the reward's direction; near 0 it is orthogonal to it; below 0 it goes
            against it (NaN without rows). One step of all rows has it for free; other values
            of ``grad_accumulation_sequences`` pay one more pass over the rows for it.
        seconds: Wall time of the update, without the pass that measures ``ascent_cosine``.
    """

    groups: int
    groups_trainable: int
    trajectories: int
    rows: int
    optimizer_steps: int
    tokens: int
    trained_tokens: int
    loss: float
    grad_norm: float
    clipped_share: float
    ratio_log_mean: float
    ratio_log_first: float
    ascent_cosine: float
    seconds: float


class StepRows(NamedTuple):
    """A step's groups as ART packs them, with the choice each row trains.

    Attributes:
        packed: The rows (one history each); None when nothing is trainable.
        results: ART's tokenized histories they were packed from.
        choices: The assistant turn of each packed row, in row order: a ``DecisionChoice``
            for a constrained decision, a plain ``Choice`` for free decoding.
    """

    packed: PackedTensors | None
    results: list[TokenizedResult]
    choices: list[Choice]


class TorchGRPOTrainer:
    """A LoRA adapter on a local model, trained with ART's GRPO objective.

    Args:
        weights: The base model's prepared folder.
        run: The training run (recipe and optimizer settings).
        base: The base model's ``models:`` entry: its ``dtype`` (the adapter's own weights are
            always float32, as peft keeps them), how its rollouts decode (``decoding``,
            ``max_new_tokens``, ``max_batch``; the temperature is the run's) and its
            ``chat_template_kwargs``.
        adapter: A checkpoint folder to start from (resuming); None starts from the untrained
            adapter (B = 0, so it acts exactly like the base model), initialised from
            ``run.seed``.
        optimizer_state: The optimizer state saved with that checkpoint, if any.
        device: ``auto`` (CUDA when available, else CPU) or a torch device name.

    Attributes:
        model: The peft model, shared with the rollouts' sampler.
        tokenizer: Its tokenizer.
        optimizer: AdamW over the adapter's weights.
    """

    def __init__(
        self,
        weights: Path,
        run: TrainingRunConfig,
        base: dict[str, Any],
        adapter: Path | None = None,
        optimizer_state: Path | None = None,
        device: str = "auto",
    ) -> None:
        device = resolve_device(device)
        self.run = run
        self._base = base
        self.tokenizer = AutoTokenizer.from_pretrained(weights)
        # The sampler's attention and dtype, which every evaluation cell uses too: the rollouts
        # share this model, so the policy trained is the policy that acts and the policy the
        # checkpoints are tested as.
        model = load_weights(weights, base["dtype"], device)
        if adapter is None:
            lora = LoraConfig(
                r=run.lora.rank,
                lora_alpha=run.lora.alpha,
                lora_dropout=run.lora.dropout,
                target_modules=list(run.lora.target_modules),
                task_type="CAUSAL_LM",
            )
            # peft draws A from torch's global generator; B starts at zero.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(run.seed)
                self.model = get_peft_model(model, lora)
        else:
            self.model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
        self._parameters = [p for p in self.model.parameters() if p.requires_grad]
        opt = run.optimizer
        self.optimizer = torch.optim.AdamW(
            self._parameters,
            lr=run.learning_rate,
            betas=(opt.beta1, opt.beta2),
            weight_decay=opt.weight_decay,
        )
        if optimizer_state is not None:
            self.optimizer.load_state_dict(torch.load(optimizer_state, weights_only=True))
        # ART warms up once per process, which for it means with fresh moments (it saves
        # none); a restored optimizer has its moments already.
        self._warmup_pending = run.warmup and optimizer_state is None
        self._decoder = self.model.get_decoder()
        self._dtype = self.model.get_input_embeddings().weight.dtype
        self._head = self.model.get_output_embeddings().weight.detach().float()
        if run.compile_update and device != "cpu":
            # Measured on CPUs only (benchmarks/README.md, "torch.compile"): said, not silent.
            logger.warning("compile_update is for a CPU; the update on %s runs eagerly", device)
        self._compiled = _CompiledLayers(self._decoder, run.compile_update and device == "cpu")
        # ART's experimental config: the loss and its clipping (None keeps ART's defaults).
        self._loss_config: art.dev.TrainConfig = {"ppo": run.loss == "ppo"}
        if run.epsilon is not None:
            self._loss_config["epsilon"] = run.epsilon
        if run.epsilon_high is not None:
            self._loss_config["epsilon_high"] = run.epsilon_high
        self._train_config = art.TrainConfig(learning_rate=run.learning_rate)
        # The untrained policy's choice log-probs on each set of prompts (it never changes).
        self._probe_base: dict[str, torch.Tensor] = {}

    def start(self) -> None:
        """Nothing to start: the model is in this process."""

    def sampler(self, decoding: str | None = None) -> LocalChatModel:
        """The current policy for rollouts: the model being trained, shared, in eval mode.

        A new backend per step, so no prefix cache computed under older weights survives.

        Args:
            decoding: The decoding to use; None for the base model's.
        """
        self.model.eval()
        return LocalChatModel.from_model(
            self.model,
            self.tokenizer,
            decoding=decoding or self._base["decoding"],
            temperature=self.run.temperature,
            max_new_tokens=self._base["max_new_tokens"],
            max_batch=self._base["max_batch"],
            chat_template_kwargs=self._base.get("chat_template_kwargs"),
        )

    def save(self, folder: Path) -> None:
        """Write the adapter (``adapter_model.safetensors``, ``adapter_config.json``)."""
        self.model.save_pretrained(folder)

    def save_optimizer(self, path: Path) -> None:
        """Write the optimizer's state (AdamW's moments and step counts)."""
        torch.save(self.optimizer.state_dict(), path)

    def rows(self, groups: list[art.TrajectoryGroup]) -> StepRows:
        """Tokenize and pack trajectory groups into rows with ART's preprocessing.

        ART shuffles with Python's global ``random``: the caller seeds it. ART's packing
        permutes the rows and keeps no link to the histories they came from, so two things
        tell a row's history. Tokenizing unshuffled yields each trajectory's histories
        consecutively and in order (the rows are permuted afterwards all the same, so the
        order of the optimizer steps stays random). And each tokenized result's ``prompt_id``,
        which only packing several histories into one row reads (this loop packs one per
        row), is set to its index: packing copies it into the row's ``parent_ids``.

        Args:
            groups: The step's groups.

        Returns:
            The packed rows, ART's tokenized histories and each row's choice.
        """
        results = list(
            art.preprocessing.tokenize.tokenize_trajectory_groups(
                self.tokenizer,
                groups,
                allow_training_without_logprobs=False,
                scale_rewards=True,
                shuffle_group_trajectories=False,
                chat_template_kwargs=self._base.get("chat_template_kwargs"),
            )
        )
        if not results:
            return StepRows(None, results, [])
        trained = _trained_choices(results)
        for index, result in enumerate(results):
            result.prompt_id = index
        longest = max(len(result.token_ids) for result in results)
        packed = art.preprocessing.pack.packed_tensors_from_tokenized_results(
            results, longest, pad_token_id=_PAD, pack_results=False
        )
        choices = [trained[int(ids[0])] for ids in packed["parent_ids"]]
        return StepRows(packed, results, choices)

    def row(self, packed: PackedTensors, index: int, warmup: bool = False) -> TrainInputs:
        """Row ``index`` as ART's training inputs, cut to its own length.

        Args:
            packed: Rows from ``rows``.
            index: The row.
            warmup: ART's warm-up inputs of the row instead (its first 1024 tokens, learning
                rate 1e-9).
        """
        inputs = art.preprocessing.inputs.create_train_inputs(
            packed, index, self._train_config, self._loss_config, warmup=warmup
        )
        length = int((inputs["tokens"][0] != _PAD).sum())
        for key, value in inputs.items():
            if isinstance(value, torch.Tensor) and value.dim() == 2:
                inputs[key] = value[:, :length]
        return inputs

    def log_probs(self, inputs: TrainInputs, choice: Choice) -> tuple[torch.Tensor, int]:
        """The current policy's log-probs of a row's trained positions, as ``art.loss`` wants.

        Position ``t`` holds the log-prob of what position ``t + 1`` trains (a sampled token,
        or a constrained decision's choice), and 0 elsewhere (the loss masks it out).

        Args:
            inputs: One row (see ``row``).
            choice: The row's choice (``StepRows.choices``).

        Returns:
            A ``[1, length]`` float32 tensor, differentiable through the adapter, and the
            number of tokens the forward pass ran.
        """
        # Eager attention: under the candidates' 4D mask PyTorch's SDPA runs its CPU backward
        # about 25 % slower (2.1 s a row against 1.7 s). The passes keep no KV cache: nothing
        # decodes on from them, and a cache would copy every layer's keys and values (and
        # hand each compiled layer a state of its own, so each would compile again).
        with _attention(self.model, "eager"), self._compiled.active():
            if isinstance(choice, DecisionChoice):
                return self._decision_log_probs(inputs, choice)
            return self._token_log_probs(inputs)

    def _token_log_probs(self, inputs: TrainInputs) -> tuple[torch.Tensor, int]:
        """A free decision's sampled tokens at the rollout temperature (see ``log_probs``)."""
        tokens = inputs["tokens"].to(self.model.device)
        predicts_sampled = inputs["assistant_mask"][0, 1:].nonzero()[:, 0].to(tokens.device)
        hidden = self._decoder(input_ids=tokens, use_cache=False).last_hidden_state[
            0, predicts_sampled
        ]
        logits = F.linear(hidden.float(), self._head) / self.run.temperature
        sampled = torch.log_softmax(logits, dim=-1).gather(
            -1, tokens[0, predicts_sampled + 1, None]
        )
        out = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
        trained = (torch.zeros_like(predicts_sampled), predicts_sampled)
        return out.index_put(trained, sampled[:, 0]), tokens.numel()

    def _decision_log_probs(
        self, inputs: TrainInputs, choice: DecisionChoice
    ) -> tuple[torch.Tensor, int]:
        """A constrained decision's log mu_theta(k), at the position before its choice.

        The row's tokens up to its one trained position are the prompt the sampler scored the
        candidates after; one forward pass scores them all again, with gradients.
        """
        tokens = inputs["tokens"][0]
        row = candidate_row(tokens[: _trained_position(inputs)].tolist(), choice.candidates)
        layout = packed_layout([row], 0, pad_id=0)
        device = self.model.device
        hidden = self._decoder(
            input_ids=layout.ids.to(device),
            attention_mask=additive_mask(layout.allowed, self._dtype).to(device),
            position_ids=layout.positions.to(device),
            use_cache=False,
        ).last_hidden_state[0, candidate_columns(row, choice.candidates)]
        log_probs = torch.log_softmax(F.linear(hidden.float(), self._head), dim=-1)
        return self._placed_log_mu(inputs, choice, log_probs), layout.ids.numel()

    def _placed_log_mu(
        self, inputs: TrainInputs, choice: DecisionChoice, log_probs: torch.Tensor
    ) -> torch.Tensor:
        """The decision's log mu_theta(k) in a row-shaped tensor, as ``log_probs`` returns it.

        Args:
            inputs: The decision's row.
            choice: Its choice.
            log_probs: The next-token log-probs at its ``candidate_columns``.
        """
        scores = torch.stack(
            [lps.sum() for lps in candidate_log_probs(log_probs, choice.candidates)]
        )
        log_mu = torch.log_softmax(scores / self.run.temperature, dim=0)[choice.chosen]
        device = log_probs.device
        out = torch.zeros((1, inputs["tokens"].shape[1]), dtype=log_mu.dtype, device=device)
        position = torch.tensor([[0], [_trained_position(inputs) - 1]], device=device)
        return out.index_put(tuple(position), log_mu.reshape(1))

    def sampler_gaps(self, rows: StepRows) -> list[float]:
        """|log p_trainer - log p_sampler| of every trained position, updating nothing.

        On the policy that sampled the rows, this is the importance ratio's numerical noise:
        the trainer's forward pass against the sampler's recorded log-probs (for a constrained
        decision, the decision-level log mu(k)).

        Args:
            rows: Rows from ``rows``.

        Returns:
            One gap per trained position, row by row.
        """
        gaps: list[float] = []
        if rows.packed is None:
            return gaps
        with torch.no_grad():
            for index, choice in enumerate(rows.choices):
                inputs = self.row(rows.packed, index)
                gaps += _sampled_gaps(inputs, self.log_probs(inputs, choice)[0]).tolist()
        return gaps

    def update(self, groups: list[art.TrajectoryGroup]) -> UpdateStats:
        """One GRPO step: AdamW steps over the packed rows, ``grad_accumulation_sequences`` each.

        At 1 (ART's LocalBackend) every row is its own optimizer step, each clipped to
        ``max_grad_norm``. Otherwise consecutive rows, in ART's shuffled order, share a step
        (``_accumulated_step``). The first update of a fresh optimizer starts with ART's
        warm-up on the first row.

        Args:
            groups: The step's trajectory groups.

        Returns:
            What the update did; a step with nothing trainable changes nothing.
        """
        start = time.perf_counter()
        rows = self.rows(groups)
        losses, norms, ratio_logs = [], [], []
        tokens = 0
        self.model.train()
        every_row = len(rows.choices)
        # All rows in one step: that step's gradient is the policy-gradient estimate itself.
        one_step = self.run.grad_accumulation_sequences is None
        before = [parameter.detach().clone() for parameter in self._parameters]
        if self._warmup_pending and rows.packed is not None:
            self._warm_up(rows)
        # After the warm-up, whose step at learning rate 1e-9 leaves the weights as they were.
        ascent = None
        measuring = time.perf_counter()
        if rows.packed is not None and not one_step:
            ascent = self._ascent(rows)
        # Left out of the update's time, which a one-row loop then reports as ART's costs.
        measured = time.perf_counter() - measuring
        size = self.run.grad_accumulation_sequences or max(every_row, 1)
        for first in range(0, every_row, size):
            indices = range(first, min(first + size, every_row))
            if self.run.grad_accumulation_sequences == 1:
                inputs = self.row(rows.packed, first)
                loss, norm, new, ran = self._step(inputs, rows.choices[first])
                done = _Accumulated([loss], [_sampled_gaps(inputs, new)], ran)
            else:
                done, norm, gradient = self._accumulated_step(rows, indices)
                if one_step:
                    ascent = -gradient
            losses += done.losses
            ratio_logs += done.ratio_logs
            norms.append(norm)
            tokens += done.tokens
        self.model.eval()
        trained = {id(result.trajectory) for result in rows.results}
        every = torch.cat(ratio_logs) if ratio_logs else torch.empty(0)
        limit = self.run.optimizer.max_grad_norm
        change = _flat(
            [now.detach() - then for now, then in zip(self._parameters, before, strict=True)]
        )
        return UpdateStats(
            groups=len(groups),
            groups_trainable=sum(
                any(id(t) in trained for t in group.trajectories) for group in groups
            ),
            trajectories=len(trained),
            rows=every_row,
            optimizer_steps=len(norms),
            tokens=tokens,
            trained_tokens=every.numel(),
            loss=_mean(losses),
            grad_norm=_mean(norms),
            clipped_share=_mean([float(norm > limit) for norm in norms]),
            ratio_log_mean=_mean(every.tolist()),
            ratio_log_first=_mean(ratio_logs[0].tolist()) if ratio_logs else math.nan,
            ascent_cosine=math.nan if ascent is None else _cosine(change, ascent),
            seconds=time.perf_counter() - start - measured,
        )

    def _ascent(self, rows: StepRows) -> torch.Tensor:
        """The update's policy-gradient estimate at the current weights, flat.

        Minus the gradient of the mean loss over every trained position of the update (as
        one accumulated step of all its rows computes it), unclipped; the adapter's gradients
        are left cleared.
        """
        inputs = [self.row(rows.packed, index) for index in range(len(rows.choices))]
        positions = sum(int(row["assistant_mask"].sum()) for row in inputs)
        # Eagerly: a measurement, which must not add compiled graphs to the update's.
        self.accumulate(inputs, rows.choices, 1 / positions, compiled=False)
        gradient = _flat([parameter.grad for parameter in self._parameters])
        self.optimizer.zero_grad(set_to_none=True)
        return -gradient

    def _step(self, inputs: TrainInputs, choice: Choice) -> tuple[float, float, torch.Tensor, int]:
        """One optimizer step on one row: its loss, gradient norm, log-probs and tokens run."""
        # As ART's compute_loss: the row's config carries the learning rate (the warm-up's
        # is 1e-9).
        self._set_learning_rate(inputs["config"].learning_rate)
        new, ran = self.log_probs(inputs, choice)
        loss = self._loss(inputs, new).policy_loss
        loss.backward()
        return loss.item(), self._optimizer_step(), new, ran

    def _set_learning_rate(self, learning_rate: float) -> None:
        """The optimizer's learning rate from now on."""
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate

    def _optimizer_step(self) -> float:
        """Clip the gradient to ``max_grad_norm``, step and clear it; the norm before clipping."""
        norm = torch.nn.utils.clip_grad_norm_(self._parameters, self.run.optimizer.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm.item()

    def _loss(self, inputs: TrainInputs, new: torch.Tensor) -> Loss:
        """ART's loss of one row, given the current policy's log-probs (``log_probs``)."""
        with warnings.catch_warnings():
            # ART's loss also computes the correlation of old and new probabilities (a metric
            # only), undefined over one trained position: NaN, and a warning per decision row.
            warnings.filterwarnings("ignore", r"cov\(\): degrees of freedom", UserWarning)
            # The row's tensors stay on the CPU (the ratio check reads them there); the loss
            # needs them where the model ran.
            on_device = {
                key: value.to(new.device) if isinstance(value, torch.Tensor) else value
                for key, value in inputs.items()
            }
            return art.loss.loss_fn(on_device, new, None, None, self._loss_config)

    def _accumulated_step(
        self, rows: StepRows, indices: Sequence[int]
    ) -> tuple[_Accumulated, float, torch.Tensor]:
        """One AdamW step on several rows: their accumulated gradient, clipped as a whole.

        The step's gradient is ART's Megatron backend's: every row's loss summed over its
        trained positions, the sum divided by the step's trained positions, so it is the mean
        over the step's trained positions of their per-position gradients (for constrained
        decisions, one position a row: the mean of the rows' gradients as the one-row loop
        computes them). ``max_grad_norm`` then clips that gradient once.

        Args:
            rows: The update's rows (``rows``).
            indices: The rows that share the step.

        Returns:
            What the rows did, the step's gradient norm before clipping, and that gradient
            (flat).
        """
        self._set_learning_rate(self.run.learning_rate)
        inputs = [self.row(rows.packed, index) for index in indices]
        positions = sum(int(row["assistant_mask"].sum()) for row in inputs)
        done = self.accumulate(inputs, [rows.choices[index] for index in indices], 1 / positions)
        gradient = _flat([parameter.grad for parameter in self._parameters])
        return done, self._optimizer_step(), gradient

    def accumulate(
        self,
        inputs: Sequence[TrainInputs],
        choices: Sequence[Choice],
        scale: float,
        compiled: bool = True,
    ) -> _Accumulated:
        """Add ``scale`` times the gradient of the rows' summed losses to the adapter's gradients.

        Constrained decisions run batched after the prompt prefix they all share, computed
        once (the idea of Prefix Grouper, arXiv 2506.05433): the prefix's keys and values go
        into every row's attention as they are, and their gradients, summed over the rows,
        flow back through the prefix in one backward pass. The gradient is the one of running
        each row whole, up to rounding: the prefix's products run at another shape (a test
        holds six rows' sum to 5e-4 of it in float32, where it measured 1e-4). Free decisions
        run one by one, whole.

        Args:
            inputs: The rows (``row``).
            choices: Their choices (``StepRows.choices``).
            scale: The factor of every row's loss.
            compiled: Run the layers compiled where ``compile_update`` asks for it; False
                runs them eagerly.

        Returns:
            The rows' losses and importance-ratio gaps, in row order, and the tokens run.
        """
        losses: list[float] = [math.nan] * len(choices)
        gaps: list[torch.Tensor] = [torch.empty(0)] * len(choices)
        tokens = 0
        decisions = [i for i, choice in enumerate(choices) if isinstance(choice, DecisionChoice)]
        layers = self._compiled.active() if compiled else nullcontext()
        with _attention(self.model, "eager"), layers:
            for i, choice in enumerate(choices):
                if isinstance(choice, DecisionChoice):
                    continue
                new, ran = self.log_probs(inputs[i], choice)
                loss = self._loss(inputs[i], new)
                (loss.policy_loss_sum * scale).backward()
                losses[i], gaps[i] = loss.policy_loss.item(), _sampled_gaps(inputs[i], new)
                tokens += ran
            if decisions:
                done = self._accumulate_decisions(
                    [inputs[i] for i in decisions], [choices[i] for i in decisions], scale
                )
                for k, i in enumerate(decisions):
                    losses[i], gaps[i] = done.losses[k], done.ratio_logs[k]
                tokens += done.tokens
        return _Accumulated(losses, gaps, tokens)

    def _accumulate_decisions(
        self, inputs: Sequence[TrainInputs], choices: Sequence[DecisionChoice], scale: float
    ) -> _Accumulated:
        """``accumulate`` for constrained decisions: batched after their shared prefix.

        The prefix runs once, with gradients; its keys and values enter each batch as leaves
        of their own, whose gradients add up over the batches and then run back through the
        prefix once. Each batch packs its rows' own prompt tokens and candidates as the
        sampler does (``packed_layout``), shortest prompts together.
        """
        actions = [_trained_position(row) for row in inputs]
        prompts = [
            row["tokens"][0, :action].tolist() for row, action in zip(inputs, actions, strict=True)
        ]
        prefix = _shared_prefix(prompts)
        device = self.model.device
        prefix_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        if prefix:
            out = self._decoder(input_ids=torch.tensor([prefix], device=device), use_cache=True)
            prefix_kv = [(keys, values) for keys, values, *_ in out.cache]
        leaves = [
            (keys.detach().requires_grad_(), values.detach().requires_grad_())
            for keys, values in prefix_kv
        ]
        losses: list[float] = [math.nan] * len(inputs)
        gaps: list[torch.Tensor] = [torch.empty(0)] * len(inputs)
        tokens = len(prefix)
        by_length = sorted(range(len(inputs)), key=lambda i: len(prompts[i]))
        for first in range(0, len(by_length), _UPDATE_BATCH):
            batch = by_length[first : first + _UPDATE_BATCH]
            packed = [
                candidate_row(prompts[i][len(prefix) :], choices[i].candidates) for i in batch
            ]
            layout = packed_layout(packed, len(prefix), pad_id=0)
            cache = (
                DynamicCache(
                    [
                        (keys.expand(len(batch), -1, -1, -1), values.expand(len(batch), -1, -1, -1))
                        for keys, values in leaves
                    ]
                )
                if leaves
                else None
            )
            hidden = self._decoder(
                input_ids=layout.ids.to(device),
                attention_mask=additive_mask(layout.allowed, self._dtype).to(device),
                position_ids=layout.positions.to(device),
                cache=cache,
                use_cache=cache is not None,
            ).last_hidden_state
            columns = [
                candidate_columns(row, choices[i].candidates)
                for row, i in zip(packed, batch, strict=True)
            ]
            log_probs = torch.log_softmax(
                F.linear(
                    torch.cat([hidden[b, c] for b, c in enumerate(columns)]).float(),
                    self._head,
                ),
                dim=-1,
            )
            total = torch.zeros((), device=device)
            for i, part in zip(batch, log_probs.split([len(c) for c in columns]), strict=True):
                new = self._placed_log_mu(inputs[i], choices[i], part)
                loss = self._loss(inputs[i], new)
                total = total + loss.policy_loss_sum
                losses[i], gaps[i] = loss.policy_loss.item(), _sampled_gaps(inputs[i], new)
            (total * scale).backward()
            tokens += layout.ids.numel()
        if prefix_kv:
            torch.autograd.backward(
                [tensor for pair in prefix_kv for tensor in pair],
                [leaf.grad for pair in leaves for leaf in pair],
            )
        return _Accumulated(losses, gaps, tokens)

    def _warm_up(self, rows: StepRows) -> None:
        """ART's warm-up: one step on the first row's warm-up inputs, at learning rate 1e-9.

        Its parameter change is negligible; what it leaves is the first row's gradient in
        Adam's moments and one more step in their bias correction (on an 8-row step the update
        then differs by about half from one without it).
        """
        inputs = self.row(rows.packed, 0, warmup=True)
        self._warmup_pending = False
        if not inputs["assistant_mask"].any():
            # ART's cut to 1024 tokens left nothing trainable; ART's step would be empty too.
            logger.warning("warm-up skipped: the first row has nothing to train in 1024 tokens")
            return
        self._step(inputs, rows.choices[0])

    def probe(
        self, conversations: Sequence[list[dict[str, str]]], tools: Sequence[Tool]
    ) -> dict[str, float]:
        """The six-way policy on a fixed probe set, and how far it is from the untrained one.

        Every probe is scored as a constrained decision at the run's temperature, whatever
        the rollouts' decoding, with the current adapter and with none (the untrained policy,
        mu_0, computed once). Twice: in float32, which measures what the adapter's weights
        learnt, and in the model's own dtype, the policy that acts. In bf16 the two differ by
        the rounding of the matrix products' inputs and outputs; the adapter's contribution and
        the residual stream stay float32, so the acting policy keeps what was learnt (a test
        holds its KL to at least 0.9 of the float32 one; README, "GRPO training").

        Args:
            conversations: The probe set's conversations (``coordgap.training.probe``).
            tools: The tools offered.

        Returns:
            ``probe_kl``, the mean KL(mu || mu_0) over the probes in nats, in float32;
            ``probe_kl_acting``, the same in the model's dtype; ``probe_<tool>``, each tool's
            mean probability in float32.
        """
        acting = self._probe_kl(conversations, tools)
        learnt = acting
        if matmul_dtype(self.model) != torch.float32:
            with _in_float32(self.model):
                learnt = self._probe_kl(conversations, tools)
        shares = learnt.current.exp().mean(dim=0).tolist()
        return {"probe_kl": learnt.kl, "probe_kl_acting": acting.kl} | {
            f"probe_{tool}": share for tool, share in zip(tools, shares, strict=True)
        }

    def first_round_right(
        self, conversations: Sequence[list[dict[str, str]]], tools: Sequence[Tool]
    ) -> dict[str, float]:
        """The positive control's expected reward, exactly, now and before training.

        The ``control`` reward is the share of seats whose round-1 decision reaches for the
        right fork, and round 1's prompts do not depend on the policy
        (``coordgap.training.probe.first_round_conversations``), so its expectation is the mean
        over the seats of mu(right | the seat's prompt). Scored as the rollouts draw their
        decisions: constrained, at the run's temperature, in the model's own dtype (the policy
        as it acts), with the current adapter and with none (the untrained model, computed
        once per set of prompts).

        Args:
            conversations: Every seat's round-1 conversation.
            tools: The tools offered; one of them reaches right (``RIGHT_REACHES``).

        Returns:
            ``r1_exact`` under the current adapter and ``r1_exact_base`` under none.
        """
        (right,) = (i for i, tool in enumerate(tools) if tool in RIGHT_REACHES)
        current = self.choice_log_probs(conversations, tools)
        base = self._base_log_probs(conversations, tools)
        return {
            "r1_exact": current[:, right].exp().mean().item(),
            "r1_exact_base": base[:, right].exp().mean().item(),
        }

    def _probe_kl(
        self, conversations: Sequence[list[dict[str, str]]], tools: Sequence[Tool]
    ) -> _Probe:
        """The current policy's log mu on the probes and its mean KL from mu_0 (same dtype)."""
        current = self.choice_log_probs(conversations, tools)
        base = self._base_log_probs(conversations, tools)
        kl = (current.exp() * (current - base)).sum(dim=-1)
        return _Probe(current, kl.mean().item())

    def _base_log_probs(
        self, conversations: Sequence[list[dict[str, str]]], tools: Sequence[Tool]
    ) -> torch.Tensor:
        """The untrained policy's log mu on ``conversations`` in the current dtype, scored once."""
        key = repr((matmul_dtype(self.model), conversations, tools))
        if key not in self._probe_base:
            with self.model.disable_adapter():
                self._probe_base[key] = self.choice_log_probs(conversations, tools)
        return self._probe_base[key]

    def choice_log_probs(
        self, conversations: Sequence[list[dict[str, str]]], tools: Sequence[Tool]
    ) -> torch.Tensor:
        """The choice log-probs, log mu over ``tools``, of each conversation: ``[P, tools]``."""
        sampler = self.sampler(decoding="constrained")

        async def decide_all() -> list[Any]:
            return await asyncio.gather(
                *(
                    sampler.decide(chat, tools, 0, BatchSlot("probe", len(conversations), i))
                    for i, chat in enumerate(conversations)
                )
            )

        scores = torch.tensor([d.transcript.scores for d in preemption.run(decide_all())])
        return torch.log_softmax(scores / self.run.temperature, dim=-1)


class _Probe(NamedTuple):
    """A policy's log mu on the probe set, and its mean KL from the untrained policy."""

    current: torch.Tensor
    kl: float


@contextmanager
def _attention(model: torch.nn.Module, implementation: str) -> Iterator[None]:
    """Attend with ``implementation`` for a while (transformers looks it up every forward)."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


class _CompiledLayers:
    """A decoder's layers, each compiled by ``torch.compile``, swapped in while the update runs.

    On a CPU with a matrix unit (AMX) the update's matrix products are under a third of its
    time and elementwise kernels over a third (benchmarks/README.md, "Where the time goes");
    inductor fuses a layer's elementwise work into a few kernels. On 2 AVX2 cores the update
    ran 8 % faster, after 40 s of compiling with the cache cold and 10 s warm
    (benchmarks/README.md, "torch.compile").

    Each layer is compiled on its own (regional compilation): the layers share one compiled
    graph per kind of call (with gradients or not, first layer or later), so compiling costs
    seconds, not minutes, and shapes are dynamic (every row has its own length). Only the
    update runs compiled: the rollouts' decisions pass a KV cache through the layers, whose
    per-layer state would make every layer a compilation of its own.

    Inductor keeps what it compiled in its cache folder (``TORCHINDUCTOR_CACHE_DIR``, by
    default one per user under the system's temporary folder), so later jobs on the machine
    load the kernels instead of compiling them; a run's results are the same with the cache
    cold or warm (a test holds them to it bit for bit).

    Args:
        decoder: The model's decoder, whose ``layers`` are swapped.
        enabled: Compile; when false, ``active`` changes nothing.
    """

    def __init__(self, decoder: torch.nn.Module, enabled: bool) -> None:
        self._decoder = decoder
        self._eager = decoder.layers
        # Wrapped once, for the trainer's life: every update runs the same compiled wrappers.
        self._compiled = (
            torch.nn.ModuleList(torch.compile(layer, dynamic=True) for layer in decoder.layers)
            if enabled
            else None
        )

    @contextmanager
    def active(self) -> Iterator[None]:
        """Run the decoder's layers compiled for a while (eager again afterwards)."""
        if self._compiled is None:
            yield
            return
        self._decoder.layers = self._compiled
        try:
            yield
        finally:
            self._decoder.layers = self._eager


@contextmanager
def _in_float32(model: torch.nn.Module) -> Iterator[None]:
    """Compute in float32 for a while: the frozen base's weights cast up, then back.

    The round trip is exact (every bf16 value is a float32 value); the adapter's own weights
    are float32 already. A float32 model is left as it is.
    """
    frozen = [p for p in model.parameters() if not p.requires_grad and p.is_floating_point()]
    dtypes = [p.dtype for p in frozen]
    for parameter in frozen:
        parameter.data = parameter.data.float()
    try:
        yield
    finally:
        for parameter, dtype in zip(frozen, dtypes, strict=True):
            parameter.data = parameter.data.to(dtype)


def _trained_choices(results: list[TokenizedResult]) -> list[Choice]:
    """The choice each tokenized result trains, from ART's unshuffled tokenization.

    Without shuffling, ART yields each kept trajectory's histories consecutively, main history
    first: the ``j``-th result of a trajectory is its ``j``-th history.
    """
    seen: dict[int, int] = {}
    choices = []
    for result in results:
        trajectory = result.trajectory
        histories = [trajectory.messages_and_choices] + [
            history.messages_and_choices for history in trajectory.additional_histories
        ]
        j = seen.get(id(trajectory), 0)
        seen[id(trajectory)] = j + 1
        choice = histories[j][-1]
        # The history's trained log-probs must be the result's: a check of the order.
        recorded = [entry.logprob for entry in choice.logprobs.content]
        trained = [lp for lp, m in zip(result.logprobs, result.assistant_mask, strict=True) if m]
        if not torch.allclose(torch.tensor(trained), torch.tensor(recorded), equal_nan=True):
            raise RuntimeError("ART's tokenization did not yield the histories in order")
        choices.append(choice)
    return choices


def _sampled_gaps(inputs: TrainInputs, new: torch.Tensor) -> torch.Tensor:
    """|new - sampler log-prob| of a row's trained positions (``new`` from ``log_probs``)."""
    sampled = inputs["assistant_mask"][0]
    return (new[0, :-1][sampled[1:]].detach().cpu() - inputs["logprobs"][0, sampled]).abs()


class _Accumulated(NamedTuple):
    """What rows whose gradients were accumulated did.

    Attributes:
        losses: Each row's ART loss (mean over its trained positions).
        ratio_logs: Each row's |log importance ratio| per trained position (``_sampled_gaps``).
        tokens: Tokens run through the model.
    """

    losses: list[float]
    ratio_logs: list[torch.Tensor]
    tokens: int


def _trained_position(inputs: TrainInputs) -> int:
    """The one trained position of a constrained decision's row."""
    (action,) = inputs["assistant_mask"][0].nonzero()[:, 0].tolist()
    return action


def _shared_prefix(prompts: Sequence[Sequence[int]]) -> list[int]:
    """The leading tokens every prompt shares, leaving each at least one token of its own.

    For a step's decisions that is about the system turn: the rows of one table size differ
    from the user turn on (the seat, the forks, the round).
    """
    shortest = min(map(len, prompts)) - 1
    length = 0
    while length < shortest and all(p[length] == prompts[0][length] for p in prompts):
        length += 1
    return list(prompts[0][:length])


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Tensors as one flat float32 vector (the adapter's weights or gradients)."""
    return torch.cat([tensor.detach().float().flatten() for tensor in tensors])


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """The cosine of two vectors, NaN if either is zero."""
    norms = a.norm() * b.norm()
    return float(a @ b / norms) if norms > 0 else math.nan


def _mean(values: list[float]) -> float:
    """The mean, NaN for no values."""
    return sum(values) / len(values) if values else math.nan

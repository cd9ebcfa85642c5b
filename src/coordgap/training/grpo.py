"""The ``torch`` GRPO trainer: ART's own math, our optimizer loop (DESIGN.md §6).

What is ART's here: ``art.preprocessing`` computes the group advantages (population standard
deviation, zero-advantage trajectories dropped), tokenizes every history (the sampled token ids
and their sampler log-probs as the old policy's), normalises token weights and advantages over
the whole step, and packs one history per row; ``art.loss.loss_fn`` gives each row's loss
(CISPO by default, or PPO). What is ours is the loop around them, mirroring ART 0.5.18's
``LocalBackend`` (reference/art-grpo.md §9, §11): a transformers + peft LoRA model and one AdamW
step per row, with ART's constant learning rate, betas, weight decay and gradient-norm clip.

Departures from ART's loop, none of which changes the objective:

* AdamW keeps its moments in float32 (ART's ``paged_adamw_8bit`` needs bitsandbytes on a GPU).
* No warm-up pass at learning rate 1e-9 before the first step (ART runs one to compile
  Unsloth's kernels).
* Each row runs at its own length instead of padded to a multiple of 2048 tokens: the padding
  is masked out of the loss, and causal attention never lets a token see what follows it.
* Log-probs are computed only where a sampled token is predicted, with the output layer in
  float32 (the sampler does the same): the loss is zero everywhere else.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from coordgap.policies.local import DTYPES, LocalChatModel
from coordgap.training._art import art

if TYPE_CHECKING:
    from pathlib import Path

    from art.preprocessing.inputs import TrainInputs
    from art.preprocessing.pack import PackedTensors
    from art.preprocessing.tokenize import TokenizedResult

    from coordgap.config import TrainingRunConfig

# Padding of ART's packed rows: never a token id, so a row's length is where it starts.
_PAD = -100


@dataclass(frozen=True, slots=True)
class UpdateStats:
    """What one GRPO update did.

    Attributes:
        groups: Groups given.
        groups_trainable: Groups with at least one trajectory left after ART dropped the
            zero-advantage ones.
        trajectories: Trajectories trained on.
        rows: Rows, each one optimizer step (one LLM call each).
        tokens: Tokens run through the model, over all rows.
        trained_tokens: Sampled tokens the loss covers.
        loss: Mean row loss (NaN without rows).
        grad_norm: Mean gradient norm before clipping (NaN without rows).
        ratio_log_mean: Mean |log importance ratio| over the trained tokens, each taken
            when its row is trained (earlier rows of the step have moved the policy by then).
        ratio_log_first: The same over the first row only: the policy that sampled, so this is
            the numerical disagreement between sampler and trainer.
        seconds: Wall time of the update.
    """

    groups: int
    groups_trainable: int
    trajectories: int
    rows: int
    tokens: int
    trained_tokens: int
    loss: float
    grad_norm: float
    ratio_log_mean: float
    ratio_log_first: float
    seconds: float


class TorchGRPOTrainer:
    """A LoRA adapter on a local model, trained with ART's GRPO objective.

    Args:
        weights: The base model's prepared folder.
        run: The training run (recipe and optimizer settings).
        base: The base model's ``models:`` entry: its ``dtype`` (the adapter's own weights are
            always float32, as peft keeps them) and how its rollouts decode (``decoding``,
            ``max_new_tokens``, ``max_batch``; the temperature is the run's).
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
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.run = run
        self._base = base
        self.tokenizer = AutoTokenizer.from_pretrained(weights)
        # Eager attention, unlike the sampler's SDPA: PyTorch's fused CPU attention is slow
        # backwards (a row took 1.4 s against eager's 1.2 s); the two agree to the bf16 bound
        # benchmarks/README.md states for the importance ratio.
        base = AutoModelForCausalLM.from_pretrained(
            weights, dtype=DTYPES[base["dtype"]], attn_implementation="eager"
        ).to(device)
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
                self.model = get_peft_model(base, lora)
        else:
            self.model = PeftModel.from_pretrained(base, adapter, is_trainable=True)
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
        self._decoder = self.model.get_decoder()
        self._head = self.model.get_output_embeddings().weight.detach().float()
        # ART's experimental config: the loss and its clipping (None keeps ART's defaults).
        self._loss_config: art.dev.TrainConfig = {"ppo": run.loss == "ppo"}
        if run.epsilon is not None:
            self._loss_config["epsilon"] = run.epsilon
        if run.epsilon_high is not None:
            self._loss_config["epsilon_high"] = run.epsilon_high
        self._train_config = art.TrainConfig(learning_rate=run.learning_rate)

    def start(self) -> None:
        """Nothing to start: the model is in this process."""

    def sampler(self) -> LocalChatModel:
        """The current policy for rollouts: the model being trained, shared, in eval mode.

        A new backend per step, so no prefix cache computed under older weights survives.
        """
        self.model.eval()
        return LocalChatModel.from_model(
            self.model,
            self.tokenizer,
            decoding=self._base["decoding"],
            temperature=self.run.temperature,
            max_new_tokens=self._base["max_new_tokens"],
            max_batch=self._base["max_batch"],
        )

    def save(self, folder: Path) -> None:
        """Write the adapter (``adapter_model.safetensors``, ``adapter_config.json``)."""
        self.model.save_pretrained(folder)

    def save_optimizer(self, path: Path) -> None:
        """Write the optimizer's state (AdamW's moments and step counts)."""
        torch.save(self.optimizer.state_dict(), path)

    def rows(
        self, groups: list[art.TrajectoryGroup]
    ) -> tuple[PackedTensors | None, list[TokenizedResult]]:
        """Tokenize and pack trajectory groups into rows with ART's preprocessing.

        ART shuffles with Python's global ``random``: the caller seeds it.

        Args:
            groups: The step's groups.

        Returns:
            The packed rows (one history each; None when nothing is trainable) and ART's
            tokenized histories they were packed from.
        """
        results = list(
            art.preprocessing.tokenize.tokenize_trajectory_groups(
                self.tokenizer, groups, allow_training_without_logprobs=False, scale_rewards=True
            )
        )
        if not results:
            return None, results
        longest = max(len(result.token_ids) for result in results)
        packed = art.preprocessing.pack.packed_tensors_from_tokenized_results(
            results, longest, pad_token_id=_PAD, pack_results=False
        )
        return packed, results

    def row(self, packed: PackedTensors, index: int) -> TrainInputs:
        """Row ``index`` as ART's training inputs, cut to its own length."""
        inputs = art.preprocessing.inputs.create_train_inputs(
            packed, index, self._train_config, self._loss_config, warmup=False
        )
        length = int((inputs["tokens"][0] != _PAD).sum())
        for key, value in inputs.items():
            if isinstance(value, torch.Tensor) and value.dim() == 2:
                inputs[key] = value[:, :length]
        return inputs

    def token_log_probs(self, inputs: TrainInputs) -> torch.Tensor:
        """The current policy's next-token log-probs of a row, as ``art.loss`` expects them.

        Position ``t`` holds log p(token ``t + 1`` | tokens up to ``t``) where token ``t + 1``
        was sampled, and 0 elsewhere (the loss masks those positions out).

        Args:
            inputs: One row (see ``row``).

        Returns:
            A ``[1, length]`` float32 tensor, differentiable through the adapter.
        """
        tokens = inputs["tokens"].to(self.model.device)
        predicts_sampled = inputs["assistant_mask"][0, 1:].nonzero()[:, 0].to(tokens.device)
        hidden = self._decoder(input_ids=tokens).last_hidden_state[0, predicts_sampled]
        log_probs = torch.log_softmax(F.linear(hidden.float(), self._head), dim=-1)
        sampled = log_probs.gather(-1, tokens[0, predicts_sampled + 1, None])[:, 0]
        out = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
        return out.index_put((torch.zeros_like(predicts_sampled), predicts_sampled), sampled)

    def sampler_gaps(self, packed: PackedTensors) -> list[float]:
        """|log p_trainer - log p_sampler| of every sampled token of the rows, updating nothing.

        On the policy that sampled the rows, this is the importance ratio's numerical noise:
        the trainer's forward pass against the sampler's recorded log-probs.

        Args:
            packed: Rows from ``rows``.

        Returns:
            One gap per sampled token, row by row.
        """
        gaps: list[float] = []
        with torch.no_grad():
            for index in range(packed["tokens"].shape[0]):
                inputs = self.row(packed, index)
                gaps += _sampled_gaps(inputs, self.token_log_probs(inputs)).tolist()
        return gaps

    def update(self, groups: list[art.TrajectoryGroup]) -> UpdateStats:
        """One GRPO step: one AdamW step per packed row, as ART's LocalBackend takes them.

        Args:
            groups: The step's trajectory groups.

        Returns:
            What the update did; a step with nothing trainable changes nothing.
        """
        start = time.perf_counter()
        packed, results = self.rows(groups)
        rows = 0 if packed is None else packed["tokens"].shape[0]
        losses, norms, ratio_logs = [], [], []
        tokens = 0
        self.model.train()
        for index in range(rows):
            inputs = self.row(packed, index)
            new = self.token_log_probs(inputs)
            loss = art.loss.loss_fn(inputs, new, None, None, self._loss_config).policy_loss
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(
                self._parameters, self.run.optimizer.max_grad_norm
            )
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            ratio_logs.append(_sampled_gaps(inputs, new))
            losses.append(loss.item())
            norms.append(norm.item())
            tokens += inputs["tokens"].numel()
        self.model.eval()
        trained = {id(result.trajectory) for result in results}
        every = torch.cat(ratio_logs) if ratio_logs else torch.empty(0)
        return UpdateStats(
            groups=len(groups),
            groups_trainable=sum(
                any(id(t) in trained for t in group.trajectories) for group in groups
            ),
            trajectories=len(trained),
            rows=rows,
            tokens=tokens,
            trained_tokens=every.numel(),
            loss=_mean(losses),
            grad_norm=_mean(norms),
            ratio_log_mean=_mean(every.tolist()),
            ratio_log_first=_mean(ratio_logs[0].tolist()) if ratio_logs else math.nan,
            seconds=time.perf_counter() - start,
        )


def _sampled_gaps(inputs: TrainInputs, new: torch.Tensor) -> torch.Tensor:
    """|new - sampler log-prob| of a row's sampled tokens (``new`` from ``token_log_probs``)."""
    sampled = inputs["assistant_mask"][0]
    return (new[0, :-1][sampled[1:]].detach().cpu() - inputs["logprobs"][0, sampled]).abs()


def _mean(values: list[float]) -> float:
    """The mean, NaN for no values."""
    return sum(values) / len(values) if values else math.nan

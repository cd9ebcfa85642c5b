"""An in-process causal LM that decides tool calls for many philosophers at once.

One ``LocalChatModel`` serves every philosopher of every episode a job runs. Concurrent
``decide`` calls are micro-batched: while one batch runs in a worker thread, the event loop
keeps collecting requests, and the next batch takes whatever has arrived (up to
``max_batch``). Each request samples with its own seeded generator, so its decision does not
depend on which other requests shared its batch.

Two decodings exist (DESIGN.md §4). ``constrained`` scores the allowed tools' tool-call
continuations against the prompt's KV cache and samples one of them, so it always yields a
tool; a 135M model cannot write tool calls on its own (reference/cpu-feasibility.md §2.3).
``free`` samples text and parses whatever calls it contains.

Every request's system turn (the seat-independent system prompt and the tool descriptions)
is the same for a whole table, so its KV cache is computed once and kept: a request runs only
its own user turn and the candidates against a copy of it.

Log-probabilities are computed with the output layer in float32: bf16 logits are rounded to
about 0.1 at typical magnitudes, which would make the recorded log-probs, and with them the
GRPO importance ratios, noisy.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from coordgap.env.protocols import TOOL_DESCRIPTIONS
from coordgap.policies.base import Decision, Transcript
from coordgap.policies.parsing import parse_text_tool_calls

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from coordgap.env.protocols import Tool

Decoding = Literal["constrained", "free"]

# Event-loop turns the batcher waits for more requests before it runs a batch. Callers that
# start together (asyncio.gather, one round of philosophers) have all enqueued after one
# turn; the extra turns catch callers that await something small first.
_COLLECT_TURNS = 4

# Shared prefixes whose KV caches are kept (about 8 MB each for SmolLM2-135M's 350-token system
# turn). A job has one per table configuration (size, protocol, rounds); more evict the oldest.
_KEPT_PREFIXES = 8


def call_text(tool: Tool) -> str:
    """The tool-call text a model writes to call ``tool`` (Hermes format, no arguments).

    Args:
        tool: The tool.

    Returns:
        The ``<tool_call>`` block of a call of ``tool`` with ``{}`` arguments, on three lines.
    """
    return f"<tool_call>\n{json.dumps({'name': tool.value, 'arguments': {}})}\n</tool_call>"


def with_tools(
    messages: Sequence[Mapping[str, str]], tools: Sequence[Tool]
) -> list[dict[str, str]]:
    """Add a description of the tools to a conversation's system message.

    Chat templates of small models (SmolLM2's among them) ignore ``tools=``, so the tools are
    described in the system prompt, in the format the continuations are scored in.

    Args:
        messages: The conversation; a leading system message is extended, otherwise one is
            inserted.
        tools: The tools allowed at this table.

    Returns:
        The conversation as sent to the model.
    """
    listing = "\n".join(f"- {tool.value}: {TOOL_DESCRIPTIONS[tool]}" for tool in tools)
    example = call_text(tools[0]).replace(f'"{tools[0].value}"', '"<tool name>"')
    block = f"Tools:\n{listing}\n\nCall one tool by replying with:\n{example}"
    chat = [dict(message) for message in messages]
    if chat and chat[0]["role"] == "system":
        chat[0]["content"] = f"{chat[0]['content']}\n\n{block}"
    else:
        chat.insert(0, {"role": "system", "content": block})
    return chat


@dataclass(slots=True)
class _Request:
    """A pending ``decide`` call."""

    messages: list[dict[str, str]]
    tools: tuple[Tool, ...]
    seed: int
    future: asyncio.Future[Decision]
    started: float


class LocalChatModel:
    """A Hugging Face causal LM, optionally with a LoRA adapter, shared by a job's decisions.

    Args:
        path: A prepared model folder (see ``coordgap.models.prepare``).
        adapter: A peft LoRA adapter folder to apply, or None for the base model.
        decoding: ``constrained`` (score the tools' calls) or ``free`` (generate and parse).
        temperature: Sampling temperature; 0 is greedy (ties go to the first candidate).
        max_new_tokens: The generation limit of ``free`` decoding.
        max_batch: The most requests in one batch.
        device: ``auto`` (CUDA when available, else CPU) or a torch device name.

    Attributes:
        model: The causal LM (a ``PeftModel`` when an adapter is given), in bf16, eval mode.
        tokenizer: Its tokenizer.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        adapter: str | Path | None = None,
        decoding: Decoding,
        temperature: float,
        max_new_tokens: int,
        max_batch: int,
        device: str = "auto",
    ) -> None:
        if decoding not in ("constrained", "free"):
            raise ValueError(f"decoding must be 'constrained' or 'free', not {decoding!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, not {temperature}")
        if max_new_tokens < 1 or max_batch < 1:
            raise ValueError("max_new_tokens and max_batch must be at least 1")
        self.decoding = decoding
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.max_batch = max_batch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(path)
        # Eager attention computes each query on its own, so a padded or cached sequence
        # gets exactly the log-probs of a plain forward pass (given _run's even padding).
        # SDPA's kernels change with the padding and moved log-probs by 0.2-0.4, which would
        # make a decision depend on its batch; they are about 1.5x faster on this CPU.
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.bfloat16, attn_implementation="eager"
        ).to(self.device)
        if adapter is not None:
            from peft import PeftModel

            # Not merged: the trainer computes log-probs through the unmerged adapter, and
            # merging into bf16 weights would round the update away from what it computes.
            model = PeftModel.from_pretrained(model, adapter)
        self.model: PreTrainedModel | PeftModel = model.eval()
        self._decoder = model.get_decoder()
        self._head = model.get_output_embeddings().weight.detach().float()
        self._end_id: int = self.tokenizer.eos_token_id
        self._pad_id: int = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self._end_id
        )
        self._continuations: dict[Tool, list[int]] = {}
        # Keys and values of every layer for a shared prefix, computed with the adapter, batch 1.
        self._prefixes: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._pending: list[_Request] = []
        self._runner: asyncio.Task[None] | None = None

    async def decide(
        self, messages: Sequence[Mapping[str, str]], tools: Sequence[Tool], seed: int
    ) -> Decision:
        """Decide one philosopher's tool call.

        Args:
            messages: The conversation (system and user messages), without tool descriptions.
            tools: The tools allowed at this table, in their protocol's order.
            seed: Seeds this decision's sampling; equal seeds give equal decisions.

        Returns:
            The decision, with a transcript of the LLM call for training: the messages as
            sent (tool descriptions included), the sampled tokens and their log-probs under the
            model at temperature 1, which is what a trainer recomputes for its ratios.
        """
        if not tools:
            raise ValueError("decide needs at least one tool")
        loop = asyncio.get_running_loop()
        request = _Request(
            with_tools(messages, tools),
            tuple(tools),
            seed,
            loop.create_future(),
            time.perf_counter(),
        )
        self._pending.append(request)
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._serve())
        return await request.future

    async def _serve(self) -> None:
        """Run batches of pending requests until none is left."""
        while self._pending:
            for _ in range(_COLLECT_TURNS):
                if len(self._pending) >= self.max_batch:
                    break
                await asyncio.sleep(0)
            # Callers that gave up (cancelled) while waiting need no decision.
            batch = [r for r in self._pending[: self.max_batch] if not r.future.done()]
            del self._pending[: self.max_batch]
            if not batch:
                continue
            try:
                # In a thread, so the event loop keeps collecting the next batch meanwhile.
                decisions = await asyncio.to_thread(self._run, batch)
            except Exception as error:
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(error)
                continue
            finished = time.perf_counter()
            for request, decision in zip(batch, decisions, strict=True):
                # Its caller may have given up while the batch ran.
                if not request.future.done():
                    latency = finished - request.started
                    request.future.set_result(replace(decision, latency_s=latency))

    @torch.inference_mode()
    def _run(self, batch: list[_Request]) -> list[Decision]:
        """Decide a batch of requests (latency not yet filled in).

        The tokenizer is used here only, in the worker thread: a fast tokenizer is not safe to
        share between threads.

        bf16 CPU kernels (AVX512-BF16, AMX) add attention terms up in adjacent pairs, so
        shifting a sequence by one position regroups the sums and moves its log-probs by up to
        0.3, while shifting it by two changes nothing. Only sequences of equal length parity
        share a forward pass, so every left padding is even: a request gets the same
        log-probs in any batch as alone, and as in an unpadded forward pass (the trainer's).
        Requests share a forward pass only when they share a cached prefix as well.
        """
        decide = self._choose if self.decoding == "constrained" else self._generate
        prompts = [self._prompt(request.messages) for request in batch]
        groups: dict[tuple[tuple[int, ...], int], list[int]] = {}
        for i, request in enumerate(batch):
            prefix = self._prefix(request.messages, prompts[i])
            length = len(prompts[i]) + self._shared_length(request.tools)
            groups.setdefault((prefix, length % 2), []).append(i)
        decisions: dict[int, Decision] = {}
        for (prefix, _), members in groups.items():
            group = decide([batch[i] for i in members], [prompts[i] for i in members], prefix)
            decisions.update(zip(members, group, strict=True))
        return [decisions[i] for i in range(len(batch))]

    def _prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """The token ids of a conversation rendered for the assistant's turn."""
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        # The template writes every special token itself; the tokenizer must not add a BOS.
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def _prefix(self, messages: list[dict[str, str]], prompt: list[int]) -> tuple[int, ...]:
        """The leading tokens of ``prompt`` that every request with its system message shares.

        That is the rendering of the system turn alone, as far as it is a prefix of
        ``prompt`` (it is, up to where the user turn starts), leaving at least one token of
        the prompt to run.
        """
        text = self.tokenizer.apply_chat_template(messages[:1], tokenize=False)
        system = self.tokenizer(text, add_special_tokens=False).input_ids
        common = 0
        for a, b in zip(system, prompt[:-1], strict=False):
            if a != b:
                break
            common += 1
        return tuple(prompt[:common])

    def _prefix_cache(self, prefix: tuple[int, ...], pads: list[int]) -> DynamicCache | None:
        """The first ``len(prefix)`` columns of left-padded rows, as a KV cache.

        Row ``i`` is ``pads[i]`` padding columns, then ``prefix``, cut to the columns' width:
        the layout of a left-padded batch (see ``_prefill``). Padding keys and values are
        zeros; the attention mask hides them. The prefix runs the first time it is asked for,
        alone and unpadded, as in the trainer's forward pass; later calls copy its keys and
        values.

        Args:
            prefix: The rows' shared prefix.
            pads: Each row's left padding.

        Returns:
            The cache, or None for an empty prefix.
        """
        if not prefix:
            return None
        if prefix not in self._prefixes:
            if len(self._prefixes) >= _KEPT_PREFIXES:
                del self._prefixes[next(iter(self._prefixes))]
            out = self._decoder(
                input_ids=torch.tensor([prefix], device=self.device), use_cache=True
            )
            self._prefixes[prefix] = [(keys, values) for keys, values, *_ in out.cache]
        width = len(prefix)
        layers = []
        for keys, values in self._prefixes[prefix]:
            rows = (
                keys.new_zeros(len(pads), *keys.shape[1:]),
                values.new_zeros(len(pads), *values.shape[1:]),
            )
            for row, pad in enumerate(pads):
                if pad < width:
                    rows[0][row, :, pad:] = keys[0, :, : width - pad]
                    rows[1][row, :, pad:] = values[0, :, : width - pad]
            layers.append(rows)
        return DynamicCache(layers)

    def _continuation(self, tool: Tool) -> list[int]:
        """The token ids of the assistant's turn that calls ``tool``, end-of-turn included."""
        if tool not in self._continuations:
            ids = self.tokenizer(call_text(tool), add_special_tokens=False).input_ids
            self._continuations[tool] = [*ids, self._end_id]
        return self._continuations[tool]

    def _shared_length(self, tools: tuple[Tool, ...]) -> int:
        """How many leading tokens the calls of ``tools`` share, when they are scored.

        Constrained decoding runs these tokens once, with the prompt; each candidate keeps at
        least one token of its own. Free decoding shares nothing.
        """
        if self.decoding == "free":
            return 0
        candidates = [self._continuation(tool) for tool in tools]
        shortest = min(map(len, candidates))
        for i in range(shortest - 1):
            if any(c[i] != candidates[0][i] for c in candidates):
                return i
        return shortest - 1

    def _log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token log-probs from final hidden states, the output layer in float32."""
        return torch.log_softmax(F.linear(hidden.float(), self._head), dim=-1)

    def _prefill(
        self, prompts: list[list[int]], prefix: tuple[int, ...], keep: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache]:
        """Run the prompts as one left-padded batch, its first columns from the prefix cache.

        The batch is laid out as if the whole prompts ran left-padded (the layout whose
        log-probs ``_run`` shows equal an unpadded pass): its first ``len(prefix)`` columns,
        padding and the start of each prompt's prefix, come from the prefix cache, and only
        the columns after them run. A shorter prompt thus runs a few more of its prefix's
        tokens instead of padding. Padding placed between the prefix and a prompt's own
        tokens instead would regroup the attention sums and move log-probs by about 0.1.

        Args:
            prompts: Token ids, one list per request, each beginning with ``prefix``.
            prefix: Their shared prefix, shorter than the longest prompt (may be empty).
            keep: How many of the last positions to return log-probs for.

        Returns:
            The next-token log-probs at each prompt's last ``keep`` positions ``[B, keep, V]``,
            the attention mask ``[B, L]``, each prompt's length ``[B]`` and the KV cache.
        """
        width = max(map(len, prompts))
        pads = [width - len(p) for p in prompts]
        ids = torch.tensor([[self._pad_id] * pad + p for pad, p in zip(pads, prompts, strict=True)])
        mask = torch.tensor(
            [[0] * pad + [1] * len(p) for pad, p in zip(pads, prompts, strict=True)]
        )
        # Positions count real tokens only, so a padded prompt sees the positions it would
        # see alone; padding positions are masked out and their value does not matter.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        start = len(prefix)
        out = self._decoder(
            input_ids=ids[:, start:].to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions[:, start:].to(self.device),
            cache=self._prefix_cache(prefix, pads),
            use_cache=True,
        )
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        return (
            self._log_probs(out.last_hidden_state[:, -keep:]),
            mask.to(self.device),
            lengths,
            out.cache,
        )

    def _choose(
        self, batch: list[_Request], prompts: list[list[int]], prefix: tuple[int, ...]
    ) -> list[Decision]:
        """Constrained decoding: score every allowed tool's call and sample one per request.

        The prompts run after their shared ``prefix``'s cached keys and values. The tokens all
        of a request's candidates begin with (the call up to the tool's name) run once,
        appended to its prompt. The rest of each candidate then runs against that
        KV cache, copied once per candidate, all candidates of the batch together.
        """
        options = [[self._continuation(tool) for tool in request.tools] for request in batch]
        shared = [self._shared_length(request.tools) for request in batch]
        keep = max(shared) + 1
        head, mask, lengths, cache = self._prefill(
            [p + c[0][:n] for p, c, n in zip(prompts, options, shared, strict=True)],
            prefix,
            keep,
        )
        owner = torch.tensor(
            [b for b, candidates in enumerate(options) for _ in candidates], device=self.device
        )
        rests = [c[n:] for candidates, n in zip(options, shared, strict=True) for c in candidates]
        width = max(map(len, rests))
        ids = torch.tensor(
            [r + [self._pad_id] * (width - len(r)) for r in rests], device=self.device
        )
        own_mask = torch.tensor(
            [[1] * len(r) + [0] * (width - len(r)) for r in rests], device=self.device
        )
        cache.batch_select_indices(owner)
        hidden = self._decoder(
            input_ids=ids,
            attention_mask=torch.cat([mask[owner], own_mask], dim=1),
            position_ids=lengths[owner, None] + torch.arange(width, device=self.device),
            cache=cache,
            use_cache=True,
        ).last_hidden_state
        decisions = []
        row = 0
        for b, (request, candidates, n) in enumerate(zip(batch, options, shared, strict=True)):
            # head[b, keep - 1 - n + j] predicts token j of every candidate, for j <= n; in the
            # candidate pass, position i of a row predicts the row's token i + 1. One request's
            # rows at a time keeps the float32 vocabulary-sized tensor small.
            early = head[b, keep - 1 - n :]
            later = self._log_probs(hidden[row : row + len(candidates), :-1])
            token_lps = [
                torch.cat(
                    [
                        _pick(early, torch.tensor(c[: n + 1], device=self.device)),
                        _pick(later[k, : len(c) - n - 1], ids[row + k, 1 : len(c) - n]),
                    ]
                ).cpu()
                for k, c in enumerate(candidates)
            ]
            row += len(candidates)
            # Summed, not length-normalised: the sum is the log-probability the model gives
            # the whole call, so softmax(sum / T) at T = 1 is the model's own distribution
            # over the allowed calls. Normalising by length would favour long tool names,
            # whose later tokens are nearly certain once the name has begun.
            totals = torch.stack([lps.sum() for lps in token_lps])
            k = _sample(totals, self.temperature, _generator(request.seed))
            decisions.append(
                self._decision(
                    request,
                    len(prompts[b]),
                    candidates[k],
                    token_lps[k].tolist(),
                    tool=request.tools[k],
                )
            )
        return decisions

    def _generate(
        self, batch: list[_Request], prompts: list[list[int]], prefix: tuple[int, ...]
    ) -> list[Decision]:
        """Free decoding: sample each request's reply token by token, then parse it."""
        log_probs, mask, lengths, cache = self._prefill(prompts, prefix, keep=1)
        log_probs = log_probs[:, -1]
        generators = [_generator(request.seed) for request in batch]
        tokens: list[list[int]] = [[] for _ in batch]
        token_lps: list[list[float]] = [[] for _ in batch]
        for step in range(self.max_new_tokens):
            if step:
                # Finished rows keep decoding (their output is ignored): simpler than
                # shrinking the batch and its cache, and the last rows finish soon anyway.
                last = torch.tensor([row[-1] for row in tokens], device=self.device)
                mask = F.pad(mask, (0, 1), value=1)
                out = self._decoder(
                    input_ids=last[:, None],
                    attention_mask=mask,
                    position_ids=(lengths + step - 1)[:, None],
                    cache=cache,
                    use_cache=True,
                )
                cache = out.cache
                log_probs = self._log_probs(out.last_hidden_state[:, -1])
            scores = log_probs.cpu()
            for b, generator in enumerate(generators):
                if tokens[b] and tokens[b][-1] == self._end_id:
                    continue
                token = _sample(scores[b], self.temperature, generator)
                tokens[b].append(token)
                token_lps[b].append(scores[b, token].item())
            if all(row[-1] == self._end_id for row in tokens):
                break
        return [
            self._decision(request, len(prompts[b]), tokens[b], token_lps[b])
            for b, request in enumerate(batch)
        ]

    def _decision(
        self,
        request: _Request,
        prompt_tokens: int,
        tokens: list[int],
        log_probs: list[float],
        *,
        tool: Tool | None = None,
    ) -> Decision:
        """Build a request's decision; without ``tool`` the reply text is parsed for one."""
        completion = self.tokenizer.decode(tokens)
        raw = self.tokenizer.decode(tokens, skip_special_tokens=True)
        reason = None
        if tool is None:
            tool, reason = parse_text_tool_calls(raw, request.tools)
        return Decision(
            tool=tool,
            no_call_reason=reason,
            raw=raw,
            tokens_in=prompt_tokens,
            tokens_out=len(tokens),
            transcript=Transcript(
                messages=tuple(request.messages),
                completion=completion,
                token_ids=tuple(tokens),
                logprobs=tuple(log_probs),
            ),
        )


def _pick(log_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The log-prob of each token, ``log_probs[i, tokens[i]]``."""
    return log_probs.gather(-1, tokens[:, None])[:, 0]


def _generator(seed: int) -> torch.Generator:
    """A CPU generator seeded for one request: its draws do not depend on the batch."""
    return torch.Generator().manual_seed(seed)


def _sample(scores: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    """Draw an index from softmax(scores / temperature); argmax (first on ties) at 0."""
    if temperature == 0:
        return int(torch.argmax(scores))
    probs = torch.softmax(scores.double() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))

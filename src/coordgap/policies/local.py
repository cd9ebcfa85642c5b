"""An in-process causal LM that decides tool calls for many philosophers at once.

One ``LocalChatModel`` serves every philosopher of every episode a job runs (and the rollouts of
a training run, sharing the trainer's model). Decisions are batched by *group*, not by timing:
the decisions of one simultaneous round of one episode form a group (``BatchSlot``), and a
group runs, in seat order and in forward passes of at most ``max_batch`` decisions, once all of
its members have asked. A decision's computation therefore depends only on its own round, never
on which other episodes happened to be waiting at the same moment, so a cell's episodes are
reproducible by construction on a given machine and thread count, however the event loop and
the kernels' threads are scheduled. Each request samples with its own seeded generator.

Two decodings exist. ``constrained`` scores the allowed tools' tool-call continuations and
samples one of them, so it always yields a tool; a 135M model cannot write tool calls on its
own (it answers in prose). ``free`` samples text and parses whatever calls it contains. What
each records for training is in ``coordgap.policies.base.Transcript``.

Every request's system turn (the seat-independent system prompt and the tool descriptions) is
the same for a whole table, so its keys and values are computed once, alone and unpadded, and
kept. A forward pass then runs, per request, one row: the request's own prompt tokens after
that prefix and the tokens every candidate call begins with, followed by the rest of the
candidates as a tree of blocks (``candidate_tree``: a token two candidates share at the same
place runs once, so ``pick_up_`` serves both forks). The attention mask lets each block see the
prefix, its request's prompt, its ancestor blocks and itself only, so all candidates of all
requests are scored in one pass without copying any cache per candidate.

Numerics (``dtype``): the output layer always runs in float32, because bf16 logits are rounded
to about 0.1 at typical magnitudes. In ``bfloat16`` the recorded log-probs agree with a plain
forward pass over prompt + completion only to within the bf16 bound measured on each CPU kernel
path (``benchmarks/README.md``, "Numerics"): different shapes round differently, so a sampler
and a trainer never agree bit for bit. ``float32`` agrees to about 1e-4 on every path, at
roughly twice the cost on a CPU with bf16 instructions.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import time
import types
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from transformers import (
    AttentionInterface,
    AttentionMaskInterface,
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
)
from transformers.activations import SiLUActivation
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from coordgap.env.protocols import TOOL_DESCRIPTIONS
from coordgap.policies.base import Decision, Transcript
from coordgap.policies.parsing import parse_text_tool_calls

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterator, Mapping, Sequence
    from pathlib import Path

    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from coordgap.env.protocols import Tool
    from coordgap.policies.base import BatchSlot

logger = logging.getLogger(__name__)

Decoding = Literal["constrained", "free"]
DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def compute_dtype(dtype: str, device: str) -> torch.dtype:
    """The dtype a model configured with ``dtype`` computes in on ``device``.

    ``bfloat16`` means the decoder's matrices are multiplied in bf16 (:func:`load_weights`),
    except on a CPU for which oneDNN has no
    bf16 kernels (an AVX2-only CPU): there torch multiplies bf16 matrices in a scalar fallback,
    measured at 1.2 GFLOP/s against float32's 65 on one core of such a machine, so the same
    bf16-rounded weights compute in float32 instead (exactly representable, and closer to the
    exact result than any bf16 kernel). Machines of this kind already round bf16 differently on
    each oneDNN path; this is one more path, logged by the loaders, and the same on every run of
    the same machine.

    Args:
        dtype: A key of :data:`DTYPES`.
        device: ``cpu`` or ``cuda``.

    Returns:
        The torch dtype to load the weights in.
    """
    if dtype == "bfloat16" and device == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.float32
    return DTYPES[dtype]


def shared_kv_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The ``sdpa`` attention of transformers, with key/value heads shared inside the kernel.

    With a mask, transformers 5.25 copies every key/value head once per query head it serves
    (``repeat_kv``) before PyTorch's fused attention, except on devices where the kernel's own
    grouped-query path is fast with a mask; on a CPU it is, and the packed rows always pass a
    mask. Sharing the heads in the kernel (``enable_gqa``) gives bit-identical log-probs and
    saves about 3 % of a decision on a 2-core CPU (benchmarks/README.md, "Where the time
    goes"). Every other call (no mask, another device, no grouped heads) is transformers' own.

    Args:
        module: The attention layer.
        query: ``[B, heads, Q, D]``.
        key: ``[B, key/value heads, K, D]``.
        value: ``[B, key/value heads, K, D]``.
        attention_mask: ``[B, 1, Q, K]`` (additive or boolean), or None.
        dropout: Attention dropout probability.
        scaling: The scores' scale (None for 1/sqrt(D)).
        **kwargs: Passed on to transformers' ``sdpa`` where it runs.

    Returns:
        The attention output ``[B, Q, heads, D]`` and no weights.
    """
    if (
        attention_mask is None
        or query.device.type != "cpu"
        or getattr(module, "num_key_value_groups", 1) == 1
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    output = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=True,
    )
    return output.transpose(1, 2).contiguous(), None


# PyTorch's fused attention (``shared_kv_sdpa``). It takes the packed rows' arbitrary 4D
# masks, and on a CPU it decides about 1.4x faster than eager attention, which materialises
# every score and its float32 softmax (benchmarks/README.md, "Numerics").
ATTENTION = "coordgap_sdpa"
AttentionInterface.register(ATTENTION, shared_kv_sdpa)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def resolve_device(device: str) -> str:
    """``device``, with ``auto`` resolved to CUDA when it is available, else the CPU."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class WeightDtypeLinear(torch.nn.Linear):
    """A linear layer that multiplies in its weights' dtype and returns its input's.

    With bf16 weights and a float32 input this is a bf16 matrix product (oneDNN's bf16
    kernels, AMX where the CPU has it) whose result rejoins the float32 computation around it.
    With float32 weights (``coordgap.training.grpo``'s float32 probe casts them up) it is
    float32 throughout.
    """

    @classmethod
    def of(cls, linear: torch.nn.Linear, dtype: torch.dtype) -> WeightDtypeLinear:
        """``linear``'s weights and bias, stored in ``dtype``."""
        layer = cls(
            linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta"
        )
        layer.weight = torch.nn.Parameter(linear.weight.detach().to(dtype), requires_grad=False)
        if linear.bias is not None:
            layer.bias = torch.nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x W^T + b`` in the weights' dtype, returned in ``x``'s."""
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)


def _gated_mlp_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A gated MLP's ``down(silu(gate(x)) * up(x))``, in place where no gradient is recorded.

    The gate's output is a fresh tensor that nothing else reads, so the activation and the
    product can overwrite it: the same values, bit for bit, without allocating two more
    tensors of the MLP's width per layer (in a decision, their allocation and first writes
    cost about a tenth of the time on a 2-core CPU: benchmarks/README.md, "Decisions as a
    tree"). Where gradients are recorded, autograd keeps the activation's input, so the
    layer runs its class's own forward.
    """
    if torch.is_grad_enabled():
        return type(self).forward(self, x)
    gate = F.silu(self.gate_proj(x), inplace=True)
    return self.down_proj(gate.mul_(self.up_proj(x)))


def _is_silu_gated_mlp(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a transformers gated MLP with a SiLU gate (Llama's, Qwen's, ...).

    transformers' ``SiLUActivation`` is ``F.silu``, which the in-place form computes exactly.
    """
    return all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj")) and (
        isinstance(getattr(module, "act_fn", None), SiLUActivation)
    )


def matmul_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype a loaded model's decoder multiplies its matrices in (see :func:`load_weights`)."""
    layers = [m for m in model.modules() if isinstance(m, WeightDtypeLinear)]
    return layers[0].weight.dtype if layers else model.get_input_embeddings().weight.dtype


def load_weights(path: Path, dtype: str, device: str) -> PreTrainedModel:
    """A causal LM from ``path`` on ``device``, as the sampler and the trainer both compute it.

    ``bfloat16`` is mixed precision: the decoder's linear layers keep bf16 weights and multiply
    in bf16 (:class:`WeightDtypeLinear`), the bulk of the work, while everything between them
    computes in float32: the residual stream, the norms, attention, and a LoRA adapter's
    products and their sum with the layer's output. A small update is then what the adapter
    adds to a float32 sum, not an increment that rounding to bf16's 8 bits discards at every
    layer (README, "GRPO training", measures both). ``float32`` is float32 throughout.

    Args:
        path: The prepared model folder.
        dtype: A key of :data:`DTYPES` (see :func:`compute_dtype`: the matrices' dtype).
        device: A resolved torch device name (:func:`resolve_device`).

    Returns:
        The model, float32 but for its decoder's matrices, with the project's attention.
    """
    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=torch.float32,
        attn_implementation=ATTENTION,
        # Where the `kernels` package is installed (ART brings it), transformers swaps layers
        # for kernels fetched from the hub by default; on a GPU that is unpinned code changing
        # the numerics, and on a node without internet access a ValueError (seen on an H200).
        use_kernels=False,
    )
    matrices = compute_dtype(dtype, device)
    if matrices != torch.float32:
        decoder = model.get_decoder()
        linears = [
            (parent, name, child)
            for parent in decoder.modules()
            for name, child in parent.named_children()
            if type(child) is torch.nn.Linear
        ]
        for parent, name, child in linears:
            setattr(parent, name, WeightDtypeLinear.of(child, matrices))
    for module in model.modules():
        if _is_silu_gated_mlp(module):
            module.forward = types.MethodType(_gated_mlp_forward, module)
    return model.to(device)


# The most candidate columns the float32 output layer scores in one product (about 100 MB of
# logits at SmolLM2's vocabulary); see ``LocalChatModel._score_candidates``.
_HEAD_ROWS = 512

# Shared prefixes whose keys and values are kept (about 16 MB each for SmolLM2-135M's 350-token
# system turn: attention computes in float32, see ``load_weights``). A job has one per table
# configuration (size, protocol, rounds); more evict the oldest.
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


@dataclass(frozen=True, slots=True)
class PackedRow:
    """One request's tokens in a packed forward pass, after the shared prefix.

    Attributes:
        stem: The request's own prompt tokens (and, for constrained decoding, the tokens every
            candidate begins with). Causal, as in a plain forward pass.
        blocks: Token blocks after the stem, each the continuation of its parent: a block sees
            the prefix, the stem, its ancestor blocks and itself, as if that path alone came
            after the stem.
        parents: Each block's parent: 0 the stem, k the k-th block (always an earlier one).
            Blocks whose parent is the stem are side by side, each seeing only the stem.
    """

    stem: list[int]
    blocks: tuple[list[int], ...] = ()
    parents: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.parents) != len(self.blocks):
            raise ValueError(f"{len(self.blocks)} blocks need as many parents, not {self.parents}")
        if any(not 0 <= parent <= k for k, parent in enumerate(self.parents)):
            raise ValueError(f"a block's parent must come before it: {self.parents}")


def shared_length(candidates: Sequence[Sequence[int]]) -> int:
    """How many leading tokens the candidate calls share (each keeps at least one of its own).

    Args:
        candidates: The token ids of every candidate call, end of turn included.

    Returns:
        The length of their common prefix, at most the shortest's length less one.
    """
    shortest = min(map(len, candidates))
    for i in range(shortest - 1):
        if any(c[i] != candidates[0][i] for c in candidates):
            return i
    return shortest - 1


class CandidateTree(NamedTuple):
    """The candidate calls after the tokens they all share, as a tree of token blocks.

    A candidate's tokens after the shared ones, but its last (the end of turn, only ever
    predicted), are the blocks of its path from the stem. Candidates that begin alike share
    the blocks of that beginning: ``pick_up_left`` and ``pick_up_right`` run ``pick_up_`` once.
    Blocks are in depth-first order, every parent before its children.

    Attributes:
        shared: The tokens every candidate begins with (``shared_length``).
        blocks: The blocks.
        parents: Each block's parent: 0 the stem, k the k-th block.
        reads: Per candidate, which scored column predicts each of its tokens: indices into the
            row's ``candidate_columns`` (the stem's last ``shared + 1``, then every block's).
    """

    shared: int
    blocks: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]
    reads: tuple[tuple[int, ...], ...]


@functools.lru_cache(maxsize=64)
def candidate_tree(candidates: tuple[tuple[int, ...], ...]) -> CandidateTree:
    """The tree of ``candidates``' own tokens (a radix tree: one block per unbranched run).

    Cached: a table asks the same few candidate sets for every decision.

    Args:
        candidates: The token ids of every candidate call, end of turn included.

    Returns:
        The tree.
    """
    shared = shared_length(candidates)
    runs = [c[shared:-1] for c in candidates]
    blocks: list[tuple[int, ...]] = []
    parents: list[int] = []
    paths: list[list[int]] = [[] for _ in candidates]

    def grow(members: list[int], depth: int, parent: int) -> None:
        """Add the blocks of ``members``' runs from ``depth`` on, below block ``parent``."""
        by_token: dict[int, list[int]] = {}
        for member in members:
            if len(runs[member]) > depth:
                by_token.setdefault(runs[member][depth], []).append(member)
        for branch in by_token.values():
            end = depth + 1
            # A block ends where its candidates part or one of them ends.
            while all(len(runs[m]) > end for m in branch) and (
                len({runs[m][end] for m in branch}) == 1
            ):
                end += 1
            blocks.append(runs[branch[0]][depth:end])
            parents.append(parent)
            for member in branch:
                paths[member].append(len(blocks))
            grow(branch, end, len(blocks))

    grow(list(range(len(candidates))), 0, 0)
    # Scored column of each block's first token: after the stem's shared + 1.
    starts = list(itertools.accumulate((len(block) for block in blocks), initial=shared + 1))
    reads = tuple(
        (
            *range(shared + 1),
            *(
                column
                for block in path
                for column in range(starts[block - 1], starts[block - 1] + len(blocks[block - 1]))
            ),
        )
        for path in paths
    )
    return CandidateTree(shared, tuple(blocks), tuple(parents), reads)


def _tree(candidates: Sequence[Sequence[int]]) -> CandidateTree:
    """``candidate_tree`` of candidates given as any sequences."""
    return candidate_tree(tuple(map(tuple, candidates)))


def candidate_row(prompt: Sequence[int], candidates: Sequence[Sequence[int]]) -> PackedRow:
    """The packed row that scores every candidate call after ``prompt`` in one pass.

    The stem is the prompt and the tokens all candidates begin with; the blocks are the
    candidates' ``candidate_tree``, so that a token two candidates share at the same place
    runs once.

    Args:
        prompt: The prompt's tokens (after whatever prefix is cached).
        candidates: The token ids of every candidate call, end of turn included.

    Returns:
        The row.
    """
    tree = _tree(candidates)
    return PackedRow(
        [*prompt, *candidates[0][: tree.shared]], tuple(map(list, tree.blocks)), tree.parents
    )


def candidate_columns(row: PackedRow, candidates: Sequence[Sequence[int]]) -> list[int]:
    """The columns of a ``candidate_row`` whose next-token log-probs score its candidates.

    Position i predicts token i + 1: the stem's last n + 1 positions predict the shared tokens
    and every candidate's first own token; a block's positions predict the tokens after them
    on each path through the block.

    Args:
        row: The row (``candidate_row``).
        candidates: Its candidates.

    Returns:
        Column indices: the stem's last n + 1, then every block's, in order
        (``CandidateTree.reads`` indexes them).
    """
    stem = len(row.stem)
    return [
        *range(stem - _tree(candidates).shared - 1, stem),
        *range(stem, stem + sum(map(len, row.blocks))),
    ]


def candidate_log_probs(
    log_probs: torch.Tensor, candidates: Sequence[Sequence[int]]
) -> list[torch.Tensor]:
    """Every candidate call's token log-probs, from the next-token log-probs of its row.

    All of them are read with one indexing operation: its backward pass then writes one
    vocabulary-sized gradient, where reading each candidate apart wrote one per read (13 for
    six tools: zeroing them took about 7 % of a profiled GRPO row on a 2-core CPU).

    Args:
        log_probs: ``[columns, vocabulary]`` log-probs at ``candidate_columns``.
        candidates: The row's candidates.

    Returns:
        One tensor per candidate: the log-prob of each of its tokens (differentiable when
        ``log_probs`` is).
    """
    columns = [column for read in _tree(candidates).reads for column in read]
    tokens = [token for candidate in candidates for token in candidate]
    device = log_probs.device
    picked = log_probs[torch.tensor(columns, device=device), torch.tensor(tokens, device=device)]
    return list(picked.split([len(candidate) for candidate in candidates]))


class Layout(NamedTuple):
    """Packed rows as a forward pass takes them (``packed_layout``).

    Attributes:
        ids: Token ids ``[B, W]``.
        positions: Position ids ``[B, W]``.
        allowed: ``[B, W, start + W]``: which keys each query may attend to.
        real: ``[B, W]``: whether a column holds a token (not padding).
    """

    ids: torch.Tensor
    positions: torch.Tensor
    allowed: torch.Tensor
    real: torch.Tensor


def packed_layout(rows: Sequence[PackedRow], start: int, pad_id: int) -> Layout:
    """Token ids, positions and the attention pattern of packed rows after a prefix.

    Row ``r`` holds its stem, then each of its blocks, then right padding. Positions continue
    from the prefix: the stem's tokens follow it, and every block starts right after its
    parent, as if its path were the only continuation. A token sees the whole prefix, its
    segment's ancestors (the stem, for a block, and the blocks between) and, causally, its own
    segment. Padding sees only the prefix (and itself), which keeps its values finite: a NaN
    there would reach every row through ``0 * NaN`` in the attention's weighted sum.

    Args:
        rows: The rows.
        start: The prefix's length (0 for none).
        pad_id: The token id of padding.

    Returns:
        The layout.
    """
    layouts = [[row.stem, *row.blocks] for row in rows]
    width = max(sum(map(len, segments)) for segments in layouts)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    columns = torch.arange(width)
    causal = columns[:, None] >= columns[None, :]
    own = torch.zeros((len(rows), width, width), dtype=torch.bool)
    real = torch.zeros((len(rows), width), dtype=torch.bool)
    for r, (row, segments) in enumerate(zip(rows, layouts, strict=True)):
        # sees[q, k]: whether segment q sees segment k (itself or an ancestor); index 0 is
        # padding, segment k is k + 1.
        sees = torch.zeros((len(segments) + 1, len(segments) + 1), dtype=torch.bool)
        sees[1, 1] = True
        # Segment of each column (as an index of sees); position of each segment's first token.
        segment = torch.zeros(width, dtype=torch.long)
        first = [start]
        column = 0
        for k, tokens in enumerate(segments):
            if k:
                parent = row.parents[k - 1]
                sees[k + 1] = sees[parent + 1]
                sees[k + 1, k + 1] = True
                first.append(first[parent] + len(segments[parent]))
            span = slice(column, column + len(tokens))
            ids[r, span] = torch.tensor(tokens, dtype=torch.long)
            positions[r, span] = torch.arange(first[k], first[k] + len(tokens))
            segment[span] = k + 1
            column += len(tokens)
        own[r] = causal & sees[segment[:, None], segment[None, :]]
        real[r] = segment > 0
    own |= torch.eye(width, dtype=torch.bool) & ~real[:, :, None]
    allowed = torch.cat([torch.ones(len(rows), width, start, dtype=torch.bool), own], dim=2)
    return Layout(ids, positions, allowed, real)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The ``[B, 1, Q, K]`` additive attention mask of a boolean pattern, in ``dtype``."""
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def template_kwargs(
    tokenizer: PreTrainedTokenizerBase, configured: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The chat template's keyword arguments, as ART's trainer renders prompts with them.

    ART 0.5.18 (``art.preprocessing.tokenize``) turns thinking off and keeps earlier turns'
    thinking whenever the template knows those switches, then applies the configured ones; the
    sampler renders the same way, so that the prompt it sampled after is the one trained on
    (a test ties this to ART's own function).

    Args:
        tokenizer: The model's tokenizer.
        configured: The model's ``chat_template_kwargs`` (None for none).

    Returns:
        The keyword arguments for ``apply_chat_template``.
    """
    kwargs: dict[str, Any] = {}
    template = tokenizer.chat_template
    if isinstance(template, str):
        if "enable_thinking" in template:
            kwargs["enable_thinking"] = False
        if "preserve_thinking" in template:
            kwargs["preserve_thinking"] = True
    return kwargs | dict(configured or {})


class LocalChatModel:
    """A Hugging Face causal LM, optionally with a LoRA adapter, shared by a job's decisions.

    Args:
        path: A prepared model folder (see ``coordgap.models.prepare``).
        adapter: A peft LoRA adapter folder to apply, or None for the base model.
        dtype: ``bfloat16`` or ``float32``: the precision the model computes in.
        decoding: ``constrained`` (score the tools' calls) or ``free`` (generate and parse).
        temperature: Sampling temperature; 0 is greedy (ties go to the first candidate).
        max_new_tokens: The generation limit of ``free`` decoding.
        max_batch: The most requests in one forward pass.
        chat_template_kwargs: Keyword arguments of the chat template (``template_kwargs``).
        device: ``auto`` (CUDA when available, else CPU) or a torch device name.

    Attributes:
        model: The causal LM (a ``PeftModel`` when an adapter is given), in eval mode.
        tokenizer: Its tokenizer.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        adapter: str | Path | None = None,
        dtype: str = "bfloat16",
        decoding: Decoding,
        temperature: float,
        max_new_tokens: int,
        max_batch: int,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        device: str = "auto",
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        device = resolve_device(device)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = load_weights(path, dtype, device)
        if adapter is not None:
            from peft import PeftModel

            # Not merged: the trainer computes log-probs through the unmerged adapter, and
            # merging into bf16 weights would round the update away from what it computes.
            model = PeftModel.from_pretrained(model, adapter)
        # The job's thread variables (Snakemake sets them from the rule's threads) decide this.
        logger.info(
            "%s in %s (computed in %s) on %s (adapter: %s), torch threads: %d",
            path,
            dtype,
            matmul_dtype(model),
            device,
            adapter,
            torch.get_num_threads(),
        )
        self._setup(
            model.eval(),
            tokenizer,
            decoding=decoding,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            max_batch=max_batch,
            chat_template_kwargs=chat_template_kwargs,
        )

    @classmethod
    def from_model(
        cls,
        model: PreTrainedModel | PeftModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        decoding: Decoding,
        temperature: float,
        max_new_tokens: int,
        max_batch: int,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> LocalChatModel:
        """Decide with a model that is already loaded (a trainer's, between its updates).

        The caller owns the model: it puts it in eval mode before deciding and calls
        ``forget_prefixes`` whenever its weights change.

        Args:
            model: The causal LM, with an attention implementation that takes 4D masks.
            tokenizer: Its tokenizer.
            decoding: As for the constructor.
            temperature: As for the constructor.
            max_new_tokens: As for the constructor.
            max_batch: As for the constructor.
            chat_template_kwargs: As for the constructor.

        Returns:
            A backend deciding with ``model``.
        """
        self = cls.__new__(cls)
        self._setup(
            model,
            tokenizer,
            decoding=decoding,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            max_batch=max_batch,
            chat_template_kwargs=chat_template_kwargs,
        )
        return self

    def _setup(
        self,
        model: PreTrainedModel | PeftModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        decoding: Decoding,
        temperature: float,
        max_new_tokens: int,
        max_batch: int,
        chat_template_kwargs: Mapping[str, Any] | None,
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
        self.model = model
        self.tokenizer = tokenizer
        self._template_kwargs = template_kwargs(tokenizer, chat_template_kwargs)
        self.device = model.device
        self._decoder = model.get_decoder()
        # The dtype the model computes in (a LoRA adapter's own weights stay in float32).
        self._dtype = model.get_input_embeddings().weight.dtype
        # Kept in float32 (see the module docstring); a tied head is the embedding matrix.
        self._head = model.get_output_embeddings().weight.detach().float()
        # Where _log_probs computes (at most _HEAD_ROWS rows of the vocabulary: about 100 MB).
        self._head_buffer = torch.empty(0, device=self.device)
        self._end_id: int = tokenizer.eos_token_id
        self._pad_id: int = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self._end_id
        )
        self._continuations: dict[Tool, list[int]] = {}
        # Keys and values of every layer for a shared prefix, computed alone, batch 1.
        self._prefixes: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        # Groups still waiting for members, by key; complete groups, in the order completed.
        self._forming: dict[Hashable, dict[int, _Request]] = {}
        self._ready: deque[list[_Request]] = deque()
        self._runner: asyncio.Task[None] | None = None

    def forget_prefixes(self) -> None:
        """Drop the cached keys and values of shared prefixes: call after the weights change."""
        self._prefixes.clear()

    async def decide(
        self,
        messages: Sequence[Mapping[str, str]],
        tools: Sequence[Tool],
        seed: int,
        batch: BatchSlot | None = None,
    ) -> Decision:
        """Decide one philosopher's tool call.

        Args:
            messages: The conversation (system and user messages), without tool descriptions.
            tools: The tools allowed at this table, in their protocol's order.
            seed: Seeds this decision's sampling; equal seeds give equal decisions.
            batch: The group this decision is made with (one simultaneous round); it runs
                once all of the group's members have asked. None: a group of its own.

        Returns:
            The decision, with a transcript of the LLM call for training: the messages as
            sent (tool descriptions included), the sampled tokens and what the policy that
            drew them gave them (``Transcript``), which a trainer recomputes for its ratios.

        Raises:
            ValueError: No tools, or a group slot that is out of range or already taken.
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
        key, size, index = (id(request), 1, 0) if batch is None else batch
        if not 0 <= index < size:
            raise ValueError(f"batch slot {index} is outside a group of {size}")
        members = self._forming.setdefault(key, {})
        if index in members:
            raise ValueError(f"batch slot {index} of group {key!r} is taken twice")
        members[index] = request
        if len(members) == size:
            del self._forming[key]
            self._ready.append([members[i] for i in range(size)])
            if self._runner is None or self._runner.done():
                self._runner = loop.create_task(self._serve())
        return await request.future

    async def _serve(self) -> None:
        """Run complete groups, in the order they completed, until none is left."""
        while self._ready:
            # Callers that gave up (cancelled) while waiting need no decision.
            group = [r for r in self._ready.popleft() if not r.future.done()]
            if not group:
                continue
            try:
                # In a thread, so the event loop keeps serving episodes meanwhile.
                decisions = await asyncio.to_thread(self._run, group)
            except Exception as error:
                for request in group:
                    if not request.future.done():
                        request.future.set_exception(error)
                continue
            finished = time.perf_counter()
            for request, decision in zip(group, decisions, strict=True):
                # Its caller may have given up while the group ran.
                if not request.future.done():
                    latency = finished - request.started
                    request.future.set_result(replace(decision, latency_s=latency))

    @torch.inference_mode()
    def _run(self, group: list[_Request]) -> list[Decision]:
        """Decide a group of requests, in order (latency not yet filled in).

        Requests share a forward pass when they share a cached prefix, at most ``max_batch``
        at a time, consecutive in the group's order. The tokenizer is used here only, in the
        worker thread: a fast tokenizer is not safe to share between threads.
        """
        decide = self._choose if self.decoding == "constrained" else self._generate
        prompts = [self._prompt(request.messages) for request in group]
        by_prefix: dict[tuple[int, ...], list[int]] = {}
        for i, request in enumerate(group):
            by_prefix.setdefault(self._prefix(request.messages, prompts[i]), []).append(i)
        decisions: dict[int, Decision] = {}
        for prefix, members in by_prefix.items():
            for start in range(0, len(members), self.max_batch):
                chunk = members[start : start + self.max_batch]
                done = decide([group[i] for i in chunk], [prompts[i] for i in chunk], prefix)
                decisions.update(zip(chunk, done, strict=True))
        return [decisions[i] for i in range(len(group))]

    def _prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """The token ids of a conversation rendered for the assistant's turn."""
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self._template_kwargs
        )
        # The template writes every special token itself; the tokenizer must not add a BOS.
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def _prefix(self, messages: list[dict[str, str]], prompt: list[int]) -> tuple[int, ...]:
        """The leading tokens of ``prompt`` that every request with its system message shares.

        That is the rendering of the system turn alone, as far as it is a prefix of
        ``prompt`` (it is, up to where the user turn starts), leaving at least one token of
        the prompt to run.
        """
        text = self.tokenizer.apply_chat_template(
            messages[:1], tokenize=False, **self._template_kwargs
        )
        system = self.tokenizer(text, add_special_tokens=False).input_ids
        common = 0
        for a, b in zip(system, prompt[:-1], strict=False):
            if a != b:
                break
            common += 1
        return tuple(prompt[:common])

    def _prefix_cache(self, prefix: tuple[int, ...], rows: int) -> DynamicCache | None:
        """The prefix's keys and values for ``rows`` rows, as a fresh KV cache.

        The prefix runs the first time it is asked for, alone and unpadded, as in the
        trainer's forward pass; later calls reuse its keys and values, broadcast (not copied)
        over the rows.

        Args:
            prefix: The rows' shared prefix.
            rows: The batch size.

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
        return DynamicCache(
            [
                (keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1))
                for keys, values in self._prefixes[prefix]
            ]
        )

    def _forward(
        self, prefix: tuple[int, ...], rows: list[PackedRow]
    ) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
        """Run packed rows (``packed_layout``) after their shared prefix's cached keys and values.

        Args:
            prefix: The shared prefix (may be empty).
            rows: One row per request.

        Returns:
            The final hidden states ``[B, W, H]``, the KV cache after the pass, and for each
            column of each row whether it holds a real token ``[B, W]`` (for decoding on).
        """
        layout = packed_layout(rows, len(prefix), self._pad_id)
        out = self._decoder(
            input_ids=layout.ids.to(self.device),
            attention_mask=additive_mask(layout.allowed, self._dtype).to(self.device),
            position_ids=layout.positions.to(self.device),
            cache=self._prefix_cache(prefix, len(rows)),
            use_cache=True,
        )
        return out.last_hidden_state, out.cache, layout.real.to(self.device)

    def _log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token log-probs of final hidden states ``[rows, H]``, the output layer in float32.

        Computed in a buffer the model keeps, and valid until the next call: allocating a
        fresh vocabulary-sized result for the product and another for its log-softmax, and
        touching their pages for the first time, cost a quarter of the output layer's time on
        a 2-core CPU (benchmarks/README.md, "Decisions as a tree"). The log-softmax runs in
        place (ATen's kernel reads a row whole before it writes it): the same values, bit for
        bit.
        """
        rows, vocabulary = hidden.shape[0], self._head.shape[0]
        if self._head_buffer.numel() < rows * vocabulary:
            self._head_buffer = torch.empty(rows * vocabulary, device=self.device)
        logits = self._head_buffer[: rows * vocabulary].view(rows, vocabulary)
        torch.mm(hidden.float(), self._head.T, out=logits)
        return torch._log_softmax(logits, -1, False, out=logits)

    def _score_candidates(
        self, hidden: torch.Tensor, rows: list[PackedRow], options: list[list[list[int]]]
    ) -> list[list[torch.Tensor]]:
        """Every request's candidates' token log-probs (``candidate_log_probs``), on the CPU.

        The output layer runs over the columns of several requests at once, up to
        ``_HEAD_ROWS``: a 2-core CPU multiplies the 49,152-row vocabulary matrix faster per
        FLOP with a few hundred rows than with one request's ~100 (benchmarks/README.md,
        "Where the time goes"), and the float32 vocabulary-sized tensor stays under 100 MB.

        Args:
            hidden: The forward pass's final hidden states ``[B, W, H]``.
            rows: The requests' rows (``candidate_row``).
            options: Each request's candidates.

        Returns:
            Per request, one tensor per candidate.
        """
        columns = [
            candidate_columns(row, candidates)
            for row, candidates in zip(rows, options, strict=True)
        ]
        scored: list[list[torch.Tensor]] = []
        for together in _consecutive_runs([len(c) for c in columns], _HEAD_ROWS):
            log_probs = self._log_probs(torch.cat([hidden[b, columns[b]] for b in together]))
            parts = log_probs.split([len(columns[b]) for b in together])
            for b, part in zip(together, parts, strict=True):
                scored.append([lps.cpu() for lps in candidate_log_probs(part, options[b])])
        return scored

    def _continuation(self, tool: Tool) -> list[int]:
        """The token ids of the assistant's turn that calls ``tool``, end-of-turn included."""
        if tool not in self._continuations:
            ids = self.tokenizer(call_text(tool), add_special_tokens=False).input_ids
            self._continuations[tool] = [*ids, self._end_id]
        return self._continuations[tool]

    def _choose(
        self, batch: list[_Request], prompts: list[list[int]], prefix: tuple[int, ...]
    ) -> list[Decision]:
        """Constrained decoding: score every allowed tool's call and sample one per request.

        A request's row is its prompt after the prefix followed by its candidates
        (``candidate_row``); the decision records every candidate's score and the choice's
        log-probability under the six-way policy it was drawn from (``Transcript``).
        """
        options = [[self._continuation(tool) for tool in request.tools] for request in batch]
        rows = [
            candidate_row(prompt[len(prefix) :], candidates)
            for prompt, candidates in zip(prompts, options, strict=True)
        ]
        hidden, _, _ = self._forward(prefix, rows)
        scored = self._score_candidates(hidden, rows, options)
        decisions = []
        for b, (request, token_lps) in enumerate(zip(batch, scored, strict=True)):
            # Summed, not length-normalised: the sum is the log-probability the model gives
            # the whole call, so softmax(sum / T) at T = 1 is the model's own distribution
            # over the allowed calls. Normalising by length would favour long tool names,
            # whose later tokens are nearly certain once the name has begun.
            scores = torch.stack([lps.double().sum() for lps in token_lps])
            k, choice_logprob = _sample(scores, self.temperature, _generator(request.seed))
            decisions.append(
                self._decision(
                    request,
                    len(prompts[b]),
                    options[b][k],
                    token_lps[k].tolist(),
                    tool=request.tools[k],
                    candidates=options[b],
                    scores=scores.tolist(),
                    choice=k,
                    choice_logprob=choice_logprob,
                )
            )
        return decisions

    def _generate(
        self, batch: list[_Request], prompts: list[list[int]], prefix: tuple[int, ...]
    ) -> list[Decision]:
        """Free decoding: sample each request's reply token by token, then parse it."""
        rows = [PackedRow(prompt[len(prefix) :]) for prompt in prompts]
        hidden, cache, seen = self._forward(prefix, rows)
        lengths = torch.tensor([len(row.stem) for row in rows], device=self.device)
        log_probs = self._log_probs(hidden[torch.arange(len(rows)), lengths - 1])
        # Keys a new token may see: the prefix, each row's prompt (not its padding), then
        # every token generated so far.
        seen = torch.cat(
            [torch.ones(len(rows), len(prefix), dtype=torch.bool, device=self.device), seen],
            dim=1,
        )
        dtype = self._dtype
        generators = [_generator(request.seed) for request in batch]
        tokens: list[list[int]] = [[] for _ in batch]
        token_lps: list[list[float]] = [[] for _ in batch]
        for step in range(self.max_new_tokens):
            if step:
                # Finished rows keep decoding (their output is ignored): simpler than
                # shrinking the batch and its cache, and the last rows finish soon anyway.
                last = torch.tensor([row[-1] for row in tokens], device=self.device)
                seen = F.pad(seen, (0, 1), value=True)
                mask = torch.zeros(seen.shape, dtype=dtype, device=self.device).masked_fill(
                    ~seen, torch.finfo(dtype).min
                )
                out = self._decoder(
                    input_ids=last[:, None],
                    attention_mask=mask[:, None, None],
                    position_ids=(len(prefix) + lengths + step - 1)[:, None],
                    cache=cache,
                    use_cache=True,
                )
                cache = out.cache
                log_probs = self._log_probs(out.last_hidden_state[:, -1])
            scores = log_probs.cpu()
            for b, generator in enumerate(generators):
                if tokens[b] and tokens[b][-1] == self._end_id:
                    continue
                token, logprob = _sample(scores[b], self.temperature, generator)
                tokens[b].append(token)
                token_lps[b].append(logprob)
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
        candidates: list[list[int]] | None = None,
        scores: list[float] | None = None,
        choice: int | None = None,
        choice_logprob: float | None = None,
    ) -> Decision:
        """Build a request's decision; without ``tool`` the reply text is parsed for one.

        The keywords after ``tool`` are a constrained decision's (see ``Transcript``).
        """
        completion = self.tokenizer.decode(tokens)
        raw = self.tokenizer.decode(tokens, skip_special_tokens=True)
        reason = None
        if tool is None:
            # A reply that never reached the end token ran into max_new_tokens.
            truncated = not tokens or tokens[-1] != self._end_id
            tool, reason = parse_text_tool_calls(raw, request.tools, truncated)
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
                temperature=self.temperature,
                candidates=None if candidates is None else tuple(map(tuple, candidates)),
                scores=None if scores is None else tuple(scores),
                choice=choice,
                choice_logprob=choice_logprob,
            ),
        )


def _consecutive_runs(widths: Sequence[int], limit: int) -> Iterator[range]:
    """Split indices into consecutive runs whose widths add up to at most ``limit``.

    Args:
        widths: Each index's width.
        limit: The largest total of a run; an index wider than it makes a run of its own.

    Yields:
        The runs, in order, together covering every index once.
    """
    start, total = 0, 0
    for index, width in enumerate(widths):
        if index > start and total + width > limit:
            yield range(start, index)
            start, total = index, 0
        total += width
    if widths:
        yield range(start, len(widths))


def _generator(seed: int) -> torch.Generator:
    """A CPU generator seeded for one request: its draws do not depend on the batch."""
    return torch.Generator().manual_seed(seed)


def _sample(
    scores: torch.Tensor, temperature: float, generator: torch.Generator
) -> tuple[int, float]:
    """Draw an index from softmax(scores / T), with its log-probability there.

    Args:
        scores: Log-probabilities (a model's at T = 1) of the options.
        temperature: T; at 0 the argmax (first on ties) is taken.
        generator: The request's generator.

    Returns:
        The index and its log-probability under the distribution drawn from; at T = 0 under
        softmax(scores), the model's own (greedy choice has no distribution to record).
    """
    tempered = scores.double() / (temperature or 1.0)
    if temperature == 0:
        index = int(torch.argmax(scores))
    else:
        index = int(torch.multinomial(torch.softmax(tempered, dim=-1), 1, generator=generator))
    return index, float(torch.log_softmax(tempered, dim=-1)[index])

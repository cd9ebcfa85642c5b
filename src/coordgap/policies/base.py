"""What every policy returns, and the interface the episode runner calls."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from collections.abc import Hashable, Sequence

    from coordgap.env.observation import Observation
    from coordgap.env.protocols import Tool


class NoCallReason(StrEnum):
    """Why a decision produced no parseable tool call (``coordgap.env.table``)."""

    EMPTY = "empty"
    NO_CALL = "no_call"
    UNKNOWN_TOOL = "unknown_tool"
    BAD_ARGUMENTS = "bad_arguments"
    SEVERAL_CALLS = "several_calls"
    # The reply was cut off by the completion token limit before it held a valid call: with
    # a reasoning model, usually a limit too small for its thinking.
    TRUNCATED = "truncated"
    TRANSPORT_ERROR = "transport_error"


class BatchSlot(NamedTuple):
    """Where a decision sits among the decisions that are made together.

    A backend that batches (the local model) runs a group once all ``size`` members have
    asked, in ``index`` order, so that a decision never depends on which unrelated calls
    happened to be waiting at the same moment. Other backends ignore it.

    Attributes:
        key: Identifies the group, e.g. (episode seed, round) for a simultaneous round.
        size: How many decisions the group has.
        index: This decision's place in the group (its seat).
    """

    key: Hashable
    size: int
    index: int


@dataclass(frozen=True, slots=True)
class Transcript:
    """One LLM call of a trainable model, as GRPO needs it (one history per call).

    What the sampling policy was depends on the decoding. Free decoding samples each token from
    the model's next-token distribution at the temperature T. Constrained decoding scores every
    allowed tool call c_j by S_j = sum_t log p(c_j,t | prompt), the model's own log-probs at
    T = 1, and draws the call k from mu = softmax(S / T): the behaviour policy is mu, a choice
    among the candidates, not the tokens of c_k (their probability also holds the mass the
    model puts on all calls together, which mu renormalises away).

    Attributes:
        messages: The chat messages sent, as ``{"role": ..., "content": ...}`` dicts.
        completion: The text of the sampled continuation (the chosen tool call).
        token_ids: The sampled continuation's token ids (constrained: the chosen call's).
        logprobs: One per token of ``token_ids``. Free decoding: its log-prob under the
            distribution it was drawn from, log softmax(logits / T) (at T = 0, greedy, the
            model's own); a served model's, as the server reported them. Constrained: its
            log-prob under the model itself, so that they sum to the chosen call's score.
        tools: The OpenAI function schemas sent with the messages, which the server rendered
            into the prompt; None when the tools are described in the messages themselves.
        temperature: The sampling temperature T.
        candidates: Constrained only (else None): the token ids of every allowed call, end of
            turn included, in the order of the tools offered.
        scores: Constrained only: each candidate's score S_j.
        choice: Constrained only: the index k of the chosen candidate.
        choice_logprob: Constrained only: log mu(k) = S_k / T - logsumexp_j(S_j / T), the
            log-probability of the choice under the policy that made it; at T = 0 (greedy,
            no distribution drawn from) log softmax(S)_k, the model's own at T = 1.
    """

    messages: tuple[dict[str, str], ...]
    completion: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    tools: tuple[dict[str, Any], ...] | None = None
    temperature: float | None = None
    candidates: tuple[tuple[int, ...], ...] | None = None
    scores: tuple[float, ...] | None = None
    choice: int | None = None
    choice_logprob: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """One philosopher's decision.

    Attributes:
        tool: The tool called, or None when there was no parseable call.
        no_call_reason: Why there was no call; None when ``tool`` is set.
        raw: The raw output the decision was parsed from.
        tokens_in: Prompt tokens spent (0 for scripted policies).
        tokens_out: Completion tokens spent.
        latency_s: Wall time of the call.
        transcript: The LLM call behind the decision, for models that record one.
    """

    tool: Tool | None
    no_call_reason: NoCallReason | None = None
    raw: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    transcript: Transcript | None = None


class Policy(Protocol):
    """Decides for a batch of philosophers that observe the table at the same moment."""

    def decide(self, observations: Sequence[Observation]) -> list[Decision]:
        """Return one decision per observation, in order."""
        ...


class AsyncPolicy(Protocol):
    """Decides for one philosopher; many calls may be in flight at once (model backends)."""

    async def adecide(self, observation: Observation) -> Decision:
        """Return the decision of the observed philosopher."""
        ...

"""A circuit breaker per endpoint: a dead or hung endpoint stops the cell after a few calls.

Without it, an endpoint that refuses connections or never answers is tried for every decision
of every episode, each waiting through all its attempts, before the cell fails on its error
episodes: at the paper's settings, hours of a cluster job or of a paid API's quota window.
The breaker watches the calls of one backend, hence of one endpoint and model: after
``stop_after`` consecutive calls ended unanswered (a refused or lost connection, a timeout, a
5xx, each after its retries) with no reply in between, it trips, and every call of the backend
from then on raises ``EndpointUnavailable`` at once. The episode runner cancels the calls in
flight and keeps the episodes already journalled, so a rerun plays only the rest.

A call that ended with a reply the endpoint did send (however malformed) or with a rate limit
neither counts nor resets: the endpoint is alive, and the cell's error share judges it. Any
decision parsed from a reply resets the count, so an endpoint that fails intermittently never
trips it.

The breaker also keeps the log short: the first failed call of each kind (the failure's label)
is a warning naming the endpoint, the model and the kind; later ones are counted, and the count
is logged when it reaches 10, 100, 1000, ...
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordgap.errors import ExpectedFailure

if TYPE_CHECKING:
    from coordgap.policies.replies import Failure

logger = logging.getLogger(__name__)


class EndpointUnavailable(ExpectedFailure, RuntimeError):
    """Consecutive calls to an endpoint went unanswered: the cell stops instead of waiting on.

    The message names the endpoint, the model, the failures by kind and their count, never the
    key.

    Args:
        calls_to: The endpoint and model (``coordgap.config.play.calls_to``).
        kinds: The consecutive failed calls that tripped the breaker, by failure label.
        stop_after: The setting that tripped it.
    """

    def __init__(self, calls_to: str, kinds: Counter[str], stop_after: int) -> None:
        calls = kinds.total()
        counted = ", ".join(f"{count} x {kind}" for kind, count in kinds.most_common())
        super().__init__(
            f"{calls_to}: {calls} calls in a row went unanswered after their "
            f"retries ({counted}), none answered in between; the endpoint looks down or hung, "
            f"so the cell stops (stop_after_failures = {stop_after}). Episodes already finished "
            "stay in the journal: once the endpoint answers, a rerun plays only the rest."
        )
        self.calls_to = calls_to
        self.kinds = kinds


@dataclass(slots=True)
class CircuitBreaker:
    """Counts one endpoint's consecutive unanswered calls and stops them past ``stop_after``.

    Attributes:
        calls_to: The endpoint and model, as messages name them
            (``coordgap.config.play.calls_to``).
        stop_after: Consecutive unanswered calls that trip the breaker (at least 1).
    """

    calls_to: str
    stop_after: int
    # The failure labels of the current run of unanswered calls.
    _run: Counter[str] = field(default_factory=Counter)
    # Every failed call so far, by label: what the log's counts say.
    _failed: Counter[str] = field(default_factory=Counter)
    _tripped: bool = False

    def __post_init__(self) -> None:
        if self.stop_after < 1:
            raise ValueError(f"stop_after_failures must be >= 1, got {self.stop_after}")

    def check(self) -> None:
        """Refuse a call once the breaker has tripped.

        Raises:
            EndpointUnavailable: The breaker has tripped.
        """
        if self._tripped:
            raise self.stop()

    def stop(self) -> EndpointUnavailable:
        """The error that stops the cell, naming the run of calls that tripped the breaker."""
        return EndpointUnavailable(self.calls_to, self._run.copy(), self.stop_after)

    def answered(self) -> None:
        """Record a call the endpoint answered: the run of unanswered calls is over.

        A call in flight may still be answered after the breaker tripped; the stop stands, and
        keeps naming the calls that caused it.
        """
        if not self._tripped:
            self._run.clear()

    def failed(self, failure: Failure, attempts: int) -> bool:
        """Record a call that failed after ``attempts`` attempts, logging it or its count.

        Args:
            failure: The last attempt's failure.
            attempts: The attempts the call made.

        Returns:
            Whether this call tripped the breaker: the caller raises ``stop()``.
        """
        self._failed[failure.label] += 1
        count = self._failed[failure.label]
        if count == 1:
            logger.warning(
                "%s: no decision after %d attempt(s): %s%s; further calls failing so are "
                "counted, not logged one by one",
                self.calls_to,
                attempts,
                failure.label,
                "" if failure.where is None else f" (raised at {failure.where})",
            )
        elif _is_power_of_ten(count):
            logger.warning(
                "%s: %d calls have failed with %s",
                self.calls_to,
                count,
                failure.label,
            )
        if not failure.unanswered:
            return False
        # Calls that were in flight when the breaker tripped fail after it: the stop keeps
        # naming the run that tripped it (``stop_after`` calls), whichever call reports it.
        if not self._tripped:
            self._run[failure.label] += 1
            self._tripped = self._run.total() >= self.stop_after
        return self._tripped


def _is_power_of_ten(count: int) -> bool:
    """Whether ``count`` is 10, 100, 1000, ...: the counts a log line reports."""
    while count % 10 == 0:
        count //= 10
    return count == 1

"""The suite's time budget (tests/budget.toml) covers every test file and fits the target."""

from __future__ import annotations

import pytest

from tests.timings import ROOT, FileBudget, load_budget, longest_first, lpt_makespan, totals

pytestmark = pytest.mark.unit

# make test's pytest on two workers, on the CI machine kind. The goal is 20 measured minutes,
# a budget schedule of 30 at the budget's 1.5x headroom; the budget regenerated from the last
# whole-suite run (19.3 min measured, 2026-12-05) schedules to 32.2, and with the learning-rate
# pilot's end-to-end test (180 s, estimated from its runs alone on a busy 2-core machine, not yet
# from a whole-suite run) to 33.7, so this holds the suite to what it costs now until the
# remaining files are cut: lower it as they are.
TARGET_S = 34 * 60
WORKERS = 2


def test_every_test_file_has_a_budget_and_every_budget_a_file() -> None:
    files = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")}
    assert set(load_budget()) == files


def test_the_budget_fits_the_target_on_two_workers() -> None:
    seconds = [entry.seconds for entry in load_budget().values()]
    assert lpt_makespan(seconds, WORKERS) <= TARGET_S


def test_the_schedule_is_the_budgets_longest_first_schedule() -> None:
    # Files go to the worker that is free first, longest file first: 5 | 4, then 3 to the
    # second (7), 3 to the first (8), 3 to the second (10); the best split (5+4 | 3+3+3) is 9.
    assert lpt_makespan([5, 4, 3, 3, 3], 2) == 10
    assert lpt_makespan([1, 1], 2) == 1

    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    budget = {"a.py": FileBudget(10, "unit"), "b.py": FileBudget(100, "training")}
    items = [Item(n) for n in ("a.py::x", "a.py::y", "c.py::z", "b.py::w", "b.py::v")]
    longest_first(items, budget)  # c.py has no budget: scheduled as 60 s
    assert [item.nodeid for item in items] == [
        "b.py::w",
        "b.py::v",
        "c.py::z",
        "a.py::x",
        "a.py::y",
    ]


def test_a_runs_seconds_add_up_by_file_and_by_worker() -> None:
    run = {"a.py::x": [1.0, "gw0"], "a.py::y": [2.0, "gw1"], "b.py::z": [3.0, "gw0"]}
    by_file, busy = totals(run)
    assert by_file == {"a.py": [1.0, 2.0], "b.py": [3.0]}
    assert busy == {"gw0": 4.0, "gw1": 2.0}

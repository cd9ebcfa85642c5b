"""Cost before compute: a study's decisions, tokens, API dollars and GPU-hours, rule by rule.

``estimate`` prices a config before anything runs. Each language model's cost follows from
three rates per decision (prompt tokens, completion tokens, GPU seconds) and how long its
episodes last (decisions per episode, as a share of N x rounds). Where earlier runs left a
model's episode tables (``results/episodes/<model>/``) and job benchmarks
(``logs/<rule>/<model>/``), those measure the rates; otherwise the config's ``plan`` section
states them and episodes are assumed to last all their rounds (an upper bound: a deadlock
ends one early). A trained model's checkpoints decide like their base model. A served model's
job also pays ``plan.server_start_s`` once, unless its rates were measured (the start is then
in the measured wall time). API dollars are tokens times ``plan.prices``; nothing else is paid
per token.

``actual`` reads the same figures from a finished run's tables and benchmarks, so the two can
be set side by side (``coordgap plan`` prints both where outputs exist).
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from coordgap.config.play import ModelSpec, cell_episodes
from coordgap.config.training import TrainingRunConfig, evaluated_steps, selected_checkpoints

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from pathlib import Path

# Rules that play episodes, in the order of the DAG.
RULES = (
    "generate_episodes",
    "generate_api_episodes",
    "generate_served_episodes",
    "train_grpo",
    "evaluate_checkpoints",
    "test_checkpoint",
)
_SUMS = ("jobs", "episodes", "decisions", "tokens_in", "tokens_out", "usd", "gpu_hours")


@dataclass(frozen=True, slots=True)
class Rates:
    """How much one model's decisions cost, and how long its episodes last.

    Attributes:
        tokens_in: Prompt tokens per decision.
        tokens_out: Completion tokens per decision.
        length: Decisions per episode as a share of N x rounds (1: no episode ends early).
        gpu_s: GPU seconds per decision (0 for API and scripted models).
        start_s: GPU seconds per job before the first decision (a server's start).
        basis: ``assumed`` (the config's plan section) or what was measured.
    """

    tokens_in: float
    tokens_out: float
    length: float
    gpu_s: float
    start_s: float
    basis: str


@dataclass(frozen=True, slots=True)
class Line:
    """One rule's jobs for one model: what they play and what that costs.

    Attributes:
        rule: The Snakemake rule.
        model: The model (``<run>@<policy>`` for a selected checkpoint, the run for training
            and validation).
        jobs: Jobs of the rule for that model.
        episodes: Episodes they play.
        decisions: Decisions in those episodes.
        tokens_in: Prompt tokens.
        tokens_out: Completion tokens.
        usd: API dollars.
        gpu_hours: GPU time.
        basis: Where the per-decision figures come from.
    """

    rule: str
    model: str
    jobs: int
    episodes: int
    decisions: float
    tokens_in: float
    tokens_out: float
    usd: float
    gpu_hours: float
    basis: str


def estimate(config: dict[str, Any], root: Path) -> list[Line]:
    """Estimate every episode-playing job of a config, before it runs.

    Args:
        config: The validated config.
        root: The project folder, whose ``results/`` and ``logs/`` may hold earlier runs.

    Returns:
        One line per rule and model, in ``RULES`` order.
    """
    plan = config["plan"]
    rounds = config["environment"]["rounds"]
    rates = {name: _rates(config, name, root) for name in config["models"]}
    lines = []
    for name, entry in config["models"].items():
        rule = ModelSpec.from_dict(name, entry).generation_rule
        cells = [(size, cell_episodes(config, name)) for size in config["experiment"]["sizes"]]
        lines.append(_line(rule, name, cells, rounds, rates[name], _price(plan, name)))
    for run_name, entry in config["training"]["runs"].items():
        run = TrainingRunConfig.from_dict(run_name, entry)
        base = rates[run.base_model]
        episodes = run.groups_per_step * run.episodes_per_group
        decisions = sum(
            episodes * run.n_at(step) * rounds * base.length for step in range(run.steps)
        )
        gpu_s = _training_seconds(run, plan, root) + base.start_s * (run.trainer == "art")
        lines.append(
            Line(
                "train_grpo",
                run_name,
                1,
                run.steps * episodes,
                decisions,
                decisions * base.tokens_in,
                decisions * base.tokens_out,
                0.0,
                gpu_s / 3600,
                base.basis,
            )
        )
        steps = evaluated_steps(config, run_name)
        validation = [(run.n_at(run.steps - 1), config["evaluation"]["episodes"])] * len(steps)
        # One job plays all of a run's checkpoints: a server starts once.
        lines.append(_line("evaluate_checkpoints", run_name, validation, rounds, base, None, 1))
    for name, (run_name, _) in selected_checkpoints(config).items():
        base_name = config["training"]["runs"][run_name]["base_model"]
        cells = [(size, cell_episodes(config, base_name)) for size in config["experiment"]["sizes"]]
        lines.append(_line("test_checkpoint", name, cells, rounds, rates[base_name], None))
    return sorted(lines, key=lambda line: RULES.index(line.rule))


def actual(config: dict[str, Any], root: Path) -> list[Line]:
    """What a run of a config used, from its episode tables and job benchmarks.

    Args:
        config: The config the run used.
        root: The project folder of the run.

    Returns:
        One line per rule and model that has outputs, in ``RULES`` order.
    """
    plan = config["plan"]
    results, logs = root / "results", root / "logs"
    found: list[tuple[str, str, list[Path], list[Path]]] = []
    for name, entry in config["models"].items():
        rule = ModelSpec.from_dict(name, entry).generation_rule
        found.append(
            (rule, name, _tables(results / "episodes" / name), _benchmarks(logs / rule / name))
        )
    for run in config["training"]["runs"]:
        rollouts = _tables(results / "train" / run / "rollouts")
        found.append(("train_grpo", run, rollouts, [logs / "train_grpo" / f"{run}.benchmark.tsv"]))
        validation = _tables(results / "eval" / run / "validation")
        benchmark = logs / "evaluate_checkpoints" / f"{run}.benchmark.tsv"
        found.append(("evaluate_checkpoints", run, validation, [benchmark]))
    for name in selected_checkpoints(config):
        tables = _tables(results / "test" / name)
        found.append(
            ("test_checkpoint", name, tables, _benchmarks(logs / "test_checkpoint" / name))
        )
    lines = []
    for rule, model, tables, benchmarks in found:
        if not tables:
            continue
        frame = _episodes(tables)
        tokens_in, tokens_out = int(frame["tokens_in"].sum()), int(frame["tokens_out"].sum())
        lines.append(
            Line(
                rule,
                model,
                sum(path.is_file() for path in benchmarks),
                frame.height,
                int(frame["decisions"].sum()),
                tokens_in,
                tokens_out,
                _cost(_price(plan, model), tokens_in, tokens_out),
                _wall_s(benchmarks) / 3600 if _uses_gpu(config, model) else 0.0,
                "actual",
            )
        )
    return lines


def render(lines: Sequence[Line], actual_lines: Sequence[Line] = ()) -> str:
    """A text table of the lines, a subtotal per rule and the total; actual figures beside.

    Args:
        lines: The estimate.
        actual_lines: What a run used so far (``actual``), shown under each estimate.

    Returns:
        The table, one row per line.
    """
    done = {(line.rule, line.model): line for line in actual_lines}
    header = ("rule", "model", *_SUMS, "basis")
    rows: list[tuple[str, ...]] = [header]
    for rule in RULES:
        of_rule = [line for line in lines if line.rule == rule]
        if not of_rule:
            continue
        for line in of_rule:
            rows.append(_row(line))
            if (line.rule, line.model) in done:
                rows.append(_row(done[line.rule, line.model], label="  so far"))
        rows.append(_row(total(of_rule, rule=rule, model="(all)")))
    rows.append(_row(total(lines, rule="total", model="")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    # Names left, numbers right.
    text = [i in (0, 1, len(header) - 1) for i in range(len(header))]
    return "".join(
        "  ".join(
            cell.ljust(width) if left else cell.rjust(width)
            for cell, width, left in zip(row, widths, text, strict=True)
        ).rstrip()
        + "\n"
        for row in rows
    )


def total(lines: Iterable[Line], rule: str, model: str) -> Line:
    """The sum of ``lines``, as one line named ``rule`` and ``model``."""
    lines = list(lines)
    sums = {field: sum(getattr(line, field) for line in lines) for field in _SUMS}
    return Line(rule=rule, model=model, basis="", **sums)


def write_csv(lines: Sequence[Line], path: Path) -> None:
    """Write the lines as CSV, one row each, with a header."""
    with path.open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=[f.name for f in dataclasses.fields(Line)])
        writer.writeheader()
        writer.writerows(dataclasses.asdict(line) for line in lines)


def api_key_variables(config: dict[str, Any]) -> list[str]:
    """The environment variables a run of the config needs, in config order."""
    names = (
        ModelSpec.from_dict(name, entry).api_key_env for name, entry in config["models"].items()
    )
    return list(dict.fromkeys(name for name in names if name is not None))


def _line(
    rule: str,
    model: str,
    cells: Sequence[tuple[int, int]],
    rounds: int,
    rates: Rates,
    price: dict[str, float] | None,
    jobs: int | None = None,
) -> Line:
    """The line of ``cells`` (N, episodes) at ``rates``, in ``jobs`` jobs (default: one each)."""
    jobs = len(cells) if jobs is None else jobs
    decisions = sum(episodes * n * rounds * rates.length for n, episodes in cells)
    tokens_in, tokens_out = decisions * rates.tokens_in, decisions * rates.tokens_out
    gpu_s = decisions * rates.gpu_s + (jobs * rates.start_s if rates.gpu_s else 0.0)
    return Line(
        rule,
        model,
        jobs,
        sum(episodes for _, episodes in cells),
        decisions,
        tokens_in,
        tokens_out,
        _cost(price, tokens_in, tokens_out),
        gpu_s / 3600,
        rates.basis,
    )


def _rates(config: dict[str, Any], name: str, root: Path) -> Rates:
    """A model's rates: measured from its earlier episodes where they exist, else assumed."""
    model, plan = ModelSpec.from_dict(name, config["models"][name]), config["plan"]
    language = model.is_language_model
    rule = model.generation_rule
    gpu = _uses_gpu(config, name)
    tables = _tables(root / "results" / "episodes" / name)
    if not tables:
        return Rates(
            tokens_in=plan["tokens_in_per_decision"] if language else 0,
            tokens_out=plan["tokens_out_per_decision"] if language else 0,
            length=1.0,
            gpu_s=plan["gpu_seconds_per_decision"] if gpu else 0.0,
            start_s=plan["server_start_s"] if model.is_served else 0.0,
            basis="assumed",
        )
    frame = _episodes(tables)
    decisions = max(int(frame["decisions"].sum()), 1)
    wall = _wall_s(_benchmarks(root / "logs" / rule / name))
    return Rates(
        tokens_in=frame["tokens_in"].sum() / decisions,
        tokens_out=frame["tokens_out"].sum() / decisions,
        length=decisions / int((frame["n"] * frame["rounds"]).sum()),
        gpu_s=(wall / decisions if wall else plan["gpu_seconds_per_decision"]) if gpu else 0.0,
        start_s=0.0 if wall else plan["server_start_s"] * model.is_served,
        basis=f"measured ({frame.height} episodes)",
    )


def _training_seconds(run: TrainingRunConfig, plan: dict[str, Any], root: Path) -> float:
    """GPU seconds of a training run: its own earlier benchmark, else steps x the plan's rate."""
    wall = _wall_s([root / "logs" / "train_grpo" / f"{run.name}.benchmark.tsv"])
    return wall or run.steps * plan["gpu_seconds_per_training_step"]


def _uses_gpu(config: dict[str, Any], model: str) -> bool:
    """Whether the jobs of a line's model, run or checkpoint hold a GPU (wall time is GPU time)."""
    if model in config["models"]:  # a generation job: as its model's kind says
        return ModelSpec.from_dict(model, config["models"][model]).gpus > 0
    return True  # training and checkpoint jobs run the base model


def _price(plan: dict[str, Any], model: str) -> dict[str, float] | None:
    return plan["prices"].get(model)  # no price: a model nobody pays per token for


def _cost(price: dict[str, float] | None, tokens_in: float, tokens_out: float) -> float:
    if price is None:
        return 0.0
    return (tokens_in * price["input"] + tokens_out * price["output"]) / 1e6


def _tables(folder: Path) -> list[Path]:
    """The episode tables in a folder (not their steps or transcripts)."""
    return sorted(
        path
        for path in folder.glob("*.parquet")
        if not path.name.endswith((".steps.parquet", ".transcripts.parquet"))
    )


def _episodes(tables: Sequence[Path]) -> pl.DataFrame:
    columns = ["n", "rounds", "decisions", "tokens_in", "tokens_out"]
    return pl.concat([pl.read_parquet(path, columns=columns) for path in tables])


def _benchmarks(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.benchmark.tsv"))


def _wall_s(benchmarks: Sequence[Path]) -> float:
    """The summed wall seconds of Snakemake benchmark files (those that exist)."""
    return sum(
        float(pl.read_csv(path, separator="\t")["s"].sum()) for path in benchmarks if path.is_file()
    )


def _row(line: Line, label: str | None = None) -> tuple[str, ...]:
    return (
        line.rule if label is None else label,
        line.model,
        f"{line.jobs:,}",
        f"{line.episodes:,}",
        f"{line.decisions:,.0f}",
        f"{line.tokens_in:,.0f}",
        f"{line.tokens_out:,.0f}",
        f"{line.usd:,.2f}",
        f"{line.gpu_hours:,.2f}",
        line.basis,
    )

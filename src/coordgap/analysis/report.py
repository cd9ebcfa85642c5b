"""The markdown report: our numbers, the degenerate maximum, and the paper's numbers beside ours.

The report is built only from the files the statistics and figure rules wrote, plus the
configuration and ``config/paper_reference.yaml``; it carries no timestamp, so the same inputs
give the same bytes.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import yaml

from coordgap.analysis.stats import COMPARISON_SCHEMA, reward_columns, summary_schema
from coordgap.env.reward import RewardVariant

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from coordgap.config import AnalysisConfig

# A cell whose mean headline reward reaches this with no meal is scoring by doing nothing.
DEGENERATE_REWARD = 0.9

_MISSING = "n/a"

_DEFINITIONS: dict[RewardVariant, str] = {
    RewardVariant.PAPER: "r = {w.nd} r_nd + {w.thru} r_thru - {w.fair} r_fair - {w.idle} r_idle",
    RewardVariant.SHAPED: (
        "the same weighted sum, except that the no-deadlock bonus counts only when at least "
        "one meal was eaten and decisions without a parseable tool call count as idle"
    ),
}


def _number(value: float | None, digits: int = 3) -> str:
    if value is None or math.isnan(value):
        return _MISSING
    return f"{value:.{digits}f}"


def _interval(mean: float | None, low: float | None, high: float | None) -> str:
    if mean is None or math.isnan(mean):
        return _MISSING
    return f"{_number(mean)} [{_number(low)}, {_number(high)}]"


def _p_value(p: float | None) -> str:
    if p is not None and p < 0.001:
        return "<0.001"
    return _number(p)


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Render a markdown table, escaping the pipes that would split a cell."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join(
        "| " + " | ".join(str(cell).replace("|", "\\|") for cell in line) + " |" for line in lines
    )


def _method(config: AnalysisConfig) -> str:
    definitions = "\n".join(
        f"- `{variant}`: {_DEFINITIONS[variant].format(w=config.weights)}"
        for variant in config.variants
    )
    confidence = f"{config.confidence * 100:g}%"
    return (
        "## Method\n\n"
        "Each cell is one model at one table size N. Episodes that ended in an error are "
        "counted in the Errors column and left out of every statistic. Rewards are derived at "
        "analysis time from the stored components: r_nd (1 without deadlock), r_thru (meals over "
        "the table's capacity), r_fair (inequality of meals between seats) and r_idle (share of "
        f"actions that were idle). The reward variants, headline first:\n\n{definitions}\n\n"
        f"Mean rewards carry {confidence} bootstrap percentile intervals "
        f"({config.bootstrap_resamples} resamples, seed {config.seed}); deadlock rates carry "
        f"{confidence} Wilson score intervals. Pairs of models are compared with Welch's t-test "
        "and Hedges' g, with Holm's correction across each variant's comparisons."
    )


def _summary_section(summary: pl.DataFrame, config: AnalysisConfig) -> str:
    header = [
        "Model",
        "N",
        "Episodes",
        "Errors",
        *(f"Reward ({variant})" for variant in config.variants),
        "Deadlock rate",
        "Meals",
        "Throughput",
        "Fairness",
        "Idle",
        "Failed rate",
        "No-call rate",
    ]
    rows = [
        [
            row["model"],
            str(row["n"]),
            str(row["episodes"]),
            str(row["errors"]),
            *(
                _interval(*(row[column] for column in reward_columns(variant)))
                for variant in config.variants
            ),
            _interval(row["deadlock_rate"], row["deadlock_ci_low"], row["deadlock_ci_high"]),
            _number(row["meals_mean"], digits=2),
            *(
                _number(row[column])
                for column in ("throughput", "fairness", "idle", "failed_rate", "no_call_rate")
            ),
        ]
        for row in summary.iter_rows(named=True)
    ]
    return "## Summary\n\n" + _table(header, rows)


def _comparisons_section(comparisons: pl.DataFrame) -> str:
    if comparisons.is_empty():
        return "## Comparisons\n\nNo comparison had episodes of both models at the same N."
    header = ["Reward", "A", "B", "N", "Mean A", "Mean B", "Diff", "t", "dof", "p", "p (Holm)"]
    header += ["Hedges' g", "Note"]
    rows = [
        [
            row["variant"],
            row["model_a"],
            row["model_b"],
            str(row["n"]),
            *(_number(row[column]) for column in ("mean_a", "mean_b", "diff", "t")),
            _number(row["dof"], digits=1),
            _p_value(row["p"]),
            _p_value(row["p_holm"]),
            _number(row["hedges_g"]),
            row["note"] or "",
        ]
        for row in comparisons.iter_rows(named=True)
    ]
    return "## Comparisons\n\n" + _table(header, rows)


def _figure_section(figure_png: str | Path, out_md: str | Path, variant: RewardVariant) -> str:
    link = Path(os.path.relpath(figure_png, Path(out_md).parent)).as_posix()
    return f"## Figure\n\n![Mean {variant} reward by model and N, with intervals]({link})"


def _degenerate_section(summary: pl.DataFrame, config: AnalysisConfig) -> str:
    headline = config.variants[0]
    mean = reward_columns(headline)[0]
    flagged = summary.filter((pl.col(mean) >= DEGENERATE_REWARD) & (pl.col("meals_mean") == 0))
    intro = (
        "## The degenerate maximum\n\n"
        f"A cell with a mean `{headline}` reward of at least {DEGENERATE_REWARD} and no meal "
        "at all is flagged: such a model scores near the maximum by doing nothing."
    )
    if flagged.is_empty():
        return f"{intro}\n\nNo cell is flagged."
    lines = "\n".join(
        f"- **{row['model']}** at N={row['n']}: mean `{headline}` reward "
        f"{_number(row[mean])} with 0 meals; it scores near the maximum by doing nothing."
        for row in flagged.iter_rows(named=True)
    )
    return f"{intro}\n\n{lines}"


def _yaml_value(item: Any) -> str:
    if isinstance(item, list):
        return "[" + ", ".join(map(str, item)) + "]"
    return str(item)


def _published(entry: dict[str, Any]) -> str:
    """Render the paper's numbers of one entry as ``key: value`` pairs."""
    return "; ".join(f"{key}: {_yaml_value(item)}" for key, item in entry.items() if key != "name")


def _ours_by_model(summary: pl.DataFrame, model: str, variant: RewardVariant) -> str:
    parts = []
    for row in summary.filter(pl.col("model") == model).iter_rows(named=True):
        reward = _interval(*(row[column] for column in reward_columns(variant)))
        deadlock = _interval(row["deadlock_rate"], row["deadlock_ci_low"], row["deadlock_ci_high"])
        meals = _number(row["meals_mean"], digits=2)
        parts.append(f"N={row['n']}: reward {reward}, deadlock {deadlock}, meals {meals}")
    return "; ".join(parts)


def _ours_by_comparison(comparisons: pl.DataFrame, name: str, variant: RewardVariant) -> str:
    # The paper names a comparison "<a> vs <b> at N=5" or "<a> vs <b> at N=10 and N=15".
    pair, _, where = name.partition(" at ")
    sizes = [int(n) for n in re.findall(r"N=(\d+)", where)]
    rows = comparisons.filter(
        pl.col("variant") == str(variant),
        pl.concat_str("model_a", pl.lit(" vs "), "model_b") == pair,
        pl.col("n").is_in(sizes) if sizes else pl.lit(value=True),
    ).iter_rows(named=True)
    return "; ".join(
        f"N={row['n']}: diff {_number(row['diff'])}, p {_p_value(row['p'])}, "
        f"g {_number(row['hedges_g'])}"
        for row in rows
    )


def _paper_section(
    paper: dict[str, Any],
    summary: pl.DataFrame,
    comparisons: pl.DataFrame,
    variant: RewardVariant,
) -> str:
    model_rows = [
        [name, _published(entry), _ours_by_model(summary, name, variant) or _MISSING]
        for name, entry in paper.get("models", {}).items()
    ]
    comparison_rows = [
        [
            entry["name"],
            _published(entry),
            _ours_by_comparison(comparisons, entry["name"], variant) or _MISSING,
        ]
        for entry in paper.get("comparisons", [])
    ]
    return (
        "## Published figures\n\n"
        f"The numbers published in {paper['paper']}, beside ours (`{variant}` reward) where a "
        f"model name matches ours.\n\n"
        + _table(["Paper model", "Published", "Ours"], model_rows)
        + "\n\n"
        + _table(["Paper comparison", "Published", "Ours"], comparison_rows)
    )


def write_report(
    summary_csv: str | Path,
    comparisons_csv: str | Path,
    figure_png: str | Path,
    paper_reference_yaml: str | Path,
    config: AnalysisConfig,
    out_md: str | Path,
) -> None:
    """Write the markdown report of one analysis.

    Args:
        summary_csv: The summary written by :func:`coordgap.analysis.stats.write_stats`.
        comparisons_csv: The comparisons written by the same call.
        figure_png: The reward figure, linked relative to the report's folder.
        paper_reference_yaml: The paper's published figures (``config/paper_reference.yaml``).
        config: The analysis configuration; its first variant is the headline.
        out_md: The report file to write.
    """
    summary = pl.read_csv(summary_csv, schema=summary_schema(config.variants))
    comparisons = pl.read_csv(comparisons_csv, schema=COMPARISON_SCHEMA)
    paper = yaml.safe_load(Path(paper_reference_yaml).read_text(encoding="utf-8"))
    headline = config.variants[0]
    sections = [
        "# coordgap results: LLM agents at the dining-philosophers table",
        _method(config),
        _summary_section(summary, config),
        _comparisons_section(comparisons),
        _figure_section(figure_png, out_md, headline),
        _degenerate_section(summary, config),
        _paper_section(paper, summary, comparisons, headline),
    ]
    Path(out_md).write_text("\n\n".join(sections) + "\n", encoding="utf-8")

"""The markdown report: findings first, then tables, figures, the paper beside us, and setup.

The report is built only from the files the statistics, monitor and figure rules wrote, the
configuration, ``config/paper_reference.yaml`` and the provenance collected by the caller; it
carries no timestamp, so the same inputs give the same bytes. Headings never contain model
names, so its anchors stay stable whatever the models are called.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import yaml

from coordgap.analysis.catalog import figure_catalog
from coordgap.analysis.comparisons import COMPARISON_SCHEMA, POWER_SCHEMA
from coordgap.analysis.control import CONTROL_SCHEMA
from coordgap.analysis.findings import findings_section
from coordgap.analysis.monitors import MONITOR_SCHEMA, MONITORS, flagged
from coordgap.analysis.paper import Check, check_published, reward_variant_of_paper
from coordgap.analysis.seeds import SEED_COMPARISON_SCHEMA, SEED_SCHEMA
from coordgap.analysis.stats import (
    SMALL_CELL,
    read_table,
    reward_columns,
    reward_sd_column,
    summary_schema,
)
from coordgap.analysis.training import read_selection, selection_section
from coordgap.analysis.two_sample import PERMUTATION_RESAMPLES
from coordgap.config.analysis import AnalysisConfig, ComparisonConfig, MonitorConfig
from coordgap.config.play import cell_episodes
from coordgap.env.variants import RewardVariant
from coordgap.provenance import check_records

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from coordgap.provenance import Provenance

_MISSING = "n/a"

_DEFINITIONS: dict[RewardVariant, str] = {
    RewardVariant.PAPER: "r = {w.nd} r_nd + {w.thru} r_thru - {w.fair} r_fair - {w.idle} r_idle",
    RewardVariant.SHAPED: (
        "the same weighted sum, except that the no-deadlock bonus counts only when at least "
        "one meal was eaten and decisions without a parseable tool call count as idle"
    ),
    RewardVariant.PROGRESS: (
        "the shaped sum, except that a round that ended with a philosopher holding both forks "
        "counts as half a meal of throughput and earns the no-deadlock bonus as a meal does, "
        "and that unfairness counts only beyond the most even split of the meals"
    ),
    RewardVariant.CONTROL: (
        "r = round1_right / N, the share of the N seats whose round-1 decision reaches for the "
        "right fork (`pick_up_right`, or dpbench4's `grab_right`), which is no weighted sum "
        "and no coordination reward"
    ),
}


@dataclass(frozen=True)
class ReportInputs:
    """The files a report is made of.

    Attributes:
        summary: ``results/stats/summary.csv``.
        comparisons: ``results/stats/comparisons.csv``.
        power: ``results/stats/power.csv``.
        monitors: ``results/stats/monitors.csv``.
        paper_reference: ``config/paper_reference.yaml``.
        figures: The figures' PNG files, each with its data CSV beside it; shown in the order
            of :func:`coordgap.analysis.catalog.figure_catalog`.
        timeline: The timeline figure's PNG (its CSV beside it).
        tables: Further statistics tables to link to (CSV), e.g. components and seats.
        selections: Every training run's ``selection.json``.
        training_figures: Their training-curve PNGs, in the same order.
        histories: Their runs' ``history.parquet`` tables, in the same order.
        seeds: ``results/stats/seeds.csv`` (every arm seed by seed), if the study trains.
        seed_comparisons: ``results/stats/seed_comparisons.csv``, if the study trains.
        arm_figures: The figures of the arms of several seeds (``arm_<arm>.png``).
        control: ``results/stats/control.csv``, if the study has a positive control.
        records: The provenance records of every output the statistics read (episodes,
            training, validation, tests); each must match the current config.
    """

    summary: Path
    comparisons: Path
    power: Path
    monitors: Path
    paper_reference: Path
    figures: Sequence[Path]
    timeline: Path
    tables: Sequence[Path] = field(default_factory=tuple)
    selections: Sequence[Path] = field(default_factory=tuple)
    training_figures: Sequence[Path] = field(default_factory=tuple)
    histories: Sequence[Path] = field(default_factory=tuple)
    seeds: Path | None = None
    seed_comparisons: Path | None = None
    arm_figures: Sequence[Path] = field(default_factory=tuple)
    control: Path | None = None
    records: Sequence[Path] = field(default_factory=tuple)


def _number(value: float | None, digits: int = 3) -> str:
    if value is None or math.isnan(value):
        return _MISSING
    return f"{value:.{digits}f}"


def _interval(mean: float | None, low: float | None, high: float | None, digits: int = 3) -> str:
    if mean is None or math.isnan(mean):
        return _MISSING
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return _number(mean, digits)
    return f"{_number(mean, digits)} [{_number(low, digits)}, {_number(high, digits)}]"


def _p_value(p: float | None) -> str:
    # Two significant digits: the tables hold p to 6 places already, and a second rounding to
    # 3 places would show 0.0015 as 0.002.
    if p is None or math.isnan(p):
        return _MISSING
    if p < 0.001:
        return "<0.001"
    return f"{p:#.2g}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Render a markdown table, escaping the pipes that would split a cell."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join(
        "| " + " | ".join(str(cell).replace("|", "\\|") for cell in line) + " |" for line in lines
    )


def _link(target: Path, out_md: Path) -> str:
    return Path(os.path.relpath(target, out_md.parent)).as_posix()


def _setup_section(config: dict[str, Any], provenance: Provenance, records: int) -> str:
    env = config["environment"]
    models = [
        f"`{name}` ({entry['kind']}, {cell_episodes(config, name)} episodes per N)"
        for name, entry in config["models"].items()
    ]
    facts = [
        ["Config digest (SHA-256)", f"`{provenance.config_digest}`"],
        ["Git commit", f"`{provenance.commit}`" if provenance.commit else "not a git checkout"],
        ["Output records", f"{records}, each made with the current config's sections"],
        ["Python", provenance.python],
        *([f"`{name}`", version] for name, version in provenance.packages.items()),
    ]
    sizes = ", ".join(str(n) for n in config["experiment"]["sizes"])
    design = (
        f"Protocol `{env['protocol']}`, `{env['turn_order']}` turns, `{env['tie_break']}` "
        f"tie-breaks, {env['rounds']} rounds per episode, deadlock "
        f"{'ends' if env['deadlock_terminal'] else 'does not end'} an episode, philosophers "
        f"see {env['history']} past decisions; N in {{{sizes}}}; base seed {config['seed']}. "
        f"Models: {', '.join(models)}."
    )
    return "## Setup\n\n" + design + "\n\n" + _table(["Item", "Value"], facts)


def _control_section(control: pl.DataFrame, csv: str) -> str:
    rows = [
        [
            f"`{row['name']}`" + (" (all seeds)" if row["level"] == "arm" else ""),
            str(row["n"]),
            _MISSING if row["step"] is None else str(row["step"]),
            _number(row["exact"]),
            _number(row["model_exact"]),
            _number(row["gain"]),
            "yes" if row["passed"] else "**no**",
            str(row["episodes"]),
            _number(row["share"]),
            _number(row["model_share"]),
        ]
        for row in control.iter_rows(named=True)
    ]
    first = control.row(0, named=True)
    header = ["Checkpoint", "N", "Step", "E[r1], exact", "Model's E[r1]", "Gain", "Passed"]
    header += [
        "Test episodes",
        "Test share",
        f"Model's test share ({first['model_episodes']} episodes)",
    ]
    return (
        "## Positive control\n\nThe control arm trains on the `control` reward: "
        f"{_DEFINITIONS[RewardVariant.CONTROL]}. It measures whether the study's training can "
        "move the policy at all, and enters no other table. Round 1's prompts do not depend on "
        "the policy, so a checkpoint's expected reward E[r1] is exact: the mean over the seats "
        "of its probability of reaching right on the seat's round-1 prompt, which the training "
        "history records after every update, beside the untrained model's. A seed passes when "
        f"its selected checkpoint's E[r1] exceeds `{first['model']}`'s by at least "
        f"{first['min_gain']:g}; the arm passes when every seed does (its row: the mean E[r1] "
        "and the smallest gain). The test episodes' share (the mean reward of the ok test "
        "episodes) estimates the same expectation with sampling noise; the check does not "
        f"read it. Data: [{Path(csv).name}]({csv}).\n\n" + _table(header, rows)
    )


def _method_section(comparing: ComparisonConfig, monitors: MonitorConfig) -> str:
    config = comparing.analysis
    definitions = "\n".join(
        f"- `{variant}`: {_DEFINITIONS[variant].format(w=config.weights)}"
        for variant in config.variants
    )
    confidence = f"{config.confidence * 100:g}%"
    power = comparing.power
    return (
        "## Method\n\n"
        "Each cell is one model at one table size N. Episodes that ended in an error are "
        "counted in the Errors column and left out of every statistic. Rewards are derived at "
        "analysis time from the stored components: r_nd (1 without deadlock), r_thru (meals over "
        "the table's capacity), r_fair (inequality of meals between seats) and r_idle (share of "
        f"actions that were idle). The reward variants, headline first:\n\n{definitions}\n\n"
        f"Intervals are {confidence}: Wilson score for rates and for mean rewards whose every "
        "value is 0 or 1 (a binary outcome), Newcombe's hybrid score for differences of rates "
        "and of binary rewards, the percentile bootstrap for other means and mean differences "
        f"({config.bootstrap_resamples} resamples, seed {config.seed}; each sample resampled on "
        "its own), and a normal approximation with the Hedges-Olkin standard error for Hedges' "
        "g. Pairs of models are compared with Welch's t-test, or, where a sample has fewer "
        f"than {SMALL_CELL} episodes or is constant, with the studentized permutation test "
        f"(the permutation test of Welch's t; exact, or {PERMUTATION_RESAMPLES:,} splits "
        "seeded with the seed above), which is exact when the two models' episodes are "
        "exchangeable under the null and, unlike the permutation test of the raw mean "
        "difference, stays valid for equal means with unequal SDs; the Brunner-Munzel "
        "permutation test of the probability of superiority assumes no equal shapes. Holm's "
        "correction runs within each family of comparisons and reward variant. Beside each "
        "comparison stands the smallest |g| a two-sided two-sample t-test of its sizes detects "
        f"at alpha {power.alpha:g} with power {power.power:g}: a difference smaller than that "
        "is one the comparison could not see, whatever its p. Undefined statistics read n/a: "
        "an effect size in SDs is undefined when both samples are constant. "
        "The monitors' thresholds: "
        + "; ".join(
            f"{name} {monitors.thresholds[check.share]:g}" for name, check in MONITORS.items()
        )
        + "."
    )


def _flags(monitors: pl.DataFrame) -> dict[tuple[str, int], list[str]]:
    return {(row["model"], row["n"]): flagged(row) for row in monitors.iter_rows(named=True)}


def _cell_flags(flags: dict[tuple[str, int], list[str]], row: dict[str, Any]) -> list[str]:
    """A summary row's monitor flags, and ``errors`` when the cell has error episodes."""
    cell = flags.get((row["model"], row["n"]), [])
    return [*cell, "errors"] if row["errors"] else cell


def _rewards_section(summary: pl.DataFrame, monitors: pl.DataFrame, config: AnalysisConfig) -> str:
    flags = _flags(monitors)
    parts = [
        "## Rewards\n\nMean episode reward with its interval (Wilson's for binary rewards, "
        "the bootstrap's otherwise) and SD, under every "
        "variant; the monitors' flags (see Monitors) stand beside the model, and `errors` marks "
        "a cell with error episodes (left out of its statistics)."
    ]
    for variant in config.variants:
        rows = [
            [
                row["model"],
                str(row["n"]),
                str(row["episodes"]),
                str(row["errors"]),
                _interval(*(row[column] for column in reward_columns(variant))),
                _number(row[reward_sd_column(variant)]),
                ", ".join(_cell_flags(flags, row)),
            ]
            for row in summary.iter_rows(named=True)
        ]
        header = ["Model", "N", "Episodes", "Errors", f"Reward ({variant})", "SD", "Flags"]
        parts.append(f"### `{variant}` reward\n\n" + _table(header, rows))
    return "\n\n".join(parts)


def _per_decision(row: dict[str, Any]) -> str:
    tokens = (row["tokens_in_per_decision"], row["tokens_out_per_decision"])
    if all(value is None for value in tokens):
        return _MISSING
    return " / ".join(_number(value, 1) for value in tokens)


def _behaviour_section(summary: pl.DataFrame) -> str:
    header = ["Model", "N", "Deadlock rate", "Zero-meal rate", "Meals (SD)", "Throughput"]
    header += ["Fairness", "Idle", "Failed", "No call", "Tokens in / out", "Seconds"]
    rows = [
        [
            row["model"],
            str(row["n"]),
            _interval(row["deadlock_rate"], row["deadlock_ci_low"], row["deadlock_ci_high"]),
            _interval(row["zero_meal_rate"], row["zero_meal_ci_low"], row["zero_meal_ci_high"]),
            f"{_number(row['meals_mean'], 2)} ({_number(row['meals_sd'], 2)})",
            *(
                _number(row[column])
                for column in ("throughput", "fairness", "idle", "failed_rate", "no_call_rate")
            ),
            _per_decision(row),
            _number(row["latency_s_per_decision"]),
        ]
        for row in summary.iter_rows(named=True)
    ]
    return (
        "## Behaviour\n\nRates with Wilson intervals; meals per episode with their SD; "
        "throughput, fairness and idle are the mean reward components; failed and no-call "
        "rates are shares of all decisions; tokens and seconds are per decision, where the "
        "model recorded them.\n\n" + _table(header, rows)
    )


def _comparisons_section(comparisons: pl.DataFrame) -> str:
    intro = "## Comparisons"
    if comparisons.is_empty():
        return f"{intro}\n\nNo comparison had episodes of both models at the same N."
    header = ["A", "B", "N", "Episodes", "Diff [CI]", "Test", "p", "p (Holm)", "Welch t (dof)"]
    header += ["Hedges' g [CI]", "g_av [CI]", "Detectable g", "P(A > B)", "BM p (Holm)"]
    header += ["Deadlock diff [Newcombe CI]", "Note"]
    parts = [
        f"{intro}\n\nA - B on per-episode reward. The difference's interval is Newcombe's when "
        "both samples are binary (every reward 0 or 1), the bootstrap's otherwise. *Test* is "
        "the test to read: Welch's t-test, or the studentized permutation test (of Welch's t) "
        f"where a sample has fewer than {SMALL_CELL} episodes or is constant (the note says "
        "which); Welch's t stays beside it. Holm's correction runs within each family and "
        "variant. Hedges' g uses the pooled SD (the paper's effect size) with a normal-"
        "approximation interval; g_av uses the average-variance SD with Bonett's interval, "
        "the one to read when the SDs differ by more than twice; both are n/a when both samples "
        "are constant. *Detectable g* is the "
        "smallest |g| a t-test of these sizes detects with the configured power. P(A > B) is "
        "the probability of superiority (ties count half), tested by the Brunner-Munzel "
        "permutation test."
    ]
    for (family, variant), group in comparisons.group_by("family", "variant", maintain_order=True):
        rows = [
            [
                row["model_a"],
                row["model_b"],
                str(row["n"]),
                f"{row['episodes_a']} / {row['episodes_b']}",
                _interval(row["diff"], row["diff_ci_low"], row["diff_ci_high"]),
                row["test"] or "",
                _p_value(row["p"]),
                _p_value(row["p_holm"]),
                f"{_number(row['t'], 2)} ({_number(row['dof'], 1)})",
                _interval(row["hedges_g"], row["hedges_g_ci_low"], row["hedges_g_ci_high"], 2),
                _interval(row["g_av"], row["g_av_ci_low"], row["g_av_ci_high"], 2),
                _number(row["detectable_g"], 2),
                _number(row["superiority"], 2),
                f"{_p_value(row['bm_p'])} ({_p_value(row['bm_p_holm'])})",
                _interval(
                    row["deadlock_diff"], row["deadlock_diff_ci_low"], row["deadlock_diff_ci_high"]
                ),
                row["note"] or "",
            ]
            for row in group.iter_rows(named=True)
        ]
        parts.append(f"### Family `{family}`, `{variant}` reward\n\n" + _table(header, rows))
    return "\n\n".join(parts)


def seeds_section(
    seeds: pl.DataFrame, pairs: pl.DataFrame, figures: Sequence[str] = ()
) -> str | None:
    """The arms seed by seed and the seed-level comparisons, if any arm has several seeds.

    With one seed per arm and no pair configured there is nothing the checkpoint families of
    the comparisons do not say already.

    Args:
        seeds: ``seeds.csv``.
        pairs: ``seed_comparisons.csv``.
        figures: Relative links to the arm figures.

    Returns:
        Markdown, or None.
    """
    if pairs.is_empty() and (seeds.is_empty() or seeds["seeds"].max() < 2):
        return None
    arms = [
        [
            f"`{row['arm']}@{row['policy']}`",
            f"`{row['variant']}`",
            row["n"],
            row["seeds"],
            row["seed_means"],
            _interval(row["mean"], row["ci_low"], row["ci_high"]),
            _number(row["pooled_mean"]),
        ]
        for row in seeds.iter_rows(named=True)
    ]
    parts = [
        "## Seeds\n\nEach arm trained once per seed; its seeds differ by chance alone. Per "
        "arm's selection: each seed's test mean, their mean with the t interval over seeds "
        "(normal seed means assumed), and the pooled episodes' mean, which treats the episodes "
        "of one seed as independent.\n\n"
        + _table(
            ["Arm", "Reward", "N", "Seeds", "Seed means", "Mean [CI over seeds]", "Pooled"],
            arms,
        ),
        *(f"![{Path(link).stem}]({link})" for link in figures),
    ]
    if not pairs.is_empty():
        rows = [
            [
                f"`{row['variant']}`",
                row["n"],
                f"{row['a']} vs {row['b']}",
                f"{row['seeds_a']} vs {row['seeds_b'] or 'model'}",
                _interval(row["diff"], row["diff_ci_low"], row["diff_ci_high"]),
                row["test"],
                _p_value(row["p"]),
                _p_value(row["p_holm"]),
                f"{_p_value(row['permutation_p'])} (min {_number(row['min_p'])})",
                f"{_p_value(row['pooled_p'])} ({row['pooled_test'] or _MISSING})",
                _number(row["pooled_detectable_diff"]),
                row["note"] or "",
            ]
            for row in pairs.iter_rows(named=True)
        ]
        parts.append(
            "### Seed-level comparisons\n\nThe study's primary family "
            "(`analysis.seed_comparisons`), Holm-corrected over its pairs at each N and "
            "reward. Against an arm: Welch's t over seed means; against a model: Welch's t of "
            "the seed means against the model's episodes, so that the model's own noise is in "
            "the interval. The permutation test of Welch's t beside it is exact for "
            "exchangeable values, and cannot go below its minimum with so few. Detectable: the "
            "smallest difference a two-sample "
            "t-test of the pooled episodes detects (`analysis.power`), in reward units.\n\n"
            + _table(
                [
                    "Reward",
                    "N",
                    "A vs B",
                    "Seeds",
                    "Diff [CI]",
                    "Test",
                    "p",
                    "Holm p",
                    "Permutation p",
                    "Pooled episodes p",
                    "Detectable",
                    "Note",
                ],
                rows,
            )
        )
    return "\n\n".join(parts)


def _power_section(power: pl.DataFrame) -> str:
    labels = {"required": "needed", "paper": "the paper", "ours": "ours"}
    rows = [
        [
            labels.get(row["design"], row["design"]),
            str(row["episodes_per_cell"]),
            "" if row["cells"] is None else str(row["cells"]),
            _number(row["power_at_effect"], 2),
            _number(row["detectable_effect"], 2),
        ]
        for row in power.iter_rows(named=True)
    ]
    first = power.row(0, named=True)
    header = ["Design", "Episodes per cell", "Our cells", "Power at g", "Detectable g"]
    return (
        f"## Power\n\nA two-sided two-sample t-test at alpha {first['alpha']:g} needs "
        f"{first['episodes_per_cell']} episodes per cell to detect g = {first['effect_size']:g} "
        f"with power {first['target_power']:g}. Below: each design's power at "
        f"g = {first['effect_size']:g}, and the smallest g it detects with power "
        f"{first['target_power']:g}.\n\n" + _table(header, rows)
    )


def _monitors_section(monitors: pl.DataFrame, config: MonitorConfig) -> str:
    definitions = "\n".join(
        f"- `{name}`: {check.definition.format(c=config)}; flagged at "
        f"{config.thresholds[check.share]:g} or more"
        for name, check in MONITORS.items()
    )
    header = ["Model", "N", "Episodes", *(f"{name}" for name in MONITORS), "Flags"]
    rows = [
        [
            row["model"],
            str(row["n"]),
            str(row["episodes"]),
            *(_number(row[check.share], 2) for check in MONITORS.values()),
            ", ".join(f"**{name}**" for name in flagged(row)),
        ]
        for row in monitors.iter_rows(named=True)
    ]
    lines = []
    for name in MONITORS:
        sizes = (
            monitors.filter(pl.col(name))
            .group_by("model", maintain_order=True)
            .agg(pl.col("n").sort().cast(pl.String).str.join(", "))
        )
        cells = "; ".join(f"{model} (N={n})" for model, n in sizes.iter_rows())
        lines.append(f"- **{name}**: {cells or 'no cell'}")
    summary = "\n".join(lines)
    return (
        "## Monitors\n\nDegenerate policies score well by not playing. Per model and N:\n\n"
        f"{definitions}\n\n" + _table(header, rows) + f"\n\nFlagged cells:\n\n{summary}"
    )


def _figures_section(inputs: ReportInputs, out_md: Path, variants: Sequence[RewardVariant]) -> str:
    by_stem = {Path(png).stem: Path(png) for png in inputs.figures}
    parts = ["## Figures\n\nEach figure's numbers are in the CSV file beside it."]
    for stem, (title, caption) in figure_catalog(variants).items():
        if stem in by_stem:
            png = by_stem[stem]
            parts.append(
                f"### {title}\n\n![{title.replace('`', '')}]({_link(png, out_md)})\n\n"
                f"{caption} Data: [{png.with_suffix('.csv').name}]"
                f"({_link(png.with_suffix('.csv'), out_md)})."
            )
    if inputs.tables:
        links = ", ".join(f"[{Path(t).name}]({_link(Path(t), out_md)})" for t in inputs.tables)
        parts.append(f"Further tables: {links}.")
    return "\n\n".join(parts)


def _timeline_section(inputs: ReportInputs, out_md: Path) -> str:
    png = Path(inputs.timeline)
    csv = png.with_suffix(".csv")
    return (
        "## An episode, step by step\n\n"
        f"![One episode, seat by seat and round by round]({_link(png, out_md)})\n\n"
        "Rows are seats, columns rounds. Each cell is the seat's decision (PL/PR pick up the "
        "left/right fork, DL/DR put it down, EAT, T think; `!` failed, `?` no tool call), the "
        "triangles the forks it held at the end of the round, a star a meal; a hatched band is "
        "a round that ended in a deadlock. The forks are recovered by replaying the recorded "
        "decisions on the environment with the episode's seed, each outcome checked against "
        f"the record. Data: [{csv.name}]({_link(csv, out_md)}). Draw any other episode with "
        "`coordgap show results/episodes/<model>/n<N>.parquet --episode <k>`."
    )


def _published(value: float | list[float]) -> str:
    return f"[{value[0]:g}, {value[1]:g}]" if isinstance(value, list) else f"{value:g}"


def _within(check: Check) -> str:
    if check.within is None:
        return _MISSING
    return "yes" if check.within else "**no**"


def _check_rows(checks: Sequence[Check]) -> list[list[str]]:
    return [
        [
            check.paper_model,
            f"`{check.quantity}`",
            _published(check.published),
            "; ".join(
                f"N={estimate.n}: {_interval(estimate.value, estimate.low, estimate.high)}"
                for estimate in check.ours
            )
            or "no model of ours by this name",
            _within(check),
        ]
        for check in checks
    ]


def _values(values: Iterable[Any]) -> str:
    return ", ".join(f"{value:g}" if isinstance(value, float) else str(value) for value in values)


def _design_rows(paper: dict[str, Any], config: dict[str, Any]) -> list[list[str]]:
    weights = config["reward"]["weights"]
    # The paper's names of the weights of r_nd, r_thru, r_fair and r_idle.
    names = {"alpha": "nd", "beta": "thru", "gamma": "fair", "delta": "idle"}
    pairs = [
        (
            "Episodes per cell",
            [paper["episodes"]["per_cell"]],
            sorted({cell_episodes(config, model) for model in config["models"]}),
        ),
        ("Philosophers N", paper["philosophers"], config["experiment"]["sizes"]),
        (
            "Rounds per episode",
            [paper["training"]["rounds_per_episode"]],
            [config["environment"]["rounds"]],
        ),
        (
            "Reward weights (nd, thru, fair, idle)",
            [paper["reward"]["weights"][name] for name in names],
            [weights[ours] for ours in names.values()],
        ),
    ]
    return [
        [name, _values(theirs), _values(ours), "same" if ours == theirs else "**differs**"]
        for name, theirs, ours in pairs
    ]


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
        f"g {_interval(row['hedges_g'], row['hedges_g_ci_low'], row['hedges_g_ci_high'], 2)}"
        for row in rows
    )


def _comparable(checks: Sequence[Check]) -> str:
    """Say which of the paper's models this config has, i.e. which rows can be compared."""
    ours = sorted({check.paper_model for check in checks if check.ours})
    if not ours:
        return (
            "**No row is comparable on this config**: none of its models has a paper model's "
            "name, so every row reads n/a (`config/paper.yaml` runs the paper's models)."
        )
    return f"Comparable on this config: the rows of {', '.join(f'`{m}`' for m in ours)}."


def _paper_section(
    paper: dict[str, Any],
    config: dict[str, Any],
    summary: pl.DataFrame,
    comparisons: pl.DataFrame,
    variants: Sequence[RewardVariant],
) -> str:
    variant = reward_variant_of_paper(variants)
    checks = check_published(paper, summary, variants)
    comparison_rows = [
        [
            entry["name"],
            "; ".join(f"{k}: {v}" for k, v in entry.items() if k != "name"),
            _ours_by_comparison(comparisons, entry["name"], variant) or _MISSING,
        ]
        for entry in paper.get("comparisons", [])
    ]
    return (
        "## Paper vs ours\n\n"
        f"The numbers published in {paper['paper']}, beside ours (`{variant}` reward) where "
        "one of our models has the paper model's name. A published range holds ours when our "
        "estimate lies in it at every N it covers; a single published number, when it lies in "
        "our interval (or equals our estimate at its precision where we have no interval). "
        "A model of ours named like one of the paper's (e.g. `qwen3-14b`) fills its rows. "
        f"{_comparable(checks)}\n\n"
        "### Design\n\n"
        + _table(["", "Paper", "Ours", "Same?"], _design_rows(paper, config))
        + "\n\n### Results\n\n"
        + _table(
            ["Paper model", "Quantity", "Published", "Ours", "In their range?"],
            _check_rows(checks),
        )
        + "\n\n### Comparisons\n\n"
        + _table(["Paper comparison", "Published", "Ours"], comparison_rows)
    )


def write_report(
    inputs: ReportInputs,
    config: dict[str, Any],
    provenance: Provenance,
    out_md: str | Path,
) -> None:
    """Write the markdown report of one analysis.

    Args:
        inputs: The statistics tables, figures and published numbers.
        config: The whole validated config the workflow ran with.
        provenance: The setup the report was made with.
        out_md: The report file; links to figures and tables are relative to its folder.

    Raises:
        ProvenanceMismatch: An output's record disagrees with ``config`` (each is named);
            nothing is written.
    """
    check_records(config, inputs.records)
    out_md = Path(out_md)
    comparing = ComparisonConfig.from_dict(config["reward"], config["analysis"])
    analysis = comparing.analysis
    monitor_config = MonitorConfig.from_dict(config["reward"], config["analysis"]["monitors"])
    summary = read_table(inputs.summary, summary_schema(analysis.variants))
    comparisons = read_table(inputs.comparisons, COMPARISON_SCHEMA)
    power = read_table(inputs.power, POWER_SCHEMA)
    monitors = read_table(inputs.monitors, MONITOR_SCHEMA)
    paper = yaml.safe_load(Path(inputs.paper_reference).read_text(encoding="utf-8"))
    selections = [read_selection(path) for path in inputs.selections]
    seed_comparisons = (
        read_table(inputs.seed_comparisons, SEED_COMPARISON_SCHEMA)
        if inputs.seeds and inputs.seed_comparisons
        else None
    )
    seeds = (
        seeds_section(
            read_table(inputs.seeds, SEED_SCHEMA),
            seed_comparisons,
            [_link(Path(png), out_md) for png in inputs.arm_figures],
        )
        if seed_comparisons is not None
        else None
    )
    control = read_table(inputs.control, CONTROL_SCHEMA) if inputs.control else None
    control_check = (
        _control_section(control, _link(inputs.control, out_md)) if control is not None else None
    )
    findings = findings_section(
        summary,
        comparisons,
        monitors,
        power,
        selections,
        variant=analysis.variants[0],
        alpha=comparing.power.alpha,
        degenerate_reward=monitor_config.degenerate_reward,
        seed_comparisons=seed_comparisons,
        control=control,
    )
    sections = [
        "# coordgap results: LLM agents at the dining-philosophers table",
        findings,
        *([control_check] if control_check else []),
        _rewards_section(summary, monitors, analysis),
        _behaviour_section(summary),
        _comparisons_section(comparisons),
        *(
            [
                selection_section(
                    selections,
                    [_link(Path(png), out_md) for png in inputs.training_figures],
                    [pl.read_parquet(path) for path in inputs.histories],
                )
            ]
            if selections
            else []
        ),
        *([seeds] if seeds else []),
        _power_section(power),
        _monitors_section(monitors, monitor_config),
        _figures_section(inputs, out_md, analysis.variants),
        _timeline_section(inputs, out_md),
        _paper_section(paper, config, summary, comparisons, analysis.variants),
        _method_section(comparing, monitor_config),
        _setup_section(config, provenance, len(inputs.records)),
    ]
    out_md.write_text("\n\n".join(sections) + "\n", encoding="utf-8")

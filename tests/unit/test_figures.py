"""Every figure from a tiny fixture: labelled axes, a legend, deterministic files, and a CSV
that holds exactly the numbers of the statistics table it was drawn from."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import polars as pl
import pytest

from coordgap.analysis import figures
from coordgap.analysis.catalog import STATISTICS_FIGURES, FigureSpec, figure_catalog
from coordgap.analysis.stats import (
    COMPONENT_SCHEMA,
    SEAT_COLUMNS,
    SEAT_SCHEMA,
    StatsOutputs,
    episode_reward_schema,
    read_columns,
    read_table,
    reward_columns,
    summary_schema,
)
from coordgap.analysis.training import (
    arm_figure,
    training_figure,
    write_arm_figure,
    write_training_figure,
)
from coordgap.env.variants import RewardVariant
from coordgap.training.history import HISTORY_SCHEMA
from tests.unit.analysis_tables import CONFIG, episode, frame, table, write_tables

if TYPE_CHECKING:
    from pathlib import Path

    from matplotlib.figure import Figure

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def stats(tmp_path_factory: pytest.TempPathFactory) -> StatsOutputs:
    """The statistics tables of a tiny fixture: four models at two sizes, one model with `@`."""
    trained = frame([episode("m@best_val", 5, i, meals=[1, 0, 0, 0, 1], think=i) for i in range(3)])
    episodes = pl.concat([table(sizes=(5, 7)), trained])
    return write_tables(episodes, tmp_path_factory.mktemp("stats") / "tables").stats


def _check_labels_and_legend(figure: Figure) -> None:
    panels = [axes for axes in figure.axes if axes.get_visible()]
    assert panels
    assert all(axes.get_xlabel() for axes in panels)
    assert panels[0].get_ylabel()
    legends = [axes.get_legend() for axes in panels if axes.get_legend()] + figure.legends
    assert legends
    texts = [text.get_text() for legend in legends for text in legend.get_texts()]
    assert "hierarchy (n=6)" in texts or "hierarchy" in texts or "no deadlock (+)" in texts


def _draw_twice(
    figure: str, table_csv: Path, tmp_path: Path, variant: RewardVariant | None = None
) -> Path:
    """Write a figure twice: same bytes, no creation date; return its CSV."""
    files = tuple(tmp_path / f"{figure}.{ext}" for ext in ("png", "pdf", "csv"))
    figures.write_figure(figure, table_csv, *files, variant=variant)
    first = [path.read_bytes() for path in files]
    figures.write_figure(figure, table_csv, *files, variant=variant)
    assert [path.read_bytes() for path in files] == first, figure
    assert b"CreationDate" not in first[1]
    assert all(first)
    return files[2]


@pytest.mark.parametrize("variant", [RewardVariant.PAPER, RewardVariant.SHAPED])
def test_reward_figure(stats: StatsOutputs, tmp_path: Path, variant: RewardVariant) -> None:
    summary = read_table(stats.summary, summary_schema(CONFIG.variants))
    figure, data = figures.reward_figure(summary, variant)
    _check_labels_and_legend(figure)
    csv = _draw_twice("reward", stats.summary, tmp_path, variant)
    columns = ["model", "n", "episodes", *reward_columns(variant)]
    assert read_columns(csv, {c: summary.schema[c] for c in columns}).equals(
        summary.select(columns)
    )
    assert data.equals(summary.select(columns))


def test_deadlock_figure(stats: StatsOutputs, tmp_path: Path) -> None:
    summary = read_table(stats.summary, summary_schema(CONFIG.variants))
    figure, _ = figures.deadlock_figure(summary)
    _check_labels_and_legend(figure)
    csv = _draw_twice("deadlock", stats.summary, tmp_path)
    columns = ["model", "n", "episodes", *figures.DEADLOCK_COLUMNS]
    assert read_columns(csv, {c: summary.schema[c] for c in columns}).equals(
        summary.select(columns)
    )


@pytest.mark.parametrize("variant", [RewardVariant.PAPER, RewardVariant.SHAPED])
def test_reward_vs_meals_figure(
    stats: StatsOutputs, tmp_path: Path, variant: RewardVariant
) -> None:
    rewards = read_table(stats.episode_rewards, episode_reward_schema(CONFIG.variants))
    figure, _ = figures.reward_vs_meals_figure(rewards, variant)
    _check_labels_and_legend(figure)
    assert len(figure.axes) == 2  # one panel per N
    # The best score without a meal is marked: the paper reward's degenerate maximum, 1.0.
    lines = [line for axes in figure.axes for line in axes.get_lines()]
    best = {line.get_ydata()[0] for line in lines if line.get_label() == "best without a meal"}
    assert best == {1.0 if variant is RewardVariant.PAPER else 0.0}
    csv = _draw_twice("reward_vs_meals", stats.episode_rewards, tmp_path, variant)
    columns = ["model", "n", "episode", "meals_total", f"reward_{variant}"]
    schema = episode_reward_schema(CONFIG.variants)
    assert read_columns(csv, {c: schema[c] for c in columns}).equals(rewards.select(columns))


@pytest.mark.parametrize("variant", [RewardVariant.PAPER, RewardVariant.SHAPED])
def test_components_figure(stats: StatsOutputs, tmp_path: Path, variant: RewardVariant) -> None:
    components = read_table(stats.components, COMPONENT_SCHEMA)
    figure, _ = figures.components_figure(components, variant)
    _check_labels_and_legend(figure)
    csv = _draw_twice("components", stats.components, tmp_path, variant)
    expected = components.filter(pl.col("variant") == str(variant))
    assert read_table(csv, COMPONENT_SCHEMA).equals(expected)
    # The diamonds sit at the mean rewards of the summary.
    summary = read_table(stats.summary, summary_schema(CONFIG.variants))
    means = summary.filter(pl.col("n") == 5).sort("model")[reward_columns(variant)[0]].to_list()
    (diamonds,) = figure.axes[0].collections
    assert [y for _, y in diamonds.get_offsets()] == pytest.approx(means, abs=1e-6)


def test_meals_by_seat_figure(stats: StatsOutputs, tmp_path: Path) -> None:
    seats = read_table(stats.seats, SEAT_SCHEMA)
    figure, _ = figures.meals_by_seat_figure(seats)
    _check_labels_and_legend(figure)
    csv = _draw_twice("meals_by_seat", stats.seats, tmp_path)
    columns = ["model", "n", "seat", *SEAT_COLUMNS]
    assert read_columns(csv, {c: SEAT_SCHEMA[c] for c in columns}).equals(seats.select(columns))


@pytest.mark.parametrize("spec", STATISTICS_FIGURES, ids=lambda spec: spec.name)
def test_every_catalog_figure_is_drawn_from_the_table_its_entry_names(
    stats: StatsOutputs, tmp_path: Path, spec: FigureSpec
) -> None:
    # The rule plot_<name> reads results/stats/<table>.csv: a wrong table fails to read here.
    for variant in CONFIG.variants if spec.per_variant else [None]:
        csv = _draw_twice(spec.name, getattr(stats, spec.table), tmp_path, variant)
        assert pl.read_csv(csv).height > 0


def test_the_catalog_and_the_drawings_name_the_same_figures(stats: StatsOutputs, tmp_path: Path):
    assert set(figures._DRAWINGS) == {spec.name for spec in STATISTICS_FIGURES}
    files = [tmp_path / f"f.{ext}" for ext in ("png", "pdf", "csv")]
    with pytest.raises(ValueError, match="unknown figure 'violin'; the figures are reward, "):
        figures.write_figure("violin", stats.summary, *files)
    with pytest.raises(ValueError, match="'reward' is drawn per reward variant; none was given"):
        figures.write_figure("reward", stats.summary, *files)
    assert not any(path.exists() for path in files)


def test_the_catalog_gives_each_variant_its_own_figure_in_report_order() -> None:
    catalog = figure_catalog(["paper", "shaped"])
    assert list(catalog) == [
        "reward_paper",
        "reward_shaped",
        "deadlock",
        "reward_vs_meals_paper",
        "reward_vs_meals_shaped",
        "components_paper",
        "components_shaped",
        "meals_by_seat",
    ]
    assert catalog["components_shaped"][0] == "`shaped` reward by term"
    assert catalog["deadlock"] == (
        "Deadlock rate by model and N",
        "The share of episodes that deadlocked, with Wilson score intervals.",
    )
    assert list(figure_catalog(["paper"]))[:2] == ["reward_paper", "deadlock"]


def test_training_figure_draws_the_curves_and_what_the_policy_did(tmp_path: Path) -> None:
    def estimate(step: int, mean: float) -> dict:
        return {
            "step": step,
            "mean": mean,
            "ci_low": mean - 0.1,
            "ci_high": mean + 0.1,
            "episodes": 6,
        }

    selection = {
        "run": "r",
        "reward": {"variant": "paper"},
        "training": [estimate(0, 0.5), estimate(1, 0.6)],
        "validation": [estimate(0, 0.4), estimate(2, 0.7)],
        "choices": {"last": {"step": 2, "estimate": estimate(2, 0.7), "runner_up": None}},
    }
    rows = [
        {
            "run": "r",
            "step": k,
            "actions_pick_up_left": 0.7 - 0.1 * k,
            "actions_pick_up_right": 0.3 + 0.1 * k,
            "entropy_mean": 0.6 + k / 10,
            "episodes": 4,
            "meals_mean": 0.5 * k,
            "both_forks_mean": 1.0 + k,
            "deadlock_rate": 1.0 - 0.5 * k,
            "groups": 2,
            "groups_trainable": k,
            "clipped_share": 1.0,
            "probe_kl": 0.001 * (k + 1),
            "probe_kl_acting": 0.01,
        }
        for k in range(2)
    ]
    history_path = tmp_path / "history.parquet"
    pl.DataFrame(rows, schema=HISTORY_SCHEMA).write_parquet(history_path)
    files = [tmp_path / f"training.{ext}" for ext in ("png", "pdf", "csv")]
    selection_path = tmp_path / "selection.json"
    selection_path.write_text(json.dumps(selection))
    write_training_figure(selection_path, history_path, *files)
    figure, _ = training_figure(selection, pl.read_parquet(history_path))
    assert figure.get_suptitle() == (
        "r: 1 of 4 groups trainable; 2 meals and 12 rounds ready to eat in 8 rollout episodes; "
        "the gradient clip cut 100% of the update rows"
    )
    data = pl.read_csv(files[2])
    # One row per checkpoint: 0 and 1 played rollouts, 1 and 2 were probed after an update.
    assert data["step"].to_list() == [0, 1, 2]
    assert data["probe_kl"].to_list() == [None, 0.001, 0.002]
    assert data["actions_pick_up_left"].to_list()[:2] == pytest.approx([0.7, 0.6])
    assert "actions_eat" not in data.columns
    # What the rollouts came to belongs to the checkpoint that played them.
    assert data["meals_mean"].to_list() == [0.0, 0.5, None]
    assert data["both_forks_mean"].to_list() == [1.0, 2.0, None]
    assert data["deadlock_rate"].to_list() == [1.0, 0.5, None]
    assert data["trainable_share"].to_list() == [0.0, 0.5, None]
    assert files[0].stat().st_size > 0


def test_cell_figures_state_n_mark_small_cells_and_keep_the_legend_off_the_data(
    stats: StatsOutputs,
) -> None:
    summary = read_table(stats.summary, summary_schema(CONFIG.variants))
    # The hierarchy's cells as a 30-episode study's; every other cell keeps its 6 (or 3).
    mixed = summary.with_columns(
        episodes=pl.when(pl.col("model") == "hierarchy").then(30).otherwise(pl.col("episodes"))
    )
    for figure, _ in (
        figures.reward_figure(mixed, RewardVariant.PAPER),
        figures.deadlock_figure(mixed),
    ):
        (axes,) = figure.axes
        assert axes.get_legend() is None
        (legend,) = figure.legends
        texts = [text.get_text() for text in legend.get_texts()]
        assert {"hierarchy (n=30)", "silent (n=6)", "m@best_val (n=3)"} <= set(texts)
        assert "hollow: n < 10\n(a smoke run)" in texts
        faces = {
            container.get_label().lstrip("_"): container.lines[0].get_markerfacecolor()
            for container in axes.containers
        }
        assert faces["silent (n=6)"] == "none"
        assert faces["hierarchy (n=30)"] != "none"


def test_an_arms_figure_overlays_its_seeds_and_their_mean(tmp_path) -> None:
    """Each seed's rollouts step by step, and the mean over seeds of every panel."""

    def history(seed: int) -> pl.DataFrame:
        rows = [
            {
                "run": f"a-s{seed}",
                "step": k,
                "reward_mean": 0.1 * seed + 0.2 * k,
                "actions_pick_up_left": 0.8 - 0.1 * k,
                "actions_eat": 0.2 + 0.1 * k if seed == 1 else None,
                "actions_think": 0.0 if seed == 1 else 0.2 + 0.1 * k,
                "entropy_mean": 0.5,
                "episodes": 6,
                "meals_mean": 0.5 * k * seed,
                "both_forks_mean": float(k + seed),
                "deadlock_rate": 0.5,
                "groups": 2,
                "groups_trainable": min(k, 2),
            }
            for k in range(3)
        ]
        return pl.DataFrame(rows, schema=HISTORY_SCHEMA)

    histories = {f"a-s{seed}": history(seed) for seed in (1, 2, 3)}
    figure, data = arm_figure("a", histories)
    assert figure.get_suptitle().startswith("a: 3 seeds (a-s1, a-s2, a-s3)")
    assert data.height == 9
    assert data.filter(pl.col("run") == "a-s2")["both_forks_mean"].to_list() == [2.0, 3.0, 4.0]
    assert data.filter(pl.col("run") == "a-s2")["actions_eat"].to_list() == [0.0, 0.0, 0.0]
    assert data.filter(pl.col("step") == 2)["trainable_share"].to_list() == [1.0, 1.0, 1.0]
    # Every overlaid panel: three seeds and the mean.
    assert [len(axes.get_lines()) for axes in figure.axes[1:]] == [4] * 5
    mean = figure.axes[2].get_lines()[-1]
    assert list(mean.get_ydata()) == pytest.approx([0.0, 1.0, 2.0])  # meals: (0.5 k)(1+2+3)/3
    paths = {}
    for run in histories:
        paths[run] = tmp_path / f"{run}.parquet"
        histories[run].write_parquet(paths[run])
    files = [tmp_path / f"arm.{ext}" for ext in ("png", "pdf", "csv")]
    write_arm_figure("a", paths, *files)
    assert pl.read_csv(files[2]).height == 9

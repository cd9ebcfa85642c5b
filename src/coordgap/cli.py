"""The ``coordgap`` command.

``coordgap show <table> --episode k`` replays one episode of an episode table (any model, any
N, also a checkpoint's evaluation table) and draws it seat by seat and round by round: it
prints the episode as text and writes the figure (PNG and PDF) with its timeline as CSV.

``coordgap plan [--configfile X [Y ...]] [--config KEY=VALUE ...]`` estimates a study's
decisions, tokens, API dollars and GPU-hours per rule before anything runs (``coordgap.plan``),
with what a run used so far beside the estimate, and lists the placeholders to fill in and the
API keys to export.

``coordgap config [--configfile X [Y ...]] [--config KEY=VALUE ...] [--out FILE]`` writes the
resolved, validated config a study's files make (``coordgap.config.overlays``) as one complete
YAML file: what to diff, archive, or give DVC as its params file.

``coordgap art-runtime`` builds ART's vLLM runtime once, into the cache that the site file's
scratch folder gives GPU jobs (``coordgap.training.art_runtime``; ``make art-runtime``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from coordgap.analysis.timeline import draw_episode, load_episode, steps_path

if TYPE_CHECKING:
    from collections.abc import Sequence

_STEPS_SUFFIX = ".steps.parquet"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="coordgap", description="Dining-philosophers coordination of LLM agents."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser(
        "show",
        help="draw one episode seat by seat and round by round",
        description=(
            "Replay one episode of an episode table on the environment and draw it: each "
            "decision, the forks each seat held, meals, failures and the deadlock. Prints the "
            "episode as text and writes <out>.png, <out>.pdf and <out>.csv."
        ),
    )
    show.add_argument(
        "table",
        type=Path,
        help="an episode table, e.g. results/episodes/<model>/n5.parquet, or its .steps.parquet",
    )
    show.add_argument("--episode", type=int, required=True, help="the episode index")
    show.add_argument(
        "--out",
        type=Path,
        help="path stem of the files written (default: timeline_<model>_n<N>_e<k> here)",
    )
    plan = commands.add_parser(
        "plan",
        help="estimate decisions, tokens, API cost and GPU-hours before anything runs",
        description=(
            "Price a study per rule: decisions, prompt and completion tokens, API dollars "
            "(plan.prices) and GPU-hours, from the rates measured in earlier runs' episode "
            "tables and benchmarks where they exist, else from the config's plan section. "
            "What a run used so far is shown beside each estimate."
        ),
    )
    plan.add_argument("--csv", type=Path, help="also write the estimate's lines to this CSV")
    resolved = commands.add_parser(
        "config",
        help="write the resolved config of a study's files as one complete YAML file",
        description=(
            "Resolve the config files as the Snakefile does (each overlay on its base, the "
            "files in order, --config last), validate the result, and write it as one "
            "complete YAML file, every key written out."
        ),
    )
    resolved.add_argument("--out", type=Path, help="write it to this file (default: stdout)")
    for command in (plan, resolved):
        command.add_argument(
            "--configfile",
            type=Path,
            nargs="+",
            default=[Path("config/config.yaml")],
            help=(
                "the study's config files, resolved and validated as the Snakefile does "
                "(overlays on their base, in order; default: config/config.yaml)"
            ),
        )
        command.add_argument(
            "--config",
            nargs="+",
            default=[],
            metavar="KEY=VALUE",
            help="overrides applied last, parsed as Snakemake parses its --config",
        )
        command.add_argument(
            "--root",
            type=Path,
            default=Path(),
            help="the project folder: its results/ and logs/ (default: here)",
        )
    commands.add_parser(
        "art-runtime",
        help="build ART's vLLM runtime into the GPU jobs' cache (needs network access)",
        description=(
            "Build the vLLM runtime ART serves with (uv, Python 3.12, torch, vLLM; 10-20 GB) "
            "into the cache folder GPU jobs use (the site file's scratch, else under $HOME), "
            "with ART's own installer. Run it once per ART version, on a node with network "
            "access and the GPU nodes' OS; GPU jobs download nothing."
        ),
    )
    return parser


def _default_stem(row: dict[str, object]) -> Path:
    # Model names are path-safe slugs, possibly with "@<selection>"; guard anything else.
    model = re.sub(r"[^\w.@-]", "_", str(row["model"]))
    return Path(f"timeline_{model}_n{row['n']}_e{row['episode']}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``coordgap`` command line.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status: 0 on success (argparse exits with 2 on a usage error).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command in ("plan", "config"):
        names = " ".join(map(str, args.configfile))
        try:
            config = _resolved(args.configfile, args.config)
        except Exception as error:  # validate raises WorkflowError, the rest ConfigError
            sys.stderr.write(f"{names}: {error}\n")
            return 1
        if args.command == "config":
            return _write_config(config, args.out)
        return _plan(config, names, args.root, args.csv)
    if args.command == "art-runtime":
        return _art_runtime()
    table: Path = args.table
    episodes = (
        table.with_name(table.name.removesuffix(_STEPS_SUFFIX) + ".parquet")
        if table.name.endswith(_STEPS_SUFFIX)
        else table
    )
    steps = steps_path(episodes)
    for path in (episodes, steps):
        if not path.is_file():
            parser.error(f"no such table: {path}")
    try:
        episode = load_episode(episodes, steps, args.episode)
        stem = args.out or _default_stem(episode.row)
        outputs = [stem.with_name(f"{stem.name}.{ext}") for ext in ("png", "pdf", "csv")]
        text = draw_episode(episode, *outputs)
    except ValueError as error:  # also a ReplayError: the steps do not replay
        parser.error(str(error))
    sys.stdout.write(text)
    sys.stdout.write("wrote " + ", ".join(map(str, outputs)) + "\n")
    return 0


def _resolved(configfiles: Sequence[Path], overrides: Sequence[str]) -> dict:
    """The config the Snakefile would run on these files and overrides, validated.

    Raises:
        ConfigError: A file, overlay or cross-key rule is wrong (the message names the key).
        WorkflowError: The schema refuses the config (the message names the key).
        ValueError: An override is not ``KEY=VALUE``.
    """
    # Imported here: the validator is not needed to draw an episode.
    from snakemake.cli import parse_config

    from coordgap.config.checks import check_cross_keys
    from coordgap.config.keys import check_schema
    from coordgap.config.overlays import resolve

    config = resolve(configfiles, parse_config(overrides)).config
    check_schema(config)
    check_cross_keys(config)
    return config


def _write_config(config: dict, out: Path | None) -> int:
    """Write a resolved config as YAML, in the files' key order."""
    import yaml

    text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
    return 0


def _plan(config: dict, names: str, root: Path, csv_path: Path | None) -> int:
    """Print the plan of a validated config."""
    # Imported here: polars is not needed to draw an episode.
    from coordgap.config.keys import unfilled_keys
    from coordgap.plan import actual, api_key_variables, estimate, render, write_csv

    lines = estimate(config, root)
    sys.stdout.write(f"Plan of {names}\n\n{render(lines, actual(config, root))}")
    if keys := unfilled_keys(config, ""):
        sys.stdout.write("\nFill in before running: " + ", ".join(k[1:] for k in keys) + "\n")
    if variables := api_key_variables(config):
        sys.stdout.write("API keys to export: " + ", ".join(variables) + "\n")
    if csv_path is not None:
        write_csv(lines, csv_path)
    return 0


def _art_runtime() -> int:
    """Build ART's vLLM runtime where GPU jobs look for it; 1 when this node cannot."""
    # Imported here, as for plan: drawing an episode needs neither.
    from coordgap.site import load_site
    from coordgap.training.art_runtime import RuntimeUnavailable, prepare_runtime

    try:
        server = prepare_runtime(load_site().scratch)
    except RuntimeUnavailable as error:
        sys.stderr.write(f"{error}\n")
        return 1
    sys.stdout.write(f"ART's vLLM runtime is ready: {server}\n")
    return 0

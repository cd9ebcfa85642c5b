"""Adapter of rule evaluate_checkpoints: a run's checkpoints play validation in one job."""

from pathlib import Path

import polars as pl

from coordgap.agents.runner import CellOutputs
from coordgap.config.play import accepted_error_share
from coordgap.config.training import TrainingRunConfig
from coordgap.data import step_label
from coordgap.evaluation.checkpoints import CheckpointJob
from coordgap.logs import job_log
from coordgap.provenance import write_record
from coordgap.tracking import tracked
from coordgap.training.history import rollout_rewards

with job_log(snakemake.log[0], "evaluate_checkpoints") as log:
    run = TrainingRunConfig.from_dict(snakemake.wildcards.run, snakemake.params.run)
    steps = snakemake.params.steps
    # The task the run ends on: its last step's table size.
    n = run.n_at(run.steps - 1)
    episodes = snakemake.params.episodes
    log.info("run %s, checkpoints %s: %d episodes each at N=%d", run.name, steps, episodes, n)
    CheckpointJob.of(
        snakemake.params,
        snakemake.input,
        snakemake.resources.serve_host,
        accepted_error_share(snakemake.config),
    ).validate(run.name, steps, n, episodes, folder=Path(snakemake.output.validation))
    with tracked(snakemake.config, run.name, "validation") as stream:
        for step in steps:
            cell = CellOutputs.at(Path(snakemake.output.validation) / step_label(step))
            stream.log(step, rollout_rewards(pl.read_parquet(cell.episodes), run))
    write_record(snakemake.output.provenance, snakemake.params.provenance, root=Path.cwd())

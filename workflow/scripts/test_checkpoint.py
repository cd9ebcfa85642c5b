"""Adapter of rule test_checkpoint: a selected checkpoint plays one cell of the test grid."""

from pathlib import Path

import polars as pl

from coordgap.agents.runner import CellOutputs
from coordgap.config.play import accepted_error_share
from coordgap.config.training import TrainingRunConfig
from coordgap.evaluation.checkpoints import CheckpointJob, chosen_step
from coordgap.logs import job_log
from coordgap.provenance import write_record
from coordgap.tracking import tracked
from coordgap.training.history import rollout_rewards

with job_log(snakemake.log[0], "test_checkpoint") as log:
    wildcards = snakemake.wildcards
    name = f"{wildcards.run}@{wildcards.policy}"
    step = chosen_step(Path(snakemake.input.choice))
    log.info("%s is checkpoint %d; N=%s", name, step, wildcards.size)
    CheckpointJob.of(
        snakemake.params,
        snakemake.input,
        snakemake.resources.serve_host,
        accepted_error_share(snakemake.config),
    ).play(
        name,
        step,
        n=int(wildcards.size),
        episodes=snakemake.params.episodes,
        outputs=CellOutputs(
            episodes=Path(snakemake.output.episodes),
            steps=Path(snakemake.output.steps),
            transcripts=Path(snakemake.output.transcripts),
        ),
    )
    # The run's reward weights summarize the cell as they do its training and validation; the
    # config, not a param, gives them: tracking is a view that never reruns a job.
    run = TrainingRunConfig.from_dict(
        wildcards.run, snakemake.config["training"]["runs"][wildcards.run]
    )
    stream_name = f"test/{wildcards.policy}/n{wildcards.size}"
    with tracked(snakemake.config, run.name, stream_name) as stream:
        stream.log(step, rollout_rewards(pl.read_parquet(snakemake.output.episodes), run))
    write_record(snakemake.output.provenance, snakemake.params.provenance, root=Path.cwd())

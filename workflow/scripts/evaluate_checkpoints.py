"""Adapter of rule evaluate_checkpoints: a run's checkpoints play validation in one job."""

from pathlib import Path

from coordgap.config.play import accepted_error_share
from coordgap.config.training import TrainingRunConfig
from coordgap.evaluation.checkpoints import CheckpointJob
from coordgap.logs import job_log
from coordgap.provenance import write_record

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
    write_record(snakemake.output.provenance, snakemake.params.provenance, root=Path.cwd())

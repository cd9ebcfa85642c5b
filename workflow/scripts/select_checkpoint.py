"""Adapter of rule select_checkpoint: the checkpoint one selection policy keeps of one run."""

from pathlib import Path

from coordgap.config.training import TrainingRunConfig
from coordgap.data import STEP_GLOB
from coordgap.evaluation.checkpoints import selection, write_json
from coordgap.logs import job_log

with job_log(snakemake.log[0], "select_checkpoint") as log:
    run = TrainingRunConfig.from_dict(snakemake.wildcards.run, snakemake.params.run)
    policy = snakemake.wildcards.policy
    chosen = selection(
        run=run,
        policies=[policy],
        rollouts=sorted(Path(snakemake.input.rollouts).glob(f"{STEP_GLOB}.parquet")),
        validation=sorted(Path(snakemake.input.validation).glob(f"{STEP_GLOB}.parquet")),
        intervals=snakemake.params.analysis,
    )["choices"][policy]
    write_json(chosen, Path(snakemake.output[0]))
    log.info("run %s, %s: step %d", run.name, policy, chosen["step"])

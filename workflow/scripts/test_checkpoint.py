"""Adapter of rule test_checkpoint: a selected checkpoint plays one cell of the test grid."""

from pathlib import Path

from coordgap.evaluation.checkpoints import chosen_step, play_checkpoint_job
from coordgap.logs import job_log

with job_log(snakemake.log[0], "test_checkpoint") as log:
    wildcards = snakemake.wildcards
    name = f"{wildcards.run}@{wildcards.policy}"
    step = chosen_step(Path(snakemake.input.choice))
    log.info("%s is checkpoint %d; N=%s", name, step, wildcards.size)
    play_checkpoint_job(
        snakemake, name=name, step=step, n=int(wildcards.size), episodes=snakemake.params.episodes
    )

"""Adapter of rule evaluate_checkpoint: one checkpoint plays the validation scenarios."""

from coordgap.config import TrainingRunConfig
from coordgap.evaluation.checkpoints import play_checkpoint_job
from coordgap.logs import job_log

with job_log(snakemake.log[0], "evaluate_checkpoint") as log:
    run = TrainingRunConfig.from_dict(snakemake.wildcards.run, snakemake.params.run)
    step = int(snakemake.wildcards.step)
    # The task the run ends on: its last step's table size.
    n = run.n_at(run.steps - 1)
    episodes = snakemake.params.episodes
    log.info("run %s, checkpoint %d: %d episodes at N=%d", run.name, step, episodes, n)
    play_checkpoint_job(snakemake, name=run.name, step=step, n=n, episodes=episodes)

"""Adapter of rule evaluate_checkpoint: one checkpoint plays the validation scenarios."""

from pathlib import Path

from coordgap.agents.runner import CellOutputs
from coordgap.analysis.provenance import write_record
from coordgap.config import EnvironmentConfig, TrainingRunConfig
from coordgap.env.observation import PromptTemplates
from coordgap.evaluation.checkpoints import play_checkpoint
from coordgap.logs import job_log

with job_log(snakemake.log[0], "evaluate_checkpoint") as log:
    run = TrainingRunConfig.from_dict(snakemake.wildcards.run, snakemake.params.run)
    step = int(snakemake.wildcards.step)
    # The task the run ends on: its last step's table size.
    n = run.n_at(run.steps - 1)
    episodes = snakemake.params.episodes
    log.info("run %s, checkpoint %d: %d episodes at N=%d", run.name, step, episodes, n)
    play_checkpoint(
        name=run.name,
        base=snakemake.params.base,
        checkpoints=Path(snakemake.input.checkpoints),
        step=step,
        n=n,
        env=EnvironmentConfig.from_dict(snakemake.params.environment),
        episodes=episodes,
        base_seed=snakemake.params.seed,
        first_scenario=snakemake.params.first_scenario,
        weights=Path(snakemake.input.weights),
        templates=PromptTemplates.load(snakemake.input.prompts),
        outputs=CellOutputs(
            episodes=Path(snakemake.output.episodes),
            steps=Path(snakemake.output.steps),
            transcripts=Path(snakemake.output.transcripts),
        ),
        serve_host=snakemake.resources.serve_host,
    )
    write_record(snakemake.output.provenance, snakemake.params.provenance, root=Path.cwd())

"""Adapter of rule test_checkpoint: a selected checkpoint plays one cell of the test grid."""

from pathlib import Path

from coordgap.agents.runner import CellOutputs
from coordgap.analysis.provenance import write_record
from coordgap.config import EnvironmentConfig
from coordgap.env.observation import PromptTemplates
from coordgap.evaluation.checkpoints import chosen_step, play_checkpoint
from coordgap.logs import job_log

with job_log(snakemake.log[0], "test_checkpoint") as log:
    wildcards = snakemake.wildcards
    name = f"{wildcards.run}@{wildcards.policy}"
    step = chosen_step(Path(snakemake.input.choice))
    log.info("%s is checkpoint %d; N=%s", name, step, wildcards.size)
    play_checkpoint(
        name=name,
        base=snakemake.params.base,
        checkpoints=Path(snakemake.input.checkpoints),
        step=step,
        n=int(wildcards.size),
        env=EnvironmentConfig.from_dict(snakemake.params.environment),
        episodes=snakemake.params.episodes,
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

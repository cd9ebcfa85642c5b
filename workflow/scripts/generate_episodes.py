"""Adapter of rule generate_episodes: play one model x N cell of episodes."""

from pathlib import Path

from coordgap.agents.generate import generate_cell
from coordgap.agents.runner import CellOutputs
from coordgap.config.play import EnvironmentConfig, ModelSpec, accepted_error_share
from coordgap.env.observation import PromptTemplates
from coordgap.logs import job_log
from coordgap.provenance import write_record

with job_log(snakemake.log[0], "generate_episodes") as log:
    model = ModelSpec.from_dict(snakemake.wildcards.model, snakemake.params.model)
    n = int(snakemake.wildcards.size)
    log.info("model %s, N=%d, %d episodes", model.name, n, snakemake.params.episodes)
    generate_cell(
        model=model,
        n=n,
        env=EnvironmentConfig.from_dict(snakemake.params.environment),
        episodes=snakemake.params.episodes,
        base_seed=snakemake.params.seed,
        first_scenario=snakemake.params.first_scenario,
        outputs=CellOutputs(
            episodes=Path(snakemake.output.episodes),
            steps=Path(snakemake.output.steps),
            transcripts=Path(snakemake.output.transcripts),
        ),
        templates=PromptTemplates.load(snakemake.input.prompts),
        # Only local models have prepared weights. `in` on a Namedlist tests its values, so
        # the names are asked for explicitly.
        weights=Path(snakemake.input.weights) if "weights" in snakemake.input.keys() else None,  # noqa: SIM118
        serve_host=snakemake.resources.serve_host,
        max_error_share=accepted_error_share(snakemake.config),
    )
    # Snakemake runs the job in the workflow's folder: its git checkout is the code's.
    write_record(snakemake.output.provenance, snakemake.params.provenance, root=Path.cwd())

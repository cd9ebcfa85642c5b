"""Adapter of rule generate_episodes: play one model x N cell of episodes."""

from coordgap.config import EnvironmentConfig, ModelSpec
from coordgap.episodes import generate_cell
from coordgap.logs import job_log

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
        episodes_path=snakemake.output.episodes,
        steps_path=snakemake.output.steps,
    )

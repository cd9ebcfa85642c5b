"""Adapter of rule compare_seeds: every arm seed by seed, and the seed-level comparisons."""

from coordgap.analysis.seeds import write_seed_tables
from coordgap.config.analysis import AnalysisConfig
from coordgap.logs import job_log

with job_log(snakemake.log[0], "compare_seeds") as log:
    arms = snakemake.params.arms
    log.info("%d arms, %d runs", len(arms), sum(map(len, arms.values())))
    write_seed_tables(
        episode_paths=snakemake.input.episodes,
        arms=arms,
        policies=snakemake.params.policies,
        pairs=[tuple(pair) for pair in snakemake.params.analysis["seed_comparisons"]],
        config=AnalysisConfig.from_dict(snakemake.params.reward, snakemake.params.analysis),
        out_seeds=snakemake.output.seeds,
        out_comparisons=snakemake.output.comparisons,
        alpha=snakemake.params.alpha,
        power=snakemake.params.power,
    )

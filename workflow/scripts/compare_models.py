"""Adapter of rule compare_models: the pairwise comparisons of every family."""

from coordgap.analysis.comparisons import write_comparisons
from coordgap.config.analysis import ComparisonConfig
from coordgap.logs import job_log

with job_log(snakemake.log[0], "compare_models") as log:
    log.info("%d episode tables", len(snakemake.input.episodes))
    write_comparisons(
        episode_paths=snakemake.input.episodes,
        config=ComparisonConfig.from_dict(
            snakemake.params.reward, snakemake.params.analysis, snakemake.params.checkpoints
        ),
        out_csv=snakemake.output[0],
    )

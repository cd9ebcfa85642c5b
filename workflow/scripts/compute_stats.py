"""Adapter of rule compute_stats: summary table, pairwise comparisons and DVC metrics."""

from coordgap.analysis.stats import write_stats
from coordgap.config import AnalysisConfig
from coordgap.logs import job_log

with job_log(snakemake.log[0], "compute_stats") as log:
    log.info("%d episode tables", len(snakemake.input.episodes))
    write_stats(
        episode_paths=snakemake.input.episodes,
        config=AnalysisConfig.from_dict(snakemake.params.reward, snakemake.params.analysis),
        summary_csv=snakemake.output.summary,
        comparisons_csv=snakemake.output.comparisons,
        metrics_json=snakemake.output.metrics,
    )

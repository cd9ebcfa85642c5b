"""Adapter of rule compute_stats: the summary, its breakdowns and the DVC metrics."""

from pathlib import Path

from coordgap.analysis.stats import StatsOutputs, write_stats
from coordgap.config.analysis import AnalysisConfig
from coordgap.logs import job_log

with job_log(snakemake.log[0], "compute_stats") as log:
    log.info("%d episode tables", len(snakemake.input.episodes))
    output = snakemake.output
    write_stats(
        episode_paths=snakemake.input.episodes,
        config=AnalysisConfig.from_dict(snakemake.params.reward, snakemake.params.analysis),
        outputs=StatsOutputs(
            summary=output.summary,
            components=output.components,
            seats=output.seats,
            episode_rewards=output.episode_rewards,
            # Each declared file is results/metrics/<model>.json (rules/common.smk: metric_targets).
            metrics={Path(path).name.removesuffix(".json"): path for path in output.metrics},
        ),
    )

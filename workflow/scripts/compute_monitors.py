"""Adapter of rule compute_monitors: the degenerate-policy monitors of every model x N cell."""

from coordgap.analysis.monitors import write_monitors
from coordgap.config.analysis import MonitorConfig
from coordgap.logs import job_log

with job_log(snakemake.log[0], "compute_monitors") as log:
    log.info("%d episode tables", len(snakemake.input.episodes))
    write_monitors(
        episode_paths=snakemake.input.episodes,
        config=MonitorConfig.from_dict(snakemake.params.reward, snakemake.params.monitors),
        out_csv=snakemake.output[0],
    )

"""Adapter of rule plot_timeline: the configured episode, seat by seat and round by round."""

from coordgap.analysis.timeline import write_timeline
from coordgap.logs import job_log

with job_log(snakemake.log[0], "plot_timeline"):
    write_timeline(
        episodes_path=snakemake.input.episodes,
        steps=snakemake.input.steps,
        episode=snakemake.params.episode,
        png=snakemake.output.png,
        pdf=snakemake.output.pdf,
        csv=snakemake.output.csv,
    )

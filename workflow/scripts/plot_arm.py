"""Adapter of rule plot_arm: an arm's seeds over training, overlaid."""

from coordgap.analysis.training import write_arm_figure
from coordgap.logs import job_log

with job_log(snakemake.log[0], "plot_arm"):
    write_arm_figure(
        arm=snakemake.wildcards.arm,
        histories=dict(zip(snakemake.params.runs, snakemake.input.histories, strict=True)),
        png=snakemake.output.png,
        pdf=snakemake.output.pdf,
        csv=snakemake.output.csv,
    )

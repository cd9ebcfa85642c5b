"""Adapter of rule plot_training: a run's training and validation curve with its selections."""

from coordgap.analysis.training import write_training_figure
from coordgap.logs import job_log

with job_log(snakemake.log[0], "plot_training"):
    write_training_figure(
        selection_json=snakemake.input.selection,
        png=snakemake.output.png,
        pdf=snakemake.output.pdf,
        csv=snakemake.output.csv,
    )

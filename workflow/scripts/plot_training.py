"""Adapter of rule plot_training: a run's reward curves and selections, and its policy's moves."""

from coordgap.analysis.training import write_training_figure
from coordgap.logs import job_log

with job_log(snakemake.log[0], "plot_training"):
    write_training_figure(
        selection_json=snakemake.input.selection,
        history=snakemake.input.history,
        png=snakemake.output.png,
        pdf=snakemake.output.pdf,
        csv=snakemake.output.csv,
    )

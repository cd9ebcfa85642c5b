"""Adapter of rule plot_deadlock: deadlock rate by model and N, with Wilson intervals."""

from coordgap.analysis.figures import write_figure
from coordgap.logs import job_log

with job_log(snakemake.log[0], "plot_deadlock"):
    write_figure(
        figure="deadlock",
        table_csv=snakemake.input.summary,
        png=snakemake.output.png,
        pdf=snakemake.output.pdf,
        csv=snakemake.output.csv,
    )

"""Adapter of rule plot_meals_by_seat: mean meals at each seat, by model and N."""

from coordgap.analysis.figures import write_figure
from coordgap.logs import job_log

with job_log(snakemake.log[0], "plot_meals_by_seat"):
    write_figure(
        figure="meals_by_seat",
        table_csv=snakemake.input.seats,
        png=snakemake.output.png,
        pdf=snakemake.output.pdf,
        csv=snakemake.output.csv,
    )

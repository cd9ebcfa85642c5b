"""Adapter of rule plot_reward: mean reward by model and N, with confidence intervals."""

from coordgap.analysis.figures import write_figure
from coordgap.logs import job_log

with job_log(snakemake.log[0], "plot_reward"):
    write_figure(
        figure="reward",
        table_csv=snakemake.input.summary,
        png=snakemake.output.png,
        pdf=snakemake.output.pdf,
        csv=snakemake.output.csv,
        variant=snakemake.wildcards.variant,
    )

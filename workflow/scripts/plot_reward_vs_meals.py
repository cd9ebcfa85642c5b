"""Adapter of rule plot_reward_vs_meals: every episode's reward against its meals."""

from coordgap.analysis.figures import write_figure
from coordgap.logs import job_log

with job_log(snakemake.log[0], "plot_reward_vs_meals"):
    write_figure(
        figure="reward_vs_meals",
        table_csv=snakemake.input.episode_rewards,
        png=snakemake.output.png,
        pdf=snakemake.output.pdf,
        csv=snakemake.output.csv,
        variant=snakemake.wildcards.variant,
    )

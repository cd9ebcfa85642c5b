"""Adapter of rule plot_reward_vs_meals: every episode's reward against its meals."""

from coordgap.analysis.figures import write_reward_vs_meals_figure
from coordgap.logs import job_log

with job_log(snakemake.log[0], "plot_reward_vs_meals"):
    write_reward_vs_meals_figure(
        episode_rewards_csv=snakemake.input.episode_rewards,
        variant=snakemake.wildcards.variant,
        png=snakemake.output.png,
        pdf=snakemake.output.pdf,
        csv=snakemake.output.csv,
    )

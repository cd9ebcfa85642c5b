# Statistics, monitors, figures and the report. Each rule's code param digests exactly the
# src/ modules its adapter imports (code_of), and its other params hold exactly the config it
# reads, so that a job reruns when, and only when, something it depends on changes.


rule compute_stats:
    input:
        episodes=analysis_tables(),
    output:
        summary=report(
            "results/stats/summary.csv",
            caption="../workflow/report/table_summary.rst",
            category="Tables",
            labels={"table": "summary"},
        ),
        components=report(
            "results/stats/components.csv",
            caption="../workflow/report/table_components.rst",
            category="Tables",
            labels={"table": "reward components"},
        ),
        seats=report(
            "results/stats/seats.csv",
            caption="../workflow/report/table_seats.rst",
            category="Tables",
            labels={"table": "meals by seat"},
        ),
        episode_rewards=report(
            "results/stats/episode_rewards.csv",
            caption="../workflow/report/table_episode_rewards.rst",
            category="Tables",
            labels={"table": "episode rewards"},
        ),
        metrics="results/metrics.json",
    params:
        code=code_of("compute_stats"),
        reward=lookup(dpath="reward", within=config),
        analysis=analysis_settings("confidence", "bootstrap_resamples", "seed"),
    log:
        "logs/compute_stats/compute_stats.log",
    benchmark:
        "logs/compute_stats/compute_stats.benchmark.tsv"
    resources:
        **RESOURCES["light"],
        **site_resources(),
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/compute_stats.py"


rule compare_models:
    input:
        episodes=analysis_tables(),
    output:
        report(
            "results/stats/comparisons.csv",
            caption="../workflow/report/table_comparisons.rst",
            category="Tables",
            labels={"table": "comparisons"},
        ),
    params:
        code=code_of("compare_models"),
        reward=lookup(dpath="reward", within=config),
        analysis=analysis_settings(
            "confidence", "bootstrap_resamples", "seed", "comparisons", "power"
        ),
        checkpoints=checkpoint_families(config),
    log:
        "logs/compare_models/compare_models.log",
    benchmark:
        "logs/compare_models/compare_models.benchmark.tsv"
    resources:
        **RESOURCES["light"],
        **site_resources(),
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/compare_models.py"


rule compute_power:
    input:
        summary="results/stats/summary.csv",
        paper_reference="config/paper_reference.yaml",
    output:
        report(
            "results/stats/power.csv",
            caption="../workflow/report/table_power.rst",
            category="Tables",
            labels={"table": "power"},
        ),
    params:
        code=code_of("compute_power"),
        power=lookup(dpath="analysis/power", within=config),
    log:
        "logs/compute_power/compute_power.log",
    benchmark:
        "logs/compute_power/compute_power.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/compute_power.py"


rule compute_monitors:
    input:
        episodes=analysis_tables(),
    output:
        report(
            "results/stats/monitors.csv",
            caption="../workflow/report/table_monitors.rst",
            category="Tables",
            labels={"table": "monitors"},
        ),
    params:
        code=code_of("compute_monitors"),
        reward=lookup(dpath="reward", within=config),
        monitors=lookup(dpath="analysis/monitors", within=config),
    log:
        "logs/compute_monitors/compute_monitors.log",
    benchmark:
        "logs/compute_monitors/compute_monitors.benchmark.tsv"
    resources:
        **RESOURCES["light"],
        **site_resources(),
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/compute_monitors.py"


rule plot_reward:
    input:
        summary="results/stats/summary.csv",
    output:
        png=report(
            "results/figures/reward_{variant}.png",
            caption="../workflow/report/figure_reward.rst",
            category="Figures",
            labels={"figure": "reward by model and N", "variant": "{variant}"},
        ),
        pdf="results/figures/reward_{variant}.pdf",
        csv="results/figures/reward_{variant}.csv",
    params:
        code=code_of("plot_reward"),
    log:
        "logs/plot_reward/{variant}.log",
    benchmark:
        "logs/plot_reward/{variant}.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/plot_reward.py"


rule plot_deadlock:
    input:
        summary="results/stats/summary.csv",
    output:
        png=report(
            "results/figures/deadlock.png",
            caption="../workflow/report/figure_deadlock.rst",
            category="Figures",
            labels={"figure": "deadlock rate by model and N", "variant": "any"},
        ),
        pdf="results/figures/deadlock.pdf",
        csv="results/figures/deadlock.csv",
    params:
        code=code_of("plot_deadlock"),
    log:
        "logs/plot_deadlock/plot_deadlock.log",
    benchmark:
        "logs/plot_deadlock/plot_deadlock.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/plot_deadlock.py"


rule plot_reward_vs_meals:
    input:
        episode_rewards="results/stats/episode_rewards.csv",
    output:
        png=report(
            "results/figures/reward_vs_meals_{variant}.png",
            caption="../workflow/report/figure_reward_vs_meals.rst",
            category="Figures",
            labels={"figure": "reward against meals", "variant": "{variant}"},
        ),
        pdf="results/figures/reward_vs_meals_{variant}.pdf",
        csv="results/figures/reward_vs_meals_{variant}.csv",
    params:
        code=code_of("plot_reward_vs_meals"),
    log:
        "logs/plot_reward_vs_meals/{variant}.log",
    benchmark:
        "logs/plot_reward_vs_meals/{variant}.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/plot_reward_vs_meals.py"


rule plot_components:
    input:
        components="results/stats/components.csv",
    output:
        png=report(
            "results/figures/components_{variant}.png",
            caption="../workflow/report/figure_components.rst",
            category="Figures",
            labels={"figure": "reward by term", "variant": "{variant}"},
        ),
        pdf="results/figures/components_{variant}.pdf",
        csv="results/figures/components_{variant}.csv",
    params:
        code=code_of("plot_components"),
    log:
        "logs/plot_components/{variant}.log",
    benchmark:
        "logs/plot_components/{variant}.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/plot_components.py"


rule plot_meals_by_seat:
    input:
        seats="results/stats/seats.csv",
    output:
        png=report(
            "results/figures/meals_by_seat.png",
            caption="../workflow/report/figure_meals_by_seat.rst",
            category="Figures",
            labels={"figure": "meals by seat", "variant": "any"},
        ),
        pdf="results/figures/meals_by_seat.pdf",
        csv="results/figures/meals_by_seat.csv",
    params:
        code=code_of("plot_meals_by_seat"),
    log:
        "logs/plot_meals_by_seat/plot_meals_by_seat.log",
    benchmark:
        "logs/plot_meals_by_seat/plot_meals_by_seat.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/plot_meals_by_seat.py"


rule plot_timeline:
    input:
        unpack(timeline_tables),
    output:
        png=report(
            "results/figures/timeline.png",
            caption="../workflow/report/figure_timeline.rst",
            category="Figures",
            labels={"figure": "one episode, step by step", "variant": "any"},
        ),
        pdf="results/figures/timeline.pdf",
        csv="results/figures/timeline.csv",
    params:
        code=code_of("plot_timeline"),
        episode=lookup(dpath="analysis/timeline/episode", within=config),
    log:
        "logs/plot_timeline/plot_timeline.log",
    benchmark:
        "logs/plot_timeline/plot_timeline.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/plot_timeline.py"


rule write_report:
    input:
        summary="results/stats/summary.csv",
        comparisons="results/stats/comparisons.csv",
        power="results/stats/power.csv",
        monitors="results/stats/monitors.csv",
        tables=[
            "results/stats/components.csv",
            "results/stats/seats.csv",
            "results/stats/episode_rewards.csv",
        ],
        figures=report_figures(),
        timeline="results/figures/timeline.png",
        selections=selection_targets(),
        training_figures=expand("results/figures/training_{run}.png", run=RUNS),
        records=provenance_records(),
        paper_reference="config/paper_reference.yaml",
    output:
        report(
            "results/report.md",
            caption="../workflow/report/report_md.rst",
            category="Report",
            labels={"file": "report.md"},
        ),
    params:
        code=code_of("write_report"),
        # The whole config: the report's setup section states its digest.
        config=config,
    log:
        "logs/write_report/write_report.log",
    benchmark:
        "logs/write_report/write_report.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/write_report.py"


rule plot_training:
    input:
        selection="results/eval/{run}/selection.json",
        history="results/train/{run}/history.parquet",
    output:
        png=report(
            "results/figures/training_{run}.png",
            caption="../workflow/report/figure_training.rst",
            category="Figures",
            labels={"figure": "training curve and checkpoint selection", "run": "{run}"},
        ),
        pdf="results/figures/training_{run}.pdf",
        csv="results/figures/training_{run}.csv",
    params:
        code=code_of("plot_training"),
    log:
        "logs/plot_training/{run}.log",
    benchmark:
        "logs/plot_training/{run}.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/plot_training.py"

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
        metrics=metric_targets(),
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


rule compare_seeds:
    input:
        episodes=analysis_tables(),
    output:
        seeds=report(
            "results/stats/seeds.csv",
            caption="../workflow/report/table_seeds.rst",
            category="Tables",
            labels={"table": "seeds"},
        ),
        comparisons=report(
            "results/stats/seed_comparisons.csv",
            caption="../workflow/report/table_seed_comparisons.rst",
            category="Tables",
            labels={"table": "seed comparisons"},
        ),
    params:
        code=code_of("compare_seeds"),
        reward=lookup(dpath="reward", within=config),
        analysis=analysis_settings("confidence", "bootstrap_resamples", "seed", "seed_comparisons"),
        # The detectable effect's alpha and power: not effect_size, which it does not read.
        alpha=lookup(dpath="analysis/power/alpha", within=config),
        power=lookup(dpath="analysis/power/power", within=config),
        arms=COMPARED_ARMS,
        policies=POLICIES,
    log:
        "logs/compare_seeds/compare_seeds.log",
    benchmark:
        "logs/compare_seeds/compare_seeds.benchmark.tsv"
    resources:
        **RESOURCES["light"],
        **site_resources(),
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/compare_seeds.py"


# The positive control's check (analysis.control): in the DAG only where the study has one.
rule check_control:
    input:
        episodes=control_tables,
        histories=control_histories,
    output:
        report(
            CONTROL_TABLE,
            caption="../workflow/report/table_control.rst",
            category="Tables",
            labels={"table": "positive control"},
        ),
    params:
        code=code_of("check_control"),
        analysis=analysis_settings("control"),
        runs=ARMS[CONTROL["run"]] if CONTROL else [],
    log:
        "logs/check_control/check_control.log",
    benchmark:
        "logs/check_control/check_control.benchmark.tsv"
    resources:
        **RESOURCES["light"],
        **site_resources(),
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/check_control.py"


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


# One plot rule per figure of the catalog (coordgap.analysis.catalog), named plot_<name>. The
# caption param feeds the Snakemake report's caption (workflow/report/figure.rst).
for figure in STATISTICS_FIGURES:
    # logs/plot_<name>/<variant>.log, or plot_<name>.log for a figure drawn once.
    log_stem = f"logs/plot_{figure.name}/" + (
        "{variant}" if figure.per_variant else f"plot_{figure.name}"
    )

    rule:
        name:
            f"plot_{figure.name}"
        input:
            table=f"results/stats/{figure.table}.csv",
        output:
            png=report(
                f"results/figures/{figure.stem}.png",
                caption="../workflow/report/figure.rst",
                category="Figures",
                labels={
                    "figure": figure.label,
                    "variant": "{variant}" if figure.per_variant else "any",
                },
            ),
            pdf=f"results/figures/{figure.stem}.pdf",
            csv=f"results/figures/{figure.stem}.csv",
        params:
            code=code_of("plot_figure"),
            figure=figure.name,
            caption=figure.caption,
        log:
            f"{log_stem}.log",
        benchmark:
            f"{log_stem}.benchmark.tsv"
        localrule: True
        conda:
            PROJECT_ENV
        script:
            "../workflow/scripts/plot_figure.py"


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
        seeds="results/stats/seeds.csv",
        seed_comparisons="results/stats/seed_comparisons.csv",
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
        histories=expand("results/train/{run}/history.parquet", run=RUNS),
        arm_figures=expand("results/figures/arm_{arm}.png", arm=SEEDED_ARMS),
        control=control_targets(),
        records=provenance_records(),
        paper_reference="config/paper_reference.yaml",
    output:
        markdown=report(
            REPORT,
            caption="../workflow/report/report_md.rst",
            category="Report",
            labels={"file": "report.md"},
        ),
        page=report(
            REPORT_PAGE,
            caption="../workflow/report/report_html.rst",
            category="Report",
            labels={"file": "report.html"},
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


rule plot_arm:
    input:
        histories=arm_histories,
    output:
        png=report(
            "results/figures/arm_{arm}.png",
            caption="../workflow/report/figure_arm.rst",
            category="Figures",
            labels={"figure": "an arm's seeds over training", "arm": "{arm}"},
        ),
        pdf="results/figures/arm_{arm}.pdf",
        csv="results/figures/arm_{arm}.csv",
    params:
        code=code_of("plot_arm"),
        runs=lambda wildcards: ARMS[wildcards.arm],
    log:
        "logs/plot_arm/{arm}.log",
    benchmark:
        "logs/plot_arm/{arm}.benchmark.tsv"
    conda:
        PROJECT_ENV
    script:
        "../workflow/scripts/plot_arm.py"


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

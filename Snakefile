# coordgap: dining-philosophers coordination of LLM agents, end to end.
#
#   snakemake --cores 8 all                          # local, the embedded CPU default
#   snakemake --workflow-profile profiles/slurm all  # GPU jobs on a SLURM cluster
#   snakemake -n --configfile config/paper.yaml      # the paper's study instead of the default
#
# Rules wire, src/coordgap computes, workflow/scripts adapt (README.md: Layout).

from snakemake.utils import min_version

from coordgap.config.overlays import resolve as resolve_config

min_version("9.19")


# A study file is an overlay on its base (coordgap.config.overlays), which Snakemake's own
# merge of config files cannot express (it never drops a key of the file underneath): the
# config is resolved here from the files as given, the embedded default when none is, before
# rules/common.smk validates it. --config key=value overrides apply last.
RESOLVED = resolve_config(
    workflow.overwrite_configfiles or ["config/config.yaml"], workflow.config_settings.config
)
config.clear()
config.update(RESOLVED.config)
# The bases too: the report lists the config files, and a remote job's source archive needs them.
workflow.configfiles.extend(path for path in RESOLVED.files if path not in workflow.configfiles)


# GPU limits from a profile serialise jobs on one workstation, not across a cluster's nodes.
resource_scopes:
    gpu="local",


report: "workflow/report/workflow.rst"


include: "rules/common.smk"
include: "rules/models.smk"
include: "rules/episodes.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"
include: "rules/analysis.smk"


# ---------------------------------------------------------------- targets


rule all:
    default_target: True
    input:
        final_targets(),


rule episodes:
    input:
        episode_targets(),


rule models:
    input:
        "resources/models/manifest.json",


rule train:
    input:
        "results/train/index.json",


rule evaluate:
    input:
        "results/eval/index.json",
        "results/test/index.json",


# The last line of a successful run points at what to read first.
onsuccess:
    if Path(REPORT).exists():
        print(f"\nDone. Read {REPORT} first: it opens with the findings.")

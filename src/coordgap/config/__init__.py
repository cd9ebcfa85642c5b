"""Typed, frozen experiment configuration, one module per phase, and the cross-key checks.

``config/config.yaml`` is checked against ``workflow/schemas/config.schema.yaml`` (JSON Schema,
``additionalProperties: false`` everywhere) by Snakemake's ``validate()`` and then by
``coordgap.config.checks.check_cross_keys`` for the rules the schema cannot express; both name
the offending key before any job runs. Jobs receive config sections through ``params:`` and
turn them into frozen objects with their ``from_dict`` constructors.

A job imports only its phase's module, so that a change to another phase's settings code
changes nothing the job executes (``coordgap.code``): ``keys`` (errors and placeholders, used by
all), ``play`` (the table and the models: what episodes depend on), ``training`` (runs and the
checkpoints they make), ``analysis`` (statistics and monitors) and ``checks`` (the parse-time
cross-key rules, which import every phase).
"""

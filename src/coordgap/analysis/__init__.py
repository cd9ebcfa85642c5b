"""Statistics, monitors, figures and the report, computed from episode tables.

``stats`` summarises each model x N cell under every reward variant; ``comparisons`` tests
pairs of models and tabulates power; ``monitors`` flags degenerate policies; all three use
``coordgap.intervals``. ``figures`` and ``timeline`` draw them (one look, from ``style``),
``paper`` sets the paper's published numbers beside ours, and ``report`` writes it all, with
the setup's records (``coordgap.provenance``), into ``results/report.md``. Nothing that plays
or trains imports this package.
"""

"""Statistics, monitors, figures and the report, computed from episode tables.

``stats`` summarises each model x N cell under every reward variant; ``comparisons`` tests
pairs of models and tabulates power; ``monitors`` flags degenerate policies; ``intervals``
holds the confidence intervals they share. ``figures`` and ``timeline`` draw them (one look,
from ``style``), ``paper`` sets the paper's published numbers beside ours, ``provenance``
records the setup, and ``report`` writes it all into ``results/report.md``.
"""

"""Statistics, figures and the report, computed from episode tables (DESIGN.md §7).

``stats`` derives every reward variant from the stored components and summarises each model x N
cell with confidence intervals and pairwise tests; ``figures`` plots the summary; ``report``
writes the markdown report beside the paper's published figures.
"""

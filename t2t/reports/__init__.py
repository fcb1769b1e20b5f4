"""Figures and markdown tables of experiment results, one module per figure.

  python -m t2t.reports.heatmap --results=<grid root>/results.jsonl --out=docs/figures/x
  python -m t2t.reports.distribution ...     (restarts: per-target seeds, STILTs Fig. 1)
  python -m t2t.reports.learning_curve ...   (metric vs training-set size)
  python -m t2t.reports.mixing ...           (metric vs a mixing rate's K or temperature T)
  python -m t2t.reports.training_curves --metrics_jsonl=<run>/metrics.jsonl ...

Each writes `<out>.png` (matplotlib, Agg backend) and `<out>.md`. A cell that failed or never ran
is marked (hatched / 'n/a' in the figure, 'n/a' in the table), never dropped.
"""

"""Probe results -> per-layer probe curves (PNG) and a markdown table.

Rows are the JSONL records of `t2t.probing.run`: {checkpoint, layer, pooling, probe_task, metric,
score}. One panel per (probe task, metric, pooling), one line per checkpoint, layers on the x
axis (embeddings, layer_1, ...): Peters et al.'s Figure 2 form (pre-trained vs fine-tuned).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from t2t.probing import representations

REQUIRED_KEYS = ("checkpoint", "layer", "pooling", "probe_task", "metric", "score")


def read_rows(path: str) -> list[dict[str, Any]]:
  """The rows of a results JSONL file (each must have ``REQUIRED_KEYS``)."""
  rows = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if line.strip():
        row = json.loads(line)
        missing = [k for k in REQUIRED_KEYS if k not in row]
        if missing:
          raise ValueError(f"{path}:{number}: a probe row lacks {missing}.")
        rows.append(row)
  return rows


def _panels(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], dict[str, dict[str, float]]]:
  """{(probe task, metric, pooling): {checkpoint: {layer: score}}}."""
  panels: dict = {}
  for row in rows:
    key = (row["probe_task"], row["metric"], row["pooling"])
    panels.setdefault(key, {}).setdefault(row["checkpoint"], {})[row["layer"]] = float(row["score"])
  return panels


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
  """A table per panel: one row per checkpoint, one column per layer."""
  lines = ["# Probe curves", ""]
  for (task, metric, pooling), curves in _panels(rows).items():
    layers = sorted({layer for curve in curves.values() for layer in curve},
                    key=representations.layer_index)
    lines += [f"## {task}: {metric} ({pooling} pooling)", "",
              "| checkpoint | " + " | ".join(layers) + " |",
              "|---|" + "---:|" * len(layers)]
    for checkpoint, curve in curves.items():
      cells = [f"{curve[layer]:.1f}" if layer in curve else "" for layer in layers]
      lines.append(f"| {checkpoint} | " + " | ".join(cells) + " |")
    lines.append("")
  return "\n".join(lines)


def plot(rows: Sequence[Mapping[str, Any]], path: str) -> str:
  """Writes the probe curves to ``path`` (PNG, matplotlib Agg) and returns it."""
  import matplotlib  # Deferred: only reports need it.
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = _panels(rows)
  if not panels:
    raise ValueError("no probe rows to plot.")
  fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.5), squeeze=False)
  for ax, ((task, metric, pooling), curves) in zip(axes[0], panels.items()):
    layers = sorted({layer for curve in curves.values() for layer in curve},
                    key=representations.layer_index)
    for checkpoint, curve in curves.items():
      xs = [i for i, layer in enumerate(layers) if layer in curve]
      ax.plot(xs, [curve[layers[i]] for i in xs], marker="o", label=checkpoint)
    ax.set_xticks(range(len(layers)))
    ax.set_xticklabels(layers, rotation=30, ha="right", fontsize=8)
    ax.set_title(f"{task} ({pooling})", fontsize=9)
    ax.set_ylabel(metric)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def write_report(rows: Sequence[Mapping[str, Any]], output_dir: str) -> tuple[str, str]:
  """Writes ``probe_curves.png`` and ``probe_report.md`` into ``output_dir``; returns their paths."""
  os.makedirs(output_dir, exist_ok=True)
  png = plot(rows, os.path.join(output_dir, "probe_curves.png"))
  md = os.path.join(output_dir, "probe_report.md")
  with open(md, "w") as f:
    f.write(markdown(rows) + "\n![probe curves](probe_curves.png)\n")
  return png, md

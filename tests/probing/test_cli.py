"""`python -m t2t.probing` end to end on bbc_topic with tiny T5 checkpoints; the report by hand."""
import importlib
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from t2t.models import t5_encoder, transformer
from t2t.probing import report
from t2t.training import checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = dict(d_model=16, num_heads=2, d_kv=8, d_ff=32, num_encoder_layers=2, num_decoder_layers=1)
BINDINGS = [f"T5Config.{k} = {v}" for k, v in TINY.items()]


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
  """Two random tiny T5 encoders (seeds 0 and 1) saved as t2t checkpoints."""
  root = tmp_path_factory.mktemp("probe_ckpts")
  encoder = t5_encoder.T5EncoderStates(transformer.T5Config(vocab_size=8192, **TINY))
  paths = []
  for seed in (0, 1):
    params = encoder.init(jax.random.PRNGKey(seed), np.ones((1, 4), np.int32), None, False)
    ckpt = checkpoints.Checkpointer(str(root / f"seed{seed}"))
    ckpt.save(10, nn.unbox(params["params"]), {}, {})
    ckpt.close()
    paths.append(str(root / f"seed{seed}"))
  return paths


def test_cli_writes_rows_curves_and_markdown(two_checkpoints, tmp_path):
  out = tmp_path / "probe"
  args = [sys.executable, "-m", "t2t.probing", "--gin_file=probing/t5_tiny.gin",
          f"--gin.probe.checkpoints={two_checkpoints!r}", f"--gin.probe.output_dir='{out}'",
          "--gin.probe.max_examples=40", "--gin.probe.max_length=32",
          "--gin.probe.poolings=['mean', 'first']"] + [f"--gin_bindings={b}" for b in BINDINGS]
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [json.loads(line) for line in (out / "probe_results.jsonl").read_text().splitlines()]
  # 2 checkpoints x 3 layers (embeddings, layer_1, layer_2) x 2 poolings, accuracy each.
  assert len(rows) == 12
  assert {(r["checkpoint"].split("/")[-1], r["layer"], r["pooling"]) for r in rows} == {
      (c, l, p) for c in ("seed0", "seed1") for l in ("embeddings", "layer_1", "layer_2")
      for p in ("mean", "first")}
  assert all(r["probe_task"] == "bbc_topic" and r["metric"] == "accuracy" and r["step"] == 10
             and 0.0 <= r["score"] <= 100.0 for r in rows)
  assert (out / "probe_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "## bbc_topic: accuracy (mean pooling)" in (out / "probe_report.md").read_text()
  assert "seed0 embeddings mean bbc_topic accuracy" in result.stdout


def test_probe_refuses_a_layer_the_checkpoint_lacks(two_checkpoints, tmp_path):
  importlib.import_module("tasks")  # registers bbc_topic
  from t2t.probing import run
  encoder = t5_encoder.T5EncoderStates(transformer.T5Config(vocab_size=8192, **TINY))
  with pytest.raises(ValueError, match=r"seed0 has no layer 'layer_4'; it has 3 states: "
                                       r"embeddings, layer_1, layer_2\."):
    run.probe(checkpoints=two_checkpoints[:1], encoder=encoder, probe_task="bbc_topic",
              output_dir=str(tmp_path), layers=["layer_4"], max_examples=4, max_length=16)


def test_probe_with_edge_windows_on_bbc_topic(two_checkpoints, tmp_path):
  importlib.import_module("tasks")
  from t2t.probing import run
  encoder = t5_encoder.T5EncoderStates(transformer.T5Config(vocab_size=8192, **TINY))
  rows = run.probe(checkpoints=two_checkpoints[:1], encoder=encoder, probe_task="bbc_topic",
                   output_dir=str(tmp_path), layers=["embeddings", "layer_2"], max_examples=30,
                   max_length=24, edge_window=4, edge_steps=5)
  edge_rows = [r for r in rows if r["pooling"] == "span"]
  assert [(r["layer"], r["probe_task"]) for r in edge_rows] == [
      ("embeddings", "bbc_topic_window4"), ("layer_2", "bbc_topic_window4")]
  assert all(0.0 <= r["score"] <= 100.0 for r in edge_rows)


def test_markdown_and_plot_by_hand(tmp_path):
  rows = [{"checkpoint": c, "layer": l, "pooling": "mean", "probe_task": "t", "metric": "accuracy",
           "score": s}
          for c, scores in (("pre", (50.0, 60.0)), ("tuned", (55.0, 80.0)))
          for l, s in zip(("embeddings", "layer_1"), scores)]
  text = report.markdown(rows)
  assert "| checkpoint | embeddings | layer_1 |" in text
  assert "| pre | 50.0 | 60.0 |" in text and "| tuned | 55.0 | 80.0 |" in text
  png, md = report.write_report(rows, str(tmp_path))
  assert os.path.getsize(png) > 1000 and open(md).read().startswith("# Probe curves")
  (tmp_path / "rows.jsonl").write_text(json.dumps({"layer": "x"}) + "\n")
  with pytest.raises(ValueError, match=r"rows.jsonl:1: a probe row lacks \['checkpoint'"):
    report.read_rows(str(tmp_path / "rows.jsonl"))


@pytest.mark.parametrize("gin_file, encoder_cls", [
    ("probing/t5_tiny.gin", "T5EncoderStates"), ("probing/bert_tiny.gin", "BertEncoderStates"),
    ("probing/bilstm_tiny.gin", "BiLSTMEncoder")])
def test_probing_gin_files_build_their_encoder(gin_file, encoder_cls):
  import gin
  from t2t import config
  config.parse_gin([gin_file], [])
  try:
    encoder = gin.query_parameter("probe.encoder").scoped_configurable_fn()
    task = gin.query_parameter("probe.probe_task")
  finally:
    gin.clear_config()
  assert type(encoder).__name__ == encoder_cls and task == "bbc_topic"

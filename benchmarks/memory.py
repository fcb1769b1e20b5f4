"""Per-device memory of parameters + optimizer state under each partitioning, on 8 devices.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m benchmarks.memory

(the flag is set here when absent). For T5 v1.1 base and large (gin/models/t5_1_1/*.gin, read
with gin, vocabulary replaced by a pass-through one so nothing is downloaded), for 1-, 2-, 4- and
8-way model parallelism (t5x standard rules, the rest of the 8 devices data parallel), 2-D and
FSDP, with AdaFactor (T5's settings, `optim.adafactor`) and AdamW: the bytes one device holds,
from the shard shape of every parameter and optimizer slot under the `Trainer`'s own shardings
(`jax.ShapeDtypeStruct` + `sharding.shard_shape`; nothing allocated). Where all 8 devices' copies
fit in `--verify-gb`, the state is also materialised (`Trainer.init_state`, one configuration
at a time) and the bytes are summed from the arrays' real `addressable_shards`; the two counts
must agree. Prints a markdown table; writes JSON to benchmarks/results/<date>_memory.json.
"""
from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import collections  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import gin  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import seqio  # noqa: E402

from t2t import config as config_lib  # noqa: E402
from t2t.models.api import EncoderDecoderModel  # noqa: E402
from t2t.models.transformer import T5Config, Transformer  # noqa: E402
from t2t.training import optim  # noqa: E402
from t2t.training.partitioning import Partitioner  # noqa: E402
from t2t.training.trainer import Trainer  # noqa: E402

MODELS = {"t5_1_1_base": "models/t5_1_1/base.gin", "t5_1_1_large": "models/t5_1_1/large.gin"}
# name -> (num_partitions, rules)
LAYOUTS = {"mp1": (1, "model_parallel"), "mp2": (2, "model_parallel"),
           "mp4": (4, "model_parallel"), "mp8": (8, "model_parallel"),
           "two_d_4x2": (2, "two_d"), "fsdp": (1, "fsdp")}
OPTIMIZERS = {"adafactor": optim.adafactor, "adamw": optim.adamw}
GIB = 2 ** 30


def t5_config(gin_file: str) -> T5Config:
  """The T5Config a model gin file builds (the whole file is parsed, nothing is called)."""
  gin.clear_config()
  for path in config_lib.gin_search_paths():  # for the file's includes
    gin.add_config_file_search_path(path)
  gin.parse_config_file(str(config_lib.resolve_gin_file(gin_file)))
  cfg = T5Config()
  gin.clear_config()
  return cfg


def abstract_bytes_per_device(abstract: Any, shardings: Any) -> int:
  """Bytes one device holds of a tree, from each leaf's shard shape (even shardings: the same on
  every device)."""
  return sum(math.prod(s.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
             for x, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings)))


def real_bytes_per_device(tree: Any) -> int:
  """The largest per-device total of the arrays' actual shards."""
  per = collections.Counter()
  for arr in jax.tree.leaves(tree):
    for shard in arr.addressable_shards:
      per[shard.device.id] += shard.data.nbytes
  return max(per.values())


def measure(model_name: str, cfg: T5Config, layout: str, opt_name: str,
            verify_bytes: float) -> dict[str, Any]:
  """One row: bytes per device of params and optimizer state (`error` when the layout does not
  divide the model). Materialises the state when 8 copies fit in `verify_bytes`."""
  parts, rules = LAYOUTS[layout]
  partitioner = Partitioner(num_partitions=parts, logical_axis_rules=rules)
  row = {"model": model_name, "layout": layout, "optimizer": opt_name,
         "mesh": dict(partitioner.mesh.shape), "rules": rules}
  model = EncoderDecoderModel(Transformer(cfg), seqio.PassThroughVocabulary(cfg.vocab_size),
                              seqio.PassThroughVocabulary(cfg.vocab_size))
  shapes = {k: (8, 8) for k in ("encoder_input_tokens", "decoder_input_tokens",
                                "decoder_target_tokens")}
  try:
    tr = Trainer(model, OPTIMIZERS[opt_name](), partitioner, shapes)
  except ValueError as e:  # e.g. 12 heads do not split 8 ways
    return {**row, "error": str(e).split("\n")[0]}  # gin appends the configurable's name
  params = abstract_bytes_per_device(tr.params_abstract, tr.params_shardings)
  opt = abstract_bytes_per_device(tr.opt_state_abstract, tr.opt_state_shardings)
  row.update(num_params=sum(x.size for x in jax.tree.leaves(tr.params_abstract)),
             param_bytes_per_device=params, opt_bytes_per_device=opt,
             total_bytes_per_device=params + opt, verified_on_real_shards=False)
  if (params + opt) * jax.device_count() <= verify_bytes:
    state = tr.init_state()
    real = (real_bytes_per_device(state.params), real_bytes_per_device(state.opt_state))
    del state
    gc.collect()
    if real != (params, opt):
      raise AssertionError(f"{model_name} {layout} {opt_name}: shard_shape says {(params, opt)} "
                           f"bytes, the real shards hold {real}.")
    row["verified_on_real_shards"] = True
  return row


def table(rows: list[dict[str, Any]]) -> str:
  lines = ["| model | optimizer | layout | mesh (data x model) | params GiB/device | "
           "opt state GiB/device | total GiB/device | checked on real shards |",
           "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    mesh = f"{r['mesh']['data']} x {r['mesh']['model']}"
    if "error" in r:
      lines.append(f"| {r['model']} | {r['optimizer']} | {r['layout']} | {mesh} | "
                   f"not divisible: {r['error'].split(' cannot')[0]} | | | |")
      continue
    lines.append(f"| {r['model']} | {r['optimizer']} | {r['layout']} | {mesh} | "
                 f"{r['param_bytes_per_device'] / GIB:.3f} | {r['opt_bytes_per_device'] / GIB:.3f}"
                 f" | {r['total_bytes_per_device'] / GIB:.3f} | "
                 f"{'yes' if r['verified_on_real_shards'] else 'no'} |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
  ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
  ap.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=list(OPTIMIZERS))
  ap.add_argument("--verify-gb", type=float, default=2.5,
                  help="materialise a configuration when all devices' copies fit in this")
  ap.add_argument("--verify-models", nargs="*", default=["t5_1_1_base"], choices=list(MODELS),
                  help="the models whose small-enough configurations are materialised")
  ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<date>_memory"
                  ".json; '-' for none)")
  args = ap.parse_args(argv)
  if jax.device_count() != 8:
    sys.exit(f"benchmarks.memory needs 8 devices, found {jax.device_count()}: set XLA_FLAGS="
             "--xla_force_host_platform_device_count=8 before JAX starts.")
  rows = []
  for model_name in args.models:
    cfg = t5_config(MODELS[model_name])
    for opt_name in args.optimizers:
      for layout in args.layouts:
        budget = args.verify_gb * GIB if model_name in args.verify_models else 0.0
        rows.append(measure(model_name, cfg, layout, opt_name, budget))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  today = datetime.date.today().isoformat()
  result = {"benchmark": "memory", "date": today, "jax": jax.__version__,
            "devices": f"{jax.device_count()} x {jax.devices()[0].platform}", "dtype": "float32",
            "rows": rows}
  out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                 f"{today}_memory.json")
  if out != "-":
    with open(out, "w") as f:
      json.dump(result, f, indent=1)
  print(table(rows))
  return result


if __name__ == "__main__":
  main()

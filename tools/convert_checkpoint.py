r"""Convert T5 checkpoints between t2t (orbax) and Hugging Face `transformers`.

  # t2t -> Hugging Face: a T5ForConditionalGeneration directory (config.json + model.safetensors)
  python -m tools.convert_checkpoint export --gin_file=models/t5_1_1/base.gin \
      --checkpoint=/tmp/run --output=/tmp/hf_t5
  # Hugging Face -> t2t: a model directory to start a run from (INITIAL_CHECKPOINT_PATH)
  python -m tools.convert_checkpoint import --hf_dir=/path/to/t5-v1_1-base --output=/tmp/t5_init

`export` reads the model's shape from the gin file(s) (plus `--gin_bindings` / `--gin.X=V`) and the
parameters from `--checkpoint` (a model directory, meaning its latest step, or one checkpoint_<N>
directory); a checkpoint that does not fit the gin model is refused, naming the first parameter
that differs and both shapes.

`import` reads `config.json` and the weights (`model.safetensors`, sharded safetensors, or
`pytorch_model.bin`) of a local T5 / mT5 directory, writes `OUTPUT/checkpoint_0` (parameters only,
no optimizer state) and `OUTPUT/model.gin` (the T5 family's base file plus the bindings that give
this model's shape), and prints those bindings. Fine-tune from it with
  --gin_file=OUTPUT/model.gin --gin_file=runs/finetune.gin --gin.INITIAL_CHECKPOINT_PATH=OUTPUT
A directory of another architecture (BERT, GPT-2, ...) is refused before any weights are read.
Nothing is downloaded: both commands work on local directories only.
"""
from __future__ import annotations

if __name__ == "__main__":  # the command line: quiet before TensorFlow is imported (t2t.logs)
  from t2t import logs
  logs.quiet()

import argparse
import json
import os
import sys
from typing import Any, Mapping, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import flax.linen as nn  # noqa: E402
import gin  # noqa: E402

from t2t import config as t2t_config  # noqa: E402
from t2t import errors  # noqa: E402
from t2t.models import hf_interop  # noqa: E402
from t2t.models import transformer  # noqa: E402
from t2t.models.transformer import T5Config, Transformer  # noqa: E402
from t2t.training import checkpoints  # noqa: E402

EXIT_BAD_INPUT = 1
MODEL_GIN = "model.gin"
# T5Config fields that fix the parameter shapes or the computation, in the order gin files list them.
_SHAPE_FIELDS = ("d_model", "num_heads", "d_kv", "d_ff", "num_encoder_layers", "num_decoder_layers",
                 "relative_attention_num_buckets", "relative_attention_max_distance",
                 "layer_norm_epsilon", "feed_forward_proj", "tie_word_embeddings")


# ------------------------------------------------------------------ Hugging Face side
def read_hf_json(path: str, key: str | None = None) -> dict[str, Any]:
  """The JSON object in `path`, a file of a Hugging Face directory (with `key`, when given).

  Raises:
    ValueError: the file is not valid JSON (truncated by an interrupted copy or download), is
      not an object, or lacks `key`; the message names the file.
  """
  from t2t import json_records  # pylint: disable=g-import-not-at-top
  raw = json_records.read_json(path, "Copy the Hugging Face directory again (config.json and "
                               "weights as save_pretrained wrote them).", cause="a truncated copy?")
  if not isinstance(raw, dict) or (key is not None and key not in raw):
    what = f"a JSON object with {key!r}" if key else "a JSON object"
    raise ValueError(f"{path} is not {what}: is it the file save_pretrained wrote? Copy the "
                     "Hugging Face directory again.")
  return raw


def load_hf_config(hf_dir: str) -> Any:
  """The `transformers` config of a local T5 / mT5 directory.

  Raises:
    FileNotFoundError: `hf_dir` has no config.json.
    ValueError: the directory holds another architecture (its `model_type` is not t5 / mt5), or
      its config.json is not valid JSON (`read_hf_json`).
  """
  path = os.path.join(hf_dir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"No Hugging Face config.json in '{hf_dir}'. Pass the directory that "
                            "save_pretrained wrote (config.json + weights).")
  raw = read_hf_json(path)
  model_type = raw.get("model_type")
  if model_type not in ("t5", "mt5"):
    architectures = ", ".join(raw.get("architectures") or []) or "unknown architecture"
    raise ValueError(f"'{hf_dir}' holds a Hugging Face model_type={model_type!r} model "
                     f"({architectures}), not T5: only T5 / mT5 encoder-decoders (model_type 't5' "
                     "or 'mt5') convert to t2t.")
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.AutoConfig.from_pretrained(hf_dir, local_files_only=True)


def load_hf_state_dict(hf_dir: str) -> dict[str, Any]:
  """Weight name -> tensor from model.safetensors (single or sharded) or pytorch_model.bin."""
  def files_from_index(index_name: str) -> list[str] | None:
    index = os.path.join(hf_dir, index_name)
    if not os.path.isfile(index):
      return None
    return sorted(set(read_hf_json(index, "weight_map")["weight_map"].values()))

  safetensors_files = files_from_index("model.safetensors.index.json")
  if safetensors_files is None and os.path.isfile(os.path.join(hf_dir, "model.safetensors")):
    safetensors_files = ["model.safetensors"]
  state: dict[str, Any] = {}
  if safetensors_files is not None:
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top
    for name in safetensors_files:
      with safe_open(os.path.join(hf_dir, name), framework="pt") as f:  # torch: bfloat16 files too
        state.update({key: f.get_tensor(key) for key in f.keys()})
    return state
  bin_files = files_from_index("pytorch_model.bin.index.json")
  if bin_files is None and os.path.isfile(os.path.join(hf_dir, "pytorch_model.bin")):
    bin_files = ["pytorch_model.bin"]
  if bin_files is None:
    raise FileNotFoundError(f"No weights in '{hf_dir}': expected model.safetensors, "
                            "model.safetensors.index.json or pytorch_model.bin.")
  import torch  # pylint: disable=g-import-not-at-top
  for name in bin_files:  # weights_only: tensors only, no arbitrary unpickling
    state.update(torch.load(os.path.join(hf_dir, name), map_location="cpu", weights_only=True))
  return state


def save_hf(params: Mapping, config: T5Config, output: str) -> None:
  """Writes `params` as a Hugging Face T5ForConditionalGeneration directory (safetensors)."""
  model = hf_interop.hf_model_from_t5(params, config)
  model.save_pretrained(output, safe_serialization=True)
  # transformers >= 5 writes tie_word_embeddings=True for every T5 and records v1.0's output scaling
  # in scale_decoder_outputs; earlier releases read tie_word_embeddings as that switch. Write the
  # model's truth so that both read the checkpoint right.
  path = os.path.join(output, "config.json")
  with open(path) as f:
    raw = json.load(f)
  raw["tie_word_embeddings"] = bool(config.tie_word_embeddings)
  with open(path, "w") as f:
    json.dump(raw, f, indent=2, sort_keys=True)


# ------------------------------------------------------------------ t2t side
def gin_bindings(config: T5Config) -> list[str]:
  """Gin lines that give a T5 family base file this config's shape (NUM_EMBEDDINGS, T5Config.*)."""
  lines = [f"NUM_EMBEDDINGS = {config.vocab_size}"]
  for field in _SHAPE_FIELDS:
    lines.append(f"T5Config.{field} = {getattr(config, field)!r}")
  return lines


def family_base_gin(config: T5Config) -> str:
  """The model gin file whose architecture `config` has (T5 v1.0 or v1.1 base)."""
  if config.feed_forward_proj == "relu" and config.tie_word_embeddings:
    return "models/t5_1_0/base.gin"
  return "models/t5_1_1/base.gin"


def model_gin(config: T5Config, source: str) -> str:
  """A model gin file for `config`: its family's base file plus the shape bindings."""
  return "\n".join([
      f"# The T5 imported from {source} by tools/convert_checkpoint.py.",
      "# Vocabulary and dropout come from the included file; override them as for any model.",
      f"include '{family_base_gin(config)}'", "", *gin_bindings(config), ""])


def import_hf(hf_dir: str, output: str) -> T5Config:
  """Converts a local Hugging Face T5 directory into a t2t model directory; returns its config.

  Writes `output/checkpoint_0` (parameters, float32) and `output/model.gin`.

  Raises:
    ValueError: another architecture, missing or misshapen weights, or `output` already holds
      checkpoints (nothing is overwritten).
  """
  hf_config = load_hf_config(hf_dir)
  config = hf_interop.t5_config_from_hf(hf_config)
  if os.path.isdir(output) and any(d.startswith(checkpoints.STEP_PREFIX + "_")
                                   for d in os.listdir(output)):
    raise ValueError(f"'{output}' already holds checkpoints; import into a new directory.")
  params = hf_interop.params_from_hf(load_hf_state_dict(hf_dir), config)
  meta = {"imported_from": os.path.abspath(hf_dir), "format": "huggingface",
          "t5_config": {k: str(v) if k in ("dtype", "param_dtype") else v
                        for k, v in vars(config).items()}}
  ckpt = checkpoints.Checkpointer(output, keep=None)
  try:
    ckpt.save(0, params, opt_state={}, meta=meta)
  finally:
    ckpt.close()
  with open(os.path.join(output, MODEL_GIN), "w") as f:
    f.write(model_gin(config, os.path.abspath(hf_dir)))
  return config


def config_from_gin(gin_files: Sequence[str], bindings: Sequence[str] = ()) -> T5Config:
  """Parses model gin files (and bindings) and returns the T5Config of their MODEL."""
  gin.clear_config()
  t2t_config.parse_gin(gin_files, bindings)
  try:
    model = gin.query_parameter("%MODEL").scoped_configurable_fn()
  except ValueError as e:
    raise ValueError(f"The gin files {list(gin_files)} define no MODEL; pass a model gin file, "
                     "e.g. --gin_file=models/t5_1_1/base.gin.") from e
  module = getattr(model, "module", None)
  if not isinstance(module, Transformer):
    raise ValueError(f"MODEL in {list(gin_files)} is {type(module).__name__}, not the T5 "
                     "encoder-decoder Transformer; only that converts to Hugging Face T5.")
  return module.config


def params_abstract(config: T5Config) -> Any:
  """Shapes and dtypes of the parameters of a Transformer with `config` (nothing allocated)."""
  tokens = jnp.ones((1, 1), jnp.int32)
  boxed = jax.eval_shape(lambda: Transformer(config).init(
      jax.random.PRNGKey(0), tokens, tokens, enable_dropout=False))["params"]
  return nn.unbox(boxed)


# What save_pretrained writes for a T5 (and the older PyTorch weights file): an output holding one
# of these is another model's directory.
_HF_MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json",
                   "pytorch_model.bin", "generation_config.json")


def check_export_output(output: str) -> None:
  """Refuses an export target that is a file, a t2t model directory or a Hugging Face model.

  Exporting writes config.json and model.safetensors into `output`; into a t2t MODEL_DIR they
  would sit beside its checkpoints (and its own config.json), into another export they would
  replace that model's files. Checked before anything is read, so nothing written is touched.
  """
  if os.path.exists(output) and not os.path.isdir(output):
    raise ValueError(f"--output '{output}' is a file; export into a new directory.")
  if not os.path.isdir(output):
    return
  present = set(os.listdir(output))
  if any(d.startswith(checkpoints.STEP_PREFIX + "_") for d in present):
    raise ValueError(f"--output '{output}' is a t2t model directory (it holds checkpoints); "
                     "export into a new directory.")
  clashing = sorted(present.intersection(_HF_MODEL_FILES))
  if clashing:
    raise ValueError(f"--output '{output}' already holds a model ({', '.join(clashing)}); "
                     "export into a new directory, or remove those files first.")


def export_hf(gin_files: Sequence[str], checkpoint: str, output: str,
              bindings: Sequence[str] = ()) -> T5Config:
  """Converts a t2t checkpoint of the gin-configured T5 into a Hugging Face directory.

  Raises:
    ValueError: `output` is a file, a t2t model directory or already holds a model
      (`check_export_output`; nothing is overwritten).
    checkpoints.CheckpointMismatchError: the checkpoint's parameters differ from the gin model's
      (the message names the first one and both shapes).
    FileNotFoundError: no checkpoint at `checkpoint`.
  """
  check_export_output(output)
  config = config_from_gin(gin_files, bindings)
  if getattr(config, "shared_encoder_decoder", False):
    raise ValueError("T5Config.shared_encoder_decoder=True has no Hugging Face T5 equivalent (its "
                     "decoder reuses encoder weights); only unshared encoder-decoders export.")
  abstract = params_abstract(config)
  device = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
  params, _ = checkpoints.load_params(checkpoint, abstract, jax.tree.map(lambda _: device, abstract))
  # A scan_layers checkpoint stores each stack's layers stacked on a leading axis; HF has per-layer
  # weights, so unstack them (a no-op otherwise).
  module, params = transformer.unscanned(Transformer(config), jax.device_get(params))
  save_hf(params, module.config, output)
  return module.config


# ------------------------------------------------------------------ command line
def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m tools.convert_checkpoint",
      description="Convert T5 checkpoints between t2t and Hugging Face transformers.")
  sub = parser.add_subparsers(dest="command", required=True)
  export = sub.add_parser("export", help="t2t checkpoint -> Hugging Face directory")
  export.add_argument("--gin_file", action="append", required=True,
                      help="model gin file(s), e.g. models/t5_1_1/base.gin")
  export.add_argument("--gin_bindings", action="append", default=[],
                      help="extra gin bindings (also --gin.X=V)")
  export.add_argument("--checkpoint", required=True,
                      help="a model directory (latest step) or one checkpoint_<N> directory")
  export.add_argument("--output", required=True, help="Hugging Face directory to write")
  imp = sub.add_parser("import", help="Hugging Face directory -> t2t model directory")
  imp.add_argument("--hf_dir", required=True, help="local T5 directory (config.json + weights)")
  imp.add_argument("--output", required=True, help="new t2t model directory")
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the command line; returns the exit status (bad input: a one-line error, status 1)."""
  args = _parser().parse_args(t2t_config.rewrite_gin_args(list(sys.argv[1:] if argv is None
                                                               else argv)))
  try:
    if args.command == "export":
      config = export_hf(args.gin_file, args.checkpoint, args.output, args.gin_bindings)
      print(f"Wrote a Hugging Face T5ForConditionalGeneration ({config.num_encoder_layers}+"
            f"{config.num_decoder_layers} layers, d_model {config.d_model}) to {args.output}.")
    else:
      config = import_hf(args.hf_dir, args.output)
      print(f"Wrote {os.path.join(args.output, 'checkpoint_0')} and "
            f"{os.path.join(args.output, MODEL_GIN)}. Gin bindings for this model "
            f"(on top of {family_base_gin(config)}):")
      print("\n".join("  " + line for line in gin_bindings(config)))
      print(f"Fine-tune from it with: --gin_file={os.path.join(args.output, MODEL_GIN)} "
            f"--gin_file=runs/finetune.gin --gin.INITIAL_CHECKPOINT_PATH={args.output}")
  except (ValueError, FileNotFoundError, errors.UserError) as e:  # bad input: one line
    if os.environ.get("T2T_TRACEBACK"):
      raise
    print(f"error: {e}", file=sys.stderr)
    return EXIT_BAD_INPUT
  return 0


if __name__ == "__main__":
  sys.exit(main())

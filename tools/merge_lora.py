r"""Merge a LoRA run's low-rank factors into its base weights, for export.

  python -m tools.merge_lora --lora_dir=/tmp/t2t/lora_run --output=/tmp/t2t/merged

Writes `<output>/checkpoint_<step>`: a plain checkpoint of the base model (W + alpha / rank * A B
on every LoRA target; parameters only), loadable as INITIAL_CHECKPOINT_PATH, or by t2t.eval and
t2t.infer with the base model's gin files (without adaptation/lora.gin). alpha is the run's
`LoraModel.alpha` (LORA_ALPHA, 16.0 in adaptation/lora.gin), read from the run's `config.gin`;
`--alpha` is needed only for a run whose config.gin records none (a LoraModel built in Python),
and is refused when it contradicts the recorded value (the merged weights would be mis-scaled).
The rank is read from the factors. `--lora_dir` may also name one `checkpoint_<N>` directory.
An `--output` that already holds `checkpoint_<step>` is refused (nothing is overwritten).
"""
from __future__ import annotations

if __name__ == "__main__":  # the command line: quiet before TensorFlow is imported (t2t.logs)
  from t2t import logs
  logs.quiet()

import argparse
import ast
import math
import os
import re
import sys
from typing import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# `LoraModel.alpha = V` in an operative config, with an optional scope and module path.
_ALPHA = re.compile(r"^(?:[\w.]+/)*(?:[\w.]+\.)?LoraModel\.alpha\s*=\s*(\S.*?)\s*$", re.M)


def recorded_alphas(config_text: str) -> list[float]:
  """The distinct `LoraModel.alpha` values an operative gin config records (macros resolved).

  One value for a run of adaptation/lora.gin (gin records defaults too); several when scopes
  bind different values; none when no LoraModel was configured by gin.
  """
  macros = dict(re.findall(r"^([A-Za-z_]\w*)\s*=\s*(\S.*?)\s*$", config_text, re.M))
  values = []
  for text in _ALPHA.findall(config_text):
    for _ in range(len(macros) + 1):  # a macro may name another macro
      if not text.startswith("%"):
        break
      text = macros.get(text[1:], "")
    try:
      value = float(ast.literal_eval(text))
    except (ValueError, TypeError, SyntaxError):
      continue  # not a literal (a configurable reference): nothing to check against
    if value not in values:
      values.append(value)
  return values


def choose_alpha(flag: float | None, config_path: str) -> float:
  """alpha for the merge: the one `config_path` records, `--alpha` (`flag`) when it records none.

  Raises:
    ValueError: a non-positive `flag`, a `flag` that contradicts the recorded value (both are
      named), or neither a recorded value nor a flag.
  """
  if flag is not None and not (math.isfinite(flag) and flag > 0):
    raise ValueError(f"--alpha must be a positive number (the run's LoraModel.alpha), got {flag}.")
  from t2t.training import paths  # pylint: disable=g-import-not-at-top
  config = paths.resolve(config_path)  # a run on gs:// too
  recorded = recorded_alphas(config.read_text()) if config.is_file() else []
  if not recorded:
    if flag is None:
      where = (f"{config_path} records no LoraModel.alpha" if config.is_file()
               else f"the run has no {config_path}")
      raise ValueError(f"{where}: pass --alpha=<the run's LoraModel.alpha>.")
    return flag
  if len(recorded) == 1 and flag is None:
    return recorded[0]
  if flag is not None and any(math.isclose(flag, r) for r in recorded):
    return flag
  shown = " or ".join(str(r) for r in recorded)
  if flag is None:
    raise ValueError(f"{config_path} records several LoraModel.alpha values ({shown}, in "
                     "different gin scopes): pass --alpha with the merged LoraModel's.")
  raise ValueError(f"--alpha={flag} contradicts the run's LoraModel.alpha = {shown} recorded in "
                   f"{config_path}: the merged weights would be scaled by {flag} / rank instead "
                   f"of {shown} / rank. Omit --alpha (--alpha is for runs whose config.gin "
                   "records none) or pass the recorded value.")


def check_output(output: str, step: int) -> None:
  """Refuses an `output` that already holds `checkpoint_<step>` (it would not be overwritten)."""
  from t2t.training import checkpoints, paths  # pylint: disable=g-import-not-at-top
  existing = paths.resolve(output) / f"{checkpoints.STEP_PREFIX}_{step}"
  if existing.exists():
    raise ValueError(f"--output {paths.to_str(output)} already holds {existing} (the merged "
                     f"checkpoint is step {step}, the LoRA checkpoint's): choose another --output, "
                     "or delete that directory to merge again.")


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--lora_dir", required=True, help="the LoRA run's MODEL_DIR or checkpoint")
  parser.add_argument("--output", required=True, help="directory for the merged checkpoint")
  parser.add_argument("--alpha", type=float, default=None,
                      help="the run's LoraModel.alpha, only for a run whose config.gin records "
                      "none (else the recorded value is used; a different one is refused)")
  args = parser.parse_args(argv)
  from t2t import errors  # pylint: disable=g-import-not-at-top
  from t2t.models import peft  # pylint: disable=g-import-not-at-top
  from t2t.training import checkpoints  # pylint: disable=g-import-not-at-top
  try:
    model_dir, step = checkpoints.resolve_checkpoint(args.lora_dir)
    alpha = choose_alpha(args.alpha, os.path.join(model_dir, "config.gin"))
    check_output(args.output, step)
    written = peft.merge_checkpoint(args.lora_dir, args.output, alpha=alpha)
  except (ValueError, FileNotFoundError, errors.UserError) as e:  # bad input: one line
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"Merged checkpoint (alpha {alpha}) written to {written}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

r"""Merge a LoRA run's low-rank factors into its base weights, for export.

  python -m tools.merge_lora --lora_dir=/tmp/t2t/lora_run --output=/tmp/t2t/merged --alpha=16

Writes `<output>/checkpoint_<step>`: a plain checkpoint of the base model (W + alpha / rank * A B
on every LoRA target; parameters only), loadable as INITIAL_CHECKPOINT_PATH, or by t2t.eval and
t2t.infer with the base model's gin files (without adaptation/lora.gin). `--alpha` must be the
run's `LoraModel.alpha` (LORA_ALPHA, 16.0 in adaptation/lora.gin); the rank is read from the
factors. `--lora_dir` may also name one `checkpoint_<N>` directory.
"""
from __future__ import annotations

if __name__ == "__main__":  # the command line: quiet before TensorFlow is imported (t2t.logs)
  from t2t import logs
  logs.quiet()

import argparse
import os
import sys
from typing import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--lora_dir", required=True, help="the LoRA run's MODEL_DIR or checkpoint")
  parser.add_argument("--output", required=True, help="directory for the merged checkpoint")
  parser.add_argument("--alpha", type=float, required=True, help="the run's LoraModel.alpha")
  args = parser.parse_args(argv)
  from t2t import errors  # pylint: disable=g-import-not-at-top
  from t2t.models import peft  # pylint: disable=g-import-not-at-top
  try:
    written = peft.merge_checkpoint(args.lora_dir, args.output, alpha=args.alpha)
  except (ValueError, FileNotFoundError, errors.UserError) as e:  # bad input: one line
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"Merged checkpoint written to {written}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

r"""Look at a seqio task or mixture before training on it: examples and token-length statistics.

  python -m tools.inspect_task bbc_topic --split validation -n 3 --inputs_length 128
  python -m tools.inspect_task my_task --module my_tasks --gin.span_corruption.noise_density=0.25

Prints the first `n` examples of a split (the text before tokenization when the task keeps it,
else the decoded tokens) with their token counts, then length statistics over up to
`--max_examples` examples: min / mean / median / p90 / p99 / max tokens (EOS included) per
feature and how many examples `--inputs_length` / `--targets_length` would truncate.

Lengths are measured before truncation: the task is built with the fewest feature lengths its
preprocessors accept (none for a supervised task). An objective that needs them (span corruption
needs the inputs length) builds its examples to the lengths given, so for such a task the
statistics describe the objective's output at those lengths. Nothing is downloaded: a TFDS task
whose data is not prepared is reported as an error.
"""
from __future__ import annotations

if __name__ == "__main__":  # the command line: quiet before TensorFlow is imported (t2t.logs)
  from t2t import logs
  logs.quiet()

import argparse
import importlib
import logging
import os
import sys
from typing import Any, Iterator, Mapping, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import seqio  # noqa: E402

from t2t.data import registry, vocabularies  # noqa: E402
from t2t.data.registry import get_mixture_or_task  # noqa: E402

# Exit status for bad input (unknown task, missing split, module that does not import).
EXIT_BAD_INPUT = 2
DEFAULT_MODULES = ("tasks",)


def import_task_modules(modules: Sequence[str] = ()) -> None:
  """Imports `tasks` and each user module, so that their tasks and mixtures are registered."""
  for module in (*DEFAULT_MODULES, *modules):
    try:
      importlib.import_module(module)
    except ImportError as err:
      raise ImportError(f"--module {module!r} could not be imported ({err}); give a module path "
                        "importable from the current directory, e.g. --module my_tasks.") from err


def _candidate_lengths(features: Sequence[str], inputs_length: int | None,
                       targets_length: int | None) -> Iterator[dict[str, int | None]]:
  """Feature-length dicts to build the dataset with, fewest lengths first (least truncation)."""
  given = {"inputs": inputs_length, "targets": targets_length}
  none = {f: None for f in features}
  yield none
  for key in ("inputs", "targets"):
    if given[key] is not None and key in features:
      yield {**none, key: given[key]}
  if all(given[k] is not None for k in given if k in features):
    yield {**none, **{k: v for k, v in given.items() if k in features}}


def _open_dataset(obj: seqio.Task | seqio.Mixture, split: str, features: Sequence[str],
                  inputs_length: int | None, targets_length: int | None, seed: int):
  """Returns (dataset, lengths used): the first candidate lengths the preprocessors accept."""
  error: ValueError | None = None
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  for lengths in _candidate_lengths(features, inputs_length, targets_length):
    # A mixture logs an ERROR for a task that rejects a candidate; only the last failure matters.
    absl_logger.setLevel(logging.CRITICAL)
    try:
      if isinstance(obj, seqio.Mixture):
        # Mixed tasks may differ in which text they keep, so a mixture shows decoded tokens.
        ds = obj.get_dataset(lengths, split=split, shuffle=False, seed=seed, num_epochs=1,
                             copy_pretokenized=False, log_mixing_proportions=False,
                             try_in_mem_cache=False)
      else:
        ds = obj.get_dataset(lengths, split=split, shuffle=False, seed=seed,
                             try_in_mem_cache=False)
      return ds, lengths
    except ValueError as err:  # an objective that needs a length says so with a ValueError
      error = err
    finally:
      absl_logger.setLevel(level)
  raise ValueError(
      f"{obj.name!r} could not be built without the feature lengths its preprocessors need "
      f"({error}). Pass them, e.g. --inputs_length 128 --targets_length 32.") from error


def length_stats(lengths: Sequence[int], limit: int | None = None) -> dict[str, Any]:
  """count, min, mean, median, p90, p99, max of token counts, and how many exceed `limit`.

  `truncated` is None when no limit is given.
  """
  if not lengths:
    raise ValueError("length_stats needs at least one length.")
  values = np.asarray(lengths, dtype=np.int64)
  return {
      "count": int(values.size),
      "min": int(values.min()),
      "mean": float(values.mean()),
      "median": float(np.median(values)),
      "p90": float(np.percentile(values, 90)),
      "p99": float(np.percentile(values, 99)),
      "max": int(values.max()),
      "limit": limit,
      "truncated": None if limit is None else int((values > limit).sum()),
  }


def _text_of(example: Mapping[str, Any], feature: str, vocabulary: seqio.Vocabulary) -> str:
  raw = example.get(f"{feature}_pretokenized")
  if raw is not None:
    return raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)
  return vocabulary.decode([int(t) for t in example[feature]])


def inspect(task_name: str, split: str = "train", n: int = 5, inputs_length: int | None = None,
            targets_length: int | None = None, max_examples: int = 1000,
            modules: Sequence[str] = (), seed: int = 0) -> dict[str, Any]:
  """Reads a registered task or mixture's split and summarises it.

  Args:
    task_name: a registered seqio task or mixture.
    split: the split to read.
    n: how many examples to return in full.
    inputs_length / targets_length: the feature lengths the model will use; each is counted
      against (`truncated`) and is fed to preprocessors that need it (see the module docstring).
    max_examples: how many examples the statistics cover at most.
    modules: extra modules to import first (they register the user's tasks).
    seed: seed of the preprocessors' randomness (objectives) and of a mixture's sampling.

  Returns:
    {"name", "kind" ("Task" or "Mixture"), "split", "num_input_examples" (int or None),
     "pipeline_lengths" (the lengths the dataset was built with),
     "examples": [{"id"?, feature: {"text", "num_tokens"}}] (n at most),
     "stats": {feature: length_stats(...)}}.

  Raises:
    ValueError: unknown name or split, unprepared data, bad numbers; ImportError: a bad module.
  """
  if n < 0:
    raise ValueError(f"n (examples to show) must be >= 0, got {n}.")
  if max_examples < 1:
    raise ValueError(f"max_examples must be >= 1, got {max_examples}.")
  for name, value in (("inputs_length", inputs_length), ("targets_length", targets_length)):
    if value is not None and value < 2:
      raise ValueError(f"{name} must be >= 2 (a token and EOS), got {value}.")
  import_task_modules(modules)
  obj = get_mixture_or_task(task_name, how_to_import="with --module my_tasks")
  registry.check_split_readable(obj, split)
  vocabularies.check_task_readable(obj)
  output_features = obj.output_features
  ds, used = _open_dataset(obj, split, list(output_features), inputs_length, targets_length, seed)
  limits = {"inputs": inputs_length, "targets": targets_length}

  examples, token_counts = [], {}
  for example in ds.take(max_examples).as_numpy_iterator():
    features = [f for f in output_features if f in example and np.ndim(example[f]) == 1]
    for f in features:
      token_counts.setdefault(f, []).append(len(example[f]))
    if len(examples) < n:
      shown: dict[str, Any] = {}
      if "id" in example:
        shown["id"] = example["id"].decode("utf-8", errors="replace")
      for f in features:
        shown[f] = {"text": _text_of(example, f, output_features[f].vocabulary),
                    "num_tokens": len(example[f])}
      examples.append(shown)
  if not token_counts:
    raise ValueError(f"{task_name!r} split {split!r} yielded no examples.")
  try:
    num_input_examples = obj.num_input_examples(split) if isinstance(obj, seqio.Task) else None
  except (KeyError, ValueError):
    num_input_examples = None
  return {
      "name": task_name,
      "kind": "Mixture" if isinstance(obj, seqio.Mixture) else "Task",
      "split": split,
      "num_input_examples": num_input_examples,
      "pipeline_lengths": used,
      "examples": examples,
      "stats": {f: length_stats(c, limits.get(f)) for f, c in token_counts.items()},
  }


def _clip(text: str, max_chars: int) -> str:
  text = " ".join(text.split())
  return text if len(text) <= max_chars else f"{text[:max_chars]} ... [+{len(text) - max_chars} chars]"


def format_report(report: Mapping[str, Any], max_chars: int = 400) -> str:
  """The report of `inspect` as text for a terminal: examples, then a table of lengths."""
  size = report["num_input_examples"]
  fed = {k: v for k, v in report["pipeline_lengths"].items() if v is not None}
  lines = [f"{report['name']} ({report['kind']}), split '{report['split']}'"
           + (f": {size} input examples" if size is not None else ""),
           f"built with feature lengths {fed}" if fed else "built without feature lengths "
           "(nothing truncated)"]
  for i, example in enumerate(report["examples"], 1):
    lines.append(f"\n--- example {i}" + (f" ({example['id']})" if "id" in example else "") + " ---")
    for feature, shown in example.items():
      if feature != "id":
        lines.append(f"{feature} ({shown['num_tokens']} tokens): {_clip(shown['text'], max_chars)}")
  count = max(s["count"] for s in report["stats"].values())
  lines.append(f"\nToken lengths over {count} examples (EOS included):")
  header = f"{'feature':<10}{'min':>7}{'mean':>9}{'median':>9}{'p90':>9}{'p99':>9}{'max':>7}  truncated"
  lines.append(header)
  for feature, s in report["stats"].items():
    if s["truncated"] is None:
      cut = "(give a length)"
    else:
      cut = f"{s['truncated']} ({100.0 * s['truncated'] / s['count']:.1f}%) at {s['limit']}"
    lines.append(f"{feature:<10}{s['min']:>7}{s['mean']:>9.1f}{s['median']:>9.1f}{s['p90']:>9.1f}"
                 f"{s['p99']:>9.1f}{s['max']:>7}  {cut}")
  return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  """Parses the command line; `--gin.X=V` is shorthand for `--gin_bindings='X = V'`."""
  from t2t import config
  parser = argparse.ArgumentParser(prog="python -m tools.inspect_task", description=__doc__.split("\n\n")[0])
  parser.add_argument("task", help="a registered task or mixture name")
  parser.add_argument("--split", default="train")
  parser.add_argument("-n", type=int, default=5, help="examples to print (default 5)")
  parser.add_argument("--inputs_length", type=int, default=None)
  parser.add_argument("--targets_length", type=int, default=None)
  parser.add_argument("--max_examples", type=int, default=1000,
                      help="examples the statistics cover at most (default 1000)")
  parser.add_argument("--module", action="extend", nargs="+", default=[],
                      help="modules to import that register tasks (besides `tasks`)")
  parser.add_argument("--gin_bindings", action="append", default=[],
                      help="gin bindings, e.g. 'span_corruption.noise_density = 0.25'; "
                           "--gin.X=V is short for --gin_bindings='X = V'")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--max_chars", type=int, default=400, help="characters shown per text")
  return parser.parse_args(config.rewrite_gin_args(list(argv))[1:])


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the tool; returns the exit status (0, or 2 for bad input with the error printed)."""
  argv = sys.argv if argv is None else argv
  args = parse_args(argv)
  from t2t import config
  from t2t.training.inputs import limit_tf_threads
  limit_tf_threads()
  try:
    import_task_modules(args.module)
    if args.gin_bindings:
      config.parse_gin([], args.gin_bindings)
    report = inspect(args.task, split=args.split, n=args.n, inputs_length=args.inputs_length,
                     targets_length=args.targets_length, max_examples=args.max_examples,
                     modules=args.module, seed=args.seed)
  except (ValueError, ImportError, FileNotFoundError) as err:
    if os.environ.get("T2T_TRACEBACK"):
      raise
    print(f"error: {err}", file=sys.stderr)
    return EXIT_BAD_INPUT
  print(format_report(report, max_chars=args.max_chars))
  return 0


if __name__ == "__main__":
  sys.exit(main())

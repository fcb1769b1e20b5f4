"""t2t.logs: a quiet CLI. Library chatter is recognised and dropped; t2t's lines stay; T2T_VERBOSE
brings the libraries back. The t2t.train runs are tests/test_no_code_execution.py's, made once per
test session."""
import pytest

from t2t import logs
from tests import test_no_code_execution



@pytest.fixture
def two_runs(tmp_path_factory):
  return test_no_code_execution.shared_runs(tmp_path_factory)  # made once per test session

# Lines captured from `python -m t2t.train` before t2t.logs existed.
NOISE_LINES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795427394.247995   19761 port.cc:153] oneDNN custom operations are on. You may "
    "see slightly different numerical results",
    "I0000 00:00:1795427394.249514   19761 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "W1123 09:50:37.143631 140078699338624 dataset_providers.py:462] Using an uncached "
    "FunctionDataset for training is not recommended",
    "E0000 00:00:1795426083.108643    3701 cuda_platform.cc:52] failed call to cuInit: INTERNAL",
    "WARNING:absl:logger_cls is empty",
    "WARNING:tensorflow:AutoGraph could not transform <function <lambda> at 0x7f8a>",
    "2026-11-23 09:50:03.238940: I tensorflow/core/util/port.cc:113] oneDNN custom operations",
    "/x/site-packages/orbax/checkpoint/manager.py:12: UserWarning: read-only checkpoint manager",
]
T2T_LINES = [
    "step 1/1  loss 9.7119  0.05 steps/s  7 tokens/s  ETA 0:00:00",
    "Resuming from /tmp/run/checkpoint_1 at step 1.",
    "error: Unknown task 'bbc_topc'. Did you mean: bbc_topic?",
    "Traceback (most recent call last):",
    "RuntimeError: RESOURCE_EXHAUSTED: Out of memory",
]


@pytest.mark.parametrize("line", NOISE_LINES)
def test_library_lines_are_noise(line):
  assert logs.is_noise(line)


@pytest.mark.parametrize("line", T2T_LINES)
def test_t2t_lines_and_tracebacks_are_not(line):
  assert not logs.is_noise(line)


def test_verbose_on_request(monkeypatch):
  monkeypatch.delenv("T2T_VERBOSE", raising=False)
  assert not logs.verbose(["t2t.train", "--gin.X=1"])
  assert logs.verbose(["t2t.train", "--verbosity=1"])
  monkeypatch.setenv("T2T_VERBOSE", "1")
  assert logs.verbose([])


def test_restated_once():
  said = set()
  assert logs.restate("W0101 tensorboard not installed", said).startswith("note: TensorBoard")
  assert logs.restate("W0101 tensorboard not installed", said) == ""
  assert logs.restate("anything else", said) is None
  assert logs.restate("E0101 ModuleNotFoundError: No module named 'tensorboard'", set())
  # t2t's own lines may name TensorBoard (the profile's viewer): they pass unchanged.
  assert logs.restate("Profile: ... View: tensorboard --logdir /m/profile (Profile tab)", said) is None


def test_a_dropped_records_indented_lines_go_with_it():
  lines = [
      # seqio's multi-line absl warning, as t2t.eval printed it (the first line was dropped,
      # "Got" and "Max Lengths" were not).
      "W1130 21:40:02.123456 140078699338624 evaluation.py:477] Given sequence lengths are "
      "longer than necessary for some evaluation inputs or targets.",
      " Got: {'inputs': 32, 'targets': 4},",
      " Max Lengths: {'inputs': 32, 'targets': 2}",
      "",
      "error: Checkpoint /m/checkpoint_1 cannot be read (...).",
      "/x/site-packages/seqio/utils.py:12: UserWarning: something",
      "  warnings.warn('something')",  # the source line Python's warnings add
      "Traceback (most recent call last):",
      '  File "/x/t2t/eval.py", line 3, in <module>',  # a traceback's frames stay
      "ValueError: bad",
      "  an indented t2t line after one of t2t's own",
  ]
  keep = logs.LineFilter()
  assert [t for t in map(keep, lines) if t is not None] == [line + "\n" for line in (
      "", "error: Checkpoint /m/checkpoint_1 cannot be read (...).",
      "Traceback (most recent call last):", '  File "/x/t2t/eval.py", line 3, in <module>',
      "ValueError: bad", "  an indented t2t line after one of t2t's own")]


def test_train_is_quiet_and_verbose_on_request(two_runs):
  first, second, *_ = two_runs
  quiet = first.stdout + first.stderr
  noisy = [line for line in quiet.splitlines() if logs.is_noise(line)]
  assert not noisy, "library lines in a quiet run:\n" + "\n".join(noisy)
  for pattern in ("absl::InitializeLog", "oneDNN", "cuda", "dataset_providers.py", "orbax"):
    assert pattern not in quiet, pattern
  assert "step 1/1" in quiet  # t2t's own progress line
  # T2T_VERBOSE=1: the libraries speak again (absl-format lines from seqio / TF / orbax).
  verbose = second.stdout + second.stderr
  assert any(logs.is_noise(line) for line in verbose.splitlines()), verbose[-2000:]
  assert "step 2/2" in verbose


GLOO = "[Gloo] Rank {} is connected to 7 peer ranks. Expected number of connected peer ranks is : 7"


def test_gloo_lines_are_the_only_stdout_noise():
  lines = logs.CollectiveLines()
  assert lines(GLOO.format(1)) is None
  for line in ("bbc_topic: accuracy 25.00", "/tmp/run/infer/inputs.jsonl", "[Gloo] something else",
               "", "3"):
    assert lines(line) == line + "\n"


def _interleave(first: str, second: str, cuts: list[int]) -> str:
  """Two Gloo messages written piece by piece from two threads: `cuts` says whose piece is next."""
  def pieces(rank):
    return ["[Gloo] Rank ", rank, " is connected to ", "7", " peer ranks. ",
            "Expected number of connected peer ranks is : ", "7", "\n"]
  queues, out = [pieces(first), pieces(second)], []
  for who in cuts:
    out.append(queues[who].pop(0))
  return "".join(out + queues[0] + queues[1])


def test_interleaved_gloo_messages_are_dropped_whole():
  # As CI printed it: rank 7's first piece, then rank 6's whole message, then the rest of 7's.
  printed = ("[Gloo] Rank 7[Gloo] Rank 6 is connected to 7 peer ranks. Expected number of "
             "connected peer ranks is : 7\n is connected to 7 peer ranks. Expected number of "
             "connected peer ranks is : 7\n")
  assert _interleave("7", "6", [0, 0, 1, 1, 1, 1, 1, 1, 1, 1]) == printed
  orders = [[0, 1, 1, 1, 1, 1, 1, 1, 1], [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1],
            [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1],  # 7's number, 6's, then 7's newline
            [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0]]  # a line that is 6's "7" alone
  for cuts in orders:
    lines = logs.CollectiveLines()
    text = "bbc_topic: step 1/3\n" + _interleave("7", "6", cuts) + "step 2/3\n\n"
    kept = [lines(line) for line in text.split("\n")[:-1]]
    # t2t's lines and its own empty line, once every message has ended, pass; nothing else does.
    assert [k for k in kept if k is not None] == ["bbc_topic: step 1/3\n", "step 2/3\n", "\n"], cuts


def test_a_line_mixing_gloo_pieces_with_other_text_is_kept():
  lines = logs.CollectiveLines()
  mixed = "[Gloo] Rank 3step 1/3 is connected to 7 peer ranks. Expected number of connected"
  assert lines(mixed) == mixed + "\n"


STDOUT_CHILD = r"""
import os, sys
from t2t import logs
assert logs.quiet(["x"]) and logs.quiet_collectives()
os.write(1, b"[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n")
print("kept", flush=True)
if len(sys.argv) > 1:  # the reader has gone: the rest must not block the process
  for _ in range(2000):
    print("x" * 1000)
print("last")
"""


def test_a_joined_runs_stdout_drops_gloo_lines_and_never_blocks(tmp_path):
  import os
  import subprocess
  import sys
  env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
  env.pop("T2T_VERBOSE", None)
  out = subprocess.run([sys.executable, "-c", STDOUT_CHILD], env=env, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout == "kept\nlast\n"
  # A reader that stops early (`| head -1`): the child still finishes.
  child = subprocess.Popen([sys.executable, "-c", STDOUT_CHILD, "flood"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
  assert child.stdout.readline() == b"kept\n"
  child.stdout.close()
  assert child.wait(timeout=120) == 0

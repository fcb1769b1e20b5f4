"""A quiet command line: t2t's own lines, none of the libraries' start-up chatter.

`python -m t2t.train/eval/infer` import TensorFlow, JAX, seqio and orbax, which print C++ log
lines (CUDA stubs, oneDNN, cpu_feature_guard, "All log messages before absl::InitializeLog"),
absl-formatted warnings (seqio's "uncached FunctionDataset", orbax's manager notes) and Python
warnings. None of it tells a t2t user anything they can act on, and it buries t2t's progress.

`quiet()` (called by `t2t.cli.run_module` before the entry point is imported) therefore:

- sets `TF_CPP_MIN_LOG_LEVEL=3` before TensorFlow is imported (unless the user set it);
- ignores Python warnings raised inside the libraries (t2t's own warnings still show);
- filters file descriptor 2 through a thread that drops lines matching `NOISE`, with the
  indented lines that continue them (C++ libraries write there directly, so `sys.stderr` alone
  cannot be filtered); everything else, tracebacks included, passes through unchanged, and
  `RESTATED` lines are replaced by t2t's own words (`LineFilter`).

In a run of several processes on CPUs, XLA's Gloo collectives print "[Gloo] Rank 0 is connected
to 1 peer ranks. ..." on fd 1 (standard output) for every communicator they build, several per
process, from several threads at once, so that two messages can interleave piece by piece within
a line. `quiet_collectives()` (called by `t2t.cli` once a multi-process run has joined) filters
fd 1 through `CollectiveLines`, which drops exactly those messages, whole or interleaved;
single-process runs leave standard output alone.

`T2T_VERBOSE=1` or an absl `--verbosity` / `-v` flag turns all of this off.
"""
from __future__ import annotations

import atexit
import os
import re
import sys
import threading
import warnings
from typing import Callable, Optional, Sequence

LIBRARIES = ("tensorflow", "tf_keras", "keras", "jax", "jaxlib", "flax", "optax", "orbax", "seqio",
             "absl", "gin", "tensorflow_datasets", "google", "etils", "chex", "numpy")

# Lines that are library chatter, never t2t's (t2t prints plain sentences, never these formats).
NOISE: tuple[re.Pattern, ...] = tuple(re.compile(p) for p in (
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called",
    r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [\w./-]+:\d+\]",  # absl/glog format, C++ or Python
    r"^(WARNING|INFO|DEBUG):(absl|tensorflow|jax|root|orbax)[:\s]",
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] ",  # TF's own C++ format
    r"oneDNN custom operations are on",
    r"cudart_stub|cuda_platform|cuda_dnn|cuda_fft|cuda_blas|Could not find cuda drivers",
    r"Unable to register cu(DNN|FFT|BLAS) factory",
    r"computation placer already registered",
    r"TF-TRT Warning",
    r"This TensorFlow binary is optimized",
    r"^To enable the following instructions",
    r"rebuild TensorFlow with the appropriate compiler flags",
    r"AutoGraph could not transform|To silence this warning, decorate the function|^Cause: ",
    r"site-packages/[\w/.-]+\.py:\d+: \w*Warning: ",  # a library's Python warning
))

# The constant pieces of the message XLA:CPU's Gloo collectives write to std::cout, one `<<` each:
# "[Gloo] Rank R is connected to P peer ranks. Expected number of connected peer ranks is : E".
GLOO_PIECES = re.compile(r"\[Gloo\] Rank | is connected to | peer ranks\. |"
                         r"Expected number of connected peer ranks is : ")

# Library lines that do matter, restated once in t2t's words.
RESTATED: tuple[tuple[re.Pattern, str], ...] = (
    # A library saying TensorBoard is missing; not any line that names it (t2t's own may).
    (re.compile(r"tensorboard\b.*\bnot (found|installed)|"
                r"(no module named|cannot import|unable to import)\W+[\w.]*tensorboard", re.I),
     "note: TensorBoard is not installed; t2t still writes metrics.jsonl in MODEL_DIR."),
)

_filter: Optional["_FdFilter"] = None
_stdout_filter: Optional["_FdFilter"] = None


def verbose(argv: Sequence[str] = ()) -> bool:
  """True when the user asked for the libraries' logs (T2T_VERBOSE=1, --verbosity, -v)."""
  if os.environ.get("T2T_VERBOSE", "") not in ("", "0"):
    return True
  return any(a.startswith(("--verbosity", "-v")) for a in argv)


def is_noise(line: str) -> bool:
  """Whether `line` (without its newline) is library chatter."""
  return any(p.search(line) for p in NOISE)


def restate(line: str, said: set[str]) -> Optional[str]:
  """t2t's version of a library line that matters (once per message), or None."""
  for pattern, message in RESTATED:
    if pattern.search(line):
      if message in said:
        return ""
      said.add(message)
      return message
  return None


class LineFilter:
  """Decides, line by line, what of fd 2 reaches the terminal.

  A noise line's indented continuation lines are noise too: absl prints a multi-line log
  record's later lines as they are (seqio's "sequence lengths are longer than necessary"
  warning leaked its "Got: ..." and "Max Lengths: ..." lines), and Python's warnings add the
  indented source line. The first line that is not indented ends the record: a traceback begins
  with "Traceback ...", so its indented frames are never taken for a record's continuation.
  """

  def __init__(self):
    self._said: set[str] = set()
    self._in_noise = False

  def __call__(self, line: str) -> Optional[str]:
    """The text to write for `line` (without its newline), or None to drop it."""
    if self._in_noise and line[:1] in (" ", "\t"):
      return None
    self._in_noise = False
    said = restate(line, self._said)
    if said is not None:
      return (said + "\n") if said else None
    if is_noise(line):
      self._in_noise = True
      return None
    return line + "\n"


class CollectiveLines:
  """Decides, line by line, what of a joined run's standard output reaches the terminal.

  Gloo's threads write their connection message in pieces (`GLOO_PIECES`, the numbers, then a
  newline), and two threads' pieces interleave: "[Gloo] Rank 7[Gloo] Rank 6 is connected to 7
  peer ranks. ... : 7" followed by " is connected to 7 peer ranks. ... : 7". A line made only of
  Gloo pieces, numbers and spaces is dropped. Each line's newline ends one message, so a line
  that begins k messages leaves k - 1 open; while messages are open, a line of nothing but
  numbers and spaces (or an empty one) is the rest of one of them and is dropped too. Any other
  line passes unchanged, a line that mixes Gloo pieces with other text included (nothing of
  t2t's output is ever cut).
  """

  def __init__(self):
    self._open = 0  # messages begun on earlier lines whose newline has not come yet

  def __call__(self, line: str) -> Optional[str]:
    """The text to write for `line` (without its newline), or None to drop it."""
    pieces = GLOO_PIECES.findall(line)
    only_gloo = not GLOO_PIECES.sub("", line).strip("0123456789 \t\r")
    if pieces:
      begun = sum(piece == "[Gloo] Rank " for piece in pieces)
      self._open = max(self._open + begun - 1, 0)
      return None if only_gloo else line + "\n"
    if self._open and only_gloo:
      self._open -= 1
      return None
    return line + "\n"


class _FdFilter:
  """Routes file descriptor `fd` (1 or 2) through a pipe; a thread forwards what `lines` keeps.

  If the real destination goes away (a reader such as `head` exits), the rest is read and
  dropped, so that the process never blocks on a full pipe.
  """

  def __init__(self, fd: int = 2, lines: Optional[Callable[[str], Optional[str]]] = None):
    self._fd = fd
    self._stream().flush()
    self._real = os.dup(fd)
    read, write = os.pipe()
    os.dup2(write, fd)
    os.close(write)
    self._read = read
    self._lines = lines or LineFilter()
    self._broken = False
    self._thread = threading.Thread(target=self._pump, name=f"t2t-fd{fd}-filter", daemon=True)
    self._thread.start()

  def _stream(self):
    return sys.stdout if self._fd == 1 else sys.stderr

  def _emit(self, text: str) -> None:
    if self._broken:
      return
    try:
      os.write(self._real, text.encode("utf-8", "replace"))
    except OSError:  # e.g. EPIPE: nobody reads any more
      self._broken = True

  def _line(self, line: str) -> None:
    text = self._lines(line)
    if text is not None:
      self._emit(text)

  def _pump(self) -> None:
    pending = ""
    while True:
      chunk = os.read(self._read, 65536)
      if not chunk:
        break
      pending += chunk.decode("utf-8", "replace")
      *lines, pending = pending.split("\n")
      for line in lines:
        self._line(line)
      if "\r" in pending:  # progress updates rewrite their line: pass them on now
        head, pending = pending.rsplit("\r", 1)
        self._emit(head + "\r")
    if pending:
      self._line(pending)

  def close(self) -> None:
    """Restores the file descriptor and waits until every filtered line is out."""
    try:
      self._stream().flush()
    except Exception:  # pylint: disable=broad-except
      pass
    os.dup2(self._real, self._fd)  # closes the pipe's last write end: the pump sees EOF
    self._thread.join(timeout=5)
    os.close(self._read)
    os.close(self._real)


def quiet(argv: Optional[Sequence[str]] = None) -> bool:
  """Silences the libraries for this process unless the user asked for them (module docstring).

  Call before TensorFlow is imported. Returns True when the output is filtered.
  """
  global _filter
  if verbose(sys.argv if argv is None else argv):
    return False
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
  for library in LIBRARIES:
    warnings.filterwarnings("ignore", module=rf"{library}(\.|$)")
  if _filter is None:
    _filter = _FdFilter(2)
    atexit.register(_close)
  return True


def quiet_collectives() -> bool:
  """Filters fd 1 through `CollectiveLines` too, when `quiet()` is filtering (a multi-process
  run: see the module docstring). Returns True when standard output is filtered."""
  global _stdout_filter
  if _filter is None:
    return False
  if _stdout_filter is None:
    _stdout_filter = _FdFilter(1, CollectiveLines())
  return True


def _close() -> None:
  global _filter, _stdout_filter
  if _stdout_filter is not None:
    _stdout_filter.close()
    _stdout_filter = None
  if _filter is not None:
    _filter.close()
    _filter = None

"""Test-wide settings: quiet TensorFlow, keep tf.data off the cores that JAX needs, and one
persistent JAX compilation cache for the session (see pytest_configure)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import t2t  # noqa: E402,F401  (first: keeps Keras's optional imports out, t2t/keras_imports.py)
import tensorflow as tf  # noqa: E402

tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.set_visible_devices([], "GPU")

import gin  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _clear_gin_config():
  """Each test starts and ends with an empty gin config (gin state is process-global)."""
  gin.clear_config()
  yield
  gin.clear_config()


# The suite compiles the same tiny models over and over: in both xdist workers, and in the many
# `python -m t2t.train / eval / infer` subprocesses the end-to-end tests start. JAX's persistent
# compilation cache lets every process after the first load the executable instead of compiling
# it again. Executables come back bit-identical (XLA serialises the compiled code), so no result
# changes; the in-memory jit caches (`_cache_size()`) count a load like a compilation.
#
# One directory per session, made by the controller before xdist starts its workers (they and
# every subprocess inherit the environment), under the controller's pytest base temp directory:
# CI starts cold, and pytest's own retention (the last 3 runs) keeps it from growing across runs.
# It never mixes with a user's own JAX cache: the variables below override theirs for the tests.
# T2T_TEST_JAX_CACHE=0 turns it off (every process compiles, as before).
#
# A maximum size is set although nothing should be evicted: only with one does JAX take a file
# lock (the `filelock` package, in the test extras) around each read and write of an entry.
# Without it a worker could read an entry the other is still writing; JAX would then warn and
# compile again -- correct, but noisy and slower.
JAX_CACHE_ENV = {
    "JAX_ENABLE_COMPILATION_CACHE": "true",
    # Compilations faster than this are cheaper to redo than to hash, write and scan for.
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.2",
    "JAX_COMPILATION_CACHE_MAX_SIZE": str(8 << 30),
}


# XLA's LLVM backend at -O0 for the tests. The suite's programs are tiny and run for a few steps,
# so much of its time is compiling them (a tiny T5's train step takes seconds, most of it in LLVM),
# not running them: -O0 took 27% off the in-process model and adaptation tests and 15-28% off the
# eight-device and two-process runs. The level changes only how LLVM optimises the kernels XLA
# emits (`IrCompiler::GetCodeGenOptLevel`); XLA's HLO passes, its fusions and its choice of runtime
# thunks and libraries (Eigen, XNNPACK/YNNPACK) are the same, and fast math stays off. Results
# agree with the default's to float rounding, not to the bit (at -O3 LLVM forms more fused
# multiply-adds and vectorises reductions), so every bit-for-bit check in the suite compares two
# programs compiled under the same flags. Set in the controller before any backend starts: the
# xdist workers and every subprocess inherit it (a test that sets XLA_FLAGS for a subprocess
# extends it, tests/support/environment.py). T2T_TEST_XLA_OPT=default compiles as users do.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def _set_test_xla_flags() -> None:
  if os.environ.get("T2T_TEST_XLA_OPT", "0") == "default":
    return
  flags = os.environ.get("XLA_FLAGS", "")
  if "--xla_backend_optimization_level" not in flags:  # a caller's own level wins
    os.environ["XLA_FLAGS"] = f"{flags} {TEST_XLA_FLAGS}".strip()


@pytest.hookimpl(trylast=True)  # after pytest's tmpdir plugin has made its factory
def pytest_configure(config):
  if hasattr(config, "workerinput"):  # an xdist worker: the controller has set the environment
    return
  _set_test_xla_flags()
  if os.environ.get("T2T_TEST_JAX_CACHE", "1") == "0":
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    return
  cache_dir = config._tmp_path_factory.getbasetemp() / "jax-compilation-cache"
  cache_dir.mkdir(mode=0o700, exist_ok=True)  # machine code this session runs: private, as
  # t2t.training.compilation_cache requires of --compilation_cache_dir (pytest's root is 0700 too)
  os.environ.update(JAX_CACHE_ENV, JAX_COMPILATION_CACHE_DIR=str(cache_dir))
  import sys
  if "jax" in sys.modules:  # imported before this hook (a plugin): its config read the old values
    import jax
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(JAX_CACHE_ENV["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
    jax.config.update("jax_compilation_cache_max_size", int(JAX_CACHE_ENV["JAX_COMPILATION_CACHE_MAX_SIZE"]))
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
  """Test modules import with Python's collector paused, then what they leave is frozen, as
  `python -m t2t.*` does for its imports (t2t/training/garbage_collection.py): models trace
  faster in every test of this process."""
  from t2t.training import garbage_collection
  with garbage_collection.imports_without_collection():
    return (yield)

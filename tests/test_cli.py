"""Tests for t2t/cli.py: bad input ends in one readable line, not a traceback."""
import subprocess
import sys
import textwrap


def _run(body, env_extra=None, args=()):
  import os
  code = textwrap.dedent("""
      from t2t import cli
      def main(argv):
      """) + textwrap.indent(textwrap.dedent(body), "  ") + "\ncli.run(main)\n"
  env = {**os.environ, **(env_extra or {})}
  env.pop("T2T_TRACEBACK", None) if not env_extra else None
  return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                        timeout=120)


def test_bad_input_error_is_one_line_and_exit_code_1():
  out = _run("raise ValueError('MODEL_DIR is wrong')")
  assert out.returncode == 1
  assert "error: MODEL_DIR is wrong" in out.stderr and "Traceback" not in out.stderr


def test_traceback_on_request():
  out = _run("raise ValueError('boom')", {"T2T_TRACEBACK": "1"})
  assert out.returncode != 0 and "Traceback" in out.stderr


def test_ctrl_c_is_one_line_and_status_130():
  # An audit's Ctrl-C during t2t.eval's compile printed a 60-130-line KeyboardInterrupt traceback.
  out = _run("raise KeyboardInterrupt")
  assert out.returncode == 130
  assert "interrupted (Ctrl-C)" in out.stderr and "Traceback" not in out.stderr, out.stderr
  out = _run("raise KeyboardInterrupt", {"T2T_TRACEBACK": "1"})
  assert "Traceback" in out.stderr and "KeyboardInterrupt" in out.stderr


def test_gin_shorthand_reaches_the_flags():
  out = _run("print(cli.FLAGS.gin_bindings)", args=["--gin.MODEL_DIR=/tmp/a", "--gin.STEPS=3"])
  assert out.returncode == 0, out.stderr
  assert "[\"MODEL_DIR = '/tmp/a'\", 'STEPS = 3']" in out.stdout


def test_a_failed_data_check_inside_tf_data_is_one_line_other_tf_errors_keep_the_traceback():
  body = """
      import tensorflow as tf
      def check(t):
        ok = tf.debugging.Assert(tf.equal(t, 'a'), [
            "ClassifierModel: a training target of 'toy'", t, "is not one of the labels ['a']."])
        with tf.control_dependencies([ok]):
          return tf.identity(t)
      list(tf.data.Dataset.from_tensor_slices(['a', 'zz']).map(check))
      """
  out = _run(body)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
  assert ("error: ClassifierModel: a training target of 'toy' zz is not one of the labels ['a']."
          in out.stderr)
  other = _run("""
      import tensorflow as tf
      tf.reshape(tf.zeros([3]), [2])
      """)
  assert other.returncode != 0 and "Traceback" in other.stderr and "InvalidArgumentError" in other.stderr


def _run_distributed(args):
  import os
  code = textwrap.dedent("""
      from t2t import cli, config
      calls = []
      parse = config.parse_gin
      config.parse_gin = lambda *a, **k: (calls.append(1), parse(*a, **k))
      def main(argv):
        import gin, jax
        cli.parse_flags_into_gin()  # what every entry point's main does: already done
        from t2t.training import host_memory
        print("main ran; parsed", len(calls), "time(s); SEED =", gin.query_parameter("%SEED"),
              "; processes", jax.process_count(), "; malloc retains freed memory",
              host_memory.applied(), "; memory schedule", host_memory.memory_schedule())
      cli.run(main, distributed=True)
      """)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("T2T_TRACEBACK", None)
  return subprocess.run([sys.executable, "-c", code, "--gin_bindings=SEED = 7", *args],
                        capture_output=True, text=True, env=env, timeout=300)


def test_entry_points_parse_gin_once_then_start_distributed_before_main():
  out = _run_distributed([])
  assert out.returncode == 0, out.stderr[-3000:]
  # --host_malloc=auto on the CPU backend: glibc's settings are in place before main runs
  assert ("main ran; parsed 1 time(s); SEED = 7 ; processes 1 ; malloc retains freed memory True"
          " ; memory schedule True") in out.stdout
  system = _run_distributed(["--host_malloc=system"])
  assert "; malloc retains freed memory False ; memory schedule False" in system.stdout, \
      system.stderr[-3000:]
  bad = _run_distributed(["--coordinator_address=127.0.0.1:1234", "--num_processes=2",
                          "--process_id=2"])
  assert bad.returncode == 1 and "main ran" not in bad.stdout
  assert "error: process_id=2 must be in 0 .. num_processes - 1 (num_processes=2)" in bad.stderr
  assert "Traceback" not in bad.stderr


def test_an_xla_like_runtime_error_keeps_its_traceback():
  """Only bad input is one line: a RuntimeError from XLA (out of memory) is a failure to debug."""
  out = _run("raise RuntimeError('RESOURCE_EXHAUSTED: Out of memory while trying to allocate')")
  assert out.returncode != 0 and "Traceback" in out.stderr and "RESOURCE_EXHAUSTED" in out.stderr


def test_a_user_error_is_one_line():
  out = _run("from t2t import errors\nraise errors.UserError('INPUT_FILE is empty')")
  assert out.returncode == 1 and "Traceback" not in out.stderr
  assert "error: INPUT_FILE is empty" in out.stderr
  out = _run("from t2t.phases import PhaseError\nraise PhaseError('phase 2 failed')")
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-1500:]

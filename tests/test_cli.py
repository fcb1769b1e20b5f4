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


def test_gin_shorthand_reaches_the_flags():
  out = _run("print(cli.FLAGS.gin_bindings)", args=["--gin.MODEL_DIR=/tmp/a", "--gin.STEPS=3"])
  assert out.returncode == 0, out.stderr
  assert "[\"MODEL_DIR = '/tmp/a'\", 'STEPS = 3']" in out.stdout

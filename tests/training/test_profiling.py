"""`train.profile`: a jax.profiler trace of exactly the steps named, by the hooks and through
train()."""
import glob
import gzip
import importlib
import json
import os
import time

import jax
import jax.numpy as jnp
import optax
import pytest

from t2t import train as train_lib
from t2t.training import profiling
from tests.support.tiny_model import tiny_t5


def _events(trace_dir, name):
  """How many calls of the jitted function `name` the Perfetto trace under trace_dir holds."""
  files = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
  assert len(files) == 1, files
  with gzip.open(files[0]) as f:
    data = json.load(f)
  events = data["traceEvents"] if isinstance(data, dict) else data
  calls = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("ph") == "X" and e.get("name") == f"PjitFunction({name})")
  count, end = 0, float("-inf")
  for start, stop in calls:   # a call's event holds a nested one of the same name: count the outer
    if start >= end:
      count, end = count + 1, stop
  return count


@pytest.mark.parametrize("field, value", [("first_step", 0), ("num_steps", -1),
                                          ("num_steps", True), ("first_step", 2.5)])
def test_bad_settings_name_the_binding(field, value):
  with pytest.raises(ValueError, match=f"Profile.{field} must be an integer >= 1"):
    profiling.Profile(**{field: value})


def test_the_hooks_trace_the_named_steps_and_nothing_else(tmp_path, capsys):
  @jax.jit
  def one_step(x):
    return jnp.tanh(x @ x)

  hook = profiling.Profile(first_step=3, num_steps=2).hook(str(tmp_path), 0, 6)
  state = jnp.eye(64)
  hook.start_hook(0, state, None, None)   # before the loop: step 0 is not first_step - 1
  for step in range(1, 7):                # in run_loop's order: stop first, start last
    state = one_step(state)
    hook.stop_hook(step, state, None, None)
    hook.start_hook(step, state, None, None)
  hook.close()                            # already stopped: nothing more
  trace = tmp_path / profiling.PROFILE_DIR
  assert _events(str(trace), "one_step") == 2   # steps 3 and 4 of six
  assert glob.glob(str(trace / "plugins" / "profile" / "*" / "*.xplane.pb"))
  summary = json.loads((trace / profiling.SUMMARY_FILE).read_text())
  assert summary["first_step"] == 3 and summary["last_step"] == 4 and summary["complete"]
  assert summary["wall_s_per_step"] == pytest.approx(summary["wall_s"] / 2)
  assert summary["perfetto_trace"].startswith(str(trace / "plugins" / "profile"))
  assert os.path.exists(summary["perfetto_trace"])
  assert "Profile: steps 3-4 traced in" in capsys.readouterr().err


def test_the_summary_splits_each_step_into_xla_and_the_rest(tmp_path, capsys):
  """A step of a few tens of ms of XLA work and 150 ms of host time (a sleep, as a slow input
  pipeline would take)."""
  @jax.jit
  def one_step(x):
    for _ in range(20):
      x = jnp.tanh(x @ x)
    return x

  state = jax.random.normal(jax.random.PRNGKey(0), (384, 384)) / 20
  one_step(state).block_until_ready()
  hook = profiling.Profile(first_step=2, num_steps=3).hook(str(tmp_path), 0, 5)
  for step in range(1, 6):
    time.sleep(0.15)
    state = one_step(state)
    hook.stop_hook(step, state, None, None)
    hook.start_hook(step, state, None, None)
  summary = json.loads((tmp_path / profiling.PROFILE_DIR / profiling.SUMMARY_FILE).read_text())
  xla, outside = summary["xla_busy_s_per_step"], summary["outside_xla_s_per_step"]
  # XLA runs a step while the host sleeps before the next (dispatch is asynchronous), so the
  # time with no program running is the sleep less that overlap.
  assert 0.002 < xla < 0.5 and 0.15 - xla <= outside < 1.0, summary
  assert xla + outside == pytest.approx(summary["wall_s_per_step"])
  assert "outside XLA: Python, input, hooks" in capsys.readouterr().err


def test_xla_busy_time_is_the_union_of_the_threads_spans(tmp_path):
  assert profiling.xla_busy_s(str(tmp_path)) is None   # no trace
  @jax.jit
  def f(x):
    return jnp.tanh(x @ x)
  x = jnp.ones((256, 256))
  f(x).block_until_ready()
  with jax.profiler.trace(str(tmp_path)):
    t0 = time.perf_counter()
    for _ in range(5):
      f(x).block_until_ready()
    wall = time.perf_counter() - t0
  assert 0 < profiling.xla_busy_s(str(tmp_path)) < wall


def test_a_run_that_ends_inside_the_trace_closes_it(tmp_path, capsys):
  hook = profiling.Profile(first_step=1, num_steps=5).hook(str(tmp_path), 0, 2)
  state = jnp.ones(4)
  hook.start_hook(0, state, None, None)
  for step in (1, 2):
    state = state + 1
    hook.stop_hook(step, state, None, None)
    hook.start_hook(step, state, None, None)
  hook.close()
  summary = json.loads((tmp_path / profiling.PROFILE_DIR / profiling.SUMMARY_FILE).read_text())
  assert not summary["complete"] and summary["last_step"] is None
  assert "the run ended before step 5" in capsys.readouterr().err


def test_a_trace_that_cannot_start_is_announced_and_training_goes_on(tmp_path, capsys):
  jax.profiler.start_trace(str(tmp_path / "someone_elses"))   # a profiler already running
  try:
    hook = profiling.Profile(first_step=1, num_steps=2).hook(str(tmp_path), 0, 3)
    for step in (0, 1, 2, 3):
      hook.stop_hook(step, jnp.ones(2), None, None)
      hook.start_hook(step, jnp.ones(2), None, None)
    hook.close()
  finally:
    jax.profiler.stop_trace()
  assert "Profile: the trace could not start in" in capsys.readouterr().err
  assert not (tmp_path / profiling.PROFILE_DIR / profiling.SUMMARY_FILE).exists()


@pytest.mark.parametrize("start, last, message", [
    (5, 10, "resumes at step 5, past Profile.first_step = 3"),
    (0, 2, "Profile.first_step = 3 is after the run's last step (2)")])
def test_steps_outside_the_run_are_announced_not_traced(tmp_path, capsys, start, last, message):
  hook = profiling.Profile(first_step=3, num_steps=2).hook(str(tmp_path), start, last)
  for step in range(start, last + 1):
    hook.stop_hook(step, jnp.ones(2), None, None)
    hook.start_hook(step, jnp.ones(2), None, None)
  hook.close()
  assert message in capsys.readouterr().err
  assert not (tmp_path / profiling.PROFILE_DIR).exists()


def test_train_traces_its_steps_two_and_three(tmp_path, capsys):
  importlib.import_module("tasks.bbc")   # registers the BBC tasks
  train_lib.train(model=tiny_t5(), mixture_or_task_name="bbc_span_corruption",
                  task_feature_lengths={"inputs": 32, "targets": 8}, train_steps=4,
                  model_dir=str(tmp_path), batch_size=2, optimizer=optax.adam(1e-3),
                  checkpoint_every=2, log_every=1,
                  profile=profiling.Profile(first_step=2, num_steps=2))
  trace = tmp_path / profiling.PROFILE_DIR
  # The step is two programs (Trainer.split_update): each ran once in each traced step.
  assert _events(str(trace), "gradient_step") == 2
  assert _events(str(trace), "update_step") == 2
  summary = json.loads((trace / profiling.SUMMARY_FILE).read_text())
  assert (summary["first_step"], summary["last_step"], summary["complete"]) == (2, 3, True)
  assert "Profile: steps 2-3 traced in" in capsys.readouterr().err


def test_the_recipe_binds_train_profile():
  import gin
  from t2t import config
  config.parse_gin(["experiments/bbc_demo/finetune.gin", "recipes/profile.gin"],
                   ["MODEL_DIR = '/tmp/unused'", "INITIAL_CHECKPOINT_PATH = None",
                    "PROFILE_FIRST_STEP = 5"])
  assert gin.query_parameter("train.profile").selector == "Profile"
  assert profiling.Profile() == profiling.Profile(first_step=5, num_steps=3)


def test_each_process_of_a_multi_process_run_traces_into_its_own_directory():
  assert profiling.trace_dir("/m", 0, 1) == os.path.join("/m", "profile")
  assert profiling.trace_dir("/m", 3, 4) == os.path.join("/m", "profile", "process_3")
  assert profiling.trace_dir("gs://b/m", 1, 2) == "gs://b/m/profile/process_1"

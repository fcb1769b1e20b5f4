"""Soak: train a tiny T5 through random SIGKILLs and SIGTERMs; the result must equal an unbroken run.

  python -m benchmarks.soak [--minutes 30] [--mean_interval 90] [--distribution exponential]
                            [--seed 0] [--checkpoint_every 25] [--keep 3] [--final_step N]
                            [--repair_input_state] [--work_dir DIR] [--keep_dirs]
                            [--out benchmarks/results/soak.json]

A benchmark, not a test: it only drives the command line (`python -m t2t.train`), as an operator
on preemptible machines would. The model is the demo's BBC span-corruption pre-training
(gin/experiments/bbc_demo/pretrain.gin) shrunk as in tests/training/test_preemption.py (d_model
32, 1+1 layers, batch 4), logging every step and checkpointing every `--checkpoint_every` steps
(keeping `--keep`), so that interruptions land between checkpoints, right on them and during
their writes.

1. Interrupted phase (`--minutes`): the run is started with TRAIN_STEPS = 10^9 in MODEL_DIR
   `interrupted/`. Once it has logged a step, a delay is drawn (`--distribution`: exponential
   with mean `--mean_interval` seconds, or uniform on [0, 2 * mean], from `--seed`), then the
   process gets SIGKILL or SIGTERM (a fair coin) and the same command is started again. SIGTERM
   must end the run with status 0 and "Preempted at step N"; after a SIGKILL the model directory
   is inspected to tell where it landed: during orbax's write (a `*.orbax-checkpoint-tmp*`
   directory left behind), after orbax's write but before the input state was saved (the newest
   checkpoint lacks `input_state/process_0.index`), right on a checkpoint (the last logged step
   is the newest checkpoint) or between checkpoints. The phase ends at the first interruption
   after the budget, once both kinds have occurred.
2. The same command with TRAIN_STEPS = the final step (default: the last step logged + one
   checkpoint interval; the schedule, inverse square root, does not depend on TRAIN_STEPS) runs
   to its end; then the same config runs to the same step uninterrupted in a fresh `straight/`.
3. The two final checkpoints are loaded read-only with orbax and compared leaf by leaf
   (parameters and optimizer state: same tree, shapes and dtypes, max |a - b|), and so are the
   per-step training losses of metrics.jsonl (the last value per step, as a restarted run
   rewrites the steps it recomputes; every earlier value of a recomputed step too).

A restart t2t refuses (it exits before training) fails the soak and ends it; with
`--repair_input_state` a refused input state (`... does not fit the rebuilt input pipeline`) is
deleted as t2t's message says and the run restarted, each repair recorded (still a FAIL), so the
final states still get compared.

Pass: both final states and all losses equal within 1e-6, every step 1..final logged, every
SIGTERM clean, both kinds used. Steps lost = the last step logged before a kill minus the step
the next run resumed from (its first logged step - 1). The JSON (also printed as a table) holds
every interruption, the verdict, the wall times and the machine (cores, CPU, load averages and
other processes' cores, `benchmarks.machine`). The work directory is deleted on a pass unless
`--keep_dirs`, and always kept on a failure, with each run's log.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence


from benchmarks import machine, report
from benchmarks.run_comparison import (STEP_PREFIX, TOLERANCE, checkpoint_steps, compare_runs,
                                       comparison_failures, set_aside_metrics)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ('--gin_file=experiments/bbc_demo/pretrain.gin', '--gin.T5Config.d_model=32',
        '--gin.T5Config.d_ff=64', '--gin.T5Config.num_heads=2', '--gin.T5Config.d_kv=16',
        '--gin.T5Config.num_encoder_layers=1', '--gin.T5Config.num_decoder_layers=1',
        '--gin.BATCH_SIZE=4', '--gin.train.log_every=1')
UNBOUNDED_STEPS = 10**9
SIGTERM_TIMEOUT_S = 300
START_TIMEOUT_S = 900


class SoakError(RuntimeError):
  """A training run misbehaved in a way that ends the soak (it exited on its own, hung, ...)."""


def train_command(model_dir: str, train_steps: int, checkpoint_every: int,
                  keep: int | None) -> list[str]:
  """The `python -m t2t.train` command line of the soak's tiny T5 (the same for every run)."""
  return [sys.executable, '-m', 't2t.train', *TINY, f'--gin.CHECKPOINT_EVERY={checkpoint_every}',
          f'--gin.train.keep_checkpoints={keep}', f'--gin.MODEL_DIR={model_dir}',
          f'--gin.TRAIN_STEPS={train_steps}']


def _env() -> dict[str, str]:
  """This checkout's t2t first on the path (the venv's editable install may point elsewhere)."""
  path = os.pathsep.join(p for p in (ROOT, os.environ.get('PYTHONPATH')) if p)
  return {**os.environ, 'PYTHONPATH': path, 'TF_CPP_MIN_LOG_LEVEL': '3', 'JAX_PLATFORMS': 'cpu'}


# --- Reading a model directory -------------------------------------------------------------------

def _new_steps(path: str, offset: int) -> list[int]:
  """Steps of the complete train records appended to metrics.jsonl after byte `offset`."""
  if not os.path.exists(path):
    return []
  with open(path, 'rb') as f:
    f.seek(offset)
    data = f.read()
  steps = []
  for line in data.split(b'\n')[:-1]:  # the last piece is '' or a line still being written
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if record.get('split') == 'train':
      steps.append(int(record['step']))
  return steps


def interruption_moment(model_dir: str, last_logged: int | None) -> tuple[str, list[str]]:
  """Where a SIGKILL landed, judged from what it left in `model_dir`: (moment, evidence).

  'during_checkpoint_write': an orbax tmp directory is left (the save was cut);
  'during_input_state_write': the newest checkpoint has no `process_0.index` input state (in
  `input_state/checkpoint_<N>/`, or inside the step directory as older t2t versions wrote it:
  cut after orbax finalised the step, before or while the input position was saved);
  'on_checkpoint': the last logged step is the newest checkpoint (killed right after a save);
  'between_checkpoints': otherwise. With asynchronous checkpoints a tmp directory may also mean
  a write that was running in the background.
  """
  tmp = sorted(d for d in os.listdir(model_dir) if d.startswith(STEP_PREFIX) and 'tmp' in d)
  if tmp:
    return 'during_checkpoint_write', tmp
  steps = checkpoint_steps(model_dir)
  if steps:
    newest = os.path.join(model_dir, f'{STEP_PREFIX}_{steps[-1]}')
    # t2t writes the state to input_state/checkpoint_<N>/ (before the orbax save); older
    # versions wrote checkpoint_<N>/input_state/ (after it).
    side = os.path.join(model_dir, 'input_state', f'{STEP_PREFIX}_{steps[-1]}')
    state = side if os.path.isdir(side) else os.path.join(newest, 'input_state')
    if not os.path.exists(os.path.join(state, 'process_0.index')):
      partial = sorted(os.listdir(state)) if os.path.isdir(state) else None
      return 'during_input_state_write', [
          f'{STEP_PREFIX}_{steps[-1]} has ' + (f'input_state/ holding only {partial}'
                                               if partial is not None else 'no input_state/')]
    if last_logged == steps[-1]:
      return 'on_checkpoint', [f'{STEP_PREFIX}_{steps[-1]}']
  return 'between_checkpoints', []


# --- Driving the runs ----------------------------------------------------------------------------

class Run:
  """One `python -m t2t.train` process, its output in `log_path`."""

  def __init__(self, cmd: Sequence[str], log_path: str):
    self.log_path = log_path
    self._log = open(log_path, 'w')
    self.proc = subprocess.Popen(list(cmd), cwd=ROOT, env=_env(), stdout=self._log,
                                 stderr=subprocess.STDOUT, start_new_session=True)

  def wait(self, timeout: float | None = None) -> int:
    try:
      return self.proc.wait(timeout)
    finally:
      if self.proc.returncode is not None:
        self._log.close()

  def log(self) -> str:
    with open(self.log_path, errors='replace') as f:
      return f.read()

  def tail(self, n: int = 2000) -> str:
    return self.log()[-n:]


def _draw(rng: random.Random, distribution: str, mean: float) -> float:
  if distribution == 'exponential':
    return rng.expovariate(1.0 / mean)
  return rng.uniform(0.0, 2.0 * mean)


def _wait_for_new_step(run: Run, metrics: str, offset: int, sample: Callable[[], None]) -> int:
  """Blocks until the run logs a step after byte `offset` of metrics.jsonl; returns that step."""
  deadline = time.monotonic() + START_TIMEOUT_S
  while True:
    steps = _new_steps(metrics, offset)
    if steps:
      return steps[0]
    if run.proc.poll() is not None:
      raise SoakError(f'The training run exited (status {run.proc.returncode}) before logging a '
                      f'step; log {run.log_path}:\n{run.tail()}')
    if time.monotonic() > deadline:
      raise SoakError(f'The training run logged no step in {START_TIMEOUT_S} s; log '
                      f'{run.log_path}:\n{run.tail()}')
    sample()
    time.sleep(0.2)


def error_line(log: str) -> str:
  """The `error: ...` line t2t prints for a user-facing failure (else the log's last line)."""
  lines = [l for l in log.strip().splitlines() if l.strip()]
  errors = [l for l in lines if l.startswith('error:')]
  return (errors or lines or ['(empty log)'])[-1][:400]


_STATE_HINT = re.compile(r'To resume anyway by replaying the stream, delete (\S+?)\.?$', re.M)


def soak(work_dir: str, minutes: float, mean_interval: float, distribution: str = 'exponential',
         seed: int = 0, checkpoint_every: int = 25, keep: int | None = 3,
         final_step: int | None = None, repair: bool = False,
         progress: Callable[[str], None] = print) -> dict[str, Any]:
  """Runs the three phases (module docstring) under `work_dir`; returns the result dict.

  With `repair`, a restart refused because a saved input state does not fit the rebuilt
  pipeline gets that state deleted, as t2t's message says, and is started again; each such
  repair is recorded and fails the soak (an operator had to step in), but the runs go on to
  the comparison.
  """
  rng = random.Random(seed)
  interrupted = os.path.join(work_dir, 'interrupted')
  straight = os.path.join(work_dir, 'straight')
  logs = os.path.join(work_dir, 'logs')
  os.makedirs(logs, exist_ok=True)
  metrics = os.path.join(interrupted, 'metrics.jsonl')
  cmd = train_command(interrupted, UNBOUNDED_STEPS, checkpoint_every, keep)
  loads: list[float] = []
  last_sample = [0.0]

  def sample() -> None:
    if time.monotonic() - last_sample[0] >= 5:
      last_sample[0] = time.monotonic()
      loads.append(os.getloadavg()[0])

  t0 = time.monotonic()
  say = lambda msg: progress(f'[soak {time.monotonic() - t0:7.1f} s] {msg}')
  events: list[dict[str, Any]] = []
  repairs: list[dict[str, Any]] = []
  failures: list[str] = []
  kinds: set[str] = set()

  def launch(command: list[str], name: str) -> tuple[Run, int, int]:
    """Starts `command` in `interrupted/`; (run, metrics offset, first new step) once it trains."""
    while True:
      set_aside_metrics(os.path.dirname(metrics))
      offset = 0
      run = Run(command, os.path.join(logs, f'{name}{"_retry%d" % len(repairs) if repairs else ""}.log'))
      try:
        first = _wait_for_new_step(run, metrics, offset, sample)
      except SoakError:
        hint = _STATE_HINT.search(run.log()) if repair else None
        if hint is None:
          raise
        repairs.append({'after_interruption': len(events) - 1, 'log': run.log_path,
                        'error': error_line(run.log()), 'deleted': hint.group(1)})
        say(f'restart refused: {error_line(run.log())[:200]}... -> deleting {hint.group(1)} '
            '(--repair_input_state)')
        shutil.rmtree(hint.group(1))
        continue
      if events:
        events[-1]['resumed_at'] = first - 1
        events[-1]['steps_lost'] = max(0, events[-1]['last_logged'] - (first - 1))
        say(f"{name} resumed at step {first - 1} (lost {events[-1]['steps_lost']} steps)")
      return run, offset, first

  final = None
  aborted = False
  with machine.Section('interrupted_phase') as phase:
    try:
      while True:
        run, offset, first = launch(cmd, f'run_{len(events):03d}')
        if not events:
          say(f'run_000 trains: first step logged after {time.monotonic() - t0:.0f} s')
        delay = _draw(rng, distribution, mean_interval)
        end = time.monotonic() + delay
        while time.monotonic() < end and run.proc.poll() is None:
          sample()
          time.sleep(0.1)
        if run.proc.poll() is not None:
          raise SoakError(f'the training run exited on its own (status {run.proc.returncode}): '
                          f'{error_line(run.log())}; log {run.log_path}')
        over = time.monotonic() - t0 >= minutes * 60.0
        kind = 'SIGKILL' if rng.random() < 0.5 else 'SIGTERM'
        if over and len(kinds) == 1:  # both kinds must occur
          kind = ({'SIGKILL', 'SIGTERM'} - kinds).pop()
        kinds.add(kind)
        events.append(_interrupt(run, kind, interrupted, metrics, offset, first, delay, failures,
                                 n=len(events), at_s=time.monotonic() - t0))
        e = events[-1]
        evidence = ': ' + ', '.join(e['evidence']) if e.get('evidence') else ''
        say(f"interruption {e['n']}: {kind} {delay:.1f} s after the first step, at step "
            f"{e['last_logged']} ({e['moment']}{evidence}; checkpoints {e['checkpoints_after'][-3:]})")
        if over and len(kinds) == 2:
          break
      final = final_step or events[-1]['last_logged'] + checkpoint_every
      say(f'budget used: {len(events)} interruptions; resuming to the final step {final}')
    except SoakError as e:
      aborted = True
      failures.append(f'after interruption {len(events) - 1}: {e}')
      say(f'FAIL: {e}')
  with machine.Section('final_run') as tail:
    if not aborted:
      try:
        run, _, _ = launch(train_command(interrupted, final, checkpoint_every, keep), 'final')
        rc = run.wait()
        if rc != 0:
          failures.append(f'the final run exited with status {rc}: {error_line(run.log())}; '
                          f'log {run.log_path}')
          aborted = True
        say(f'final run done (status {rc})')
      except SoakError as e:
        aborted = True
        failures.append(f'the final run: {e}')
        say(f'FAIL: {e}')
  with machine.Section('straight_run') as ref:
    if not aborted:
      say(f'training {final} steps uninterrupted in {straight}')
      started = time.monotonic()
      run = Run(train_command(straight, final, checkpoint_every, keep),
                os.path.join(logs, 'straight.log'))
      rc = run.wait()
      if rc != 0:
        aborted = True
        failures.append(f'the uninterrupted run exited with status {rc}: '
                        f'{error_line(run.log())}; log {run.log_path}')
      say(f'uninterrupted run done (status {rc}) in {time.monotonic() - started:.0f} s')
  comparison = None
  if not aborted:
    comparison = compare_runs(interrupted, straight, final)
    failures += comparison_failures(comparison)
  if repairs:
    failures.append(f'{len(repairs)} restart(s) were refused ("{repairs[0]["error"][:160]}...") '
                    'and resumed only after deleting the input state by hand')
  if not aborted and len(kinds) < 2:
    failures.append(f'only {sorted(kinds)} occurred')
  loads += [s.loadavg_after for s in (phase, tail, ref)]
  all_logs = ''.join(open(os.path.join(logs, f), errors='replace').read()
                     for f in sorted(os.listdir(logs)) if not f.startswith('straight'))
  kills = [e for e in events if e['kind'] == 'SIGKILL']
  moments: dict[str, int] = {}
  for e in kills:
    moments[e['moment']] = moments.get(e['moment'], 0) + 1
  return {
      'benchmark': 'soak', 'final_step': final, 'checkpoint_every': checkpoint_every,
      'keep_checkpoints': keep, 'minutes': minutes, 'mean_interval_s': mean_interval,
      'distribution': distribution, 'seed': seed, 'repair_input_state': repair, 'command': cmd,
      'interruptions': len(events), 'sigkills': len(kills),
      'sigterms': sum(e['kind'] == 'SIGTERM' for e in events),
      'sigkill_moments': moments, 'restarts': len(events) + len(repairs),
      'steps_lost': sum(e.get('steps_lost', 0) for e in events),
      'corrupt_checkpoints_set_aside': len(re.findall(r'Checkpoint \d+ is corrupted', all_logs)),
      'input_replays': len(re.findall(r'replaying the input stream', all_logs)),
      'repairs': repairs, 'aborted': aborted,
      'comparison': comparison, 'failures': failures, 'passed': not failures,
      'tolerance': TOLERANCE, 'events': events,
      'wall_s': {'interrupted_phase': phase.wall_s, 'final_run': tail.wall_s,
                 'straight_run': ref.wall_s, 'total': time.monotonic() - t0},
      'sections': [s.as_dict() for s in (phase, tail, ref)],
      'loadavg_1min': {'min': min(loads), 'mean': sum(loads) / len(loads), 'max': max(loads),
                       'samples': len(loads)},
      'work_dir': work_dir,
  }


def _interrupt(run: Run, kind: str, model_dir: str, metrics: str, offset: int, first: int,
               delay: float, failures: list[str], n: int, at_s: float) -> dict[str, Any]:
  """Sends `kind` to the run, waits for it to end, and records what it left behind."""
  event: dict[str, Any] = {'n': n, 'kind': kind, 'after_s': round(delay, 2), 'at_s': round(at_s, 1),
                           'log': run.log_path}
  if kind == 'SIGKILL':
    run.proc.send_signal(signal.SIGKILL)
    event['returncode'] = run.wait()
    event['last_logged'] = max(_new_steps(metrics, offset), default=first - 1)
    event['moment'], event['evidence'] = interruption_moment(model_dir, event['last_logged'])
  else:
    run.proc.send_signal(signal.SIGTERM)
    try:
      event['returncode'] = run.wait(SIGTERM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      run.proc.send_signal(signal.SIGKILL)
      event['returncode'] = run.wait()
      failures.append(f'interruption {n}: SIGTERM did not end the run in {SIGTERM_TIMEOUT_S} s '
                      f'(killed); log {run.log_path}')
    event['last_logged'] = max(_new_steps(metrics, offset), default=first - 1)
    m = re.search(r'Preempted at step (\d+)', run.log())
    event['preempted_at'] = int(m.group(1)) if m else None
    if event['returncode'] != 0 or m is None:
      failures.append(f"interruption {n}: SIGTERM ended the run with status "
                      f"{event['returncode']} and {'no ' if m is None else 'a '}'Preempted' line; "
                      f'log {run.log_path}')
    event['moment'] = 'graceful'
  event['checkpoints_after'] = checkpoint_steps(model_dir)
  return event


def table(r: dict[str, Any]) -> str:
  """The soak's result as a short human-readable table."""
  c = r.get('comparison') or {}
  p, o, l = c.get('params', {}), c.get('opt_state', {}), c.get('losses', {})
  fmt = lambda x: 'n/a' if x is None else f'{x:.3g}'
  rows = [
      ('verdict', 'PASS' if r['passed'] else 'FAIL: ' + ' | '.join(r['failures'])),
      ('interruptions', f"{r['interruptions']} ({r['sigkills']} SIGKILL, {r['sigterms']} SIGTERM)"),
      ('SIGKILL landed', ', '.join(f'{k} {v}' for k, v in sorted(r['sigkill_moments'].items()))
       or 'n/a'),
      ('restarts / steps lost', f"{r['restarts']} / {r['steps_lost']}"),
      ('corrupt set aside / input replays',
       f"{r['corrupt_checkpoints_set_aside']} / {r['input_replays']}"),
      ('final step', str(r['final_step'])),
      ('params max |diff|', f"{fmt(p.get('max_abs_diff'))} ({p.get('unequal_leaves', 'n/a')} of "
                            f"{p.get('leaves', 'n/a')} leaves not bitwise equal)"),
      ('opt state max |diff|', f"{fmt(o.get('max_abs_diff'))} ({o.get('unequal_leaves', 'n/a')} of "
                               f"{o.get('leaves', 'n/a')} leaves not bitwise equal)"),
      ('loss max |diff| last / all', f"{fmt(l.get('max_abs_diff_last'))} / "
                                     f"{fmt(l.get('max_abs_diff_all'))} over "
                                     f"{l.get('steps_compared', 'n/a')} steps"),
      ('wall s (phase, final, straight)',
       ', '.join(f"{r['wall_s'][k]:.0f}" for k in ('interrupted_phase', 'final_run',
                                                    'straight_run'))),
      ('load 1-min min/mean/max', '/'.join(f"{r['loadavg_1min'][k]:.2f}"
                                           for k in ('min', 'mean', 'max'))
       + f" on {r['machine']['cores']} cores"),
  ]
  width = max(len(k) for k, _ in rows)
  return '\n'.join(f'{k:<{width}}  {v}' for k, v in rows)


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(prog='python -m benchmarks.soak',
                               description=__doc__.split('\n')[0])
  ap.add_argument('--minutes', type=float, default=30.0, help='length of the interrupted phase')
  ap.add_argument('--mean_interval', type=float, default=90.0,
                  help='mean seconds from a run\'s first logged step to its interruption')
  ap.add_argument('--distribution', default='exponential', choices=['exponential', 'uniform'])
  ap.add_argument('--seed', type=int, default=0)
  ap.add_argument('--checkpoint_every', type=int, default=25)
  ap.add_argument('--keep', type=int, default=3, help='checkpoints kept (0: all)')
  ap.add_argument('--final_step', type=int, default=None,
                  help='default: the last step logged + one checkpoint interval')
  ap.add_argument('--repair_input_state', action='store_true',
                  help='delete an input state that a restart refuses (as t2t says) and go on; '
                       'still a FAIL, but the runs are compared')
  ap.add_argument('--work_dir', default=None, help='default: a new directory under /tmp')
  ap.add_argument('--keep_dirs', action='store_true', help='keep the work directory on a pass')
  ap.add_argument('--out', default=os.path.join(ROOT, 'benchmarks', 'results', 'soak.json'))
  args = ap.parse_args(argv)
  for flag, value, ok in (('--minutes', args.minutes, args.minutes > 0),
                          ('--mean_interval', args.mean_interval, args.mean_interval > 0),
                          ('--checkpoint_every', args.checkpoint_every, args.checkpoint_every >= 1),
                          ('--keep', args.keep, args.keep >= 0),
                          ('--final_step', args.final_step,
                           args.final_step is None or args.final_step >= 1)):
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
      ap.error(f'{flag}={value} must be positive{" or 0" if flag == "--keep" else ""}')
  out_dir = os.path.dirname(os.path.abspath(args.out))
  if not os.path.isdir(out_dir):
    ap.error(f'--out={args.out}: the directory {out_dir} does not exist')
  if args.work_dir and os.path.exists(args.work_dir) and os.listdir(args.work_dir):
    ap.error(f'--work_dir={args.work_dir} is not empty: the soak needs fresh model directories')
  quiet = machine.check_quiet(allow_loaded=True)  # correctness, not speed: load is recorded only
  work_dir = args.work_dir or tempfile.mkdtemp(prefix='t2t_soak_')
  os.makedirs(work_dir, exist_ok=True)
  print(f'[soak] work directory {work_dir}; {args.minutes:g} min of interruptions every '
        f'~{args.mean_interval:g} s ({args.distribution}, seed {args.seed}), checkpoint every '
        f'{args.checkpoint_every} steps', flush=True)
  started = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())
  result = soak(work_dir, args.minutes, args.mean_interval, args.distribution, args.seed,
                args.checkpoint_every, args.keep or None, args.final_step,
                args.repair_input_state, progress=lambda m: print(m, flush=True))
  result['machine'] = dict(quiet, date_utc=started, cpu=report.cpu_model(),
                           platform=platform.platform(), loadavg_at_end=list(os.getloadavg()))
  result['argv'] = sys.argv[1:] if argv is None else list(argv)
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=1)
    f.write('\n')
  print(table(result), flush=True)
  if result['passed'] and not args.keep_dirs:
    shutil.rmtree(work_dir, ignore_errors=True)
  else:
    print(f'[soak] work directory kept: {work_dir}', flush=True)
  print(f'[soak] JSON written to {args.out}', flush=True)
  if not result['passed']:
    sys.exit(1)


if __name__ == '__main__':
  main()

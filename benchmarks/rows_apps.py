"""Rows of the applications: progress bars, metrics rows and their writers,
the peers (jax-tqdm, chex), steered loops and the backward pass, each
against the plain scan (or XLA's floor) measured in the same run."""

from __future__ import annotations

import io
import json
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
from jax.experimental import io_callback

import hostcall

from common import (Bench, EVERY, X, matmul_step, median_time, noop, numbered,
                    row)

PROGRESS = "progress bar and metrics"  # the target the peers are compared to


def progress_bar(b: Bench) -> list[dict]:
  """A progress bar (a few percent: three times the repeats)."""
  def step(carry, _):
    return matmul_step(carry), None

  fn = jax.jit(lambda x: hostcall.progress.scan(
      step, x, None, length=b.steps, file=io.StringIO())[0])
  us, ratio = b.paired(fn, repeats=3 * b.repeats)
  _, effectful = b.paired(fn, repeats=3 * b.repeats,
                          base_fn=b.effectful_base_fn)
  return [row("progress bar (hostcall.progress.scan)", us, ratio, 1.1,
               "a tick every 1% of the loop"),
          row("... progress bar / effectful dispatch", us, effectful,
               None, "vs the plain scan with one jax.debug.callback")]


SHORT = 100  # the steps of a short loop's bar
SHORT_CALLS = 200  # the calls of the Python loop that times it


def short_loop_bar(b: Bench) -> list[dict]:
  """A short loop's bar: a ``hostcall.jit`` step whose ``progress.scan``
  of ``SHORT`` steps opens, ticks and closes a bar each call, called from
  a Python loop, against tqdm's own bar over a Python loop as long, in the
  same run (every bar drawn and closed before each clock stops)."""
  from tqdm import tqdm
  sink = io.StringIO()

  def step(carry, _):
    return jnp.tanh(carry), None

  run = hostcall.jit(lambda x: hostcall.progress.scan(
      step, x, None, length=SHORT, file=sink)[0])
  x = jnp.linspace(-1.0, 1.0, 16, dtype=jnp.float32)

  def bars() -> float:
    start = time.perf_counter()
    for _ in range(SHORT_CALLS):
      out = run(x)
    jax.block_until_ready(out)
    hostcall.barrier()
    return (time.perf_counter() - start) / SHORT_CALLS

  def tqdm_bars() -> float:
    start = time.perf_counter()
    for _ in range(SHORT_CALLS):
      for _ in tqdm(range(SHORT), file=sink):
        pass
    return (time.perf_counter() - start) / SHORT_CALLS

  bars(), tqdm_bars()  # compiled, and tqdm's monitor started
  times, ratios = [], []
  for _ in range(3 * b.repeats):
    took, base = bars(), tqdm_bars()
    sink.seek(0)
    sink.truncate()
    times.append(took)
    ratios.append(took / base)
  return [row(f"{SHORT}-step bar under hostcall.jit / tqdm's own bar",
              statistics.median(times) * 1e6, statistics.median(ratios), 2.0,
              f"per call of a Python loop; tqdm over range({SHORT})")]


def progress_bar_postfix(b: Bench) -> list[dict]:
  """A bar showing the step's loss (``progress.set_postfix``), against the
  same bar loop without it: what the postfix adds, the value riding in the
  loop's state and on the bar's ticks. The loss is one the step returns
  anyway (its ``ys``), as a training step's is; one computed for the bar
  alone costs its own computation too (the second row)."""
  def loop(postfix: bool, returned: bool):
    def step(carry, _):
      carry = matmul_step(carry)
      loss = carry[0, 0]
      if postfix:
        hostcall.progress.set_postfix(loss=loss)
      return carry, loss if returned else None
    return jax.jit(lambda x: hostcall.progress.scan(
        step, x, None, length=b.steps, file=io.StringIO()))

  repeats = 3 * b.repeats
  us, ratio = b.paired(loop(True, True), repeats=repeats,
                       base_fn=loop(False, True))
  us_alone, alone = b.paired(loop(True, False), repeats=repeats,
                             base_fn=loop(False, False))
  return [row("progress bar + set_postfix(loss) / the bar alone", us, ratio,
              1.02, "the loss the step returns; ratio to the same bar loop"),
          row("... set_postfix of a value computed for it / the bar",
              us_alone, alone, None, "carry[0, 0] computed for the bar only")]


def metrics_rows(b: Bench) -> list[dict]:
  """Per-step metrics, against XLA's floor (the same values as ys), and
  with a progress bar (the demo's loop)."""
  repeats = 3 * b.repeats
  rows = []
  with tempfile.TemporaryDirectory() as root:
    run = hostcall.metrics.Run("bench", root=root)

    def logged_step(state, _):
      i, carry = state
      carry = matmul_step(carry)
      run.log(i, value=carry[0, 0], norm=carry[0, 1])
      return (i + 1, carry), None

    def logged(loop, jit=jax.jit, **options):
      return jit(lambda x: loop(logged_step, (0, x), None, length=b.steps,
                                **options)[0][1])

    def stacked_step(state, _):  # the same values, returned as ys
      i, carry = state
      carry = matmul_step(carry)
      return (i + 1, carry), (i, carry[0, 0], carry[0, 1])

    # All three stacked: returning one of them, XLA drops the others.
    floor = jax.jit(lambda x: jax.lax.scan(stacked_step, (0, x), None,
                                           length=b.steps)[1])
    floor_us, floor_ratio = b.paired(floor, repeats=repeats)
    rows.append(row("floor: lax.scan returning the logged values as ys",
                     floor_us, floor_ratio, None,
                     "reference: XLA stacks them, no callback"))
    rows.append(row("per-step metrics in lax.scan (a tap a step)",
                     *b.paired(logged(jax.lax.scan), repeats=repeats), None,
                     "reference"))
    us, ratio = b.paired(logged(hostcall.scan, every=EVERY), repeats=repeats)
    rows.append(row(f"per-step metrics (hostcall.scan, every={EVERY})",
                     us, ratio, None, "JSON Lines; ratio to the plain scan"))
    # The target is against XLA's own cost of the same values as ys.
    rows.append(row("... per-step metrics / the floor", us,
                     ratio / floor_ratio, 1.1, "ratio to the floor row"))
    fn = logged(hostcall.progress.scan, file=io.StringIO())
    us, ratio = b.paired(fn, repeats=repeats)
    rows.append(row("progress bar + per-step metrics (progress.scan)",
                     us, ratio, 1.2, "chunks of 1% of the loop"))
    _, effectful = b.paired(fn, repeats=repeats,
                            base_fn=b.effectful_base_fn)
    rows.append(row("... progress bar + metrics / effectful dispatch", us,
                     effectful, None,
                     "vs the plain scan with one jax.debug.callback"))
    # The same loop under hostcall.jit: on one CPU device the bar's events
    # and the rows are queued without a JAX effect. Its target row stops
    # the clock once every host call is delivered and every row written
    # (what the user waits for), against XLA's floor paired in the same run.
    jitted = logged(hostcall.progress.scan, jit=hostcall.jit,
                    file=io.StringIO())
    us, ratio = b.paired(jitted, repeats=repeats, delivered=True,
                         base_fn=floor)
    rows.append(row("progress bar + per-step metrics under hostcall.jit",
                     us, ratio, 1.1, "every call delivered, rows written; "
                     "ratio to the floor row"))
    us, ratio = b.paired(jitted, repeats=repeats)
    rows.append(row("... under hostcall.jit, device side", us, ratio,
                     None, "the queue drained after the timing"))
    # What hostcall adds to XLA's own cost of the same values (the floor).
    rows.append(row("... under hostcall.jit, device side / the floor",
                     us, ratio / floor_ratio, None, "ratio to the floor row"))
    # The barrier waits until every row is written.
    e2e = median_time(lambda: (fn(X).block_until_ready(), hostcall.barrier()),
                       b.repeats)
    run.close()
    rows.append(row("... end to end, rows written / plain scan",
                     e2e / b.steps * 1e6, e2e / (b.base * b.steps / 1e6),
                     None, "JSON Lines on disk"))
  return rows


def peers(b: Bench) -> list[dict]:
  """What users pick instead, measured in the same run: jax-tqdm's bar
  (against ``progress.scan``) and a JAX ``io_callback`` writing JSON Lines
  each step (against ``hostcall.metrics`` in ``hostcall.scan``)."""
  repeats = 3 * b.repeats
  rows = []
  try:
    from jax_tqdm import scan_tqdm
  except ImportError:
    rows.append(row("peer: jax-tqdm scan_tqdm", None, None, None,
                     "not installed: pip install 'hostcall[bench]'"))
  else:
    def peer_step(carry, i):
      return matmul_step(carry), None
    bar = scan_tqdm(b.steps, print_rate=max(1, b.steps // 100),
                    file=io.StringIO())(peer_step)
    fn = jax.jit(lambda x: jax.lax.scan(bar, x, jnp.arange(b.steps))[0])
    rows.append(row("peer: jax-tqdm scan_tqdm (a tick every 1%)",
                     *b.paired(fn, repeats=repeats), None,
                     f"compare: {numbered(PROGRESS, 'progress bar')}"))
  with tempfile.TemporaryDirectory() as root:
    out = open(f"{root}/peer.jsonl", "w")

    def write_row(i, value, norm):
      out.write(json.dumps({"step": int(i), "value": float(value),
                            "norm": float(norm)}) + "\n")

    def logged_step(state, _):
      i, carry = state
      carry = matmul_step(carry)
      io_callback(write_row, None, i, carry[0, 0], carry[0, 1], ordered=True)
      return (i + 1, carry), None

    fn = jax.jit(lambda x: jax.lax.scan(logged_step, (0, x), None,
                                        length=b.steps)[0][1])
    rows.append(row("peer: JAX io_callback writing JSON Lines each step",
                     *b.paired(fn, repeats=repeats), None,
                     f"compare: {numbered(PROGRESS, 'per-step metrics')}"))
    out.close()
  return rows


def steered_loops(b: Bench) -> list[dict]:
  """Loops the host can stop (``hostcall.control``): a check every 1%
  of the loop, against the plain scan."""
  repeats = 3 * b.repeats

  def step(carry, _):
    return matmul_step(carry), None

  def steered(**options):
    return jax.jit(lambda x: hostcall.progress.scan(
        step, x, None, length=b.steps, every=max(1, b.steps // 100),
        **options).value[0])

  return [
      row("interruptible loop, no bar (Ctrl-C, time limit)",
           *b.paired(steered(disable=True, interruptible=True,
                             time_limit=3600.0), repeats=repeats), 1.05,
           "a check every 1% of the loop"),
      row("... with a progress bar",
           *b.paired(steered(file=io.StringIO(), interruptible=True,
                             time_limit=3600.0), repeats=repeats), 1.1,
           f"compare: {numbered(PROGRESS, 'progress bar')}"),
      row("... stopped by a host predicate (stop_when)",
           *b.paired(steered(disable=True, stop_when=lambda status: False),
                     repeats=repeats), 1.1,
           "the predicate runs after each tick"),
      row("steered while_loop with a bar under hostcall.jit",
           *b.paired(_steered_while(b.steps), repeats=repeats,
                     base_fn=jax.jit(lambda x: jax.lax.while_loop(
                         lambda c: c[0] < b.steps,
                         lambda c: (c[0] + 1, matmul_step(c[1])),
                         (0, x))[1]), delivered=True), 1.05,
           "ratio to the plain while_loop, every call delivered"),
  ]


def _steered_while(steps: int):
  """A steered ``while_loop`` with a bar (``hostcall.progress.while_loop``
  with a time limit, a tick and a check every 1% of ``steps``), under
  ``hostcall.jit``."""
  return hostcall.jit(lambda x: hostcall.progress.while_loop(
      lambda c: c[0] < steps, lambda c: (c[0] + 1, matmul_step(c[1])),
      (0, x), total=steps, every=max(1, steps // 100), time_limit=3600.0,
      file=io.StringIO()).value[1])


def backward_pass(b: Bench) -> list[dict]:
  """One ``grad_callback`` a step on the carry (its 64x64 cotangent,
  16 KiB) in the scan under ``grad``, asynchronous, against the same
  backward pass without it; and one ``Run.log_grad`` a step (its norm)."""
  repeats = 3 * b.repeats

  def loss(watch):
    def step(carry, _):
      return watch(matmul_step(carry)), None
    return lambda x: jnp.sum(jax.lax.scan(step, x, None, length=b.steps)[0])

  plain = jax.jit(jax.grad(loss(lambda c: c)))
  watched = jax.jit(hostcall.delivery("async")(jax.grad(loss(
      lambda c: hostcall.grad_callback(noop, c)))))
  rows = []
  us, ratio = b.paired(watched, repeats=repeats, base_fn=plain)
  rows.append(row("grad_callback a step under grad, async, end to end",
                   us, ratio, 1.2,
                   "16 KiB cotangent a step; ratio to the same backward pass "
                   "without it, every call delivered"))
  us, ratio = b.paired(watched, drain=False, repeats=repeats, base_fn=plain)
  rows.append(row("... device side", us, ratio, None,
                   "the queue drained after the timing"))
  with tempfile.TemporaryDirectory() as root:
    run = hostcall.metrics.Run("bench-grad", root=root)
    logged = jax.jit(jax.grad(loss(lambda c: run.log_grad(c=c))))
    us, ratio = b.paired(logged, repeats=repeats, base_fn=plain)
    run.close()
  rows.append(row("Run.log_grad a step (the norm), rows written", us,
                   ratio, None, "ratio to the same backward pass without it"))
  return rows


def tracking_writers(b: Bench) -> list[dict]:
  """Per-step metrics (in ``hostcall.scan``) through the MLflow writer,
  to a SQLite tracking store, against the JSON Lines writer: the device
  side (the writer thread keeps the device from waiting either way) and
  the host's drain (from the computation's end until every row is
  stored)."""
  try:
    import mlflow  # noqa: F401
  except ImportError:
    return [row("per-step metrics, MLflow writer", None, None, None,
                 "not installed: pip install 'hostcall[mlflow]'")]
  repeats = 3 * b.repeats
  rows, device = [], {}
  with tempfile.TemporaryDirectory() as root:
    writers = {
        "JSON Lines": "jsonl",
        "MLflow": hostcall.metrics.MlflowWriter(
            "bench", tracking_uri=f"sqlite:///{root}/mlflow.db")}
    for label, writer in writers.items():
      run = hostcall.metrics.Run(f"bench-{label}", root=root,
                                 writers=[writer])

      def logged_step(state, _, run=run):
        i, carry = state
        carry = matmul_step(carry)
        run.log(i, value=carry[0, 0], norm=carry[0, 1])
        return (i + 1, carry), None

      fn = jax.jit(lambda x, step=logged_step: hostcall.scan(
          step, (0, x), None, length=b.steps, every=EVERY)[0][1])
      # Device side: the rows are drained after the timings, not between.
      us, ratio = b.paired(fn, drain=False, repeats=repeats)
      device[label] = ratio
      rows.append(row(f"per-step metrics, {label} writer (device side)",
                       us, ratio, None, f"hostcall.scan, every={EVERY}"))
      drains = []
      for _ in range(b.repeats):
        fn(X).block_until_ready()
        start = time.perf_counter()
        hostcall.barrier()
        drains.append(time.perf_counter() - start)
      drain = statistics.median(drains)
      rows.append(row(f"... host drain, {label}", drain / b.steps * 1e6,
                       None, None,
                       f"{drain * 1e3:.1f} ms to store {b.steps} rows after "
                       "the computation ended (us_per_step: per row)"))
      run.close()
  rows.append(row("... MLflow / JSON Lines, device side",
                   None, device["MLflow"] / device["JSON Lines"], 1.1,
                   "the writer thread keeps the device from waiting"))
  return rows

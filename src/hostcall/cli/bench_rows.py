"""The rows of ``hostcall bench``: one function a row (or a group of rows
measured together), each timing a jitted ``lax.scan`` whose step is one
64x64 float32 matmul (plus ``tanh``) with some host calls, against the same
scan without them, measured in the same run.

Every row function takes a ``Bench`` (sizes, the plain scan and its time)
and returns its rows: ``{"row", "us_per_step", "ratio", "target", "pass",
"note"}``.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import statistics
import tempfile
import threading
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

import hostcall
from hostcall import host_callback as hcb
from hostcall.cli import bench_jit

X = jnp.eye(64, dtype=jnp.float32) * 0.5
EVERY = 256  # hostcall.scan's chunk in the loop-buffered rows


def _noop(*args, **kwargs):
  return None


def _median_time(run, repeats: int) -> float:
  run()
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    run()
    samples.append(time.perf_counter() - start)
  return statistics.median(samples)


def _matmul_step(carry):
  return jnp.tanh(carry @ carry) * 0.5


def _scan(tap, steps: int, payload: int = 1, delivery: str = "sync"):
  def step(carry, _):
    carry = _matmul_step(carry)
    if tap is not None:
      value = carry[0, 0] if payload == 1 else jnp.broadcast_to(
          carry[0, 0], (payload,))
      tap(value)
    return carry, None

  # The delivery applies while the function is traced.
  return jax.jit(hostcall.delivery(delivery)(
      lambda x: jax.lax.scan(step, x, None, length=steps)[0]))


def _per_step(fn, steps, repeats, drain=True) -> float:
  def run():
    fn(X).block_until_ready()
    if drain:
      hostcall.barrier()
  return _median_time(run, repeats) / steps * 1e6


def _row(name, us, ratio, target, note="") -> dict:
  return {"row": name, "us_per_step": us, "ratio": ratio, "target": target,
          "pass": None if target is None or ratio is None
          else ratio <= target, "note": note}


@dataclasses.dataclass
class Bench:
  """What every row measures against: the plain scan and its time."""

  steps: int
  repeats: int
  base_fn: Callable = None
  base: float = 0.0

  def __post_init__(self):
    self.base_fn = _scan(None, self.steps)
    self.base = _per_step(self.base_fn, self.steps, self.repeats)

  @functools.cached_property
  def effectful_base_fn(self) -> Callable:
    """The plain scan with one ``jax.debug.callback`` after the loop: JAX
    dispatches it as it dispatches every program with effects (on the
    calling thread, off its C++ fast path), so that a ratio against it
    leaves out what that dispatch costs and keeps what the taps cost."""
    def effectful(x):
      out = self.base_fn(x)
      jax.debug.callback(_noop, out[0, 0])
      return out
    return jax.jit(effectful)

  def paired(self, fn, drain=True, repeats=None, base_fn=None,
             delivered=False) -> tuple[float, float]:
    """(us/step of fn, median ratio to the plain scan, or to ``base_fn``),
    the two run alternately so that the machine's drift hits both alike.
    ``delivered``: the clock stops once every host call is delivered (and
    every row written); else once the outputs are ready (the device side),
    the queue drained after it where ``drain``."""
    base_fn = base_fn or self.base_fn
    def once(f):
      start = time.perf_counter()
      jax.block_until_ready(f(X))
      if delivered:
        hostcall.barrier()
      elapsed = time.perf_counter() - start
      if drain and not delivered:
        hostcall.barrier()
      return elapsed
    once(fn), once(base_fn)
    times, ratios = [], []
    for _ in range(repeats or self.repeats):
      t, b = once(fn), once(base_fn)
      times.append(t)
      ratios.append(t / b)
    hostcall.barrier()
    return statistics.median(times) / self.steps * 1e6, statistics.median(
        ratios)


def plain_scan(b: Bench) -> list[dict]:
  return [_row("no callback (64x64 matmul step)", b.base, 1.0, None)]


def jax_references(b: Bench) -> list[dict]:
  """JAX's own callbacks, for reference."""
  rows = []
  for name, tap in (
      ("jax.debug.callback, scalar", lambda v: jax.debug.callback(_noop, v)),
      ("jax io_callback, scalar", lambda v: io_callback(_noop, None, v)),
  ):
    rows.append(_row(name, *b.paired(_scan(tap, b.steps)), None, "reference"))

  def pure_step(carry, _):
    carry = _matmul_step(carry)
    value = jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct(
        (), carry.dtype), carry[0, 0])
    return carry.at[0, 0].set(value), None
  fn = jax.jit(lambda x: jax.lax.scan(pure_step, x, None, length=b.steps)[0])
  rows.append(_row("jax pure_callback, scalar (result used)", *b.paired(fn),
                   None, "reference"))
  return rows


def default_tap(b: Bench) -> list[dict]:
  """1. The default (synchronous, ordered) tap."""
  return [_row(f"1. default tap, {label}", *b.paired(_scan(
      lambda v: hcb.id_tap(_noop, v), b.steps, payload)), 1.5)
          for payload, label in ((1, "scalar"), (1024, "4 KiB"))]


def ordered_vs_unordered(b: Bench) -> list[dict]:
  """1. Three taps a step: ordering's cost."""
  def three(ordered):
    def tap(v):
      for _ in range(3):
        if ordered:
          hcb.id_tap(_noop, v)
        else:
          hostcall.debug_callback(_noop, v)
    return tap
  ordered = _per_step(_scan(three(True), b.steps), b.steps, b.repeats)
  unordered = _per_step(_scan(three(False), b.steps), b.steps, b.repeats)
  return [_row("1. 3 taps a step, ordered vs unordered", ordered,
               ordered / unordered, 1.1,
               f"unordered: {unordered:.1f} us/step")]


def loop_buffered(b: Bench) -> list[dict]:
  """2. hostcall.scan gathers K steps of taps on the device."""
  def step(carry, _):
    carry = _matmul_step(carry)
    hcb.id_tap(_noop, carry[0, 0])
    return carry, None

  rows = []
  for delivery in ("sync", "async"):
    fn = jax.jit(hostcall.delivery(delivery)(lambda x: hostcall.scan(
        step, x, None, length=b.steps, every=EVERY)[0]))
    rows.append(_row(
        f"2. loop-buffered tap (hostcall.scan, every={EVERY}), {delivery}",
        *b.paired(fn), 1.05, f"device buffer {EVERY * 4} B"))
  return rows


def async_device_side(b: Bench) -> list[dict]:
  """3. Asynchronous taps: what the device pays."""
  return [_row(f"3. async tap{label}, device side", *b.paired(_scan(
      lambda v: hcb.id_tap(_noop, v), b.steps, payload, "async"),
      drain=False), 1.2) for payload, label in ((1, ""), (1024, " 4 KiB"))]


def async_dispatch(b: Bench) -> list[dict]:
  """3. An asynchronously tapping call returns before its loop ends."""
  fn = _scan(lambda v: hcb.id_tap(_noop, v), b.steps, delivery="async")
  fn(X).block_until_ready()
  hostcall.barrier()
  start = time.perf_counter()
  out = fn(X)
  returned = time.perf_counter() - start
  out.block_until_ready()
  total = time.perf_counter() - start
  hostcall.barrier()
  return [_row("3. async dispatch kept: call returns / loop time",
               returned * 1e6 / b.steps, returned / total, 0.5,
               f"returned after {returned * 1e3:.2f} ms of "
               f"{total * 1e3:.1f} ms")]


def async_slow_host(b: Bench) -> list[dict]:
  """3. A slow host function overlaps the device's work."""
  steps = max(50, b.steps // 4)

  def sleepy(v, transforms):
    time.sleep(100e-6)

  fn = _scan(lambda v: hcb.id_tap(sleepy, v), steps, delivery="async")
  host_total = _median_time(lambda: [time.sleep(100e-6)
                                     for _ in range(steps)], b.repeats)
  device_total = b.base * steps / 1e6
  e2e = _median_time(lambda: (fn(X).block_until_ready(), hostcall.barrier()),
                     b.repeats)
  return [_row("3. async, host sleeps 100 us: end to end / max(host, device)",
               e2e / steps * 1e6, e2e / max(host_total, device_total), 1.15)]


def one_tap_per_call(b: Bench) -> list[dict]:
  """4. One tap in a jitted function called once."""
  small = jnp.ones(16)
  plain = jax.jit(lambda v: v * 2)
  tapped = jax.jit(lambda v: hcb.id_tap(_noop, v) * 2)
  t_plain = _median_time(lambda: plain(small).block_until_ready(),
                         b.repeats * 20)
  t_tap = _median_time(lambda: tapped(small).block_until_ready(),
                       b.repeats * 20)
  return [_row("4. one tap in a jitted call", t_tap * 1e6, t_tap / t_plain,
               2.0, f"plain call {t_plain * 1e6:.1f} us")]


def big_async_tap(b: Bench) -> list[dict]:
  """5. 1 MiB, asynchronous, against an in-cache memcpy of 1 MiB."""
  mib = np.ones(1 << 18, np.float32)
  dst = np.empty_like(mib)
  memcpy = _median_time(lambda: np.copyto(dst, mib), b.repeats * 20)
  steps = max(20, b.steps // 20)
  fn = _scan(lambda v: hcb.id_tap(_noop, v), steps, 1 << 18, "async")
  plain = _scan(lambda v: v.sum(), steps, 1 << 18)
  with_tap = _per_step(fn, steps, b.repeats, drain=False)
  hostcall.barrier()
  without = _per_step(plain, steps, b.repeats, drain=False)
  per_tap = max(with_tap - without, 0.0)
  return [_row("5. 1 MiB async tap vs 1 MiB memcpy", per_tap,
               per_tap / (memcpy * 1e6), 3.0,
               f"memcpy {memcpy * 1e6:.1f} us")]


def busy_main_thread(b: Bench) -> list[dict]:
  """6. Asynchronous delivery while a Python thread keeps the GIL busy."""
  fn = _scan(lambda v: hcb.id_tap(_noop, v), b.steps, delivery="async")
  run = lambda: (fn(X).block_until_ready(), hostcall.barrier())  # noqa: E731
  idle = _median_time(run, b.repeats)
  stop = threading.Event()

  def busy():
    while not stop.is_set():
      sum(range(1000))
  worker = threading.Thread(target=busy)
  worker.start()
  try:
    loaded = _median_time(run, b.repeats)
  finally:
    stop.set()
    worker.join()
  return [_row("6. async taps with a busy Python thread vs idle",
               loaded / b.steps * 1e6, loaded / idle, 2.0,
               f"idle: {idle / b.steps * 1e6:.1f} us/step")]


def progress_bar(b: Bench) -> list[dict]:
  """7. A progress bar (a few percent: three times the repeats)."""
  def step(carry, _):
    return _matmul_step(carry), None

  fn = jax.jit(lambda x: hostcall.progress.scan(
      step, x, None, length=b.steps, file=io.StringIO())[0])
  us, ratio = b.paired(fn, repeats=3 * b.repeats)
  _, effectful = b.paired(fn, repeats=3 * b.repeats,
                          base_fn=b.effectful_base_fn)
  return [_row("7. progress bar (hostcall.progress.scan)", us, ratio, 1.1,
               "a tick every 1% of the loop"),
          _row("7. ... progress bar / effectful dispatch", us, effectful,
               None, "vs the plain scan with one jax.debug.callback")]


def metrics_rows(b: Bench) -> list[dict]:
  """7. Per-step metrics, against XLA's floor (the same values as ys), and
  with a progress bar (the demo's loop)."""
  repeats = 3 * b.repeats
  rows = []
  with tempfile.TemporaryDirectory() as root:
    run = hostcall.metrics.Run("bench", root=root)

    def logged_step(state, _):
      i, carry = state
      carry = _matmul_step(carry)
      run.log(i, value=carry[0, 0], norm=carry[0, 1])
      return (i + 1, carry), None

    def logged(loop, jit=jax.jit, **options):
      return jit(lambda x: loop(logged_step, (0, x), None, length=b.steps,
                                **options)[0][1])

    def stacked_step(state, _):  # the same values, returned as ys
      i, carry = state
      carry = _matmul_step(carry)
      return (i + 1, carry), (i, carry[0, 0], carry[0, 1])

    # All three stacked: returning one of them, XLA drops the others.
    floor = jax.jit(lambda x: jax.lax.scan(stacked_step, (0, x), None,
                                           length=b.steps)[1])
    floor_us, floor_ratio = b.paired(floor, repeats=repeats)
    rows.append(_row("7. floor: lax.scan returning the logged values as ys",
                     floor_us, floor_ratio, None,
                     "reference: XLA stacks them, no callback"))
    rows.append(_row("7. per-step metrics in lax.scan (a tap a step)",
                     *b.paired(logged(jax.lax.scan), repeats=repeats), None,
                     "reference"))
    us, ratio = b.paired(logged(hostcall.scan, every=EVERY), repeats=repeats)
    rows.append(_row(f"7. per-step metrics (hostcall.scan, every={EVERY})",
                     us, ratio, None, "JSON Lines; ratio to the plain scan"))
    # The target is against XLA's own cost of the same values as ys.
    rows.append(_row("7. ... per-step metrics / the floor", us,
                     ratio / floor_ratio, 1.1, "ratio to the floor row"))
    fn = logged(hostcall.progress.scan, file=io.StringIO())
    us, ratio = b.paired(fn, repeats=repeats)
    rows.append(_row("7. progress bar + per-step metrics (progress.scan)",
                     us, ratio, 1.2, "chunks of 1% of the loop"))
    _, effectful = b.paired(fn, repeats=repeats,
                            base_fn=b.effectful_base_fn)
    rows.append(_row("7. ... progress bar + metrics / effectful dispatch", us,
                     effectful, None,
                     "vs the plain scan with one jax.debug.callback"))
    # The same loop under hostcall.jit: on one CPU device the bar's events
    # and the rows are queued without a JAX effect (issue 23). Its target
    # row stops the clock once every host call is delivered and every row
    # written, as issue 23's rows do.
    jitted = logged(hostcall.progress.scan, jit=hostcall.jit,
                    file=io.StringIO())
    us, ratio = b.paired(jitted, repeats=repeats, delivered=True)
    rows.append(_row("7. progress bar + per-step metrics under hostcall.jit",
                     us, ratio, 1.1, "every call delivered, rows written; "
                     "ratio to the plain scan"))
    us, ratio = b.paired(jitted, repeats=repeats)
    rows.append(_row("7. ... under hostcall.jit, device side", us, ratio,
                     None, "the queue drained after the timing"))
    # What hostcall adds to XLA's own cost of the same values (the floor).
    rows.append(_row("7. ... under hostcall.jit, device side / the floor",
                     us, ratio / floor_ratio, None, "ratio to the floor row"))
    # The barrier waits until every row is written.
    e2e = _median_time(lambda: (fn(X).block_until_ready(), hostcall.barrier()),
                       b.repeats)
    run.close()
    rows.append(_row("7. ... end to end, rows written / plain scan",
                     e2e / b.steps * 1e6, e2e / (b.base * b.steps / 1e6),
                     None, "JSON Lines on disk"))
  return rows


def peers(b: Bench) -> list[dict]:
  """8. What users pick instead, measured in the same run: jax-tqdm's bar
  (against ``progress.scan``) and a JAX ``io_callback`` writing JSON Lines
  each step (against ``hostcall.metrics`` in ``hostcall.scan``)."""
  repeats = 3 * b.repeats
  rows = []
  try:
    from jax_tqdm import scan_tqdm
  except ImportError:
    rows.append(_row("8. peer: jax-tqdm scan_tqdm", None, None, None,
                     "not installed: pip install 'hostcall[bench]'"))
  else:
    def peer_step(carry, i):
      return _matmul_step(carry), None
    bar = scan_tqdm(b.steps, print_rate=max(1, b.steps // 100),
                    file=io.StringIO())(peer_step)
    fn = jax.jit(lambda x: jax.lax.scan(bar, x, jnp.arange(b.steps))[0])
    rows.append(_row("8. peer: jax-tqdm scan_tqdm (a tick every 1%)",
                     *b.paired(fn, repeats=repeats), None,
                     "compare: 7. progress bar"))
  with tempfile.TemporaryDirectory() as root:
    out = open(f"{root}/peer.jsonl", "w")

    def write_row(i, value, norm):
      out.write(json.dumps({"step": int(i), "value": float(value),
                            "norm": float(norm)}) + "\n")

    def logged_step(state, _):
      i, carry = state
      carry = _matmul_step(carry)
      io_callback(write_row, None, i, carry[0, 0], carry[0, 1], ordered=True)
      return (i + 1, carry), None

    fn = jax.jit(lambda x: jax.lax.scan(logged_step, (0, x), None,
                                        length=b.steps)[0][1])
    rows.append(_row("8. peer: JAX io_callback writing JSON Lines each step",
                     *b.paired(fn, repeats=repeats), None,
                     "compare: 7. per-step metrics"))
    out.close()
  return rows


def steered_loops(b: Bench) -> list[dict]:
  """9. Loops the host can stop (``hostcall.control``): a check every 1%
  of the loop, against the plain scan."""
  repeats = 3 * b.repeats

  def step(carry, _):
    return _matmul_step(carry), None

  def steered(**options):
    return jax.jit(lambda x: hostcall.progress.scan(
        step, x, None, length=b.steps, every=max(1, b.steps // 100),
        **options).value[0])

  return [
      _row("9. interruptible loop, no bar (Ctrl-C, time limit)",
           *b.paired(steered(disable=True, interruptible=True,
                             time_limit=3600.0), repeats=repeats), 1.05,
           "a check every 1% of the loop"),
      _row("9. ... with a progress bar",
           *b.paired(steered(file=io.StringIO(), interruptible=True,
                             time_limit=3600.0), repeats=repeats), 1.1,
           "compare: 7. progress bar"),
      _row("9. ... stopped by a host predicate (stop_when)",
           *b.paired(steered(disable=True, stop_when=lambda status: False),
                     repeats=repeats), 1.1,
           "the predicate runs after each tick"),
  ]


def backward_pass(b: Bench) -> list[dict]:
  """10. One ``grad_callback`` a step on the carry (its 64x64 cotangent,
  16 KiB) in the scan under ``grad``, asynchronous, against the same
  backward pass without it; and one ``Run.log_grad`` a step (its norm)."""
  repeats = 3 * b.repeats

  def loss(watch):
    def step(carry, _):
      return watch(_matmul_step(carry)), None
    return lambda x: jnp.sum(jax.lax.scan(step, x, None, length=b.steps)[0])

  plain = jax.jit(jax.grad(loss(lambda c: c)))
  watched = jax.jit(hostcall.delivery("async")(jax.grad(loss(
      lambda c: hostcall.grad_callback(_noop, c)))))
  rows = []
  us, ratio = b.paired(watched, repeats=repeats, base_fn=plain)
  rows.append(_row("10. grad_callback a step under grad, async, end to end",
                   us, ratio, 1.2,
                   "16 KiB cotangent a step; ratio to the same backward pass "
                   "without it, every call delivered"))
  us, ratio = b.paired(watched, drain=False, repeats=repeats, base_fn=plain)
  rows.append(_row("10. ... device side", us, ratio, None,
                   "the queue drained after the timing"))
  with tempfile.TemporaryDirectory() as root:
    run = hostcall.metrics.Run("bench-grad", root=root)
    logged = jax.jit(jax.grad(loss(lambda c: run.log_grad(c=c))))
    us, ratio = b.paired(logged, repeats=repeats, base_fn=plain)
    run.close()
  rows.append(_row("10. Run.log_grad a step (the norm), rows written", us,
                   ratio, None, "ratio to the same backward pass without it"))
  return rows


def tracking_writers(b: Bench) -> list[dict]:
  """11. Per-step metrics (in ``hostcall.scan``) through the MLflow writer,
  to a SQLite tracking store, against the JSON Lines writer: the device
  side (the writer thread keeps the device from waiting either way) and
  the host's drain (from the computation's end until every row is
  stored)."""
  try:
    import mlflow  # noqa: F401
  except ImportError:
    return [_row("11. per-step metrics, MLflow writer", None, None, None,
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
        carry = _matmul_step(carry)
        run.log(i, value=carry[0, 0], norm=carry[0, 1])
        return (i + 1, carry), None

      fn = jax.jit(lambda x, step=logged_step: hostcall.scan(
          step, (0, x), None, length=b.steps, every=EVERY)[0][1])
      # Device side: the rows are drained after the timings, not between.
      us, ratio = b.paired(fn, drain=False, repeats=repeats)
      device[label] = ratio
      rows.append(_row(f"11. per-step metrics, {label} writer (device side)",
                       us, ratio, None, f"hostcall.scan, every={EVERY}"))
      drains = []
      for _ in range(b.repeats):
        fn(X).block_until_ready()
        start = time.perf_counter()
        hostcall.barrier()
        drains.append(time.perf_counter() - start)
      drain = statistics.median(drains)
      rows.append(_row(f"11. ... host drain, {label}", drain / b.steps * 1e6,
                       None, None,
                       f"{drain * 1e3:.1f} ms to store {b.steps} rows after "
                       "the computation ended (us_per_step: per row)"))
      run.close()
  rows.append(_row("11. ... MLflow / JSON Lines, device side",
                   None, device["MLflow"] / device["JSON Lines"], 1.1,
                   "the writer thread keeps the device from waiting"))
  return rows


#: Every row, in the order printed.
ROWS = (plain_scan, jax_references, default_tap, ordered_vs_unordered,
        loop_buffered, async_device_side, async_dispatch, async_slow_host,
        one_tap_per_call, big_async_tap, busy_main_thread, progress_bar,
        metrics_rows, peers, steered_loops, backward_pass, tracking_writers,
        bench_jit.jit_rows)


def measure(steps: int, repeats: int) -> list[dict]:
  """Every row, measured against the same plain scan."""
  bench = Bench(steps, repeats)
  return [row for rows_of in ROWS for row in rows_of(bench)]

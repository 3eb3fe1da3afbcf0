"""hostcall's speed targets, measured against plain JAX in the same run.

Every row times a jitted ``lax.scan`` whose step is one 64x64 float32 matmul
(plus ``tanh``), with and without taps, median of REPEATS runs after a
warm-up, and reports microseconds per step and the ratio to the same scan
without callbacks (or to the quantity the target names). Results go to the
terminal, to ``<out>/latest.json`` and, when matplotlib is installed, to
``<out>/latest.png``.

Usage: hostcall bench [--steps N] [--repeats R] [--smoke] [--out DIR]
(``make bench`` runs it with ``--out benchmarks/results``).
"""

from __future__ import annotations

import io
import json
import pathlib
import platform
import statistics
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

import hostcall
from hostcall import host_callback as hcb
from hostcall.cli.arguments import positive_int


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


def _scan(tap, steps: int, payload: int = 1, delivery: str = "sync"):
  def step(carry, _):
    carry = jnp.tanh(carry @ carry) * 0.5
    if tap is not None:
      value = carry[0, 0] if payload == 1 else jnp.broadcast_to(
          carry[0, 0], (payload,))
      tap(value)
    return carry, None

  # The delivery mode applies while the function is traced.
  return jax.jit(hostcall.delivery(delivery)(
      lambda x: jax.lax.scan(step, x, None, length=steps)[0]))


X = jnp.eye(64, dtype=jnp.float32) * 0.5


def _per_step(fn, steps, repeats, drain=True) -> float:
  def run():
    fn(X).block_until_ready()
    if drain:
      hostcall.barrier()
  return _median_time(run, repeats) / steps * 1e6


def _device_side(fn, steps, repeats) -> float:
  """Time until the computation's result is ready; taps may still be queued."""
  value = _per_step(fn, steps, repeats, drain=False)
  hostcall.barrier()
  return value


def _paired(fn, base_fn, steps, repeats, drain=True) -> tuple[float, float]:
  """(us/step of fn, median ratio to base_fn), the two run alternately so
  that the machine's drift hits both alike."""
  def once(f):
    start = time.perf_counter()
    f(X).block_until_ready()
    elapsed = time.perf_counter() - start
    if drain:
      hostcall.barrier()
    return elapsed
  once(fn), once(base_fn)
  times, ratios = [], []
  for _ in range(repeats):
    t, b = once(fn), once(base_fn)
    times.append(t)
    ratios.append(t / b)
  hostcall.barrier()
  return statistics.median(times) / steps * 1e6, statistics.median(ratios)


def measure(steps: int, repeats: int) -> list[dict]:
  rows = []
  base_fn = _scan(None, steps)
  base = _per_step(base_fn, steps, repeats)
  paired = lambda fn, drain=True: _paired(fn, base_fn, steps, repeats, drain)

  def row(name, us, ratio, target, note=""):
    rows.append({"row": name, "us_per_step": us, "ratio": ratio,
                 "target": target,
                 "pass": None if target is None or ratio is None
                 else ratio <= target, "note": note})

  row("no callback (64x64 matmul step)", base, 1.0, None)
  for name, tap in (
      ("jax.debug.callback, scalar", lambda v: jax.debug.callback(_noop, v)),
      ("jax io_callback, scalar", lambda v: io_callback(_noop, None, v)),
  ):
    us, ratio = paired(_scan(tap, steps))
    row(name, us, ratio, None, "reference")

  def pure(v):
    return jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct((), v.dtype), v)

  def pure_step(carry, _):
    carry = jnp.tanh(carry @ carry) * 0.5
    return carry.at[0, 0].set(pure(carry[0, 0])), None
  fn = jax.jit(lambda x: jax.lax.scan(pure_step, x, None, length=steps)[0])
  us, ratio = paired(fn)
  row("jax pure_callback, scalar (result used)", us, ratio, None,
      "reference")

  # 1. The default (synchronous, ordered) tap.
  for payload, label in ((1, "scalar"), (1024, "4 KiB")):
    us, ratio = paired(_scan(lambda v: hcb.id_tap(_noop, v), steps, payload))
    row(f"1. default tap, {label}", us, ratio, 1.5)

  def three(mode):
    def tap(v):
      for _ in range(3):
        hcb.id_tap(_noop, v) if mode == "ordered" else hostcall.debug_callback(
            _noop, v)
    return tap
  ordered = _per_step(_scan(three("ordered"), steps), steps, repeats)
  unordered = _per_step(_scan(three("unordered"), steps), steps, repeats)
  row("1. 3 taps a step, ordered vs unordered", ordered, ordered / unordered,
      1.1, f"unordered: {unordered:.1f} us/step")

  # 2. Loop-buffered: hostcall.scan gathers K steps of taps on the device.
  every = 256

  def buffered_step(carry, _):
    carry = jnp.tanh(carry @ carry) * 0.5
    hcb.id_tap(_noop, carry[0, 0])
    return carry, None

  for delivery in ("sync", "async"):
    fn = jax.jit(hostcall.delivery(delivery)(lambda x: hostcall.scan(
        buffered_step, x, None, length=steps, every=every)[0]))
    us, ratio = paired(fn)
    row(f"2. loop-buffered tap (hostcall.scan, every={every}), {delivery}",
        us, ratio, 1.05, f"device buffer {every * 4} B")

  # 3. Asynchronous delivery.
  fn = _scan(lambda v: hcb.id_tap(_noop, v), steps, delivery="async")
  fn4k = _scan(lambda v: hcb.id_tap(_noop, v), steps, 1024, "async")
  us, ratio = paired(fn, drain=False)
  row("3. async tap, device side", us, ratio, 1.2)
  us, ratio = paired(fn4k, drain=False)
  row("3. async tap 4 KiB, device side", us, ratio, 1.2)
  start = time.perf_counter()
  out = fn(X)
  returned = time.perf_counter() - start
  out.block_until_ready()
  total = time.perf_counter() - start
  hostcall.barrier()
  row("3. async dispatch kept: call returns / loop time", returned * 1e6 /
      steps, returned / total, 0.5,
      f"returned after {returned * 1e3:.2f} ms of {total * 1e3:.1f} ms")

  sleep_steps = max(50, steps // 4)

  def sleepy(v, transforms):
    time.sleep(100e-6)

  fn = _scan(lambda v: hcb.id_tap(sleepy, v), sleep_steps, delivery="async")
  host_total = _median_time(lambda: [time.sleep(100e-6)
                                     for _ in range(sleep_steps)], repeats)
  device_total = base * sleep_steps / 1e6
  e2e = _median_time(lambda: (fn(X).block_until_ready(), hostcall.barrier()),
                     repeats)
  row("3. async, host sleeps 100 us: end to end / max(host, device)",
      e2e / sleep_steps * 1e6, e2e / max(host_total, device_total), 1.15)

  # 4. One tap in a jitted function called once.
  small = jnp.ones(16)
  plain = jax.jit(lambda v: v * 2)
  tapped = jax.jit(lambda v: hcb.id_tap(_noop, v) * 2)
  t_plain = _median_time(lambda: plain(small).block_until_ready(),
                         repeats * 20)
  t_tap = _median_time(lambda: tapped(small).block_until_ready(),
                       repeats * 20)
  row("4. one tap in a jitted call", t_tap * 1e6, t_tap / t_plain, 2.0,
      f"plain call {t_plain * 1e6:.1f} us")

  # 5. 1 MiB, asynchronous, against an in-cache memcpy of 1 MiB.
  mib = np.ones(1 << 18, np.float32)
  dst = np.empty_like(mib)
  memcpy = _median_time(lambda: np.copyto(dst, mib), repeats * 20)
  big_steps = max(20, steps // 20)
  fn = _scan(lambda v: hcb.id_tap(_noop, v), big_steps, 1 << 18, "async")
  plain_big = _scan(lambda v: v.sum(), big_steps, 1 << 18)
  with_tap = _device_side(fn, big_steps, repeats)
  without = _device_side(plain_big, big_steps, repeats)
  per_tap = max(with_tap - without, 0.0)
  row("5. 1 MiB async tap vs 1 MiB memcpy", per_tap, per_tap / (memcpy * 1e6),
      3.0, f"memcpy {memcpy * 1e6:.1f} us")

  # 6. A busy Python main thread.
  fn = _scan(lambda v: hcb.id_tap(_noop, v), steps, delivery="async")
  idle = _median_time(lambda: (fn(X).block_until_ready(), hostcall.barrier()),
                      repeats)
  stop = threading.Event()

  def busy():
    while not stop.is_set():
      sum(range(1000))
  worker = threading.Thread(target=busy)
  worker.start()
  try:
    loaded = _median_time(lambda: (fn(X).block_until_ready(),
                                   hostcall.barrier()), repeats)
  finally:
    stop.set()
    worker.join()
  row("6. async taps with a busy Python thread vs idle", loaded / steps * 1e6,
      loaded / idle, 2.0, f"idle: {idle / steps * 1e6:.1f} us/step")

  # 7. Applications: a progress bar, per-step metrics, both (the demo's loop).
  # Their overheads are a few percent: three times the repeats.
  paired = lambda fn, drain=True: _paired(fn, base_fn, steps, 3 * repeats,
                                          drain)
  bar_file = io.StringIO()

  def plain_step(carry, _):
    return jnp.tanh(carry @ carry) * 0.5, None

  fn = jax.jit(lambda x: hostcall.progress.scan(
      plain_step, x, None, length=steps, file=bar_file)[0])
  us, ratio = paired(fn)
  row("7. progress bar (hostcall.progress.scan)", us, ratio, 1.1,
      "a tick every 1% of the loop")
  with tempfile.TemporaryDirectory() as root:
    run = hostcall.metrics.Run("bench", root=root)

    def logged_step(state, _):
      i, carry = state
      carry = jnp.tanh(carry @ carry) * 0.5
      run.log(i, value=carry[0, 0], norm=carry[0, 1])
      return (i + 1, carry), None

    def logged(loop, **options):
      return jax.jit(lambda x: loop(logged_step, (0, x), None, length=steps,
                                    **options)[0][1])

    def stacked_step(state, _):  # the same values, returned as ys
      i, carry = state
      carry = jnp.tanh(carry @ carry) * 0.5
      return (i + 1, carry), (i, carry[0, 0], carry[0, 1])

    fn = jax.jit(lambda x: jax.lax.scan(stacked_step, (0, x), None,
                                        length=steps)[1][1])
    us, ratio = paired(fn)
    row("7. floor: lax.scan returning the logged values as ys", us, ratio,
        None, "reference: XLA stacks them, no callback")
    us, ratio = paired(logged(jax.lax.scan))
    row("7. per-step metrics in lax.scan (a tap a step)", us, ratio, None,
        "reference")
    us, ratio = paired(logged(hostcall.scan, every=every))
    row(f"7. per-step metrics (hostcall.scan, every={every})", us, ratio, 1.1,
        "JSON Lines")
    fn = logged(hostcall.progress.scan, file=bar_file)
    us, ratio = paired(fn)
    row("7. progress bar + per-step metrics (progress.scan)", us, ratio, 1.1,
        "chunks of 1% of the loop")
    e2e = _median_time(lambda: (fn(X).block_until_ready(), hostcall.barrier()),
                       repeats)  # the barrier waits until every row is written
    run.close()
    row("7. ... end to end, rows written / plain scan", e2e / steps * 1e6,
        e2e / (base * steps / 1e6), None, "JSON Lines on disk")
  return rows


def _print(rows, steps, repeats) -> None:
  print(f"hostcall benchmarks: scan of {steps} steps (64x64 matmul), median "
        f"of {repeats}; jax {jax.__version__}, {platform.machine()}, "
        f"queue: {hostcall.queue_stats()['native'] and 'native' or 'python'}")
  print(f"{'row':62s} {'us/step':>9s} {'ratio':>7s} {'target':>7s}  result")
  for r in rows:
    us = "-" if r["us_per_step"] is None else f"{r['us_per_step']:.2f}"
    ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
    target = "" if r["target"] is None else f"{r['target']:.2f}x"
    verdict = {None: "", True: "pass", False: "MISS"}[r["pass"]]
    print(f"{r['row']:62s} {us:>9s} {ratio:>7s} {target:>7s}  {verdict} "
          f"{r['note']}")


def _chart(rows, path) -> bool:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return False
  shown = [r for r in rows if r["ratio"] is not None]
  fig, ax = plt.subplots(figsize=(10, 0.45 * len(shown) + 1))
  names = [r["row"] for r in shown]
  ratios = [r["ratio"] for r in shown]
  colors = ["tab:gray" if r["pass"] is None else
            ("tab:green" if r["pass"] else "tab:red") for r in shown]
  ax.barh(names, ratios, color=colors)
  for i, r in enumerate(shown):
    if r["target"] is not None:
      ax.plot([r["target"]] * 2, [i - 0.4, i + 0.4], "k--")
  ax.set_xscale("log")
  ax.invert_yaxis()
  ax.set_xlabel("ratio (dashed: target; green pass, red miss, grey reference)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return True


HELP = "hostcall's speed against plain JAX, measured here"


def add_arguments(parser) -> None:
  parser.add_argument("--steps", type=positive_int, default=2000,
                      help="steps of the benchmark scan (default: 2000)")
  parser.add_argument("--repeats", type=positive_int, default=7,
                      help="timed runs per row; rows report the median "
                      "(default: 7)")
  parser.add_argument("--smoke", action="store_true",
                      help="tiny sizes: check that the benchmark runs")
  parser.add_argument("--out", default=None,
                      help="directory for latest.json and latest.png "
                      "(default: a new temporary directory, printed)")


def run(args) -> int:
  steps, repeats = (40, 2) if args.smoke else (args.steps, args.repeats)
  rows = measure(steps, repeats)
  _print(rows, steps, repeats)
  results = pathlib.Path(args.out or
                         tempfile.mkdtemp(prefix="hostcall-bench-"))
  results.mkdir(parents=True, exist_ok=True)
  (results / "latest.json").write_text(json.dumps(
      {"steps": steps, "repeats": repeats, "jax": jax.__version__,
       "machine": platform.machine(), "rows": rows}, indent=2))
  print(f"results: {results / 'latest.json'}")
  if _chart(rows, results / "latest.png"):
    print(f"chart: {results / 'latest.png'}")
  return 0

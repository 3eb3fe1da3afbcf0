"""Per-step cost of a tap inside a jitted scan, against plain JAX, same run.

Step: one 64x64 float32 matmul (plus tanh) in a ``lax.scan`` of STEPS steps.
Rows: no callback; hostcall ``id_tap`` (ordered, the default); JAX's own
``jax.debug.callback``, ``io_callback`` and ``pure_callback``. Each is timed
REPEATS times after a warm-up; the median is reported, in microseconds per
step and as a ratio to the scan without a callback. Results are printed and
written to benchmarks/results/latest.json.

Usage: python benchmarks/run.py [--steps N] [--repeats R] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp
from jax.experimental import io_callback

from hostcall import host_callback as hcb


def _noop(*args, **kwargs):
  return None


def _scan_with(tap, steps):
  def step(carry, _):
    carry = jnp.tanh(carry @ carry) * 0.5
    if tap is not None:
      tap(carry[0, 0])
    return carry, None

  @jax.jit
  def run(x):
    return jax.lax.scan(step, x, None, length=steps)[0]
  return run


def _pure(x):
  return jax.pure_callback(lambda v: v, jax.ShapeDtypeStruct((), x.dtype), x)


VARIANTS = {
    "no callback": None,
    "hostcall id_tap (ordered)": lambda x: hcb.id_tap(_noop, x),
    "jax.debug.callback": lambda x: jax.debug.callback(_noop, x),
    "io_callback (unordered)": lambda x: io_callback(_noop, None, x),
    "pure_callback (result used)": None,  # built below: it must feed the carry
}


def _pure_scan(steps):
  def step(carry, _):
    carry = jnp.tanh(carry @ carry) * 0.5
    carry = carry.at[0, 0].set(_pure(carry[0, 0]))
    return carry, None

  @jax.jit
  def run(x):
    return jax.lax.scan(step, x, None, length=steps)[0]
  return run


def _time(fn, x, repeats):
  fn(x).block_until_ready()
  jax.effects_barrier()
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn(x).block_until_ready()
    jax.effects_barrier()
    samples.append(time.perf_counter() - start)
  return statistics.median(samples)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=2000)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--smoke", action="store_true",
                      help="tiny sizes, to check the benchmark runs")
  args = parser.parse_args(argv)
  steps, repeats = (50, 2) if args.smoke else (args.steps, args.repeats)

  x = jnp.eye(64, dtype=jnp.float32) * 0.5
  rows = []
  for name, tap in VARIANTS.items():
    fn = _pure_scan(steps) if name.startswith("pure") else _scan_with(tap,
                                                                      steps)
    rows.append((name, _time(fn, x, repeats) / steps * 1e6))
  base = rows[0][1]
  print(f"scan of {steps} steps, 64x64 matmul, median of {repeats}; "
        f"jax {jax.__version__}, {platform.processor() or platform.machine()}")
  print(f"{'variant':32s} {'us/step':>9s} {'ratio':>7s}")
  for name, us in rows:
    print(f"{name:32s} {us:9.1f} {us / base:7.2f}x")
  out = pathlib.Path(__file__).parent / "results"
  out.mkdir(exist_ok=True)
  (out / "latest.json").write_text(json.dumps({
      "steps": steps, "repeats": repeats, "jax": jax.__version__,
      "rows": [{"variant": n, "us_per_step": u, "ratio": u / base}
               for n, u in rows]}, indent=2))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())

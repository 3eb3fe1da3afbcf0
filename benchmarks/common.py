"""What every benchmark row shares: the 64x64 matmul scan with and without
host calls, timing (medians, paired runs against the plain scan), and a
row's record ``{"row", "us_per_step", "ratio", "target", "pass", "note"}``."""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp

import hostcall


X = jnp.eye(64, dtype=jnp.float32) * 0.5


EVERY = 256  # hostcall.scan's chunk in the loop-buffered rows


#: The speed targets, numbered as docs/performance.md's tables and history
#: call them ("row 7"). The harness prints each of a target's rows with its
#: number in front, and a note that points at another row names it with
#: ``numbered``: the numbers are assigned here only. The rows that measure
#: no target (the plain scan, JAX's own callbacks) have none.
TARGETS = {
    "default tap": 1,
    "loop-buffered tap": 2,
    "async tap": 3,
    "one tap a call": 4,
    "1 MiB async tap": 5,
    "busy main thread": 6,
    "progress bar and metrics": 7,
    "peers": 8,
    "steered loops": 9,
    "backward pass": 10,
    "tracking writers": 11,
    "hostcall.jit": 12,
    "compile time": 13,
    "mixed calls": 14,
}


def numbered(target: str | None, name: str) -> str:
  """``name`` as printed among ``target``'s rows ("7. progress bar ...");
  unchanged for a reference row (``target`` None)."""
  return name if target is None else f"{TARGETS[target]}. {name}"


def noop(*args, **kwargs):
  return None


def median_time(run, repeats: int) -> float:
  run()
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    run()
    samples.append(time.perf_counter() - start)
  return statistics.median(samples)


def matmul_step(carry):
  return jnp.tanh(carry @ carry) * 0.5


def scan(tap, steps: int, payload: int = 1, delivery: str = "sync"):
  def step(carry, _):
    carry = matmul_step(carry)
    if tap is not None:
      value = carry[0, 0] if payload == 1 else jnp.broadcast_to(
          carry[0, 0], (payload,))
      tap(value)
    return carry, None

  # The delivery applies while the function is traced.
  return jax.jit(hostcall.delivery(delivery)(
      lambda x: jax.lax.scan(step, x, None, length=steps)[0]))


def per_step(fn, steps, repeats, drain=True) -> float:
  def run():
    fn(X).block_until_ready()
    if drain:
      hostcall.barrier()
  return median_time(run, repeats) / steps * 1e6


def row(name, us, ratio, target, note="") -> dict:
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
    self.base_fn = scan(None, self.steps)
    self.base = per_step(self.base_fn, self.steps, self.repeats)

  @functools.cached_property
  def effectful_base_fn(self) -> Callable:
    """The plain scan with one ``jax.debug.callback`` after the loop: JAX
    dispatches it as it dispatches every program with effects (on the
    calling thread, off its C++ fast path), so that a ratio against it
    leaves out what that dispatch costs and keeps what the taps cost."""
    def effectful(x):
      out = self.base_fn(x)
      jax.debug.callback(noop, out[0, 0])
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

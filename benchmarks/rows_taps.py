"""Rows of the taps themselves: the plain scan, JAX's own callbacks, and
hostcall's taps (sync, ordered, loop-buffered, asynchronous, big, on a busy
main thread), each against the plain scan measured in the same run."""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

import hostcall
from hostcall import host_callback as hcb

from common import (Bench, EVERY, X, matmul_step, median_time, noop, per_step,
                    row, scan)


def plain_scan(b: Bench) -> list[dict]:
  return [row("no callback (64x64 matmul step)", b.base, 1.0, None)]


def jax_references(b: Bench) -> list[dict]:
  """JAX's own callbacks, for reference."""
  rows = []
  for name, tap in (
      ("jax.debug.callback, scalar", lambda v: jax.debug.callback(noop, v)),
      ("jax io_callback, scalar", lambda v: io_callback(noop, None, v)),
  ):
    rows.append(row(name, *b.paired(scan(tap, b.steps)), None, "reference"))

  def pure_step(carry, _):
    carry = matmul_step(carry)
    value = jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct(
        (), carry.dtype), carry[0, 0])
    return carry.at[0, 0].set(value), None
  fn = jax.jit(lambda x: jax.lax.scan(pure_step, x, None, length=b.steps)[0])
  rows.append(row("jax pure_callback, scalar (result used)", *b.paired(fn),
                   None, "reference"))
  return rows


def default_tap(b: Bench) -> list[dict]:
  """The default (synchronous, ordered) tap."""
  return [row(f"default tap, {label}", *b.paired(scan(
      lambda v: hcb.id_tap(noop, v), b.steps, payload)), 1.5)
          for payload, label in ((1, "scalar"), (1024, "4 KiB"))]


def ordered_vs_unordered(b: Bench) -> list[dict]:
  """Three taps a step: ordering's cost."""
  def three(ordered):
    def tap(v):
      for _ in range(3):
        if ordered:
          hcb.id_tap(noop, v)
        else:
          hostcall.debug_callback(noop, v)
    return tap
  ordered = per_step(scan(three(True), b.steps), b.steps, b.repeats)
  unordered = per_step(scan(three(False), b.steps), b.steps, b.repeats)
  return [row("3 taps a step, ordered vs unordered", ordered,
               ordered / unordered, 1.1,
               f"unordered: {unordered:.1f} us/step")]


def loop_buffered(b: Bench) -> list[dict]:
  """hostcall.scan gathers K steps of taps on the device."""
  def step(carry, _):
    carry = matmul_step(carry)
    hcb.id_tap(noop, carry[0, 0])
    return carry, None

  rows = []
  for delivery in ("sync", "async"):
    fn = jax.jit(hostcall.delivery(delivery)(lambda x: hostcall.scan(
        step, x, None, length=b.steps, every=EVERY)[0]))
    rows.append(row(
        f"loop-buffered tap (hostcall.scan, every={EVERY}), {delivery}",
        *b.paired(fn), 1.05, f"device buffer {EVERY * 4} B"))
  return rows


def async_device_side(b: Bench) -> list[dict]:
  """Asynchronous taps: what the device pays."""
  return [row(f"async tap{label}, device side", *b.paired(scan(
      lambda v: hcb.id_tap(noop, v), b.steps, payload, "async"),
      drain=False), 1.2) for payload, label in ((1, ""), (1024, " 4 KiB"))]


def async_dispatch(b: Bench) -> list[dict]:
  """An asynchronously tapping call returns before its loop ends."""
  fn = scan(lambda v: hcb.id_tap(noop, v), b.steps, delivery="async")
  fn(X).block_until_ready()
  hostcall.barrier()
  start = time.perf_counter()
  out = fn(X)
  returned = time.perf_counter() - start
  out.block_until_ready()
  total = time.perf_counter() - start
  hostcall.barrier()
  return [row("async dispatch kept: call returns / loop time",
               returned * 1e6 / b.steps, returned / total, 0.5,
               f"returned after {returned * 1e3:.2f} ms of "
               f"{total * 1e3:.1f} ms")]


def async_slow_host(b: Bench) -> list[dict]:
  """A slow host function overlaps the device's work."""
  steps = max(50, b.steps // 4)

  def sleepy(v, transforms):
    time.sleep(100e-6)

  fn = scan(lambda v: hcb.id_tap(sleepy, v), steps, delivery="async")
  host_total = median_time(lambda: [time.sleep(100e-6)
                                     for _ in range(steps)], b.repeats)
  device_total = b.base * steps / 1e6
  e2e = median_time(lambda: (fn(X).block_until_ready(), hostcall.barrier()),
                     b.repeats)
  return [row("async, host sleeps 100 us: end to end / max(host, device)",
               e2e / steps * 1e6, e2e / max(host_total, device_total), 1.15)]


def one_tap_per_call(b: Bench) -> list[dict]:
  """One tap in a jitted function called once."""
  small = jnp.ones(16)
  plain = jax.jit(lambda v: v * 2)
  tapped = jax.jit(lambda v: hcb.id_tap(noop, v) * 2)
  t_plain = median_time(lambda: plain(small).block_until_ready(),
                         b.repeats * 20)
  t_tap = median_time(lambda: tapped(small).block_until_ready(),
                       b.repeats * 20)
  return [row("one tap in a jitted call", t_tap * 1e6, t_tap / t_plain,
               2.0, f"plain call {t_plain * 1e6:.1f} us")]


def big_async_tap(b: Bench) -> list[dict]:
  """1 MiB, asynchronous, against an in-cache memcpy of 1 MiB."""
  mib = np.ones(1 << 18, np.float32)
  dst = np.empty_like(mib)
  memcpy = median_time(lambda: np.copyto(dst, mib), b.repeats * 20)
  steps = max(20, b.steps // 20)
  fn = scan(lambda v: hcb.id_tap(noop, v), steps, 1 << 18, "async")
  plain = scan(lambda v: v.sum(), steps, 1 << 18)
  with_tap = per_step(fn, steps, b.repeats, drain=False)
  hostcall.barrier()
  without = per_step(plain, steps, b.repeats, drain=False)
  per_tap = max(with_tap - without, 0.0)
  return [row("1 MiB async tap vs 1 MiB memcpy", per_tap,
               per_tap / (memcpy * 1e6), 3.0,
               f"memcpy {memcpy * 1e6:.1f} us")]


def busy_main_thread(b: Bench) -> list[dict]:
  """Asynchronous delivery while a Python thread keeps the GIL busy."""
  fn = scan(lambda v: hcb.id_tap(noop, v), b.steps, delivery="async")
  run = lambda: (fn(X).block_until_ready(), hostcall.barrier())  # noqa: E731
  idle = median_time(run, b.repeats)
  stop = threading.Event()

  def busy():
    while not stop.is_set():
      sum(range(1000))
  worker = threading.Thread(target=busy)
  worker.start()
  try:
    loaded = median_time(run, b.repeats)
  finally:
    stop.set()
    worker.join()
  return [row("async taps with a busy Python thread vs idle",
               loaded / b.steps * 1e6, loaded / idle, 2.0,
               f"idle: {idle / b.steps * 1e6:.1f} us/step")]

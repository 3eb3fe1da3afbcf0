"""The compile-time rows of ``hostcall bench``: how long the first call of a
step takes (tracing, lowering, XLA's compilation and the run) under
``hostcall.jit`` against ``jax.jit``, for a step that logs many values, as a
model's per-layer norms are logged. Each sample is a new function (nothing
cached), the two jits alternated so that the machine's drift hits both
alike; the ratio is the median of the samples' ratios."""

from __future__ import annotations

import statistics
import tempfile
import time

import jax
import jax.numpy as jnp

import hostcall

from common import row
from rows_jit import _calls_as_outputs

#: Values a call logs, one row each. (10,000 is measured apart, in
#: docs/performance.md: jax.jit alone takes seconds to compile it.)
COUNTS = (10, 100, 1000)
TARGET = 1.5
#: The same, with the calls as outputs.
OUTPUTS_COUNTS = (100, 1000)


def _logging_step(run, count: int):
  def step(x, i):
    run.log({f"m{k}": x + k for k in range(count)}, step=i)
    return x * 2
  return step


def _first_call(jit, run, count: int) -> float:
  """Seconds of a new function's first call, until its outputs are ready
  (its rows are written after the clock stops)."""
  step = jit(_logging_step(run, count))
  start = time.perf_counter()
  jax.block_until_ready(step(jnp.float32(1), 0))
  elapsed = time.perf_counter() - start
  hostcall.barrier()
  return elapsed


def _compared(b, run, count: int) -> tuple[float, float, float]:
  """(median ratio, hostcall.jit's median seconds, jax.jit's) of the first
  calls of ``count`` values, alternated."""
  # More samples of the smallest, whose few ms of noise each move a ratio
  # by a tenth; fewer of the largest: a second or so each.
  samples = (3 * b.repeats if count <= 100 else b.repeats if count < 1000
             else min(b.repeats, max(3, b.repeats // 2)))
  mine, theirs = [], []
  for _ in range(samples):
    theirs.append(_first_call(jax.jit, run, count))
    mine.append(_first_call(hostcall.jit, run, count))
  return (statistics.median(m / t for m, t in zip(mine, theirs)),
          statistics.median(mine), statistics.median(theirs))


def compile_rows(b) -> list[dict]:
  """The first call's time under hostcall.jit over jax.jit's, for each
  of ``COUNTS`` values logged by one ``Run.log``; and, for reference, the
  same with the calls as outputs (the way of an accelerator)."""
  rows = []
  with tempfile.TemporaryDirectory() as root, hostcall.metrics.Run(
      "compile", root=root, writers=["memory"]) as run:
    for jit in (jax.jit, hostcall.jit):  # each jit's first use, unmeasured
      _first_call(jit, run, 2)
    for count in COUNTS:
      ratio, mine, theirs = _compared(b, run, count)
      rows.append(row(
          f"first call (compile) of a step logging {count} values, "
          "hostcall.jit / jax.jit", None, ratio, TARGET,
          f"median {mine * 1e3:.0f} ms against {theirs * 1e3:.0f} ms"))
    with _calls_as_outputs():
      _first_call(hostcall.jit, run, 2)
      for count in OUTPUTS_COUNTS:
        ratio, mine, theirs = _compared(b, run, count)
        rows.append(row(
            f"... {count} values with the calls as outputs (as on an "
            "accelerator)", None, ratio, None,
            f"reference: median {mine * 1e3:.0f} ms against "
            f"{theirs * 1e3:.0f} ms"))
  return rows

"""The rows of ``hostcall bench`` for a step that makes several host calls
under ``hostcall.jit``: 2, 4 and 10 calls of mixed kinds (hostcall's and
JAX's prints and callbacks, ``Run.log``) in one 16-float ``tanh`` step,
called from a Python loop. Each row's target is the sum of what each of
its calls costs alone, measured in the same run: the ratio of the step
that makes it alone to the plain step, less one, summed, plus one. Every
host call is delivered (and every row written) before the clock stops."""

from __future__ import annotations

import collections
import contextlib
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp

import hostcall

from common import row

CALLS = 2000
_X = jnp.linspace(-1.0, 1.0, 16, dtype=jnp.float32)

#: The mixes, each the kinds of its calls in the order the step makes them.
MIXES = (
    ("hostcall.debug_print", "hostcall.debug_callback"),
    ("jax.debug.print", "jax.debug.callback"),
    ("hostcall.debug_print", "hostcall.debug_callback", "jax.debug.print",
     "Run.log"),
    ("hostcall.debug_print", "hostcall.debug_callback", "jax.debug.print",
     "Run.log", "hostcall.debug_callback", "hostcall.debug_print",
     "Run.log", "jax.debug.print", "hostcall.debug_callback",
     "jax.debug.callback"),
)


def _noop(*args):
  return None


def _call(kind: str, x, k: int, run) -> None:
  """One call of ``kind`` on the step's values (the ``k``-th of the step)."""
  v = x[k % 16]
  if kind == "hostcall.debug_print":
    hostcall.debug_print("x={}", v)
  elif kind == "hostcall.debug_callback":
    hostcall.debug_callback(_noop, v)
  elif kind == "jax.debug.print":
    jax.debug.print("x={}", v)
  elif kind == "jax.debug.callback":
    jax.debug.callback(_noop, v)
  else:
    run.log(loss=v, acc=x[(k + 1) % 16])


def _step(kinds, run):
  def step(x):
    for k, kind in enumerate(kinds):
      _call(kind, x, k, run)
    return jnp.tanh(x)
  return step


def _loop(step):
  """Seconds per call of a Python loop of ``CALLS`` calls of ``step``, with
  every output ready and every host call delivered (once warmed up)."""
  def once():
    start = time.perf_counter()
    out = _X
    for _ in range(CALLS):
      out = step(_X)
    jax.block_until_ready(out)
    hostcall.barrier()
    return (time.perf_counter() - start) / CALLS
  once()
  return once


def mixed_calls_rows(b) -> list[dict]:
  """Each kind alone (references), then each mix against its target."""
  repeats = 3 * b.repeats
  with tempfile.TemporaryDirectory() as root, \
      open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
    run = hostcall.metrics.Run("mixed", root=root)
    loops = {"plain": _loop(jax.jit(_step((), run)))}
    kinds = sorted({kind for mix in MIXES for kind in mix})
    for kind in kinds:
      loops[(kind,)] = _loop(hostcall.jit(_step((kind,), run)))
    for mix in MIXES:
      loops[mix] = _loop(hostcall.jit(_step(mix, run)))
    ratios, times = _alternated(loops, repeats)
    run.close()
  rows = [row(f"one {kind} ({SHORT[kind]}) a step, hostcall.jit",
              times[(kind,)],
              ratios[(kind,)], None, "reference: its cost alone")
          for kind in kinds]
  for mix in MIXES:
    target = 1 + sum(ratios[(kind,)] - 1 for kind in mix)
    rows.append(row(f"{len(mix)} calls a step: {_named(mix)}", times[mix],
                    ratios[mix], target,
                    "target: the sum of each call's cost alone"))
  return rows


def _alternated(loops: dict, repeats: int) -> tuple[dict, dict]:
  """(median ratio to the plain step, median us a call) of each loop, the
  loops run one after another ``repeats`` times, each ratio against the
  plain step's run just before it (the machine's drift hits all alike)."""
  ratios, times = collections.defaultdict(list), collections.defaultdict(
      list)
  for _ in range(repeats):
    for key, once in loops.items():
      if key == "plain":
        continue
      base, t = loops["plain"](), once()
      ratios[key].append(t / base)
      times[key].append(t * 1e6)
  return ({k: statistics.median(v) for k, v in ratios.items()},
          {k: statistics.median(v) for k, v in times.items()})


#: How a row names each kind (the references spell it out once).
SHORT = {"hostcall.debug_print": "hp", "hostcall.debug_callback": "hc",
         "jax.debug.print": "jp", "jax.debug.callback": "jc",
         "Run.log": "log"}


def _named(mix) -> str:
  return "+".join(SHORT[kind] for kind in mix)

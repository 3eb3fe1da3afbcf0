"""The rows of ``hostcall bench`` for ``hostcall.jit``: a Python loop over a
small jitted step (a 16-float ``tanh``), as a training loop calls its
``train_step``, against the plain jitted step in the same run. Every host
call is delivered (and every row written) before the clock stops."""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import hostcall
from hostcall._jit import routes

from common import row

CALLS = 2000
METRICS = 10
_X = jnp.linspace(-1.0, 1.0, 16, dtype=jnp.float32)


_calls_as_outputs = routes.calls_as_outputs


def _noop(*args):
  return None


def _loop_time(step, calls: int, finish=None) -> float:
  """Seconds per call of a Python loop of ``calls`` calls, with every
  output ready and every host call delivered."""
  def once():
    start = time.perf_counter()
    outs = [step(_X, i) for i in range(calls)]
    jax.block_until_ready(outs[-1])
    if finish is not None:
      finish(outs)
    hostcall.barrier()
    return (time.perf_counter() - start) / calls
  once()
  return once


def _paired(fn, base, repeats: int) -> tuple[float, float]:
  """(us per call of ``fn``, median ratio to ``base``), alternated."""
  times, ratios = [], []
  for _ in range(repeats):
    t, b = fn(), base()
    times.append(t)
    ratios.append(t / b)
  return statistics.median(times) * 1e6, statistics.median(ratios)


def _step(x, i):
  del i
  return jnp.tanh(x)


def _uses_the_step(x, i):
  return jnp.tanh(x) + 0 * i


def jit_rows(b) -> list[dict]:
  """hostcall.jit: a jitted step with a callback, a print or metrics, each
  against the plain step and against the floor of the same work done
  without a host call."""
  loops = _Loops(b)
  rows = [loops.plain_row()]
  callbacks = _callback_rows(loops)
  rows += callbacks
  rows.append(_loop_step_row(loops))
  rows += _user_code_rows(loops)
  rows.append(_outputs_row(loops))
  rows += _callback_floor_rows(loops, hostcall_jit=callbacks[-1])
  rows += _metrics_rows(loops)
  return rows


class _Loops:
  """What the rows are measured against: the plain step's loop, and the
  plain step that takes the loop's Python int, each timed by the same
  loop of ``CALLS`` calls."""

  def __init__(self, b):
    # A row with a target takes three times the paired runs of a reference
    # row: its median swings less (docs/performance.md, its first lines).
    self.repeats, self.reference = 3 * b.repeats, max(3, b.repeats)
    self.base = _loop_time(jax.jit(_step), CALLS)

  @functools.cached_property
  def base_at(self):
    """JAX moves the loop's Python int to the device each call, which costs
    the plain step as much: a step that takes it is paired with this one."""
    return _loop_time(jax.jit(_uses_the_step), CALLS)

  def plain_row(self) -> dict:
    return row("plain jitted step (16-float tanh), Python loop",
               statistics.median(self.base() for _ in range(3)) * 1e6, 1.0,
               None)

  def measure(self, name, step, target=None, note=None, base=None,
              finish=None) -> dict:
    """The row of a loop over ``step`` (``finish``: what the loop does with
    the outputs), paired with ``base`` (the plain step's loop)."""
    us, ratio = _paired(_loop_time(step, CALLS, finish), base or self.base,
                        self.reference if target is None else self.repeats)
    if note is None:
      note = "reference" if target is None else ""
    return row(name, us, ratio, target, note)


def _tapped(debug_callback):
  def step(x, i):
    debug_callback(_noop, x[0])
    return jnp.tanh(x)
  return step


def _callback_rows(loops: _Loops) -> list[dict]:
  """One callback a call, under ``jax.jit`` and ``hostcall.jit``."""
  return [loops.measure(f"one callback a call, {name}",
                        jit(_tapped(callback)), target)
          for name, jit, callback, target in (
              ("jax.jit + jax.debug.callback", jax.jit, jax.debug.callback,
               None),
              ("jax.jit + hostcall.debug_callback", jax.jit,
               hostcall.debug_callback, None),
              ("hostcall.jit + hostcall.debug_callback", hostcall.jit,
               hostcall.debug_callback, 1.5))]


def _loop_step_row(loops: _Loops) -> dict:
  """The callback given the loop's step too, paired with the plain step
  that takes it (``_Loops.base_at``)."""
  def step_tapped(x, i):
    hostcall.debug_callback(_noop, i, x[0])
    return jnp.tanh(x)

  return loops.measure(
      "... with the loop's step, against the plain step that takes it",
      hostcall.jit(step_tapped), 1.5,
      "hostcall.jit + hostcall.debug_callback(f, i, x[0])",
      base=loops.base_at)


def _user_code_rows(loops: _Loops) -> list[dict]:
  """The user's code unchanged: JAX's own ``jax.debug.print`` and
  ``jax.debug.callback``, under ``jax.jit`` and under ``hostcall.jit``,
  printing to a file nobody reads so that the terminal costs nothing."""
  def jax_printed(x, i):
    jax.debug.print("x0={}", x[0])
    return jnp.tanh(x)

  with open(os.devnull, "w") as devnull, \
      contextlib.redirect_stdout(devnull):
    return [loops.measure(f"one {name} a call (the user's code)", jit(step),
                          target)
            for name, jit, step, target in (
                ("jax.debug.print, jax.jit", jax.jit, jax_printed, None),
                ("jax.debug.print, hostcall.jit", hostcall.jit, jax_printed,
                 1.5),
                ("jax.debug.callback, jax.jit", jax.jit,
                 _tapped(jax.debug.callback), None),
                # (2.0x: JAX's contract hands the callback a jax.Array a
                # value, whose cheapest constructor puts the floor near
                # 2.2x; docs/performance.md, row 12.)
                ("jax.debug.callback, hostcall.jit", hostcall.jit,
                 _tapped(jax.debug.callback), 2.0))]


def _outputs_row(loops: _Loops) -> dict:
  """hostcall.jit's other way, where calls cannot be queued from the device
  (an accelerator, several devices): the calls as outputs."""
  with _calls_as_outputs():
    return loops.measure(
        "... the same with the calls as outputs (as on an accelerator)",
        hostcall.jit(_tapped(hostcall.debug_callback)))


def _callback_floor_rows(loops: _Loops, hostcall_jit: dict) -> list[dict]:
  """The floor: the step returns the value, and the loop calls the function
  on each call's value itself; and ``hostcall_jit``'s row against it."""
  def returned_value(x, i):
    return jnp.tanh(x), x[0]

  def call_each(outs):
    for o in outs:
      _noop(np.asarray(o[1]))

  floor = loops.measure(
      "floor: the step returns the value, the loop calls the function",
      jax.jit(returned_value), finish=call_each)
  return [floor, row("... hostcall.jit callback / the floor",
                     hostcall_jit["us_per_step"],
                     hostcall_jit["ratio"] / floor["ratio"], None,
                     "ratio to the floor row")]


def _metrics_rows(loops: _Loops) -> list[dict]:
  """``METRICS`` metrics a call with ``Run.log`` under ``hostcall.jit``,
  against the plain step and against the floor."""
  names = [f"m{k}" for k in range(METRICS)]
  with tempfile.TemporaryDirectory() as root:
    run = hostcall.metrics.Run("jit", root=root)
    rows = _logged_rows(loops, run, names)
    rows += _written_floor_rows(loops, root, names, logged=rows[0])
    run.close()
  return rows


def _logged_rows(loops: _Loops, run, names) -> list[dict]:
  # The steps numbered on the host, in call order, as the floor numbers
  # its rows: the step does not use the loop's Python int.
  def logged(x, i):
    del i
    run.log(**{n: x[k] for k, n in enumerate(names)})
    return jnp.tanh(x)

  # The step given by the loop, paired with the plain step that takes it.
  def logged_at(x, i):
    run.log(i, **{n: x[k] for k, n in enumerate(names)})
    return jnp.tanh(x)

  rows = [loops.measure(f"{METRICS} metrics a call, Run.log under "
                        "hostcall.jit", hostcall.jit(logged), 1.6,
                        "JSON Lines, steps numbered on the host"),
          loops.measure("... the same, Run.log(i, ...) with the loop's step",
                        hostcall.jit(logged_at), 1.6,
                        "against the plain step that takes it",
                        base=loops.base_at)]
  int_us, int_ratio = _paired(loops.base_at, loops.base, loops.reference)
  rows.append(row("... a plain step that uses the loop's step", int_us,
                  int_ratio, None,
                  "reference: JAX's cost of a Python int argument"))
  return rows


def _written_floor_rows(loops: _Loops, root, names, logged: dict
                        ) -> list[dict]:
  """The floor: the step returns the same values stacked, and the loop
  hands them to the same kind of writer itself; and ``logged``'s row
  against it."""
  floor_writer = hostcall.metrics.JsonlWriter(f"{root}/floor.jsonl")

  def returned(x, i):
    return jnp.tanh(x), x[:METRICS]

  def write_rows(outs):
    values = np.stack([np.asarray(o[1]) for o in outs])
    floor_writer.write(hostcall.metrics.Block(
        step=np.arange(len(outs)), metrics=dict(zip(names, values.T))))

  floor = loops.measure(
      "floor: the step returns the metrics, the loop writes them",
      jax.jit(returned), finish=write_rows)
  floor_writer.close()
  return [floor, row("... Run.log under hostcall.jit / the floor",
                     logged["us_per_step"], logged["ratio"] / floor["ratio"],
                     1.15, "ratio to the floor row")]

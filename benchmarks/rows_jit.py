"""The rows of ``hostcall bench`` for ``hostcall.jit``: a Python loop over a
small jitted step (a 16-float ``tanh``), as a training loop calls its
``train_step``, against the plain jitted step in the same run. Every host
call is delivered (and every row written) before the clock stops."""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import hostcall
from hostcall._jit import jitted as jit_module

CALLS = 2000
METRICS = 10
_X = jnp.linspace(-1.0, 1.0, 16, dtype=jnp.float32)


@contextlib.contextmanager
def _calls_as_outputs():
  before = jit_module.mode
  jit_module.mode = "outputs"
  try:
    yield
  finally:
    jit_module.mode = before


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


def _row(name, us, ratio, target, note="") -> dict:
  return {"row": name, "us_per_step": us, "ratio": ratio, "target": target,
          "pass": None if target is None else ratio <= target, "note": note}


def _step(x, i):
  del i
  return jnp.tanh(x)


def _uses_the_step(x, i):
  return jnp.tanh(x) + 0 * i


def jit_rows(b) -> list[dict]:
  """12. hostcall.jit: a jitted step with a print or metrics (issue 23)."""
  # A row with a target: 21 paired runs (its median swings by about 0.04
  # over 7 on this box); a reference row: 7.
  repeats, reference = 3 * b.repeats, max(3, b.repeats)
  base = _loop_time(jax.jit(_step), CALLS)
  rows = [_row("12. plain jitted step (16-float tanh), Python loop",
               statistics.median(base() for _ in range(3)) * 1e6, 1.0, None)]

  def tapped(debug_callback):
    def step(x, i):
      debug_callback(_noop, x[0])
      return jnp.tanh(x)
    return step

  for name, jit, callback, target in (
      ("jax.jit + jax.debug.callback", jax.jit, jax.debug.callback, None),
      ("jax.jit + hostcall.debug_callback", jax.jit,
       hostcall.debug_callback, None),
      ("hostcall.jit + hostcall.debug_callback", hostcall.jit,
       hostcall.debug_callback, 1.5)):
    us, ratio = _paired(_loop_time(jit(tapped(callback)), CALLS), base,
                        reference if target is None else repeats)
    rows.append(_row(f"12. one callback a call, {name}", us, ratio, target,
                     "reference" if target is None else ""))
  # (The floor row below divides hostcall.jit's row, the last of these.)
  jit_us, jit_ratio = us, ratio

  # The loop's step passed as an argument (issue 42): JAX moves the Python
  # int to the device each call, which costs the plain step as much ("a
  # plain step that uses the loop's step", below), so that such a row is
  # paired with that plain step, which takes the same argument.
  def step_tapped(x, i):
    hostcall.debug_callback(_noop, i, x[0])
    return jnp.tanh(x)

  base_at = _loop_time(jax.jit(_uses_the_step), CALLS)
  us, ratio = _paired(_loop_time(hostcall.jit(step_tapped), CALLS), base_at,
                      repeats)
  rows.append(_row("12. ... with the loop's step, against the plain step "
                   "that takes it", us, ratio, 1.5,
                   "hostcall.jit + hostcall.debug_callback(f, i, x[0])"))
  # The user's code unchanged: JAX's own jax.debug.print and
  # jax.debug.callback, under jax.jit and under hostcall.jit (issue 42),
  # printing to a file nobody reads so that the terminal costs nothing.
  def jax_printed(x, i):
    jax.debug.print("x0={}", x[0])
    return jnp.tanh(x)

  with open(os.devnull, "w") as devnull, \
      contextlib.redirect_stdout(devnull):
    for name, jit, step, target in (
        ("jax.debug.print, jax.jit", jax.jit, jax_printed, None),
        ("jax.debug.print, hostcall.jit", hostcall.jit, jax_printed, 1.5),
        ("jax.debug.callback, jax.jit", jax.jit,
         tapped(jax.debug.callback), None),
        ("jax.debug.callback, hostcall.jit", hostcall.jit,
         tapped(jax.debug.callback), 1.5)):
      us, ratio = _paired(_loop_time(jit(step), CALLS), base,
                          reference if target is None else repeats)
      rows.append(_row(f"12. one {name} a call (the user's code)", us,
                       ratio, target, "reference" if target is None else ""))

  # hostcall.jit's other way, where calls cannot be queued from the device
  # (an accelerator, several devices): the calls as outputs.
  with _calls_as_outputs():
    outputs_us, outputs_ratio = _paired(
        _loop_time(hostcall.jit(tapped(hostcall.debug_callback)), CALLS),
        base, reference)
  rows.append(_row("12. ... the same with the calls as outputs (as on an "
                   "accelerator)", outputs_us, outputs_ratio, None,
                   "reference"))

  # The floor: the step returns the value, and the loop calls the function
  # on each call's value itself.
  def returned_value(x, i):
    return jnp.tanh(x), x[0]

  def call_each(outs):
    for o in outs:
      _noop(np.asarray(o[1]))

  floor_us, floor_ratio = _paired(
      _loop_time(jax.jit(returned_value), CALLS, finish=call_each), base,
      reference)
  rows.append(_row("12. floor: the step returns the value, the loop calls "
                   "the function", floor_us, floor_ratio, None, "reference"))
  rows.append(_row("12. ... hostcall.jit callback / the floor", jit_us,
                   jit_ratio / floor_ratio, None, "ratio to the floor row"))

  names = [f"m{k}" for k in range(METRICS)]
  with tempfile.TemporaryDirectory() as root:
    run = hostcall.metrics.Run("jit", root=root)

    # The steps numbered on the host, in call order, as the floor numbers
    # its rows: the step does not use the loop's Python int.
    def logged(x, i):
      del i
      run.log(**{n: x[k] for k, n in enumerate(names)})
      return jnp.tanh(x)

    us, ratio = _paired(_loop_time(hostcall.jit(logged), CALLS), base,
                        repeats)
    rows.append(_row(f"12. {METRICS} metrics a call, Run.log under "
                     "hostcall.jit", us, ratio, 1.6,
                     "JSON Lines, steps numbered on the host"))

    # The step given by the loop: JAX moves the Python int to the device
    # each call, which costs the plain step as much (the next row).
    def logged_at(x, i):
      run.log(i, **{n: x[k] for k, n in enumerate(names)})
      return jnp.tanh(x)

    at_us, at_ratio = _paired(_loop_time(hostcall.jit(logged_at), CALLS),
                              base_at, repeats)
    rows.append(_row("12. ... the same, Run.log(i, ...) with the loop's "
                     "step", at_us, at_ratio, 1.6,
                     "against the plain step that takes it"))
    int_us, int_ratio = _paired(base_at, base, reference)
    rows.append(_row("12. ... a plain step that uses the loop's step",
                     int_us, int_ratio, None,
                     "reference: JAX's cost of a Python int argument"))

    # The floor: the step returns the same values stacked, and the loop
    # hands them to the same kind of writer itself.
    floor_writer = hostcall.metrics.JsonlWriter(f"{root}/floor.jsonl")

    def returned(x, i):
      return jnp.tanh(x), x[:METRICS]

    def write_rows(outs):
      values = np.stack([np.asarray(o[1]) for o in outs])
      floor_writer.write(hostcall.metrics.Block(
          step=np.arange(len(outs)), metrics=dict(zip(names, values.T))))

    floor_us, floor_ratio = _paired(
        _loop_time(jax.jit(returned), CALLS, finish=write_rows), base,
        reference)
    rows.append(_row("12. floor: the step returns the metrics, the loop "
                     "writes them", floor_us, floor_ratio, None, "reference"))
    rows.append(_row("12. ... Run.log under hostcall.jit / the floor", us,
                     ratio / floor_ratio, 1.15, "ratio to the floor row"))
    floor_writer.close()
    run.close()
  return rows

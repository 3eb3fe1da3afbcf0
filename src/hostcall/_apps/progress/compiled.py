"""Progress bars for compiled loops: the loops.

A wrapped loop is a chunked loop (``loops/chunked.py``) whose site has a bar
spec: it sends its events (``loops/events.py``): *open* before its first step,
a *tick* with the step count after each chunk of steps and *close* after its
last step. ``scan`` and ``fori_loop`` run as ``hostcall.scan`` chunks of
``every`` steps, so the device makes about a hundred host calls a loop
whatever its length. ``while_loop`` cannot know its length: it runs chunks
whose size the host chooses at each tick from the rate it measured (about
``invocations.TICK_INTERVAL`` seconds of steps), so a slow loop ticks every
step and a fast one every few thousand. ``track`` decorates a body alone: one
tick per step, buffered when the body runs inside ``hostcall.scan``. The bar's
options are checked in ``options.py``; the host side is
``loops/invocations.py``'s registry, which ``bars.py`` listens to.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from hostcall._apps.loops import (chunked as _chunked, chunks as _chunks,
                                  events as _events, invocations as _loops,
                                  steerer as _steerer,
                                  tick_values as _tick_values)
from hostcall._apps.progress import options as _options
from hostcall._core import bind
from hostcall._core.checks import check_callable

def _spec(desc, total, unit, leave, file, all_processes, options):
  """The bar of a loop traced here: its row is the loop's nesting depth."""
  return _options.spec(desc, total, unit, leave, file, all_processes,
                           options, position=_chunked.depth())


def _check_every(every):
  if every is not None:
    _chunks.check_every(every, ", or None for the default")


def scan(f: Callable, init, xs=None, length: int | None = None,
         reverse: bool = False, unroll: int | bool = 1, *,
         desc: str | None = None, every: int | None = None,
         unit: str = "step", leave: bool | None = None, file=None,
         all_processes: bool = False, interruptible: bool = False,
         time_limit: float | None = None, stop_when: Callable | None = None,
         **tqdm_options) -> Any:
  """``jax.lax.scan`` with a progress bar.

  Arguments:
    f, init, xs, length, reverse, unroll: as for ``jax.lax.scan``.
    desc: the bar's label.
    every: steps between two updates of the bar (one host call each);
      default: a hundredth of the loop. Taps in ``f`` are delivered in
      chunks of ``every`` steps too (see ``hostcall.scan``); in a loop
      that is not steered (no ``interruptible``, ``time_limit`` or
      ``stop_when``), in chunks of up to 256 steps (and 64 KiB of their
      values, a vmap lane's) where ``every`` is smaller, each after the
      bar's updates of its steps; ``f`` is then traced once more, to size
      them (as ``jax.lax.scan``, ``f`` may be traced more than once: keep
      Python state, such as a random key split at trace time, out of it).
    unit: what a step is called on the bar.
    leave: keep the finished bar on screen; default: only outermost bars.
    file: where the bar is drawn (default: ``tqdm.auto``, the terminal's
      stderr or a notebook widget).
    all_processes: draw a bar in every process of a multi-process job, not
      only in process 0.
    interruptible: the first Ctrl-C (a notebook's interrupt) stops the loop
      at its next check and the call returns normally; a second one raises
      ``KeyboardInterrupt`` as usual.
    time_limit: seconds after which the loop stops at its next check.
    stop_when: a host predicate, called after each chunk with a
      ``hostcall.control.LoopStatus`` (and free to look at what the loop
      logged, e.g. ``hostcall.control.plateau(run, "loss")``); True stops
      the loop at a following check.
    **tqdm_options: further ``tqdm`` arguments (``colour``, ``ncols``...).

  Returns:
    What ``jax.lax.scan`` returns; with any of ``interruptible``,
    ``time_limit`` or ``stop_when``, a ``hostcall.control.Result`` whose
    ``value`` is that (``ys`` rows of the steps not run are zeros), with
    ``stopped``, ``steps`` and ``reason``.

  One bar per call of the loop at run time, also under ``jit`` (not one per
  trace). Nested progress loops draw nested bars. Under ``vmap`` one bar
  counts the steps and shows the number of lanes; on several devices
  (``shard_map``, ``pmap``) one bar follows the slowest device. The device
  never waits for the bar: hostcall's delivery thread draws it, and closes
  it a moment after the loop ends (``hostcall.barrier()`` waits for that),
  or, marked ``stopped``, when its computation fails.

  Example:
    >>> import io, jax, hostcall
    >>> out = io.StringIO()
    >>> run = jax.jit(lambda x: hostcall.progress.scan(
    ...     lambda c, _: (c * x, None), 1.0, length=500, file=out)[0])
    >>> float(run(1.001))
    1.6483...
    >>> hostcall.barrier(); "500/500" in out.getvalue()
    True
  """
  check_callable(f, "hostcall.progress.scan's body f")
  _check_every(every)
  stop, desc = _steered(interruptible, time_limit, stop_when, desc)
  steps = _chunks.scan_length(xs, length, "hostcall.progress.scan")
  site = _loops.invocations.site(_spec(desc, steps, unit, leave, file,
                                       all_processes, tqdm_options))
  every = every or max(1, -(-int(steps) // 100))
  return _chunked.scan_loop(site, stop, _events.ticks(stop, tqdm_options),
                            lambda c, x: _chunks.step_output(f(c, x)), init,
                            xs, length, reverse, unroll, every, steps,
                            values=True)


def _steered(interruptible, time_limit, stop_when, desc):
  """The loop's ``Stop`` (None: not steered), and its bar's label."""
  stop = _steerer.steerer().stop_of(interruptible, time_limit, stop_when)
  if stop is not None and stop.interruptible:
    # (A desc that is no str is refused with the bar's other options.)
    if desc is None or isinstance(desc, str):
      desc = f"{desc} (Ctrl-C stops)" if desc else "Ctrl-C stops"
  return stop, desc


def fori_loop(lower, upper, body_fun: Callable, init_val, *,
              unroll: int | bool | None = None, desc: str | None = None,
              every: int | None = None, unit: str = "step",
              leave: bool | None = None, file=None,
              all_processes: bool = False, interruptible: bool = False,
              time_limit: float | None = None,
              stop_when: Callable | None = None, **tqdm_options) -> Any:
  """``jax.lax.fori_loop`` with a progress bar.

  Arguments and bar options as for ``hostcall.progress.scan``; with bounds
  known at trace time the loop runs as ``hostcall.progress.scan`` (and is
  reverse-differentiable), otherwise as ``hostcall.progress.while_loop``.

  Returns:
    What ``jax.lax.fori_loop`` returns.

  Example:
    >>> import io, jax, hostcall
    >>> out = io.StringIO()
    >>> hostcall.progress.fori_loop(0, 10, lambda i, c: c + i, 0, file=out)
    Array(45, dtype=int32)
    >>> hostcall.barrier(); "10/10" in out.getvalue()
    True
  """
  check_callable(body_fun, "hostcall.progress.fori_loop's body_fun")
  options = dict(desc=desc, every=every, unit=unit, leave=leave, file=file,
                 all_processes=all_processes, interruptible=interruptible,
                 time_limit=time_limit, stop_when=stop_when, **tqdm_options)
  steered = _steerer.steerer().stop_of(interruptible, time_limit,
                                        stop_when) is not None
  try:
    lo, hi = int(lower), int(upper)
  except (TypeError, jax.errors.ConcretizationTypeError):
    lo = hi = None
  if lo is not None:
    def step(state, _):
      i, carry = state
      return (i + 1, body_fun(i, carry)), None
    out = scan(step, (jnp.asarray(lo, jnp.result_type(lower)), init_val),
               length=max(hi - lo, 0), unroll=1 if unroll is None else unroll,
               **options)
    if steered:
      return out._replace(value=out.value[0][1])
    return out[0][1]

  def cond(state):
    return state[0] < upper

  def body(state):
    i, carry = state
    return i + 1, body_fun(i, carry)

  index = jnp.asarray(lower, jnp.result_type(lower, upper))
  total = jnp.maximum(jnp.asarray(upper) - index, 0)
  out = _while(cond, body, (index, init_val), total, **options)
  if steered:
    return out._replace(value=out.value[1])
  return out[1]


def while_loop(cond_fun: Callable, body_fun: Callable, init_val, *,
               total=None, desc: str | None = None,
               every: int | None = None,
               unit: str = "step", leave: bool | None = None, file=None,
               all_processes: bool = False, interruptible: bool = False,
               time_limit: float | None = None,
               stop_when: Callable | None = None, **tqdm_options) -> Any:
  """``jax.lax.while_loop`` with a progress bar: a counter with its rate.

  Arguments and bar options as for ``hostcall.progress.scan``, except
  ``every``: default None lets the host pace the ticks (about ten a second,
  whatever a step costs); an int fixes the steps between ticks. ``total``
  (tqdm's): the steps the bar expects, where you know them (an int, or a
  traced one); without it the bar counts with its rate.

  Returns:
    What ``jax.lax.while_loop`` returns.

  Under ``vmap`` with a batched predicate the bar shows how many lanes are
  still running.

  Example:
    >>> import io, jax, hostcall
    >>> out = io.StringIO()
    >>> hostcall.progress.while_loop(lambda c: c < 100, lambda c: c + 1, 0,
    ...                              file=out)
    Array(100, dtype=int32, weak_type=True)
    >>> hostcall.barrier(); "100step" in out.getvalue().replace(" ", "")
    True
  """
  if total is not None:
    _check_total(total)
  return _while(cond_fun, body_fun, init_val,
                -1 if total is None else total, desc=desc, every=every,
                unit=unit, leave=leave, file=file,
                all_processes=all_processes, interruptible=interruptible,
                time_limit=time_limit, stop_when=stop_when, **tqdm_options)


def _check_total(total) -> None:
  """A while_loop's ``total=``: an integer count of steps, 0 to 2**31 - 1
  (a bar counts in int32), concrete or traced."""
  dtype = getattr(total, "dtype", None)
  integer = (isinstance(total, int) and not isinstance(total, bool)) or (
      dtype is not None and np.ndim(total) == 0
      and jnp.issubdtype(dtype, jnp.integer))
  try:
    fits = integer and 0 <= int(total) <= _chunked.INT32_MAX
  except jax.errors.ConcretizationTypeError:
    fits = integer   # traced: the bar reads it as it runs
  if not fits:
    raise TypeError(
        "hostcall.progress.while_loop: total= is the number of steps the "
        f"bar expects, an int from 0 to {_chunked.INT32_MAX} (or a traced "
        f"int); got {total!r}. Pass such an int, or leave it out to count "
        "without a total.")


def _while(cond_fun, body_fun, init_val, total, *, desc, every, unit, leave,
           file, all_processes, interruptible=False, time_limit=None,
           stop_when=None, **tqdm_options):
  check_callable(cond_fun, "the while loop's cond_fun")
  check_callable(body_fun, "the while loop's body_fun")
  _check_every(every)
  stop, desc = _steered(interruptible, time_limit, stop_when, desc)
  site = _loops.invocations.site(_spec(desc, None, unit, leave, file,
                                       all_processes, tqdm_options))

  return _chunked.while_loop(site, stop, _events.ticks(stop, tqdm_options),
                             cond_fun, body_fun, init_val, total, every,
                             values=True)


def track(body: Callable | None = None, *, total: int | None = None,
          desc: str | None = None, unit: str = "step",
          leave: bool | None = None, file=None, all_processes: bool = False,
          **tqdm_options) -> Callable:
  """Decorates a loop body so that each of its steps advances a bar.

  For a body passed to ``lax.scan``, ``lax.fori_loop`` or
  ``lax.while_loop`` you cannot change the loop call of; wrapping the loop
  (``hostcall.progress.scan`` and the others) is cheaper and knows when each
  invocation starts and ends. Each step makes one host call, gathered
  ``every`` steps at a time when the loop is ``hostcall.scan``.

  Arguments:
    body: the loop body (any signature; it is called unchanged).
    total: the number of steps of one invocation: the bar closes when it is
      reached and the next step opens a new one. Without it one counter
      runs until the next ``hostcall.barrier()``. In a loop whose length is
      known when traced (``lax.scan``, ``hostcall.scan`` and the loops
      built on them) it must be that length.
    desc, unit, leave, file, all_processes, **tqdm_options: as for
      ``hostcall.progress.scan``.

  Returns:
    The decorated body (or a decorator, when called without ``body``).

  Example:
    >>> import io, jax, hostcall
    >>> out = io.StringIO()
    >>> @hostcall.progress.track(total=20, file=out)
    ... def step(c, x):
    ...   return c + x, None
    >>> jax.lax.scan(step, 0.0, jax.numpy.ones(20))[0]
    Array(20., dtype=float32)
    >>> hostcall.barrier(); "20/20" in out.getvalue()
    True
  """
  if body is None:
    return functools.partial(track, total=total, desc=desc, unit=unit,
                             leave=leave, file=file,
                             all_processes=all_processes, **tqdm_options)
  check_callable(body, "hostcall.progress.track's body")
  if total is not None and not (isinstance(total, int)
                                and not isinstance(total, bool) and total > 0):
    raise ValueError(
        f"hostcall.progress.track: total is the number of steps of one "
        f"invocation of the loop (a Python int > 0) or None (a counter), got "
        f"{total!r} of type {type(total).__name__}.")
  # The options are checked now, where the mistake is made (the bar's spec
  # is made when the body is traced, which knows its nesting).
  _spec(desc, total, unit, leave, file, all_processes, tqdm_options)

  @functools.wraps(body)
  def tracked(*args, **kwargs):
    # A bar closes at its total and the next step opens another: a total
    # that is not the loop's length would draw its one run as several bars
    # (or never close it). Where the loop running the body says its length
    # (lax.scan, hostcall.scan and the loops built on them), they must
    # agree.
    length = _chunks.enclosing_loop_length()
    if total is not None and length is not None and length != total:
      raise ValueError(
          f"hostcall.progress.track(total={total}) decorates the body of a "
          f"loop of {length} steps: its bar would close after {total} steps "
          f"and start again. Pass total={length} (the steps of one run of "
          "the loop), or leave total out for a counter.")
    # The nesting depth (the bar's row) is known when the body is traced.
    spec = _spec(desc, total, unit, leave, file, all_processes, tqdm_options)
    site = _loops.invocations.site(spec)
    with _chunked.nested(), _tick_values.once(
        tqdm_options.get("disable") is not True) as values:
      out = body(*args, **kwargs)
    # The values its body set (set_postfix) ride on the step's call.
    bind([_events.lanes_probe(out), *values.values],
         target=_events.Step(site, values.layout), kind="call",
         ordering="unordered")
    return out

  return tracked


def close_all() -> None:
  """Closes every bar still open.

  Bars close themselves when their loop ends, when their computation fails
  in a host function, and at the next ``hostcall.barrier()`` when it fails
  elsewhere; this closes the rest at once (say, before printing a report).

  Example:
    >>> import hostcall
    >>> hostcall.progress.close_all()
  """
  _loops.invocations.close_all()

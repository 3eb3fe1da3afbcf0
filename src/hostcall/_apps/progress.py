"""Progress bars for compiled loops: the device side.

A wrapped loop sends *open* before its first step, a *tick* with the step
count after each chunk of steps and *close* after its last step, all as
asynchronous taps (the device copies a few numbers into hostcall's queue and
goes on). ``scan`` and ``fori_loop`` run as ``hostcall.scan`` chunks of
``every`` steps, so the device makes about a hundred host calls a loop
whatever its length. ``while_loop`` cannot know its length: it runs chunks
whose size the host chooses at each tick from the rate it measured (about
``bars.TICK_INTERVAL`` seconds of steps), so a slow loop ticks every step
and a fast one every few thousand. ``track`` decorates a body alone: one
tick per step, buffered when the body runs inside ``hostcall.scan``. The
host side is ``bars.py``.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hostcall import _jax_private
from hostcall._apps import bars as _bars
from hostcall._apps import control as _control
from hostcall._apps import scan as _scan
from hostcall._core import CallTarget, TapTarget, bind, target
from hostcall._flavours.checks import check_callable

_local = threading.local()

# Targets ---------------------------------------------------------------------


class _BarEvent:
  """A bar's event at one loop (``site``): it happens once, rematerialised or
  not; under vmap it sees every lane at once; step counts have nothing to
  differentiate."""

  remat = "once"

  def __repr__(self):
    return f"progress.{type(self).__name__[1:].lower()}({self.site})"


@target
class _BarQuestion(_BarEvent, CallTarget):
  """An event whose answer the loop waits for (its failure fails the
  loop's computation)."""

  site: int
  bufferable = False

  def vmap_method(self) -> str:
    return "broadcast_all"

  def check_differentiable(self) -> None:
    return None


@target
class _BarTap(_BarEvent, TapTarget):
  """An event the loop does not wait for (failures wait for the barrier)."""

  site: int


def _handle(value) -> int:
  """The invocation handle an event carries (the same in every lane)."""
  return int(np.asarray(value).reshape(-1)[0])


@target
class _Open(_BarQuestion):
  """Opens the bar of one invocation: ``(total,)``; returns the invocation's
  handle, which the loop's other events carry (the loop cannot start before
  its open, and a bar never mixes two invocations)."""

  stop: Any = None  # a hostcall.control Stop: a steered loop
  bufferable = False

  def deliver(self, flat_args, context):
    total = int(np.asarray(flat_args[0]).reshape(-1)[0])
    handle = _bars.bars.open(self.site, context.device,
                             None if total < 0 else total, context)
    if self.stop is not None:
      _control.controls.open(handle, self.stop)
    lanes = tuple(size for _, size in reversed(context.batch_levels))
    return [np.full(lanes, handle, np.int32)]


@target
class _Close(_BarTap):
  """Closes an invocation's bar when its loop ends:
  ``(handle, count, witness)``."""

  bufferable = False

  def deliver(self, flat_args, context):
    handle, count, _ = flat_args
    _bars.bars.close(_handle(handle), context.device, _bars.last_count(count),
                     _bars.lanes_of(context))
    return ()


@target
class _Tick(_BarTap):
  """The step count after a chunk: ``(handle, count, witness[, running])``."""

  bufferable = False

  def deliver(self, flat_args, context):
    handle, count, _, *active = flat_args
    running = int(np.count_nonzero(active[0])) if active else None
    _bars.bars.tick(_handle(handle), context.device, _bars.last_count(count),
                    _bars.lanes_of(context), running)
    _control.controls.after_tick(_handle(handle), _bars.last_count(count),
                                 context.device)
    return ()


@target
class _Step(_BarTap):
  """One step of a decorated body (``track``)."""

  delivery = "async"

  def deliver(self, flat_args, context):
    _bars.bars.step(self.site, context.device, 1, _bars.lanes_of(context),
                    context)
    return ()

  def deliver_steps(self, stacked, steps, context):
    _bars.bars.step(self.site, context.device, steps,
                    _bars.lanes_of(context), context)


@target
class _Pace(_BarQuestion):
  """A while_loop's question: how many steps until the next tick?"""

  bufferable = False

  def deliver(self, flat_args, context):
    steps = _bars.bars.pace(_handle(flat_args[0]), context.device)
    lanes = tuple(size for _, size in reversed(context.batch_levels))
    return [np.full(lanes, steps, np.int32)]


# Device side -----------------------------------------------------------------


def _lanes_probe(tree) -> jax.Array:
  """A zero-size array batched wherever ``tree`` is: it makes a tick see
  the vmap lanes without sending any data."""
  probe = jnp.zeros((0,), jnp.int8)
  for leaf in _control.data_leaves(tree):
    probe = probe + jnp.ravel(leaf)[:0].astype(jnp.int8)
  return probe


@contextlib.contextmanager
def _nested():
  _local.depth = getattr(_local, "depth", 0) + 1
  try:
    yield
  finally:
    _local.depth -= 1


def _tqdm_options() -> frozenset:
  """The keyword options a tqdm bar takes (those hostcall sets aside)."""
  import tqdm
  names = set(inspect.signature(tqdm.tqdm.__init__).parameters)
  return frozenset(names - {"self", "iterable", "kwargs", "desc", "total",
                            "unit", "position", "leave", "file"})


def _spec(desc, total, unit, leave, file, all_processes, options):
  position = getattr(_local, "depth", 0)
  unknown = sorted(set(options) - _tqdm_options())
  if unknown:
    hints = []
    for name in unknown:
      close = difflib.get_close_matches(
          name, sorted(_tqdm_options()) + ["desc", "every", "unit", "leave",
                                           "file", "all_processes"], n=1)
      hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close
                                  else ""))
    raise TypeError(
        f"hostcall.progress got unknown option(s) {', '.join(hints)}. It "
        "takes desc, every, unit, leave, file, all_processes and tqdm's "
        f"options: {', '.join(sorted(_tqdm_options()))}.")
  try:
    items = tuple(sorted(options.items()))
    hash(items)
  except TypeError:
    raise TypeError(f"progress bar options must be hashable, got "
                    f"{options!r}") from None
  return _bars.BarSpec(
      desc=desc, total=total, unit=unit, position=position,
      leave=(position == 0) if leave is None else bool(leave), file=file,
      all_processes=bool(all_processes), options=items)


_INT_AVAL = _jax_private.ShapedArray((), jnp.int32)


# The bar's events are asynchronous taps: the device copies a few numbers
# into the queue and goes on; the consumer thread draws. They are unordered
# for JAX: data dependencies order them (open -> loop -> close), and the
# queue keeps the order in which the device sent them.


def _open(site, total, stop=None) -> tuple[jax.Array, jax.Array]:
  """The invocation's handle, and the loop's initial step count, which
  waits for it."""
  (handle,) = bind([jnp.asarray(total, jnp.int32)], target=_Open(site, stop),
                   kind="call", result_avals=(_INT_AVAL,),
                   ordering="unordered")
  return handle, jnp.zeros_like(handle)


def _witness(tree) -> jax.Array:
  """One number read from every leaf of ``tree`` (or an empty array when it
  holds no data), batched wherever ``tree`` is."""
  value = _control.witness(tree)
  return value if value.size else _lanes_probe(tree).astype(jnp.float32)


def _tick(site, handle, count, results, *active):
  # Reading the chunk's results keeps the tick after the chunk's steps.
  bind([handle, count, _witness(results), *active], target=_Tick(site),
       kind="call", delivery="async", ordering="unordered")


def _ticks(stop, tqdm_options) -> bool:
  """Whether a loop's chunks tick: not when no bar is drawn (``disable``)
  and no host predicate reads them."""
  return not (tqdm_options.get("disable") is True
              and (stop is None or stop.stop_when is None))


def _close(site, handle, count, results):
  # The runtime starts an operation when its input buffers are ready, and
  # XLA may know a loop's final step count without running it (an induction
  # variable): reading the loop's results makes the close wait for its end.
  bind([handle, count, _witness(results)], target=_Close(site),
       kind="call", delivery="async", ordering="unordered")


def _check_every(every):
  if every is not None and (not isinstance(every, int) or
                            isinstance(every, bool) or every < 1):
    raise ValueError(f"every must be a positive int or None, got {every!r}")


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
      chunks of ``every`` steps too (see ``hostcall.scan``).
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
  _check_every(every)
  stop, desc = _steered(interruptible, time_limit, stop_when, desc)
  steps = _scan.scan_length(xs, length, "hostcall.progress.scan")
  site = _bars.bars.site(_spec(desc, steps, unit, leave, file, all_processes,
                               tqdm_options))
  every = every or max(1, -(-int(steps) // 100))

  def body(state, x):
    count, carry = state
    with _nested():
      carry, y = _scan.step_output(f(carry, x))
    return (count + 1, carry), y

  handle, count = _open(site, steps, stop)
  out = _scan.scan(
      body, (count, init), xs, length=length, reverse=reverse,
      unroll=unroll, every=every,
      after_chunk=None if not _ticks(stop, tqdm_options) else
      lambda state, ys: _tick(site, handle, state[0], (state, ys)),
      check=None if stop is None else
      lambda state, index: _control.check(handle, index, after=state))
  (count, carry), ys = out[:2]
  if stop is not None:
    count = count + _control.end(handle, after=(carry, ys))
  _close(site, handle, count, (carry, ys))
  if stop is None:
    return carry, ys
  return _control.Result((carry, ys), out[2] != 0, count, out[2])


def _steered(interruptible, time_limit, stop_when, desc):
  """The loop's ``Stop`` (None: not steered), and its bar's label."""
  stop = _control.Stop.of(interruptible, time_limit, stop_when)
  if stop is not None and stop.interruptible:
    _control.controls.install_python_handler()
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
  options = dict(desc=desc, every=every, unit=unit, leave=leave, file=file,
                 all_processes=all_processes, interruptible=interruptible,
                 time_limit=time_limit, stop_when=stop_when, **tqdm_options)
  steered = _control.Stop.of(interruptible, time_limit, stop_when) is not None
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
               desc: str | None = None, every: int | None = None,
               unit: str = "step", leave: bool | None = None, file=None,
               all_processes: bool = False, interruptible: bool = False,
               time_limit: float | None = None,
               stop_when: Callable | None = None, **tqdm_options) -> Any:
  """``jax.lax.while_loop`` with a progress bar: a counter with its rate.

  Arguments and bar options as for ``hostcall.progress.scan``, except
  ``every``: default None lets the host pace the ticks (about ten a second,
  whatever a step costs); an int fixes the steps between ticks.

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
  return _while(cond_fun, body_fun, init_val, -1, desc=desc, every=every,
                unit=unit, leave=leave, file=file,
                all_processes=all_processes, interruptible=interruptible,
                time_limit=time_limit, stop_when=stop_when, **tqdm_options)


def _while(cond_fun, body_fun, init_val, total, *, desc, every, unit, leave,
           file, all_processes, interruptible=False, time_limit=None,
           stop_when=None, **tqdm_options):
  _check_every(every)
  stop, desc = _steered(interruptible, time_limit, stop_when, desc)
  site = _bars.bars.site(_spec(desc, None, unit, leave, file, all_processes,
                               tqdm_options))
  pace = _Pace(site)

  def chunk(state):
    count, carry, checks, reason = state
    if every is None:
      (steps,) = bind([handle], target=pace, kind="call",
                      result_avals=(_INT_AVAL,), ordering="unordered")
    else:
      steps = every

    def inner_cond(inner):
      return (inner[0] < steps) & cond_fun(inner[2])

    def inner_body(inner):
      j, count, carry = inner
      with _nested():
        carry = body_fun(carry)
      return j + 1, count + 1, carry

    _, count, carry = lax.while_loop(inner_cond, inner_body,
                                     (jnp.int32(0), count, carry))
    if _ticks(stop, tqdm_options):
      _tick(site, handle, count, carry, cond_fun(carry))
    if stop is not None:
      checks = checks + 1
      reason = _control.check(handle, checks, after=(count, carry))
    return count, carry, checks, reason

  handle, count = _open(site, total, stop)
  count, carry, _, reason = lax.while_loop(
      lambda state: cond_fun(state[1]) & (state[3] == 0), chunk,
      (count, init_val, jnp.int32(0), jnp.int32(0)))
  if stop is not None:
    count = count + _control.end(handle, after=carry)
  _close(site, handle, count, carry)
  if stop is None:
    return carry
  return _control.Result(carry, reason != 0, count, reason)


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
      runs until the next ``hostcall.barrier()``.
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

  @functools.wraps(body)
  def tracked(*args, **kwargs):
    # The nesting depth (the bar's row) is known when the body is traced.
    spec = _spec(desc, total, unit, leave, file, all_processes, tqdm_options)
    step = _Step(_bars.bars.site(spec))
    with _nested():
      out = body(*args, **kwargs)
    bind([_lanes_probe(out)], target=step, kind="call",
         delivery=step.delivery, ordering="unordered")
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
  _bars.bars.close_all()

"""Host targets: the host side of one call site, as the primitive carries it.

A target's ``deliver(flat_args, context)`` turns the flat NumPy operands into
what the user's function expects, calls it and returns flat NumPy results
(none for a tap). Its class attributes say how the call behaves under each
transformation and on failure. Two bases absorb what every flavour and
application would otherwise repeat:

* ``PostponingTarget``: called for its effect. Its failures are postponed to the
  next barrier; under ``vmap`` it receives the whole batch; it has nothing to
  differentiate.
* ``CallTarget``: its failures fail the computation that made the call (its
  results, if any, are needed there). ``vmap`` and derivatives are refused
  unless a subclass says how.

Targets are frozen dataclasses (``@target``): two equal call sites compare
equal, so that tracing the same function twice reuses JAX's compilations.
"""

from __future__ import annotations

import concurrent.futures as concurrent_futures
import dataclasses
import functools
import os
import threading
from typing import Any, Callable, Sequence

import jax
import numpy as np

from hostcall import _jax_private
from hostcall._core import context as contexts
from hostcall._core.context import CallContext

#: Declares a target class: a frozen dataclass, compared by its fields (a
#: field that must not count for equality says ``compare=False``), with the
#: class's own ``__repr__``.
target = functools.partial(dataclasses.dataclass, frozen=True, repr=False)


def key_of(field: str, how: Callable[[Any], Any] | None = None) -> Any:
  """A field holding what equality compares for ``field`` (a function, say,
  which may be unhashable, declared ``compare=False``): ``how(value)``,
  ``hash_key`` by default; None where the value is None. Filled when the
  instance is made (``KeyedFields``)."""
  return dataclasses.field(init=False, repr=False, default=None,
                           metadata={"key_of": (field, how)})


class KeyedFields:
  """A frozen dataclass whose ``key_of`` fields fill themselves."""

  def __post_init__(self):
    for f in dataclasses.fields(self):
      found = f.metadata.get("key_of")
      if found is not None:
        field, how = found
        value = getattr(self, field)
        object.__setattr__(self, f.name, None if value is None
                           else (how or hash_key)(value))


#: When the host may see a call (``Schedule.when``), strictest first.
SCHEDULES = ("live", "queued", "deferred", "buffered")


@dataclasses.dataclass(frozen=True)
class Schedule:
  """When and how the host sees a target's calls: one declared value a
  target (``HostTarget.schedule``), from which every decision about it is
  read.

  Attributes:
    when: from the strictest to the loosest (each allows what the ones
      before it allow; see ``SCHEDULES``):

      * ``"live"``: as the program runs, the program waiting for it (a
        steered loop's check, whose answer the loop reads);
      * ``"queued"``: also queued from the device without a JAX effect
        (``hostcall.jit``'s queued route, ``_jit/threaded``), delivered
        while the program runs, in program order (a progress bar's tick);
      * ``"deferred"``: also delivered once the program is done, from its
        outputs (``hostcall.jit``'s outputs route, ``_jit/deferring``);
      * ``"buffered"``: also gathered over K steps by ``hostcall.scan``
        and delivered a chunk at a time (the default: taps, metrics).
    answer: for a call with results: whether ``hostcall.jit`` may queue
      the call instead of waiting for it (the host function still gets the
      call, later), its results then holding a handle the device makes,
      queued with the call as its last operand (with when it was made);
      where the device makes none (a global view of several devices), this
      value instead. None: it must be waited for. A bar's open answers -1,
      "this device's latest invocation"; the host adopts a device's handle
      as the invocation's.
    live_without_effect: for a ``"live"`` call: whether ``hostcall.jit``,
      queueing a program's other calls on one device, may run this one
      live without a JAX effect, ordered by the value threaded through the
      program instead (``_jit/threaded``), so that the program still takes
      JAX's fast path: a chunked loop's open, pace and finish, which its
      host side expects while other calls of the program are still queued.
    loop_event: whether the call is one of a chunked loop's own events (its
      open, ticks, pace, finish), not a call its body makes:
      ``hostcall.jit`` queues a steered loop's events beside a body that
      makes no call.
    asks_first: for such a call without results: the target's
      ``ask_first(*operands)``, staged before it, a traced int32, says
      whether the host function must still run (not 0); it then runs only
      then (a steered loop's finish: the device ends the loop itself and
      asks the host only to raise a failure).
    delivery: the delivery the target asks for (``"async"`` for taps whose
      host side never needs to run before the computation goes on); None:
      the delivery in force when traced. ``hostcall.scan`` flushes
      asynchronously when every tap of its chunk asks for it.
    inline_outside_jit: called outside ``jit``, whether the host function
      runs right away in the calling thread (JAX's debug callbacks) rather
      than from a compiled call.
  """

  when: str = "buffered"
  answer: int | None = None
  live_without_effect: bool = False
  loop_event: bool = False
  asks_first: bool = False
  delivery: str | None = None
  inline_outside_jit: bool = False

  def __post_init__(self):
    if self.when not in SCHEDULES:
      raise ValueError(f"a schedule's when is one of {SCHEDULES}; got "
                       f"{self.when!r}")


class HostTarget(KeyedFields):
  """The base of every target; see the module's docstring."""

  #: ``"fail"``: an exception in the host function fails the computation
  #: (which needs the results, or, as JAX's debug callbacks, reports it so);
  #: ``"postpone"``: it is logged and raised by the next barrier.
  on_error: str = "fail"

  #: When and how the host sees this target's calls (a class attribute, or
  #: a property where a field decides it).
  schedule: Schedule = Schedule()

  @property
  def bufferable(self) -> bool:
    """Whether ``hostcall.scan`` may gather this call over K steps."""
    return (SCHEDULES.index(self.schedule.when)
            >= SCHEDULES.index("buffered"))

  @property
  def deferrable(self) -> bool:
    """Whether ``hostcall.jit`` may deliver this call from its outputs."""
    return (SCHEDULES.index(self.schedule.when)
            >= SCHEDULES.index("deferred"))

  @property
  def queueable(self) -> bool:
    """Whether ``hostcall.jit`` may queue this call from the device."""
    return SCHEDULES.index(self.schedule.when) >= SCHEDULES.index("queued")

  def ask_first(self, *operands):
    """Where ``schedule.asks_first``: a traced int32, not 0 where the host
    function must still run (see ``Schedule``)."""
    raise NotImplementedError(f"{self!r} asks nothing first")

  #: Whether a failure of this call may be contained (see
  #: ``calls.set_containment``): held back while the loop that runs it
  #: stops on every device and process, then raised there. False for the
  #: steering's own calls, which raise contained failures and open loops.
  containable: bool = True

  #: Whether, in a branch of a ``cond`` under ``vmap`` whose predicate is
  #: batched, the call is made only for the lanes that took the branch
  #: (``gating``); its ``deliver`` then honours ``CallContext.gates``.
  gatable: bool = False

  #: How ``jax.checkpoint`` treats the call: ``"again"`` (runs again where
  #: its inputs are rematerialised, as the legacy module documented),
  #: ``"debug"`` (exactly as ``jax.debug.callback`` under every policy) or
  #: ``"once"`` (never again: a metric row, a progress event).
  remat: str = "again"

  #: A vectorised host side: ``deliver_steps(stacked_args, steps, context)``
  #: receives K buffered steps at once (the step axis after the batch axes)
  #: instead of one ``deliver`` call per step; None when it has none.
  deliver_steps: Callable | None = None

  #: Whether ``deliver_steps`` may also take consecutive queued calls of
  #: the call site at once, from one computation or several (under
  #: ``jax.jit`` and ``hostcall.jit``): true where each call stands alone
  #: (a metrics row, a bar's tick, which carries its invocation), not where
  #: a call belongs to the buffered steps around it (a decorated body's
  #: step).
  joins_calls: bool = False

  #: Seconds, or None: where set, ``hostcall.jit``'s native queue may drop
  #: a queued call of this site made less than this long after the last
  #: one it queued with the same first operand (``enqueue.emit_threaded``),
  #: because a later call carries all the dropped one would show (a bar's
  #: tick: its close carries the count and the values). None: each is
  #: queued.
  thin_interval: float | None = None

  #: The JAX function this call site stands in for, named in failure logs
  #: with JAX's own words ("jax.pure_callback failed"); None if none.
  jax_name: str | None = None

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    # A target is a primitive parameter: JAX's caches of those must not
    # keep its host function alive once the programs that call it are gone.
    _jax_private.cache_weakly(cls)

  def deliver(self, flat_args: Sequence[np.ndarray],
              context: CallContext) -> Sequence[Any]:
    raise NotImplementedError

  def caller(self, context: CallContext) -> Callable[..., Any]:
    """``call(*flat_args)``: delivers one call of this site in ``context``
    as ``deliver`` does, its results dropped. A target may return a
    quicker one for the calls of a site delivered one after another
    (``calls.run_each``)."""
    return lambda *flat_args: self.deliver(flat_args, context)

  def lines_writer(self, context: CallContext):
    """Where a run of this site's calls in ``context`` may be written at
    once (``calls.run_lines``): an object with ``lines_of(columns)`` (the
    text of every call, or None where it cannot say),
    ``write_lines(text)`` and optionally ``write_delivered(text)``, the
    same on a delivery thread; None where each call must run (the
    default)."""
    del context
    return None

  def vmap_method(self) -> str:
    """How a call with results is batched, or raise to refuse ``vmap``.

    ``"sequential"``: the host function is called once per batch element, in
    index order, from one host call that carries the whole batch;
    ``"concurrent"``: the same calls, run at the same time by a pool of
    threads.
    ``"expand_dims"`` / ``"broadcast_all"`` / ``"legacy_vectorized"``: it is
    called once with every batch axis in front.
    """
    raise NotImplementedError(f"vmap of {self!r} is not supported.")

  def has_derivatives(self) -> bool:
    """Whether ``jvp`` computes tangents (rather than returning None)."""
    return False

  def jvp(self, primals, tangents) -> list | None:
    """Tangents of a call's results, staged with JAX ops, or None when the
    target has no derivative rule."""
    del primals, tangents
    return None

  def transpose(self, cts, args) -> list:
    """Cotangents of the operands, for targets linear in some operands."""
    raise NotImplementedError(f"{self!r} is not linear; it cannot be "
                              "transposed.")

  def check_differentiable(self) -> None:
    """Called when a call with results meets a non-zero tangent: raise
    unless its results may be treated as constants (zero tangents)."""
    raise NotImplementedError(
        f"the host call {self!r} has no derivative rule: wrap it in "
        "jax.custom_jvp / jax.custom_vjp, stop the gradient with "
        "jax.lax.stop_gradient, or use hostcall.pure_callback with "
        "derivative rules.")

  @property
  def label(self) -> str:
    """How logs and errors name this call site (``hostcall.pure_callback``)."""
    return repr(self)

  def __repr__(self):
    return type(self).__name__


class PostponingTarget(HostTarget):
  """A host function called for its effect: failures wait for the barrier,
  the whole batch arrives at once under ``vmap``, nothing to differentiate."""

  on_error = "postpone"

  def vmap_method(self) -> str:
    return "broadcast_all"

  def check_differentiable(self) -> None:
    return None


class CallTarget(HostTarget):
  """A host function whose failures fail the computation that called it."""

  on_error = "fail"


class Steps:
  """A vectorised target's ``deliver_steps`` for ``n`` buffered steps (of a
  ``hostcall.scan`` chunk, or of ``hostcall.jit`` calls delivered
  together), seen by ``calls.deliver`` as one target with the target's own
  failure policy."""

  __slots__ = ("target", "n")

  def __init__(self, of: HostTarget, n: int):
    self.target, self.n = of, n

  def deliver(self, flat_args, context):
    return self.target.deliver_steps(flat_args, self.n, context)

  def __getattr__(self, name):
    return getattr(self.target, name)

  def __repr__(self):
    return repr(self.target)


@functools.lru_cache(maxsize=1024)
def is_positional(in_tree) -> bool:
  """Whether ``in_tree``, of ``(args, kwargs)``, is that of positional
  array arguments only: its flat leaves are the arguments."""
  n = in_tree.num_leaves
  return in_tree == jax.tree_util.tree_structure(((0,) * n, {}))


#: vmap methods under which the host function gets the whole batch at once.
VECTORISED = ("expand_dims", "broadcast_all", "legacy_vectorized")


def call_per_element(call: Callable[[list], list], flat_args: list,
                     levels: Sequence, n_results: int,
                     concurrent: bool = False) -> list:
  """Calls ``call`` once per batch element, in index order, and stacks.

  ``levels`` are ``(batch_dims, axis_size)`` of the vmaps, innermost first;
  the outermost is peeled first, since inner levels' ``batch_dims`` refer to
  arrays without its axis. ``concurrent``: the calls run at the same time
  in a pool of threads; results still come in index order, and a failure
  raises the first failing element's exception, as in index order.
  """
  if not levels:
    return list(call(flat_args))
  # A lane's host function that runs a concurrent call itself runs those
  # lanes in its own thread: waiting on the pool from the pool could leave
  # every worker waiting.
  if concurrent and not threading.current_thread().name.startswith(
      _LANE_THREADS):
    # Each thread runs its element in this call's context (call_context(),
    # and the barrier's refusal inside a host function).
    in_context = functools.partial(
        _call_in_context, call, contexts.call_context(),
        contexts.delivering_asynchronously())
    futures = [_lane_pool().submit(in_context, flat)
               for flat in _elements(flat_args, levels)]
    concurrent_futures.wait(futures)
    results = [f.result() for f in futures]
  else:  # one element's operands sliced at a time
    results = [call(flat) for flat in _elements(flat_args, levels)]
  if not n_results:
    return []
  sizes = tuple(size for _, size in reversed(levels))
  return [np.stack(column).reshape(sizes + np.shape(column[0]))
          for column in zip(*results)]


def _call_in_context(call, call_context, asynchronous, flat):
  if call_context is None:
    return call(flat)
  with contexts.calling(call_context, asynchronous=asynchronous):
    return call(flat)


def _elements(flat_args: list, levels: Sequence):
  """Each batch element's operands, in index order (outermost first). An
  operand added after a level was recorded (a ``cond``'s gate, given by an
  outer ``vmap``) has no entry in that level's dims: it is not batched
  there."""
  if not levels:
    yield flat_args
    return
  *inner, (dims, size) = levels
  dims = tuple(dims) + (None,) * (len(flat_args) - len(dims))
  for i in range(size):
    yield from _elements([a if d is None else np.take(a, i, axis=d)
                          for a, d in zip(flat_args, dims)], inner)


_LANE_THREADS = "hostcall-lanes"


@functools.cache
def _lane_pool() -> concurrent_futures.ThreadPoolExecutor:
  # One pool for the process, made on first use; its threads end with it.
  return concurrent_futures.ThreadPoolExecutor(
      max_workers=max(4, min(32, (os.cpu_count() or 1) * 4)),
      thread_name_prefix=_LANE_THREADS)


def hash_key(fn) -> Any:
  """``fn`` itself when hashable (so equal functions share compilations),
  else its identity."""
  try:
    hash(fn)
    return fn
  except TypeError:
    return ("id", id(fn))

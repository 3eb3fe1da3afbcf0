"""``hostcall.jit``: ``jax.jit`` whose taps carry no JAX effect.

Any JAX effect sends a compiled call off JAX's C++ dispatch path, and an
ordered one adds a token per call: a jitted step with one print costs many
times a plain one. ``hostcall.jit`` compiles the same program with its
deferrable host calls (see ``hostcall._jit.deferring``) taken out of its
effects, so that dispatch runs it on the fast path:

* for a program on one CPU device (of one or several) with the native tap
  queue, each call is
  queued from the device as the program runs (``hostcall._jit.threaded``:
  a custom call without a JAX effect, or with ``HOSTCALL_NATIVE=0`` a JAX
  Python callback, ordered by a value
  threaded through the program, ``lax.scan``, ``while_loop`` and ``cond``
  included), and the queue's consumer thread delivers it, as it delivers
  asynchronous taps, in the order the devices made them, with the
  asynchronous taps of every other program. On several devices the
  program also returns the value its last call returned, which the call
  strips and keeps until a barrier (``deferred.keep_queueing``): the CPU
  runtime does not run several devices' programs in the order they were
  dispatched, so the barrier waits for each such program itself;
* elsewhere (an accelerator; a global view of several devices, whose
  queued calls' order value would be replicated, a collective
  ``jax.jit``'s program lacks), the calls' operands become extra outputs,
  and the ``hostcall-deferred`` thread replays the calls once those
  outputs are ready (``hostcall._runtime.outputs_replay``).

A program with a host call that cannot be taken out is compiled as
``jax.jit`` compiles it, unchanged.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import warnings
from typing import Any, Callable

import jax

from hostcall import _jax_private
from hostcall._core.checks import check_callable
from hostcall._jit import deferrable, deferring, jax_callbacks, marker
from hostcall._jit import plan as replay_plan
from hostcall._runtime import (dispatch_stdout, emission, queue_library,
                               tap_queue)
from hostcall._runtime.outputs_replay import deferred
from hostcall._runtime.markers import markers


class HostcallJitWarning(UserWarning):
  """``hostcall.jit`` left a program as ``jax.jit`` compiles it (once per
  function): which call kept it so, and what to write instead."""


@jax.tree_util.register_pytree_node_class
class _DeferredOutputs:
  """The packed deferred values of one call, with their plan as the
  pytree's static part (so that each cached executable keeps its own)."""

  def __init__(self, packs, plan):
    self.packs, self.plan = list(packs), plan

  def tree_flatten(self):
    return self.packs, self.plan

  @classmethod
  def tree_unflatten(cls, plan, packs):
    return cls(packs, plan)


#: Whether this process's devices are of a platform whose row serves the
#: native queue, the native library loaded, found once (None until then):
#: read by every call of ``hostcall.jit``.
_QUEUED: bool | None = None
#: Whether this process has several devices (found with ``_QUEUED``): a
#: queued program then returns its last call's order value, kept for the
#: barrier to wait for.
_SEVERAL = False
_dispatching_at_top_level = _jax_private.dispatching_at_top_level


def _devices_with_the_native_queue() -> bool:
  global _QUEUED, _SEVERAL
  if _QUEUED is None:
    _SEVERAL = jax.local_device_count() > 1  # (set before _QUEUED is read)
    _QUEUED = (emission.serves(jax.default_backend(), "enqueue")
               and _has_the_native_queue())
  return _QUEUED


def _has_the_native_queue() -> bool:
  """Whether the native queue's library loads (its FFI handlers
  registered or, with ``HOSTCALL_NATIVE=0``, not: the calls are then
  JAX Python callbacks pushing into the same queue); False where the
  extension is missing (the calls then become outputs, which need no
  native code)."""
  try:
    queue_library.ffi()
  except queue_library.libraries.HostcallNativeError:
    return False
  return True


def _queues_from_the_device() -> bool:
  """Whether programs are compiled for the devices of a process whose
  platform serves the native queue (its row of ``emission.PLATFORMS``;
  today a CPU, one device or several): their deferrable calls are then
  queued from the program itself without a JAX effect
  (``hostcall._jit.threaded``), in the one queue that asynchronous taps of
  every other program go through, so that the host gets them all in the
  order the devices made them. On several devices a barrier waits for the
  queueing programs themselves (``deferred.keep_queueing``); on one, for
  a program dispatched after them. Elsewhere (a platform without the
  native queue) they become outputs."""
  return mode == "auto" and (_QUEUED if _QUEUED is not None
                             else _devices_with_the_native_queue())


_keys = itertools.count()

#: ``"auto"`` (queued where ``_queues_from_the_device`` says so) or
#: ``"outputs"`` (always deferred to outputs; for tests and comparison).
mode = "auto"


class Jitted:
  """The three ``jax.jit`` functions behind one ``hostcall.jit`` function,
  and how a call chooses between them (see ``function``).

  ``lower``, ``trace`` and ``eval_shape`` are ``jax.jit``'s, on the program
  with its host calls where they are (an AOT-compiled program keeps them).
  """

  def __init__(self, fun: Callable, jit_kwargs: dict):
    self._fun = fun
    self._key = next(_keys)  # (its markers' line)
    self._warned = False  # said once why the program stays as it is
    self._plain = jax.jit(fun, **jit_kwargs)
    # Shardings given: a program over several devices, maybe.
    self._sharded = bool(jit_kwargs.get("in_shardings") is not None
                         or jit_kwargs.get("out_shardings") is not None)
    kwargs = dict(jit_kwargs)
    if "out_shardings" in kwargs:  # the deferred outputs: left to XLA
      kwargs["out_shardings"] = (kwargs["out_shardings"], None)

    def traced(*args, **kwargs):
      return self._traced(False, args, kwargs)

    # Where the queue is reached natively: the program also queues its
    # place (``hostcall._jit.marker``).
    def traced_marked(*args, **kwargs):
      return self._traced(True, args, kwargs)

    # fun's signature (through __wrapped__): jax.jit finds static and
    # donated arguments by name or position in it, passed either way.
    def queueing(*args, **kwargs):
      return self._traced_queueing(False, args, kwargs)

    # On several devices: the outputs, and the order value the program's
    # last queued call returned (None where it queues none).
    def queueing_kept(*args, **kwargs):
      return self._traced_queueing(True, args, kwargs)

    functools.update_wrapper(traced, fun)
    functools.update_wrapper(traced_marked, fun)
    functools.update_wrapper(queueing, fun)
    functools.update_wrapper(queueing_kept, fun)
    self._deferring = jax.jit(traced, **kwargs)
    self._deferring_marked = jax.jit(traced_marked, **kwargs)
    self._queueing = jax.jit(queueing, **jit_kwargs)
    self._queueing_kept = jax.jit(queueing_kept, **kwargs)

  def function(self) -> Callable:
    """What ``hostcall.jit`` returns: a Python function (which binds as a
    method, as ``jax.jit``'s functions do) with ``lower``, ``trace``,
    ``eval_shape`` and ``clear_cache``. A function, not this object made
    callable: a call of an instance's ``__call__`` costs 0.1 to 0.3 us more
    than a function's, a tenth of what this wrapper may add to a call."""
    queueing, queueing_kept = self._queueing, self._queueing_kept
    noted_stdout = dispatch_stdout.NOTED

    def jitted(*args, **kwargs):
      if _dispatching_at_top_level() and _queues_from_the_device():
        consumer = tap_queue.consumer
        if not consumer.started and not _starts(consumer.start):
          return self._plain(*args, **kwargs)  # the interpreter exits
        if sys.stdout is not noted_stdout[0]:  # (its prints go there)
          dispatch_stdout.changed()
        if _SEVERAL:
          if self._sharded or _spans_devices(args, kwargs):
            # A global view: queued from one device, its calls' order
            # value would be replicated to the others, a collective
            # jax.jit's program lacks (threads dispatching such programs
            # at once deadlocked at the runtime's rendezvous); its calls
            # become outputs instead, and the program queues its place
            # among other programs' asynchronous taps.
            return self._call_marked(args, kwargs)
          # The CPU runtime does not run several devices' programs in the
          # order they were dispatched: the barrier waits for this one's
          # last call itself (keep_queueing marks it to).
          outs, last = queueing_kept(*args, **kwargs)
          if last is not None:
            deferred.keep_queueing(last)
          return outs
        # (Forwarding no keywords is the cheaper call.)
        outs = queueing(*args, **kwargs) if kwargs else queueing(*args)
        # The barrier then waits for this program to have run: marked once
        # it is dispatched (a barrier another thread runs meanwhile, which
        # takes the mark, settles programs dispatched before it only).
        deferred.queued_since_barrier = True
        return outs
      return self._call_elsewhere(args, kwargs)

    functools.update_wrapper(jitted, self._fun)
    jitted.lower, jitted.trace = self.lower, self.trace
    jitted.eval_shape, jitted.clear_cache = self.eval_shape, self.clear_cache
    jitted._hostcall_jitted = self
    return jitted

  def _call_elsewhere(self, args, kwargs):
    """A call that does not queue its host calls from the device."""
    if not _dispatching_at_top_level():
      # Under a transformation (vmap, grad, an enclosing jit), the host
      # calls are staged into the enclosing program, as jax.jit's are;
      # under jax.disable_jit() they run as the function runs.
      return self._plain(*args, **kwargs)
    if not deferred.started and not deferred.start():
      # The interpreter exits: no thread can start to replay the calls.
      return self._plain(*args, **kwargs)
    dispatch_stdout.noted()
    outs, extra = self._deferring(*args, **kwargs)
    if extra.plan is not None:
      deferred.submit(extra.plan, extra.packs)
    return outs

  def _call_marked(self, args, kwargs):
    """A global view's call where the queue's consumer delivers the
    devices' taps: its calls become outputs, replayed by the consumer where
    the program's marker sits in the queue (``hostcall._runtime.markers``).
    The caller has started the consumer and noted ``sys.stdout``; the
    deferred thread plays no part."""
    markers.begin(self._key)
    extra = None
    try:
      outs, extra = self._deferring_marked(*args, **kwargs)
    finally:
      if extra is not None and extra.plan is not None:
        markers.hand_in(self._key, extra.plan, extra.packs)
        # A barrier waits for the program to have run (its marker queued).
        deferred.keep_queueing(extra.packs[0])
      else:  # it raised, or makes no host call (and queues no marker)
        markers.abandon(self._key)
    return outs

  @property
  def _active(self):
    """The ``jax.jit`` function a call of this one runs here (a call
    whose arguments lie on several devices runs ``_deferring``)."""
    if _queues_from_the_device():
      return self._queueing_kept if _SEVERAL else self._queueing
    return self._deferring

  def _trace(self, args, kwargs):
    """``(closed jaxpr, its dynamic arguments, the output tree)`` of fun
    on ``args`` and ``kwargs``.

    Traced as ``fun`` itself, its static arguments (those ``jax.jit``
    passed in as they are, no tracer among their leaves) given as static,
    so that an error while tracing names the user's function and
    arguments, as ``jax.jit``'s does."""
    static_argnums = tuple(i for i, a in enumerate(args) if _is_static(a))
    static_kwargs = {k: v for k, v in kwargs.items() if _is_static(v)}
    fun = (functools.partial(self._fun, **static_kwargs) if static_kwargs
           else self._fun)
    dynamic_kwargs = {k: v for k, v in kwargs.items()
                      if k not in static_kwargs}
    closed, shapes = jax.make_jaxpr(
        fun, static_argnums=static_argnums, return_shape=True)(
            *args, **dynamic_kwargs)
    values = jax.tree_util.tree_leaves(
        ([a for i, a in enumerate(args) if i not in static_argnums],
         dynamic_kwargs))
    return closed, values, jax.tree_util.tree_structure(shapes)

  def _deferrable(self, closed, rules: deferrable.Rules):
    """The program to defer the host calls of (``closed``, JAX's own
    callbacks made hostcall's), or None where it must run as it is; then
    says once which call kept it so. Across processes, None: each process
    makes its own calls during the program, as under jax.jit (a deferred
    value, or a chosen device, may be another process's)."""
    if jax.process_count() > 1:
      return None
    rewritten = jax_callbacks.as_hostcalls(closed)
    verdict = rules.analyse(rewritten)
    body_call = None
    if (verdict and rules.queued
        and jax_callbacks.first_kept(rewritten, deferrable.runs_live)):
      body_call = jax_callbacks.first_kept(rewritten,
                                           deferrable.is_loop_body_call)
    if verdict and body_call is None:
      return rewritten
    if body_call is not None and not self._warned:
      self._warned = True
      warnings.warn(
          f"hostcall.jit: {getattr(self._fun, '__name__', 'the function')}"
          f" runs as jax.jit runs it, because it has a steered loop and "
          f"host calls it would queue ({body_call}): a queued call's "
          "failure would reach the host after the loop's checks, which "
          "must stop the loop at it. A steered loop alone (a bar, a time "
          "limit, a predicate) takes the fast path; see "
          "docs/performance.md.", HostcallJitWarning,
          stacklevel=_user_stacklevel())
      return None
    if verdict is None and not self._warned:
      self._warned = True
      rewritable = jax_callbacks.picker(rewritten)
      kept = jax_callbacks.first_kept(
          rewritten, lambda eqn: (rules.keeps_live(eqn)
                                  and not rewritable(eqn)),
          why=rules.why_kept)
      warnings.warn(
          f"hostcall.jit: {getattr(self._fun, '__name__', 'the function')}"
          f" runs as jax.jit runs it, its host calls inside the program "
          f"(JAX's effects, its slower dispatch), because of {kept}. "
          "hostcall.debug_print / debug_callback / "
          "io_callback without results (and JAX's jax.debug.print, "
          "jax.debug.callback, io_callback whose results are unused) are "
          "taken out; see docs/performance.md.", HostcallJitWarning,
          stacklevel=_user_stacklevel())
    return None

  def _traced_queueing(self, keep: bool, args, kwargs):
    """The program with its deferrable calls queued; with ``keep``, the
    outputs and the order value its last queued call returned (None where
    it queues none)."""
    if _jax_private.is_top_level():
      # Called as it is, not traced: jax_debug_nans' de-optimized rerun of
      # a call whose outputs had a NaN. Its host calls run as it runs, as
      # in jax.jit's rerun.
      outs = self._fun(*args, **kwargs)
      return (outs, None) if keep else outs
    closed, values, out_tree = self._trace(args, kwargs)
    program = self._deferrable(closed, deferrable.QUEUED)
    last = None
    if program is not None and keep:
      outs, last = deferring.evaluate_threaded(program, values,
                                               keep_order=True)
    elif program is not None:
      outs = deferring.evaluate_threaded(program, values)
    else:
      outs = jax.extend.core.jaxpr_as_fun(closed)(*values)
    outs = jax.tree_util.tree_unflatten(out_tree, outs)
    return (outs, last) if keep else outs

  def _traced(self, marked: bool, args, kwargs):
    if _jax_private.is_top_level():  # (see _traced_queueing)
      return self._fun(*args, **kwargs), _DeferredOutputs([], None)
    closed, values, out_tree = self._trace(args, kwargs)
    program = self._deferrable(closed, deferrable.AS_OUTPUTS)
    if program is None:
      outs = jax.extend.core.jaxpr_as_fun(closed)(*values)
      return (jax.tree_util.tree_unflatten(out_tree, outs),
              _DeferredOutputs([], None))
    outs, extra, nodes = deferring.evaluate(program, values)
    packs, plan = replay_plan.pack(extra, nodes)
    if marked:
      marker.bind(self._key)
    return (jax.tree_util.tree_unflatten(out_tree, outs),
            _DeferredOutputs(packs, plan))

  def lower(self, *args, **kwargs):
    return self._plain.lower(*args, **kwargs)

  def trace(self, *args, **kwargs):
    return self._plain.trace(*args, **kwargs)

  def eval_shape(self, *args, **kwargs):
    return self._plain.eval_shape(*args, **kwargs)

  def clear_cache(self) -> None:
    self._plain.clear_cache()
    self._deferring.clear_cache()
    self._deferring_marked.clear_cache()
    self._queueing.clear_cache()
    self._queueing_kept.clear_cache()


# hostcall's own files
_PACKAGE_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep


def _user_stacklevel() -> int:
  """The ``stacklevel`` of a warning raised here that points at the user's
  line (the first frame outside hostcall and JAX), which called the
  function whose tracing raises it."""
  frame, level = sys._getframe(1), 1
  while frame is not None and (frame.f_code.co_filename.startswith(
      _PACKAGE_DIR) or _jax_private.is_jax_frame(frame)):
    frame, level = frame.f_back, level + 1
  return level if frame is not None else 2


def _spans_devices(args, kwargs) -> bool:
  """Whether an argument lies on several devices (the program is then a
  global view of them)."""
  for leaf in jax.tree_util.tree_leaves((args, kwargs)):
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None and len(sharding.device_set) > 1:
      return True
  return False


def _starts(start) -> bool:
  """Whether ``start()`` (of a delivery thread) succeeds; False where the
  interpreter exits and no thread can start (Python 3.12 on)."""
  try:
    start()
  except RuntimeError:
    return False
  return True


def _is_static(value) -> bool:
  """Whether ``jax.jit`` passed ``value`` in as it is (a static argument):
  it has leaves, none of them a tracer."""
  leaves = jax.tree_util.tree_leaves(value)
  return bool(leaves) and not any(
      isinstance(leaf, _jax_private.Tracer) for leaf in leaves)


def jit(fun: Callable | None = None, /, **jit_kwargs: Any):
  """``jax.jit``, with the host calls whose results are unused taken out of
  the program's JAX effects: dispatch takes JAX's fast path.

  Taps, prints and metrics rows (``debug_callback``, ``debug_print``,
  ``io_callback`` without results, ``id_tap``/``id_print``,
  ``metrics.Run.log``, ``hostcall.scan``'s flushes) at the top level of the
  function, of a ``jax.jit`` inside it or in a ``lax.scan`` body are
  compiled without an effect. For a program on one CPU device (of one or
  several) the device queues their values as it runs (``while_loop`` bodies and ``cond``
  branches too), and hostcall's consumer thread delivers them in program
  order, in order with other programs' asynchronous taps; elsewhere (an
  accelerator, a program over several devices) they become extra outputs,
  delivered once the call's outputs are ready.
  The call returns at once, as ``jax.jit``'s does, and
  ``hostcall.barrier()`` waits for the host functions. A failing host
  function is reported by the next barrier, as an asynchronous tap's is.

  There a progress bar's events are queued too (its open
  answers "this device's latest invocation"). A program with a host call
  that must run where it is (a call with results that has an effect, a
  steered loop, and where calls become outputs a progress bar or a tap in
  a ``while_loop`` or ``cond``) is
  compiled exactly as ``jax.jit`` compiles it: its host calls run during
  the call, in their order.

  Arguments:
    fun: the function to compile (or omit it: ``@hostcall.jit(...)``
      decorates).
    **jit_kwargs: ``jax.jit``'s keyword arguments (``static_argnums``,
      ``donate_argnums``, ``in_shardings``, ``out_shardings``, ...).

  Returns:
    The compiled function, called as ``jax.jit``'s; its ``lower`` is
    ``jax.jit``'s (host calls kept where they are).

  Example:
    >>> import hostcall, jax.numpy as jnp
    >>> @hostcall.jit
    ... def step(x):
    ...   hostcall.debug_print("x = {}", x)
    ...   return jnp.tanh(x)
    >>> y = step(jnp.float32(0.5))
    >>> hostcall.barrier()
    x = 0.5
  """
  if fun is None:
    return functools.partial(jit, **jit_kwargs)
  check_callable(fun, "hostcall.jit's fun")
  return Jitted(fun, jit_kwargs).function()

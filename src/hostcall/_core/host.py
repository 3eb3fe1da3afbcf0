"""The host side of a hostcall: context, delivery, errors, barrier."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from hostcall._core import errors as _errors

logger = logging.getLogger("hostcall")


class CallbackException(Exception):
  """A host function run by a tap raised; raised by the next barrier.

  The message carries the original exception's text and host traceback, and the
  original exception is chained as ``__cause__``.
  """


@dataclasses.dataclass(frozen=True)
class CallContext:
  """What the host function may learn about the call that reached it.

  Attributes:
    transforms: the JAX transformations applied to the tapped value, outermost
      last, as ``(name, params)`` pairs, e.g.
      ``(('batch', {'batch_dims': (0,)}),)``.
    device: the ``jax.Device`` whose computation made the call.
    process_index: the index of the process that owns ``device``.
    batch_levels: ``(batch_dims, axis_size)`` of each enclosing ``vmap``,
      innermost first.
    shard_indices: in a partitioned call (``partitioned=True`` under ``jit``
      of sharded arrays), where each array operand's shard sits in its
      global array: one tuple of slices per flat operand. None otherwise.
  """

  transforms: tuple[tuple[str, dict[str, Any]], ...]
  device: Any
  batch_levels: tuple[tuple[tuple, int], ...] = ()
  shard_indices: tuple[tuple[slice, ...], ...] | None = None

  @property
  def process_index(self) -> int:
    """The index of the process (host) that owns ``device``."""
    return getattr(self.device, "process_index", 0)


class HostTarget:
  """The host function of one call site, as the primitive carries it.

  ``deliver(flat_args, context)`` turns the flat NumPy operands into what the
  user function expects, calls it and returns flat NumPy results (an empty
  sequence for a tap). Subclasses (one per flavour) override ``deliver``.

  Instances are compared by ``key`` so that tracing the same function twice
  reuses JAX's compilation cache.
  """

  #: Whether errors propagate into the JAX call (calls) or wait for the next
  #: barrier (taps, whose computation does not wait for them).
  returns_results: bool = False

  #: Whether ``hostcall.scan`` may gather this tap's values over K steps.
  #: Taps whose host side must see each event as it happens say no.
  bufferable: bool = True

  #: The delivery this target asks for (``"async"`` for taps whose host side
  #: never needs to run before the computation goes on); None: the mode in
  #: force when traced. ``hostcall.scan`` flushes asynchronously when every
  #: tap of its chunk asks for it.
  delivery: str | None = None

  #: Called outside ``jit``, whether the host function runs right away in the
  #: calling thread (JAX's debug callbacks) rather than from a compiled call.
  inline_outside_jit: bool = False

  #: How ``jax.checkpoint`` treats the call: ``"tap"`` (runs again where its
  #: inputs are rematerialised, as the legacy module documented),
  #: ``"debug"`` (exactly as ``jax.debug.callback`` under every policy) or
  #: ``"once"`` (never again: a metric row, a progress event).
  remat: str = "tap"

  #: A vectorised host side: ``deliver_steps(stacked_args, steps, context)``
  #: receives K buffered steps at once (the step axis after the batch axes)
  #: instead of one ``deliver`` call per step; None when it has none.
  deliver_steps: Callable | None = None

  def __init__(self, key: tuple):
    self.key = key

  def __hash__(self):
    return hash(self.key)

  def __eq__(self, other):
    return type(self) is type(other) and self.key == other.key

  def deliver(self, flat_args: Sequence[np.ndarray],
              context: CallContext) -> Sequence[Any]:
    raise NotImplementedError

  def vmap_method(self) -> str:
    """How a value-returning call is batched, or raise to refuse ``vmap``.

    ``"sequential"``: the host function is called once per batch element, in
    index order, from one host call that carries the whole batch.
    ``"expand_dims"`` / ``"broadcast_all"``: it is called once with every
    batch axis in front (unbatched operands given a unit / full axis).
    """
    raise NotImplementedError(f"vmap of {self!r} is not supported.")

  def has_derivatives(self) -> bool:
    """Whether ``jvp`` computes tangents (rather than returning None)."""
    return False

  def jvp(self, primals, tangents) -> list | None:
    """Tangents of a value-returning call's results, staged with JAX ops, or
    None when the target has no derivative rule."""
    del primals, tangents
    return None

  def transpose(self, cts, args) -> list:
    """Cotangents of the operands, for targets linear in some operands."""
    raise NotImplementedError(f"{self!r} is not linear; it cannot be "
                              "transposed.")

  def check_differentiable(self) -> None:
    """Called when a result-returning call meets a non-zero tangent: raise
    unless its results may be treated as constants (zero tangents)."""
    raise NotImplementedError(
        f"the host call {self!r} has no derivative rule: wrap it in "
        "jax.custom_jvp / jax.custom_vjp, stop the gradient with "
        "jax.lax.stop_gradient, or use hostcall.pure_callback with "
        "derivative rules.")

  def __repr__(self):
    return f"{type(self).__name__}({self.key[0]!r})"

  @property
  def label(self) -> str:
    """How logs and errors name this call site (``hostcall.pure_callback``)."""
    return repr(self)

  #: The JAX function this call site stands in for, named in failure logs
  #: with JAX's own words ("jax.pure_callback failed"); None if none.
  jax_name: str | None = None


class _ErrorLog:
  """The exceptions taps raised since the last barrier."""

  def __init__(self):
    self._lock = threading.Lock()
    self._last: tuple[BaseException, str] | None = None
    self.count = 0

  def record(self, exc: BaseException, formatted: str) -> None:
    with self._lock:
      self._last = (exc, formatted)
      self.count += 1

  def take(self) -> tuple[BaseException, str, int] | None:
    with self._lock:
      last, count = self._last, self.count
      self._last, self.count = None, 0
    if last is None:
      return None
    return (*last, count)


errors = _ErrorLog()


def _unpack_transforms(transforms: tuple) -> tuple:
  # The primitive keeps transforms as hashable tuples; users see dicts.
  unpacked = []
  for name, *params in transforms:
    if name == "batch":  # ("batch", batch_dims, axis_size)
      unpacked.append((name, {"batch_dims": params[0]}))
    else:
      unpacked.append((name, {}))
  return tuple(unpacked)


_current = threading.local()


def call_context() -> CallContext | None:
  """The context of the host call running in this thread, or None.

  Host functions of every flavour may call it to learn which device called
  them (``.device``), from which process (``.process_index``) and under which
  transformations (``.transforms``, ``.batch_levels``).

  Example:
    >>> import jax, numpy as np, hostcall
    >>> jax.jit(lambda x: hostcall.debug_callback(
    ...     lambda v: print(hostcall.call_context().device), x))(1.0)
    cpu:0
  """
  return getattr(_current, "context", None)


def batch_levels(transforms) -> tuple[tuple[tuple, int], ...]:
  """``(batch_dims, axis_size)`` of each vmap in ``transforms``, innermost
  first."""
  return tuple((t[1], t[2]) for t in transforms if t[0] == "batch")


def make_context(transforms: tuple, device,
                 shard_indices: tuple | None = None) -> CallContext:
  """The context of one call site on one device, built once at lowering
  (per call for a partitioned call, which learns its shard's index)."""
  return CallContext(_unpack_transforms(transforms), device,
                     batch_levels(transforms), shard_indices)


def run(target: HostTarget, flat_args: Sequence[np.ndarray],
        context: CallContext, asynchronous: bool = False) -> tuple:
  """Runs ``target`` for one call reaching the host: from the runtime
  (synchronous delivery), or from the queue's consumer thread."""
  if not asynchronous:
    # The runtime lends us views of device buffers that it reuses once we
    # return; a host function that keeps its argument must keep a copy.
    flat_args = [np.array(a) if isinstance(a, np.ndarray) else a
                 for a in flat_args]
  outer = getattr(_current, "context", None), delivering_asynchronously()
  _current.context, _current.asynchronous = context, asynchronous
  try:
    return _deliver(target, flat_args, context)
  finally:
    _current.context, _current.asynchronous = outer


def delivering_asynchronously() -> bool:
  """Whether this thread delivers a queued (asynchronous) call now: its
  computation has gone on and will not fail with the host function."""
  return getattr(_current, "asynchronous", False)


_barrier_hooks: list[Callable[[], None]] = []
_abort_hooks: list[Callable[[], None]] = []


def add_barrier_hook(hook: Callable[[], None]) -> None:
  """Runs ``hook()`` at the end of every barrier: where applications built
  on taps flush what they buffered."""
  _barrier_hooks.append(hook)


def barrier_started() -> float | None:
  """When the barrier running its hooks in this thread began
  (``time.monotonic()``), or None outside a barrier."""
  return getattr(_current, "barrier_started", None)


def add_abort_hook(hook: Callable[[], None]) -> None:
  """Runs ``hook()`` when a host function raises into its computation, which
  then fails: where applications close what the computation opened."""
  _abort_hooks.append(hook)


def run_hooks(hooks: list) -> None:
  for hook in list(hooks):
    try:
      hook()
    except Exception:  # noqa: BLE001 - one application must not stop others
      logger.exception("hostcall: hook %r raised", hook)


def _deliver(target, flat_args, context) -> tuple:
  failure = None
  try:
    out = target.deliver(flat_args, context)
    return tuple(out) if target.returns_results else ()
  except (KeyboardInterrupt, SystemExit) as exc:
    # Ctrl-C, or sys.exit() from a signal handler, stops the computation:
    # it is no tap failure to postpone (unless the computation has gone on).
    if delivering_asynchronously():
      formatted = _errors.format_safely(exc)
      logger.error("hostcall: tap function %r raised\n%s", target, formatted)
      errors.record(exc, formatted)
      return ()
    failure = _stop_computation(target, exc)
  except BaseException as exc:  # noqa: BLE001 - a tap must never kill the run
    if target.returns_results:
      failure = _stop_computation(target, exc)
    else:
      formatted = _errors.format_safely(exc)
      logger.error("hostcall: tap function %r raised; the next barrier will "
                   "raise CallbackException.\n%s", target, formatted)
      errors.record(exc, formatted)
  if failure is not None:
    # Raised outside the handler, so that no unprintable original rides
    # along as the context of its stand-in.
    raise failure
  return ()


def _stop_computation(target, exc: BaseException) -> BaseException:
  """Logs ``exc`` and returns what to raise into the runtime for it."""
  _errors.log_failure(target.label, exc, target.jax_name)
  run_hooks(_abort_hooks)
  return _errors.for_runtime(exc, target.label)


def settle() -> None:
  """Waits until every callback started so far has run on the host and runs
  the barrier hooks (rows flushed, orphaned bars closed); raises nothing."""
  from hostcall._core import asynchronous  # the queue starts on first use
  _current.barrier_started = time.monotonic()
  try:
    asynchronous.wait()
    run_hooks(_barrier_hooks)
  finally:
    _current.barrier_started = None


def barrier(logging_name: str | None = None) -> None:
  """Waits until every callback started before it has run on the host.

  Raises ``CallbackException`` if a tap function raised since the last
  barrier, with the last exception's text and traceback.

  Arguments:
    logging_name: a name for this barrier in hostcall's debug log.

  Example:
    >>> import jax, hostcall
    >>> seen = []
    >>> _ = jax.jit(lambda x: hostcall.host_callback.id_tap(
    ...     lambda v, tr: seen.append(int(v)), x))(3)
    >>> hostcall.barrier()
    >>> seen
    [3]
  """
  if call_context() is not None:
    raise RuntimeError(
        "hostcall.barrier() / barrier_wait() was called from inside a host "
        "function, where it would wait for the very computation (or queue) "
        "that is running it. Call it from the code that runs the JAX "
        "program, after the call returns.")
  logger.debug("barrier %s: waiting", logging_name or "")
  settle()
  logger.debug("barrier %s: done", logging_name or "")
  failure = errors.take()
  if failure is not None:
    exc, formatted, count = failure
    raise CallbackException(
        "There were exceptions during callback processing. Last one was: "
        f"{formatted}\n(hostcall: {count} tap function call(s) raised since "
        "the last barrier; each was logged when it happened.)") from exc


def check_callable(fn: Callable, what: str) -> None:
  if not callable(fn):
    raise TypeError(
        f"{what} must be callable, got {fn!r} of type {type(fn).__name__}; "
        "pass the function itself (`f`), not the result of calling it "
        "(`f(x)`).")


def _name(fn) -> str:
  name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
  module = getattr(fn, "__module__", None)
  if name and module and module not in ("builtins", "__main__"):
    return f"{module}.{name}"
  return name or repr(fn)


def check_arguments(fn: Callable, args: Sequence, kwargs: dict, what: str,
                    fix: str) -> None:
  """Raises ``TypeError`` when the trace already shows that ``fn`` cannot
  take the arguments its host call will give it (``args``/``kwargs``:
  placeholders of the right number and names), saying how to fix it."""
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):
    return  # no signature to read (some builtins): the call will tell
  try:
    signature.bind(*args, **kwargs)
  except TypeError as exc:
    given = ", ".join([*args, *(f"{k}=..." for k in kwargs)]) or "nothing"
    raise TypeError(
        f"{what} will call {_name(fn)}{signature} with ({given}), which it "
        f"cannot take: {exc}. {fix}") from None


_ARRAY_LIKE = (jax.Array, jax.core.Tracer, np.ndarray, np.generic, bool, int,
               float, complex)


def is_array_like(leaf) -> bool:
  """Whether ``leaf`` can travel to the host as an array operand."""
  return isinstance(leaf, _ARRAY_LIKE)


def check_operands(flat, what: str) -> None:
  """Raises a ``TypeError`` naming the first leaf that is not array-like."""
  for leaf in flat:
    if not is_array_like(leaf):
      raise TypeError(
          f"{what}: every leaf of the arguments sent to the host must be a "
          f"JAX array, a NumPy array or a Python number; got {leaf!r} of type "
          f"{type(leaf).__name__}. Pass other Python objects to the host "
          "function through a closure or functools.partial instead.")


def hash_key(fn) -> Any:
  """``fn`` itself when hashable (so equal functions share compilations),
  else its identity."""
  try:
    hash(fn)
    return fn
  except TypeError:
    return ("id", id(fn))

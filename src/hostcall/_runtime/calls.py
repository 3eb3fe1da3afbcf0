"""Running a target for one call that reached the host.

``run`` is what the runtime (synchronous delivery) and the queue's consumer
thread (asynchronous delivery) call: it sets the call's context, calls the
target and decides what a failure does. A target that fails its computation
(``on_error="fail"``) hands the runtime an exception it can carry; one that
postpones (taps) logs it for the next barrier. ``KeyboardInterrupt`` and
``SystemExit`` (Ctrl-C, a signal handler's ``sys.exit()``) always stop a
computation that waits for the host function; one that does not wait (an
asynchronous delivery) has gone on, so they are postponed like any failure.

A failure that would stop one device while its peers run on into a
collective (a steered loop's stop check agrees across devices and
processes) may be *contained* instead: the application that owns the loop
(``set_containment``) takes it, the call returns zeros, the device's later
host calls are skipped, every device stops at the loop's next check, and the
failure is raised on each of them then.

The JAX error a ``SystemExit`` becomes, left uncaught, ends the process with
the status ``sys.exit()`` asked for, as the ``SystemExit`` would have.
"""

from __future__ import annotations

import logging
import sys
from typing import Callable, Iterable, Sequence

import numpy as np

from hostcall._runtime import errors
from hostcall._core.context import (CallContext, calling,
                                    delivering_asynchronously)
from hostcall._core.targets import HostTarget, Steps

logger = logging.getLogger("hostcall")

_abort_hooks: list[Callable[[], None]] = []
_excepthook_before: list = []  # sys.excepthook before ours, once installed


def add_abort_hook(hook: Callable[[], None]) -> None:
  """Runs ``hook()`` when a host function raises into its computation, which
  then fails: where applications close what the computation opened."""
  _abort_hooks.append(hook)


_round_hooks: list[Callable[[], None]] = []


def add_round_hook(hook: Callable[[], None]) -> None:
  """Runs ``hook()`` each time a delivery thread (the queue's consumer,
  ``hostcall.jit``'s deferred thread) has delivered what it took in one
  trip: no more calls come before its next trip (a gather window away), so
  that what they handed on (a metrics writer's blocks) may go now."""
  _round_hooks.append(hook)


def round_ended() -> None:
  """Runs the trip hooks (see ``add_round_hook``); raises nothing: the
  delivery threads never die."""
  try:
    run_hooks(_round_hooks)
  except BaseException:  # noqa: BLE001 - (run_hooks logs an Exception)
    logger.exception("hostcall: a delivery trip's hook failed")


def run_hooks(hooks: Sequence[Callable[[], None]]) -> None:
  """Runs each hook; one that raises is logged and the others still run."""
  for hook in list(hooks):
    try:
      hook()
    except Exception:  # noqa: BLE001 - one application must not stop others
      logger.exception("hostcall: hook %r raised", hook)


class Stopped(Exception):
  """Carries a failure, already logged and made one the runtime can carry,
  out of ``deliver`` to ``run``, through any target delivering for others
  (``hostcall.scan``'s flush), which must not catch or handle it again."""

  def __init__(self, failure: BaseException):
    super().__init__()
    self.failure = failure


class Contained(Exception):
  """A failure a containment took, on its way out of ``deliver`` to
  ``run``, which answers the computation with zeros."""


class Containment:
  """What may hold back a failure of a synchronous call (see the module's
  docstring). ``failing`` holds the devices whose host calls are skipped
  now (read on every call: a plain attribute, usually empty)."""

  failing: frozenset = frozenset()

  def take(self, context: CallContext, exc: BaseException) -> bool:
    """Whether the failure ``exc`` of a call of ``context.device`` is held
    back, to be raised later on every device."""
    raise NotImplementedError


_containment: Containment | None = None


def set_containment(containment: Containment) -> None:
  """Installs the application that may contain failures (one: the steered
  loops of ``hostcall.control``)."""
  global _containment
  _containment = containment


def run(target: HostTarget, flat_args: Sequence[np.ndarray],
        context: CallContext, asynchronous: bool = False,
        result_avals: Sequence = ()) -> tuple:
  """Runs ``target`` for one call reaching the host: from the runtime
  (synchronous delivery), or from the queue's consumer thread.
  ``result_avals``: what the computation expects back, for a call whose
  failure is contained or that is skipped."""
  if not asynchronous:
    if (_containment is not None and _containment.failing
        and target.containable and context.device in _containment.failing):
      return _zeros(result_avals)  # its loop stops at the next check
    # The runtime lends us views of device buffers that it reuses once we
    # return; a host function that keeps its argument must keep a copy.
    flat_args = [np.array(a) if isinstance(a, np.ndarray) else a
                 for a in flat_args]
  elif context._tally is not None:  # each a run of its program
    context._tally.add(target.n if isinstance(target, Steps) else 1)
  with calling(context, asynchronous):
    try:
      return deliver(target, flat_args, context)
    except Stopped as stopped:
      failure = stopped.failure
    except Contained:
      return _zeros(result_avals)
  # Raised outside the handler, so that no unprintable original rides along
  # as the context of its stand-in.
  raise failure


def run_each(target: HostTarget, flats: Iterable, context: CallContext,
             single: bool = False) -> None:
  """Runs ``target`` for each of several queued calls of one call site,
  in order, in one call context: each fails alone, postponed to the
  barrier (as ``run(..., asynchronous=True)`` would). The target's
  ``caller`` calls the host function (of a debug callback: directly),
  its results dropped; a failure goes through ``deliver``'s policy.

  ``flats``: each call's flat arguments, or with ``single`` its one
  argument."""
  tally = getattr(context, "_tally", None)
  if tally is not None:  # each a run of its program
    flats = list(flats)
    tally.add(len(flats))
  call = target.caller(context)
  with calling(context, True):
    each(target, call, flats, context, single)


def each(target: HostTarget, call: Callable, flats: Iterable,
         context: CallContext, single: bool = False) -> None:
  """``run_each``'s calls, in the call context its caller put in force:
  ``call`` (``target.caller(context)``) for each of ``flats``, each
  failing alone."""
  # One frame for the run, not one a call: a small call costs little
  # more than the host function itself.
  if single:
    for arg in flats:
      try:
        call(arg)
      except BaseException as exc:  # noqa: BLE001 - a tap must never kill the run
        failed(target, exc, context)
    return
  for flat_args in flats:
    try:
      call(*flat_args)
    except BaseException as exc:  # noqa: BLE001 - a tap must never kill the run
      failed(target, exc, context)


def run_lines(target: HostTarget, columns: list, context: CallContext
              ) -> bool:
  """Runs several queued calls of one call site at once where its host
  function writes lines that can be formatted together (a print:
  ``target.lines_writer``): one write for the run. False, nothing run,
  where it cannot (then ``run_each`` runs each call). A failing write is
  reported once for the run, as a call's failure."""
  if not isinstance(context, CallContext):
    return False  # (a context a device: partitioned calls run each)
  writer = target.lines_writer(context)
  if writer is None:
    return False
  try:
    text = writer.lines_of(columns)
  except Exception:  # noqa: BLE001 - each call then runs, failing in its words
    text = None
  if text is None:
    return False
  if context._tally is not None and columns:  # each a run of its program
    context._tally.add(len(columns[0]))
  with calling(context, True):
    try:
      writer.write_lines(text)
    except BaseException as exc:  # noqa: BLE001 - a tap must never kill the run
      failed(target, exc, context)
  return True


def is_host_function_entry(frame) -> bool:
  """Whether ``frame`` is where hostcall calls a host function (the frames
  above it are the function's, and whatever interrupts it)."""
  return frame.f_code in _ENTRY_CODES


def deliver(target: HostTarget, flat_args: Sequence[np.ndarray],
            context: CallContext) -> tuple:
  """``target.deliver`` under ``target``'s failure policy, in the call
  context ``run`` set. A target that delivers for others (the taps of a
  loop's chunk) calls this for each, so that each fails as it would alone:
  a postponing one is logged for the barrier and the others go on; one that
  fails its computation raises ``Stopped``, which passes through to ``run``.
  """
  try:
    out = target.deliver(flat_args, context)
    return tuple(out) if target.on_error == "fail" else ()
  except BaseException as exc:  # noqa: BLE001 - a tap must never kill the run
    return failed(target, exc, context)


def failed(target: HostTarget, exc: BaseException, context: CallContext
            ) -> tuple:
  """The failure policy of a host function that raised ``exc``: postponed
  to the barrier (returns ``()``), or raised as ``Stopped``/``Contained``
  for the computation that waits for it."""
  if isinstance(exc, (Stopped, Contained)):
    raise exc
  if delivering_asynchronously():
    # The computation has gone on without waiting: nothing left to stop,
    # Ctrl-C and sys.exit() included; the barrier reports it.
    errors.postpone(exc, f"tap function {target!r}")
    return ()
  if (target.on_error == "fail"
      or isinstance(exc, (KeyboardInterrupt, SystemExit))):
    # Ctrl-C or a signal handler's sys.exit() stops a computation that
    # waits for the host function, whatever the target's policy.
    if (_containment is not None and target.containable
        and _containment.take(context, exc)):
      errors.log_failure(target.label, exc, target.jax_name)
      raise Contained() from None
    raise Stopped(_stop_computation(target, exc)) from None
  errors.postpone(exc, f"tap function {target!r}")
  return ()


#: Where hostcall calls host functions (see ``is_host_function_entry``).
_ENTRY_CODES = {deliver.__code__, each.__code__}


def calls_host_functions(*functions) -> None:
  """Marks ``functions`` as places that call host functions themselves,
  as ``each`` does (see ``is_host_function_entry``)."""
  _ENTRY_CODES.update(f.__code__ for f in functions)


def _zeros(result_avals) -> tuple:
  return tuple(np.zeros(a.shape, a.dtype) for a in result_avals)


def _stop_computation(target, exc: BaseException) -> BaseException:
  """Logs ``exc`` and returns what to raise into the runtime for it."""
  failure = errors.for_runtime(exc, target.label)
  if target.containable:  # else: a contained failure, logged when it came
    errors.log_failure(target.label, failure, target.jax_name)
  run_hooks(_abort_hooks)
  _summarise_if_uncaught()
  return failure


def _summarise_if_uncaught() -> None:
  """Installs hostcall's ``sys.excepthook`` (once): where no one catches
  the JAX error a host function's failure became, it ends with one line
  naming that failure and ``hostcall.original_errors()`` (the runtime's
  text shows it last, under JAX's frames); and a ``SystemExit``'s JAX error
  ends the process with the status ``sys.exit()`` asked for (the runtime
  carries no other kind; else ``sys.exit(6)`` in a signal handler would
  end it with 1, the status of any uncaught error)."""
  if not _excepthook_before:
    _excepthook_before.append(sys.excepthook)
    sys.excepthook = _excepthook


def _excepthook(exc_type, error, tb) -> None:
  original = errors.original_error(error)
  if isinstance(original, SystemExit):
    # Raised from sys.excepthook, a SystemExit ends the interpreter with its
    # status (after the exit hooks, which deliver what is queued); logged
    # already, it is not printed again, as sys.exit() prints nothing.
    raise original
  _excepthook_before[0](exc_type, error, tb)
  line = errors.summary(error) if original is not None else None
  if line is not None:
    try:
      sys.stderr.write(line + "\n")
    except Exception:  # noqa: BLE001 - a closed stderr at exit
      pass

"""Running a target for one call that reached the host.

``run`` is what the runtime (synchronous delivery) and the queue's consumer
thread (asynchronous delivery) call: it sets the call's context, calls the
target and decides what a failure does. A target that fails its computation
(``on_error="fail"``) hands the runtime an exception it can carry; one that
postpones (taps) logs it for the next barrier. ``KeyboardInterrupt`` and
``SystemExit`` (Ctrl-C, a signal handler's ``sys.exit()``) always stop a
computation that waits for the host function; one that does not wait (an
asynchronous delivery) has gone on, so they are postponed like any failure.
The JAX error a ``SystemExit`` becomes, left uncaught, ends the process with
the status ``sys.exit()`` asked for, as the ``SystemExit`` would have.
"""

from __future__ import annotations

import logging
import sys
from typing import Callable, Sequence

import numpy as np

from hostcall._core import errors
from hostcall._core.context import (CallContext, calling,
                                    delivering_asynchronously)
from hostcall._core.targets import HostTarget

logger = logging.getLogger("hostcall")

_abort_hooks: list[Callable[[], None]] = []
_excepthook_before: list = []  # sys.excepthook before ours, once installed


def add_abort_hook(hook: Callable[[], None]) -> None:
  """Runs ``hook()`` when a host function raises into its computation, which
  then fails: where applications close what the computation opened."""
  _abort_hooks.append(hook)


def run_hooks(hooks: Sequence[Callable[[], None]]) -> None:
  """Runs each hook; one that raises is logged and the others still run."""
  for hook in list(hooks):
    try:
      hook()
    except Exception:  # noqa: BLE001 - one application must not stop others
      logger.exception("hostcall: hook %r raised", hook)


def run(target: HostTarget, flat_args: Sequence[np.ndarray],
        context: CallContext, asynchronous: bool = False) -> tuple:
  """Runs ``target`` for one call reaching the host: from the runtime
  (synchronous delivery), or from the queue's consumer thread."""
  if not asynchronous:
    # The runtime lends us views of device buffers that it reuses once we
    # return; a host function that keeps its argument must keep a copy.
    flat_args = [np.array(a) if isinstance(a, np.ndarray) else a
                 for a in flat_args]
  with calling(context, asynchronous):
    return _deliver(target, flat_args, context)


def is_host_function_entry(frame) -> bool:
  """Whether ``frame`` is where hostcall calls a host function (the frames
  above it are the function's, and whatever interrupts it)."""
  return frame.f_code is _deliver.__code__


def _deliver(target, flat_args, context) -> tuple:
  failure = None
  try:
    out = target.deliver(flat_args, context)
    return tuple(out) if target.on_error == "fail" else ()
  except (KeyboardInterrupt, SystemExit) as exc:
    if delivering_asynchronously():
      errors.postpone(exc, f"tap function {target!r}")
      return ()
    failure = _stop_computation(target, exc)
  except BaseException as exc:  # noqa: BLE001 - a tap must never kill the run
    if target.on_error == "fail":
      failure = _stop_computation(target, exc)
    else:
      errors.postpone(exc, f"tap function {target!r}")
  if failure is not None:
    # Raised outside the handler, so that no unprintable original rides
    # along as the context of its stand-in.
    raise failure
  return ()


def _stop_computation(target, exc: BaseException) -> BaseException:
  """Logs ``exc`` and returns what to raise into the runtime for it."""
  errors.log_failure(target.label, exc, target.jax_name)
  run_hooks(_abort_hooks)
  if isinstance(exc, SystemExit):
    _exit_if_uncaught()
  return errors.for_runtime(exc, target.label)


def _exit_if_uncaught() -> None:
  """Makes the JAX error that a ``SystemExit`` becomes (the runtime carries
  no other kind) end the process with the ``SystemExit``'s status where no
  one catches it: else ``sys.exit(6)`` in a signal handler would end it
  with 1, the status of any uncaught error."""
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

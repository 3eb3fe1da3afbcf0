"""The engine's side of a steered loop: what the loops of the engine ask
of whatever steers them (the stop check after each chunk, the device's
own finish, the options checked, the result), provided by the steering
application (``hostcall._apps.control``, which calls ``provide`` when
imported, as ``hostcall`` imports it), so that the engine imports no
application and a progress loop is steered without importing it."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple


class Steerer(NamedTuple):
  """What steers the engine's loops.

  Attributes:
    stop_of: ``(interruptible, time_limit, stop_when)`` -> the loop's
      ``Stop`` (its options, checked; hashable), or None when none is set.
    check: ``(handle, index, after)`` -> the stop check's answer (traced):
      0 to go on, else the reason to stop.
    finish_here: ``(handle, reason)`` -> the device's own end of the loop
      under ``hostcall.jit`` (traced): not 0 where the host's finish must
      still run.
    result: ``(value, stopped, steps, reason)`` -> what a steered loop
      returns.
  """

  stop_of: Callable[..., Any]
  check: Callable[..., Any]
  finish_here: Callable[..., Any]
  result: Callable[..., Any]


_provided: list[Steerer] = []


def provide(steerer: Steerer) -> None:
  """``steerer`` steers the engine's loops from now on."""
  _provided[:] = [steerer]


def steerer() -> Steerer:
  """What steers the engine's loops."""
  if not _provided:
    raise RuntimeError(
        "hostcall: no steering is provided for a steered loop; import "
        "hostcall (which imports hostcall.control) first.")
  return _provided[0]

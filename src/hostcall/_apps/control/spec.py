"""What a steered loop is asked and what it answers: the reasons it stops,
``Stop`` (its options, checked), ``LoopStatus`` (what ``stop_when`` is told)
and ``Result`` (what it returns)."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable, NamedTuple

import numpy as np

from hostcall import _jax_private
from hostcall._core.targets import KeyedFields, key_of

# Why a loop stopped early (``Result.reason``); 0: it ran to its end.
#: ``Result.reason`` of a loop stopped by Ctrl-C (``interruptible=True``).
INTERRUPTED = 1
#: ``Result.reason`` of a loop stopped by its ``time_limit=``.
TIME_LIMIT = 2
#: ``Result.reason`` of a loop stopped by its ``stop_when=`` predicate.
STOP_WHEN = 3
#: ``Result.reason`` of a loop stopped because a host function it ran failed
#: (on this device or another): never returned, the loop's call raises that
#: failure on every device once they have all stopped.
FAILED = 4

_REASON_NAMES = {0: None, INTERRUPTED: "interrupted", TIME_LIMIT: "time_limit",
                 STOP_WHEN: "stop_when", FAILED: "failed"}


def reason_name(reason) -> str | None:
  """``"interrupted"``, ``"time_limit"``, ``"stop_when"``, or None (the loop
  ran to its end) for a ``Result.reason``."""
  accepted = ", ".join(f"{k} ({v or 'ran to its end'})"
                       for k, v in _REASON_NAMES.items())
  if isinstance(reason, _jax_private.Tracer):
    raise TypeError(
        f"reason_name reads a Result.reason on the host, got a traced value "
        f"({reason!r}); call it on the Result the jitted function returns "
        "(or compare the reason with hostcall.control.TIME_LIMIT and the "
        "others inside it).")
  try:
    values = np.asarray(reason)
    integral = (values.size > 0 and (np.issubdtype(values.dtype, np.integer)
                or (np.issubdtype(values.dtype, np.floating)
                    and bool(np.all(values == np.round(values))))))
  except Exception:  # noqa: BLE001 - whatever cannot be read is refused below
    integral = False
  if not integral:
    raise TypeError(
        f"reason_name takes a Result.reason (an integer, or an array of "
        f"them under vmap), got {reason!r}; it is one of {accepted}.")
  # Under vmap every lane stops with the others: one reason for all.
  value = int(values.reshape(-1)[0])
  if value not in _REASON_NAMES:
    raise ValueError(f"reason_name got {value}, which is no reason a "
                     f"steered loop gives; a Result.reason is one of "
                     f"{accepted}.")
  return _REASON_NAMES[value]


class Result(NamedTuple):
  """What a steered loop returns.

  Attributes:
    value: what the plain loop returns (for ``scan``, ``(carry, ys)``; the
      rows of ``ys`` past ``steps`` are zeros).
    stopped: whether it stopped early (a bool array).
    steps: how many steps it ran (an int32 array).
    reason: why it stopped: 0 (it did not), ``INTERRUPTED``,
      ``TIME_LIMIT`` or ``STOP_WHEN``; ``reason_name`` spells it.
  """

  value: Any
  stopped: Any
  steps: Any
  reason: Any


@dataclasses.dataclass(frozen=True)
class LoopStatus:
  """What ``stop_when`` is told after each chunk of a steered loop.

  Attributes:
    steps: the steps the loop has run (on the device that ticked).
    elapsed: seconds since the loop started.
    device: the device that ticked.
  """

  steps: int
  elapsed: float
  device: Any


@dataclasses.dataclass(frozen=True)
class Stop(KeyedFields):
  """When a steered loop stops early (hashable: part of the call site)."""

  interruptible: bool = False
  time_limit: float | None = None
  stop_when: Callable | None = dataclasses.field(default=None, compare=False)
  stop_when_key: Any = key_of("stop_when")

  @classmethod
  def of(cls, interruptible, time_limit, stop_when) -> "Stop | None":
    """The spec of these options, checked; None when none is set."""
    if not isinstance(interruptible, bool):
      raise TypeError(f"interruptible must be True or False, got "
                      f"{interruptible!r}")
    if time_limit is not None:
      time_limit = _seconds(time_limit)
    if stop_when is not None and not callable(stop_when):
      raise TypeError(
          f"stop_when must be a function of a hostcall.control.LoopStatus "
          f"returning a bool, got {stop_when!r}")
    if not interruptible and time_limit is None and stop_when is None:
      return None
    return cls(interruptible, time_limit, stop_when)


# The largest time limit the native clock can hold, in microseconds (its
# deadline is nanoseconds of the steady clock in an int64): any longer
# limit is never reached, and is passed as none.
MAX_LIMIT_US = 2**62 // 1000


def _seconds(time_limit) -> float:
  """``time_limit=`` as a float of seconds > 0 (``inf``: no limit), or a
  ``ValueError`` (whatever came) naming what came and what to pass."""
  expected = "time_limit is a number of seconds > 0 (math.inf: no limit)"
  fix = "Pass a Python number of seconds, e.g. time_limit=3600.0."
  if isinstance(time_limit, _jax_private.Tracer):
    raise ValueError(
        f"{expected}, known when the loop is traced (the host keeps the "
        f"deadline), got a traced value ({time_limit!r}). {fix} To vary it "
        "between calls of a jitted function, make it a static argument "
        "(jax.jit(..., static_argnames=...)).")
  if (isinstance(time_limit, (bool, np.bool_))
      or not isinstance(time_limit, numbers.Real)
      or not float(time_limit) > 0):  # NaN too
    raise ValueError(f"{expected}, got {time_limit!r} of type "
                     f"{type(time_limit).__name__}. {fix}")
  return float(time_limit)

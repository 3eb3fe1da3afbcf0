"""The asynchronous queue's public settings and counters:
``hostcall.set_queue_capacity``, ``hostcall.set_gather_window`` and
``hostcall.queue_stats`` (the queue and its thread: ``tap_queue``)."""

from __future__ import annotations

import math

from hostcall._runtime.tap_queue import (DEFAULT_GATHER, IDLE_GATHER,
                                         MAX_GATHER, consumer)


def set_queue_capacity(nbytes: int) -> None:
  """Bounds the asynchronous queue to ``nbytes`` (default 64 MiB).

  A tap that would exceed it waits (the device stalls) until the host has
  delivered enough: back-pressure, never loss. One tap larger than the
  bound still goes through alone.

  Arguments:
    nbytes: an int from 65536 to 2**62.
  """
  consumer.set_capacity(nbytes)


def set_gather_window(seconds: float | None) -> None:
  """How long asynchronous taps may wait on the host to be delivered
  together (default 0.01 s, 0.002 s while the main thread waits).

  Once a tap is queued, hostcall's delivery thread waits up to this long
  for others to join it, then delivers them all in one trip. Every trip
  wakes a thread, which costs the device time (on a small machine, a
  share of its core: docs/performance.md, "The gather window", has the
  measurements). The window never delays what
  someone waits for: ``hostcall.barrier()``, a full queue, a batch of 4096
  taps, a quarter of the queue's bytes, and steered
  loops with a ``stop_when`` predicate end it at once. Synchronous taps
  never wait.

  By default the window is shorter (0.002 s) while the main thread has
  kept its core idle since the last trip (it waits for a program's
  outputs, or a barrier): its Python then competes with no trip, and what
  is delivered while the program runs is not left for after it. A window
  given here holds whatever the main thread does.

  Arguments:
    seconds: from 0 (deliver every tap as soon as it comes) to 1; None
      for the default.

  Example:
    >>> import hostcall
    >>> hostcall.set_gather_window(0.001)
    >>> hostcall.set_gather_window(None)  # the default
  """
  if seconds is None:
    consumer.gather, consumer.idle_gather = DEFAULT_GATHER, IDLE_GATHER
    return
  try:
    value = float(seconds)
  except (TypeError, ValueError):
    value = math.nan
  if isinstance(seconds, bool) or not 0 <= value <= MAX_GATHER:
    raise ValueError(
        f"the gather window is a number of seconds from 0 to {MAX_GATHER}; "
        f"got {seconds!r}. The default is {DEFAULT_GATHER} "
        f"({IDLE_GATHER} while the main thread waits): "
        "set_gather_window(None).")
  # From the delivery thread's next trip; whatever the main thread does.
  consumer.gather = consumer.idle_gather = value


def queue_stats() -> dict:
  """The asynchronous queue's counters.

  Returns:
    A dict: ``pushed`` and ``delivered`` (taps so far), ``queued`` and
    ``queued_bytes`` (waiting now), ``capacity`` (the bound, bytes),
    ``producer_waits`` (times a tap waited for room), ``producers_waiting``
    (taps waiting now), ``trips`` (times the delivery thread took taps
    from the queue: see ``set_gather_window``) and ``native`` (whether the
    device queues through the native FFI handlers: False with
    ``HOSTCALL_NATIVE=0``, whose taps are pushed by JAX's callbacks).

  Example:
    >>> import hostcall
    >>> hostcall.queue_stats()["capacity"]
    67108864
  """
  consumer.start()
  stats = consumer.stats()
  stats["native"] = consumer.native
  return stats

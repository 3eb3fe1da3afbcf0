"""Markers: a program whose host calls became outputs takes its place in the
queue.

``hostcall.jit``'s outputs route (a global view of several CPU devices)
replays a program's host calls from its outputs, after the program. The
asynchronous taps of other programs reach the host through the queue, in
the order the devices made them. So that the replay keeps its place among
them, the program queues one marker item as it runs, from the device that
makes a global view's calls (``hostcall._jit.marker``), and the queue's
consumer replays the program's calls when it reaches the marker: after the
taps queued before the program ran, before those queued after.

A marker names its function, not its dispatch: the consumer replays the
oldest outputs of that function handed in (the dispatching thread hands
them in once the dispatch returns), in the order the dispatches returned,
which is the order the device ran them for a function called from one
thread. What cannot hang or lose calls:

* a marker whose outputs are not yet handed in waits only while a dispatch
  of its function is under way (``begin``, then ``hand_in`` or
  ``abandon``), each of which ends; it waits on a ``concurrent.futures``
  future, a wait the queue's watchdog recognises (a device waiting for room
  in the queue is then let through);
* a program that failed before its marker leaves failed outputs: the next
  marker drops them (its calls never ran, as under ``jax.jit``: its caller
  meets the error in its results);
* outputs that no marker claimed (a marker that took an earlier dispatch's)
  are replayed by the barrier, late but never lost;
* values waiting here are bounded in bytes as the deferred thread's are: a
  thread that runs ahead waits for room *after* handing its outputs in, so
  that the consumer never waits for a thread that waits for it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading

import jax
import numpy as np

from hostcall import _jax_private
from hostcall._core import targets
from hostcall._core.context import why_waiting_is_forbidden
from hostcall._runtime import calls, errors


class _Outputs:
  """One dispatch's outputs: its plan and packed values (device arrays,
  maybe not yet computed)."""

  __slots__ = ("plan", "packs", "size")

  def __init__(self, plan, packs):
    self.plan, self.packs, self.size = plan, packs, plan.nbytes


class Markers:
  """Each marked function's outputs handed in and its dispatches under
  way, and the bytes the outputs hold."""

  def __init__(self):
    self._lock = threading.Condition()
    self._handed: dict = collections.defaultdict(collections.deque)
    self._under_way: collections.Counter = collections.Counter()
    #: Resolved when something is handed in or abandoned.
    self._arrival = concurrent.futures.Future()
    self._bytes = 0
    self.capacity = 64 << 20

  def after_fork_in_child(self) -> None:
    self.__init__()

  # The dispatching thread.

  def begin(self, key) -> None:
    """A dispatch of the function ``key`` starts."""
    with self._lock:
      self._under_way[key] += 1

  def hand_in(self, key, plan, packs) -> None:
    """The outputs of the dispatch of ``key`` that just returned; then,
    where the values waiting exceed the capacity, waits for room (never
    where waiting is forbidden: a host function, the consumer)."""
    outputs = _Outputs(plan, packs)
    with self._lock:
      self._handed[key].append(outputs)
      self._bytes += outputs.size
      self._ended(key)
      if self._bytes > self.capacity and why_waiting_is_forbidden() is None:
        self._lock.wait_for(lambda: self._bytes <= self.capacity
                            or not outputs.size)

  def abandon(self, key) -> None:
    """The dispatch of ``key`` raised, or made no host call."""
    with self._lock:
      self._ended(key)

  def _ended(self, key) -> None:
    self._under_way[key] -= 1
    if not self._under_way[key]:
      del self._under_way[key]
    arrival, self._arrival = self._arrival, concurrent.futures.Future()
    arrival.set_result(None)

  # The consumer.

  def reached(self, key) -> None:
    """At a marker of the function ``key``: replays the oldest dispatch
    of it handed in, once there is one (none where no dispatch of it is
    under way: its dispatch raised)."""
    while True:
      with self._lock:
        line = self._handed.get(key)
        while line and _failed(line[0]):
          self._drop(key, line[0])
        if line:
          outputs = line[0]
          self._drop(key, outputs)
          break
        if not self._under_way[key]:
          return
        arrival = self._arrival
      concurrent.futures.wait([arrival])
    _replay(outputs)

  def _drop(self, key, outputs: _Outputs) -> None:
    """(Under the lock.) Lets go of a dispatch's outputs."""
    line = self._handed.get(key)
    if line is not None:
      try:
        line.remove(outputs)
      except ValueError:
        pass
      if not line:
        del self._handed[key]
    self._bytes -= outputs.size
    outputs.size = 0
    self._lock.notify_all()

  # A barrier, once the programs dispatched before it have run and the
  # queue is delivered.

  def replay_unclaimed(self) -> None:
    """Replays the outputs no marker claimed, of programs that have run,
    in the order they were handed in, and drops failed ones."""
    with self._lock:
      lines = {key: list(line) for key, line in self._handed.items()}
    for key, line in lines.items():
      for outputs in line:
        if not all(p.is_ready() for p in outputs.packs):
          break  # still running: its marker is yet to come
        with self._lock:
          if outputs not in self._handed.get(key, ()):
            continue  # a marker took it meanwhile
          self._drop(key, outputs)
        _replay(outputs)

  def waiting(self) -> int:
    """How many dispatches' outputs wait for a marker."""
    with self._lock:
      return sum(map(len, self._handed.values()))


def _failed(outputs: _Outputs) -> bool:
  """Whether a dispatch's program is known to have failed (without
  waiting for it)."""
  packs = outputs.packs
  if not all(p.is_ready() for p in packs):
    return False
  try:
    for p in packs:
      p.block_until_ready()
  except Exception:  # noqa: BLE001 - what is being asked
    return True
  return False


def _replay(outputs: _Outputs) -> None:
  plan, packs = outputs.plan, outputs.packs
  try:
    # Waited for first: that wait lets go of the interpreter lock, which
    # a fetch of a value not yet computed holds, and which a device of the
    # program may need for its marker (a Python callback).
    jax.block_until_ready(packs)
    with jax.transfer_guard_device_to_host("allow"):
      values = [np.asarray(p) for p in packs]
  except Exception:  # noqa: BLE001 - a failed program: nothing to replay
    return
  try:
    plan.replay([values[0]], _jax_private.device_assignment(
        packs[0].sharding), _run_one)
  except BaseException as exc:  # noqa: BLE001 - the consumer never dies
    errors.postpone(exc, "delivering the host calls of a hostcall.jit "
                    "program")


def _run_one(target, operands, context) -> None:
  calls.run(target, operands, context, asynchronous=True)


@targets.target
class MarkerTarget(targets.PostponingTarget):
  """The host side of a marker: replays the dispatch it claimed."""

  key: int
  containable = False

  def deliver(self, flat_args, context):
    del flat_args, context
    markers.reached(self.key)
    return ()

  @property
  def label(self) -> str:
    return "a hostcall.jit program's place in the queue"


markers = Markers()
os.register_at_fork(after_in_child=markers.after_fork_in_child)

"""The one thread that writes every metrics run's rows (``WriterThread``).

A run's rows arrive as blocks from the taps' delivery; the writer thread
hands them to the run's host side (a ``Sink``), joining the blocks that wait
for it with the same columns into one write, so that formatting costs less
a row. It lets blocks gather for a while first (``GATHER_SECONDS``, unless
someone waits for them, or the delivery thread that handed them over ended
its trip): each time it wakes and takes the GIL costs a Python loop
dispatching on another core a hand-off. The backlog is bounded: past
the bound, whoever hands over a block waits. This module knows runs only as ``Sink``s: it imports nothing of
``run.py`` or ``runs.py``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from typing import Protocol

from hostcall._apps.metrics import block as _blocks
from hostcall._core.context import forbid_waiting
from hostcall._runtime import calls

logger = logging.getLogger("hostcall")


class _Resume:
  def __repr__(self):
    return "RESUME"


#: Handed over in place of a block: the sink's writers are open (the blocks
#: it was handed before may be written now).
RESUME = _Resume()


class Tally:
  """How many of a sink's puts are written. The writer thread counts them
  here after letting go of the sink, so that a run closed and dropped by
  its owner is released by the time ``close()`` returns.

  Arguments:
    lock: the sink's lock, which ``changed`` waits with.
  """

  __slots__ = ("changed", "written")

  def __init__(self, lock):
    self.changed = threading.Condition(lock)
    self.written = 0

  def add(self, count: int) -> None:
    """Counts ``count`` more puts written, and wakes who waits for them."""
    with self.changed:
      self.written += count
      self.changed.notify_all()

  def wait_for(self, count: int) -> None:
    """Waits until ``count`` puts are written (with the sink's lock not
    held by the caller)."""
    with self.changed:
      self.changed.wait_for(lambda: self.written >= count)


class Sink(Protocol):
  """What the writer thread hands blocks to (a run's host side)."""

  #: Where the writer thread counts the puts written.
  tally: Tally

  def write(self, block, count: int = 1) -> int:
    """Writes ``block``, the rows of ``count`` puts, or takes ``RESUME``;
    returns how many puts are written now (blocks may wait for
    ``RESUME``)."""


class WriterThread:
  """The one thread that hands blocks to every run's writers, so that a
  slow disk never slows the device nor the delivery of other callbacks (and
  runs left open cost no thread each).

  Blocks waiting for it are bounded (``MAX_PENDING_BYTES`` of arrays, and
  ``MAX_PENDING_BLOCKS``, each of which costs Python objects besides):
  past the bound, whoever hands over a block (the tap's delivery) waits,
  and the device with it: back-pressure, never loss, never unbounded
  memory.
  """

  MAX_PENDING_BYTES = 256 << 20
  MAX_PENDING_BLOCKS = 16384

  #: How long blocks wait for others to join them before a write, at most:
  #: no longer once a write's worth waits (``GATHER_BYTES``, or
  #: ``MERGE_BLOCKS`` blocks), nor while someone waits for them to be
  #: written (``waited_for``). Large blocks (a ``hostcall.jit`` loop's trip)
  #: go at once, and are written while the loop goes on; small ones (a
  #: progress bar's chunk of rows) gather, because each write wakes the
  #: writer and takes the GIL from the loop (what that saves is measured in
  #: docs/performance.md, "Rows gathered, flushes spaced").
  GATHER_SECONDS = 0.05
  GATHER_BYTES = 64 << 10

  def __init__(self):
    self._queue: queue.SimpleQueue = queue.SimpleQueue()
    self._lock = threading.Lock()
    self._room = threading.Condition(self._lock)
    self._pending_bytes = self._pending_blocks = 0
    self._thread: threading.Thread | None = None
    # Wakes the writer out of its gathering (only then: a wake-up a put
    # would cost the hand-off the gathering saves).
    self._gathered = threading.Condition(self._lock)
    self._gathering = False
    self._waiters = 0
    self._round_ended = False
    self._waiting_for_room = 0

  @property
  def is_writer(self) -> bool:
    """Whether the calling thread is the writer thread."""
    return threading.current_thread() is self._thread

  def put(self, sink: Sink, block) -> None:
    """Hands ``block`` (or ``RESUME``) to the thread, for ``sink``; waits
    while the backlog is full (never on the writer thread itself)."""
    size = block.nbytes if block is not RESUME else 0
    with self._lock:
      if self._thread is None:
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="hostcall-metrics-writer")
        self._thread.start()
      if not self.is_writer and block is not RESUME:
        # One block larger than the bound still goes through alone.
        def room():
          return self._pending_blocks == 0 or (
              self._pending_bytes + size <= self.MAX_PENDING_BYTES
              and self._pending_blocks < self.MAX_PENDING_BLOCKS)
        if not room():
          # The writer must not gather while someone waits for room.
          self._waiting_for_room += 1
          self._gathered.notify()
          try:
            self._room.wait_for(room)
          finally:
            self._waiting_for_room -= 1
      self._pending_bytes += size
      self._pending_blocks += 1
      self._room.notify_all()  # for whoever watches the backlog
      wake = self._gathering and self._gathered_enough()
    self._queue.put((sink, block, size))
    if wake:  # (once the block is there to be joined)
      with self._lock:
        self._gathered.notify()

  @contextlib.contextmanager
  def waited_for(self):
    """While in it, the writer does not let blocks gather: whoever waits
    for rows to be written (a flush, a barrier, a close) never waits out
    ``GATHER_SECONDS``."""
    with self._lock:
      self._waiters += 1
      self._gathered.notify()
    try:
      yield
    finally:
      with self._lock:
        self._waiters -= 1

  def round_ended(self) -> None:
    """A delivery thread ended a trip (``calls.add_round_hook``): the blocks
    it handed over are all here, and no others come before its next trip,
    a gather window away; gathering on would only delay them (a
    ``hostcall.jit`` loop's rows are written while the device still runs
    rather than at the barrier after it; docs/performance.md, "Rows
    gathered, flushes spaced", has what that saves)."""
    if not self._pending_blocks:
      return  # (read unlocked: what a put adds later meets the next trip)
    with self._lock:
      if self._pending_blocks:  # (the writer may not be gathering yet)
        self._round_ended = True
        self._gathered.notify()

  def _gathered_enough(self) -> bool:
    """Whether the writer should write now (with ``_lock`` held)."""
    return bool(self._waiters or self._round_ended or self._waiting_for_room
                or self._pending_blocks >= self.MERGE_BLOCKS
                or self._pending_bytes >= self.GATHER_BYTES)

  def _gather(self) -> None:
    """Lets blocks gather (see ``GATHER_SECONDS``)."""
    with self._lock:
      self._gathering = True
      try:
        self._gathered.wait_for(self._gathered_enough, self.GATHER_SECONDS)
      finally:
        self._gathering = self._round_ended = False

  #: Blocks the writer joins into one write at most (formatting a row
  #: costs about half as much in a write of thousands as in one of 20).
  MERGE_BLOCKS = 256

  def _loop(self) -> None:
    forbid_waiting("a metrics writer")
    following = None  # an item taken out that did not join the last write
    while True:
      if following is None:
        sink, block, size = self._queue.get()
        if block is not RESUME:
          self._gather()
      else:  # (a backlog: no gathering)
        sink, block, size = following
      blocks, sizes, following = [block], size, None
      if block is not RESUME:
        more, more_sizes, following = self._waiting_behind(sink, block)
        blocks += more
        sizes += more_sizes
      count = len(blocks)
      tally, written = sink.tally, 0
      try:
        written = self._write(sink, blocks)
      except BaseException:  # noqa: BLE001 - the writer thread never dies
        logger.exception("hostcall: metrics writing failed")
      finally:
        # Let go of the sink before saying its rows are written: a run
        # closed and dropped by its owner is released with its rows.
        sink = block = blocks = None
        tally.add(written)
        with self._lock:
          self._pending_bytes -= sizes
          self._pending_blocks -= count
          self._room.notify_all()

  def _waiting_behind(self, sink, block):
    """The blocks for ``sink`` with ``block``'s columns that wait right
    behind it, their sizes, and the item that stopped them (or None)."""
    more, sizes, columns = [], 0, _blocks.columns_of(block)
    while len(more) + 1 < self.MERGE_BLOCKS:
      try:
        item = self._queue.get_nowait()
      except queue.Empty:
        return more, sizes, None
      if (item[0] is not sink or item[1] is RESUME
          or _blocks.columns_of(item[1]) != columns):
        return more, sizes, item
      more.append(item[1])
      sizes += item[2]
    return more, sizes, None

  @staticmethod
  def _write(sink, blocks) -> int:
    """Hands ``blocks`` to ``sink``; returns how many puts it wrote now."""
    if len(blocks) > 1:
      try:
        joined = _blocks.concatenate(blocks)
      except BaseException:  # noqa: BLE001 - e.g. MemoryError: one by one
        pass
      else:
        return sink.write(joined, len(blocks))
    return sum(sink.write(block) for block in blocks)


#: The writer thread of every run of the process (started on first use).
shared = WriterThread()
calls.add_round_hook(shared.round_ended)

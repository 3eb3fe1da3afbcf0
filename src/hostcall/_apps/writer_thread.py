"""The one thread that writes every metrics run's rows (``_Writers``).

A run's rows arrive as blocks from the taps' delivery; the writer thread
hands them to the run's writers, joining the blocks that wait for it with
the same columns into one write, so that formatting costs less a row. The
backlog is bounded: past the bound, whoever hands over a block waits.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING

from hostcall._apps import writers as _writers
from hostcall._core.context import forbid_waiting

if TYPE_CHECKING:
  from hostcall._apps.metrics import Run

logger = logging.getLogger("hostcall")

#: Tells the writer thread that a run's writers are open.
_RESUME = None


class _Writers:
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

  def __init__(self):
    self._queue: queue.SimpleQueue = queue.SimpleQueue()
    self._lock = threading.Lock()
    self._room = threading.Condition(self._lock)
    self._pending_bytes = self._pending_blocks = 0
    self._thread: threading.Thread | None = None

  @property
  def is_writer(self) -> bool:
    """Whether the calling thread is the writer thread."""
    return threading.current_thread() is self._thread

  def put(self, run: "Run", block) -> None:
    size = block.nbytes if block is not _RESUME else 0
    with self._lock:
      if self._thread is None:
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="hostcall-metrics-writer")
        self._thread.start()
      if not self.is_writer and block is not _RESUME:
        # One block larger than the bound still goes through alone.
        self._room.wait_for(lambda: self._pending_blocks == 0 or (
            self._pending_bytes + size <= self.MAX_PENDING_BYTES
            and self._pending_blocks < self.MAX_PENDING_BLOCKS))
      self._pending_bytes += size
      self._pending_blocks += 1
      self._room.notify_all()  # for whoever watches the backlog
    self._queue.put((run, block, size))

  #: Blocks the writer joins into one write at most (formatting a row
  #: costs about half as much in a write of thousands as in one of 20).
  MERGE_BLOCKS = 256

  def _loop(self) -> None:
    forbid_waiting("a metrics writer")
    following = None  # an item taken out that did not join the last write
    while True:
      run, block, size = following or self._queue.get()
      blocks, sizes, following = [block], size, None
      if block is not _RESUME:
        more, more_sizes, following = self._waiting_behind(run, block)
        blocks += more
        sizes += more_sizes
      count = len(blocks)
      tally, written = run._tally, 0
      try:
        written = self._write(run, blocks)
      except BaseException:  # noqa: BLE001 - the writer thread never dies
        logger.exception("hostcall: metrics writing failed")
      finally:
        # Let go of the run before saying its rows are written: a run
        # closed and dropped by its owner is released with its rows.
        run = block = blocks = None
        tally.add(written)
        with self._lock:
          self._pending_bytes -= sizes
          self._pending_blocks -= count
          self._room.notify_all()

  def _waiting_behind(self, run, block):
    """The blocks for ``run`` with ``block``'s columns that wait right
    behind it, their sizes, and the item that stopped them (or None)."""
    more, sizes, columns = [], 0, _writers.columns_of(block)
    while len(more) + 1 < self.MERGE_BLOCKS:
      try:
        item = self._queue.get_nowait()
      except queue.Empty:
        return more, sizes, None
      if (item[0] is not run or item[1] is _RESUME
          or _writers.columns_of(item[1]) != columns):
        return more, sizes, item
      more.append(item[1])
      sizes += item[2]
    return more, sizes, None

  @staticmethod
  def _write(run, blocks) -> int:
    """Hands ``blocks`` to ``run``; returns how many puts it wrote now."""
    if len(blocks) > 1:
      try:
        joined = _writers.concatenate(blocks)
      except BaseException:  # noqa: BLE001 - e.g. MemoryError: one by one
        pass
      else:
        return run._write(joined, len(blocks))
    return sum(run._write(block) for block in blocks)


_writer_thread = _Writers()

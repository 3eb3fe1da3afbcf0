"""The rows of ``Run.log`` call sites whose calls alternate with other
sites' calls in one delivered batch (``hostcall.jit``'s step that logs and
also prints or calls back: ``_runtime/interleaved.py``).

Delivered as a run of its own, each such call made a ``Block`` of one row,
took its steps alone and handed the block to the writer thread: several
times what the row costs in a run of its site's calls. Here, as each call
is delivered (in program order), only what a host function between two
calls can see is done: the run's steps taken (two sites of one run number
their rows in program order) and ``Run.latest`` noted. The rows
themselves are put once the batch's calls are all delivered
(``finish``), before the batch counts as delivered (so a barrier, a
flush, a close waits for them), a block for each stretch of one run's
rows with the same columns, in program order.
"""

from __future__ import annotations

import threading

import numpy as np

from hostcall._apps.metrics.block import Block
from hostcall._runtime import calls


class SiteRows:
  """One ``Run.log`` site's calls in an interleaved batch (the interface of
  ``interleaved.py``'s deliveries: ``deliver(count)`` for each run of its
  calls, in queue order, ``skip(count)`` for a run not delivered,
  ``finish()`` once the batch's runs are all delivered).

  Arguments:
    site: the call site's id.
    target: its ``LogTarget``.
    context: its calls' context (outside ``vmap``).
    columns: its calls' operands, each ``(calls, *shape)``.
  """

  scope, neutral = None, False

  def __init__(self, site: int, target, context, columns: list):
    self.site, self.target, self.context = site, target, context
    self.columns, self.at = columns, 0
    self.tally = context._tally
    values = columns[1:] if target.has_step else columns
    self.steps = columns[0] if target.has_step else None
    # What ``Run.latest`` notes of each call: its metrics in the order
    # given, a text value as a row of its column would hold it.
    by_name = dict(zip(target.names, values))
    texts = dict(target.texts)
    self.latest = [(name, by_name[name]) if name in by_name
                   else (name, np.full(1, texts[name]))
                   for name in (target.order or target.names)]
    device = getattr(context, "device", None)
    self.key = (target.names, target.order, target.texts, target.has_step,
                tuple((c.dtype, c.shape[1:]) for c in values),
                getattr(device, "id", None))

  def deliver(self, count: int) -> None:
    at = self.at
    self.at = last = at + count
    if self.tally is not None:  # each a run of its program
      self.tally.add(count)
    sink = self.target.sink.current()
    if self.steps is None:
      first = sink.first_step(count)
      step = first + count - 1
    else:
      first, step = None, int(self.steps[last - 1])
    _pending(sink).append((self, at, count, first))
    if count:
      latest = sink.latest
      for name, column in self.latest:
        latest[name] = (step, column[min(last, len(column)) - 1])

  def skip(self, count: int) -> None:
    self.at += count

  def finish(self) -> None:
    """Puts the rows noted and not yet put (``put_pending``), then lets go
    of this site's calls."""
    try:
      put_pending()
    finally:
      if self.target.eager:
        self.target.sink.users.eager_calls(-len(self.columns[0]))
      self.columns = self.latest = self.steps = None

  def _block(self, group: list) -> Block:
    """One block of ``group``'s rows: ``(rows, at, count, first step)``,
    every ``rows`` of this one's ``key``."""
    sources = list(dict.fromkeys(one for one, _, _, _ in group))
    base = dict(zip(sources, np.cumsum(
        [0] + [len(one.columns[0]) for one in sources[:-1]])))
    counts = np.array([count for _, _, count, _ in group])
    total = int(counts.sum())
    within = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    rows = np.repeat([base[one] + at for one, at, _, _ in group],
                     counts) + within

    def taken(j):
      if len(sources) == 1:
        return sources[0].columns[j][rows]
      return np.concatenate([one.columns[j] for one in sources])[rows]

    target = self.target
    if target.has_step:
      step, *values = [taken(j) for j in range(len(self.columns))]
      step = step.astype(np.int64)
    else:
      values = [taken(j) for j in range(len(self.columns))]
      step = np.repeat(np.array([first for _, _, _, first in group],
                                dtype=np.int64), counts) + within
    return target.rows_block(step, values, self.context)


def _stretches(segments: list):
  """``segments`` cut where the columns change: ``(first rows, stretch)``."""
  stretch: list = []
  for segment in segments:
    if stretch and segment[0].key != stretch[-1][0].key:
      yield stretch[0][0], stretch
      stretch = []
    stretch.append(segment)
  if stretch:
    yield stretch[0][0], stretch


_thread = threading.local()


def _pending(sink) -> list:
  """The rows noted on this thread for ``sink`` and not yet put."""
  try:
    by_sink = _thread.by_sink
  except AttributeError:
    by_sink = _thread.by_sink = {}
  try:
    return by_sink[sink]
  except KeyError:
    segments = by_sink[sink] = []
    return segments


def put_pending() -> None:
  """Puts the rows noted on this thread and not yet put, every run's, in
  program order: once a batch's calls are all delivered, and before
  anything else this thread hands a run (``RunSink.put``: a config change,
  a row of a site delivered otherwise), which must come after them."""
  by_sink = getattr(_thread, "by_sink", None)
  if not by_sink:
    return
  _thread.by_sink = {}  # (so that the puts below find none)
  for sink, segments in by_sink.items():
    for one, stretch in _stretches(segments):
      try:
        sink.put(one._block(stretch))
      except BaseException as exc:  # noqa: BLE001 - the others still go
        calls.failed(one.target, exc, one.context)

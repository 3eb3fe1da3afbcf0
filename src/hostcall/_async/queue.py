"""Asynchronous delivery: taps queued on the host, delivered by one thread.

A tap in asynchronous mode does not call Python from the device computation.
Its operands are copied into a bounded FIFO queue (the native XLA FFI
handler of ``hostcall._async.native``, or a Python queue when that cannot be
built) and the computation goes on; one consumer thread delivers the taps to
their host functions in queue order, which is program order on each device.
A full queue blocks the producer (back-pressure), never drops. ``barrier()``
waits until everything queued so far is delivered; an ``atexit`` hook does
the same before the interpreter exits.

A child forked (``os.fork()``) from a process that started the queue has
none of its threads: what is queued is the parent's to deliver, and the
child's exit hook waits for nothing (it would wait forever for a thread the
child does not have). The child cannot use the queue (JAX itself is not
fork-safe): starting it there is an error.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import operator
import os
import sys
import threading
import time
import weakref

import jax
import ml_dtypes
import numpy as np

from hostcall import _jax_private
from hostcall._async import native, queues
from hostcall._async.deferred import deferred
from hostcall._core import calls, errors
from hostcall._core.targets import HostTarget, Steps

logger = logging.getLogger("hostcall")

_JAX_DIR = os.path.dirname(jax.__file__) + os.sep
# Where a consumer whose host function waits for a computation sits: JAX,
# or a future (which another thread completes, maybe running one).
_WAITING_DIRS = (_JAX_DIR, *(
    os.path.join(os.path.dirname(threading.__file__), name) + os.sep
    for name in ("concurrent", "asyncio")))

#: Default bound of queued bytes (payload plus 64 bytes an item).
DEFAULT_CAPACITY = 64 << 20
#: Seconds the consumer lets asynchronous taps gather once one has come
#: (see ``set_gather_window``).
DEFAULT_GATHER = 0.01
_MAX_GATHER = 1.0
_MIN_CAPACITY, _MAX_CAPACITY = 1 << 16, 1 << 62

# A barrier follows taps made by asynchronously delivered host functions
# (which may run computations that tap in turn) this many rounds deep.
_MAX_BARRIER_ROUNDS = 64


def element_bits(dtype: np.dtype) -> int:
  """Bits an element of ``dtype`` takes in a device buffer."""
  if dtype == jax.dtypes.float0:
    return 8  # stored as bool
  if dtype.itemsize == 1 and dtype.kind in "iufV":
    for info in (ml_dtypes.iinfo, ml_dtypes.finfo):  # int4, float4_e2m1fn...
      try:
        return min(8, int(info(dtype).bits))
      except (TypeError, ValueError):
        pass
  return dtype.itemsize * 8


class Layout:
  """What the bytes of one queued operand are: shape, dtype, packed size.

  Fixed when a call site is lowered; the native handler copies exactly
  ``nbytes`` per operand (sub-byte types arrive packed, low bits first).
  """

  def __init__(self, shape, dtype):
    self.shape = tuple(int(d) for d in shape)
    self.dtype = np.dtype(dtype)
    self.bits = element_bits(self.dtype)
    self.count = math.prod(self.shape)
    self.nbytes = -(-self.count * self.bits // 8)

  def decode(self, raw, offset: int) -> np.ndarray:
    if self.dtype == jax.dtypes.float0 or not self.count:
      return np.zeros(self.shape, self.dtype)
    if self.bits % 8 == 0:
      return np.frombuffer(raw, self.dtype, self.count, offset).reshape(
          self.shape)
    codes = np.frombuffer(raw, np.uint8, self.nbytes, offset)
    per_byte, mask = 8 // self.bits, (1 << self.bits) - 1
    shifts = np.arange(per_byte, dtype=np.uint8) * self.bits
    unpacked = ((codes[:, None] >> shifts) & mask).astype(np.uint8)
    return unpacked.reshape(-1)[:self.count].view(self.dtype).reshape(
        self.shape)


def layouts_of(avals) -> tuple[Layout, ...] | None:
  """The layouts of a site's operands, or None when one cannot be queued
  natively (an extended dtype: the Python-callback path takes it)."""
  try:
    return tuple(Layout(a.shape, a.dtype) for a in avals)
  except TypeError:
    return None


class SiteRef:
  """What keeps a call site registered: owned by the executable its program
  was compiled into (``_jax_private.keep_with_executable``, or the push
  callback that closes over it), so that the site, and the host function
  with all it closes over, is released when that executable is."""

  __slots__ = ("site", "__weakref__")

  def __init__(self, site: int):
    self.site = site

  def __call__(self, *args):
    # Registered as a host callback only to be owned; nothing calls it.
    raise RuntimeError("hostcall: a call site's keepalive was called")


class _Sites:
  """Call sites by id: what to deliver a queued item to, and how to read it.

  ``contexts`` is one ``CallContext``, a list of them indexed by the
  device's partition id (the last operand), or a function of the operands
  returning ``(arrays, context)`` (a partitioned call).

  A site lives as long as its ``SiteRef``, then until a barrier has waited
  for the computations dispatched before that (one may still be running,
  its Python executable gone), then until every tap queued by then is
  delivered: no new taps can come, but taps queued may still wait for the
  consumer.
  """

  def __init__(self):
    self._ids = itertools.count(1)
    self._sites: dict[int, tuple] = {}
    self._joinable: set[int] = set()
    self._lock = threading.Lock()
    # Sites whose SiteRef died. Appended by the garbage collector's
    # callback, in whatever thread it runs, maybe one holding ``_lock``:
    # a deque's append takes no lock of ours.
    self._retired: collections.deque = collections.deque()
    # (site, taps pushed when it was seen retired): dropped once as many
    # are delivered, the queue being first in, first out.
    self._draining: list[tuple[int, int]] = []

  def add(self, target: HostTarget, contexts, layouts=None,
          joinable: bool = False) -> SiteRef:
    """Registers a call site. ``joinable``: its consecutive queued calls
    may be delivered together (``hostcall.jit``'s queued calls: each call
    of a vectorised target that ``joins_calls`` in one ``deliver_steps``)."""
    ref = SiteRef(next(self._ids))
    with self._lock:
      self._sites[ref.site] = (target, contexts, layouts)
      if joinable:
        self._joinable.add(ref.site)
    finalizer = weakref.finalize(ref, self._retired.append, ref.site)
    finalizer.atexit = False  # at exit, nothing to release
    return ref

  def get(self, site: int):
    try:
      return self._sites[site]
    except KeyError:
      raise RuntimeError(
          f"hostcall: a queued tap names call site {site}, which is no "
          "longer registered (the executable that queued it was released "
          "before the tap was counted); the tap was dropped.") from None

  def take_retired(self) -> list[int]:
    """The sites retired so far, taken by a barrier before it waits for
    the computations dispatched so far (see ``settled``)."""
    seen = []
    while self._retired:
      seen.append(self._retired.popleft())
    return seen

  def give_back(self, seen: list[int]) -> None:
    """Returns ``take_retired``'s sites, not settled, for the next."""
    self._retired.extendleft(reversed(seen))

  def settled(self, seen: list[int], pushed: int) -> None:
    """``seen`` (``take_retired``'s) once every computation dispatched
    before they were taken has run: ``pushed``, the taps queued by then,
    counts all of theirs. Each is forgotten once as many are delivered."""
    if seen:
      with self._lock:
        self._draining.extend((site, pushed) for site in seen)

  def prune(self, delivered: int) -> None:
    """Forgets settled sites whose queued taps are all delivered.

    ``delivered``: taps delivered so far (read earlier is only more
    cautious).
    """
    if not self._draining:
      return
    with self._lock:
      keep = []
      for site, mark in self._draining:
        if delivered >= mark:
          self._sites.pop(site, None)
          self._joinable.discard(site)
        else:
          keep.append((site, mark))
      self._draining = keep

  def joinable(self, site: int) -> bool:
    return site in self._joinable

  def __len__(self) -> int:
    return len(self._sites)


sites = _Sites()


_raw_of = operator.itemgetter(2)
_INDICES = [(i, Ellipsis) for i in range(queues.NativeQueue.BATCH)]


def _indices(n: int) -> list:
  """``[(0, ...), (1, ...), ...]``, ``n`` of them: each call's row of a
  column, as an array (0-d for a scalar operand)."""
  return (_INDICES[:n] if n <= len(_INDICES)
          else list(zip(range(n), itertools.repeat(Ellipsis))))


def _columns(target, layouts, items) -> list:
  """The operands of several queued calls of one site (a list of items or
  a ``Packed`` run), each stacked ``(calls, *shape)``: read at once where
  every operand is whole bytes."""
  whole_bytes = layouts is not None and all(
      layout.bits % 8 == 0 and layout.count for layout in layouts)
  if isinstance(items, queues.Packed):
    if not whole_bytes:
      return _columns(target, layouts, items.items())
    rows = items.rows()
  elif whole_bytes and {type(raw) for _, _, raw in items} == {bytes}:
    rows = np.frombuffer(b"".join(raw for _, _, raw in items),
                         np.uint8).reshape(len(items), -1)
  else:
    rows = None
  if rows is not None:
    if rows.shape[1] != sum(layout.nbytes for layout in layouts):
      raise RuntimeError(
          f"hostcall: queued calls have {rows.shape[1]} bytes each where "
          f"their call site describes "
          f"{sum(layout.nbytes for layout in layouts)}")
    columns, at = [], 0
    for layout in layouts:
      width = layout.dtype.itemsize
      if (layout.dtype.kind in "biufc" and rows.shape[1] % width == 0
          and at % width == 0):
        # Read as its dtype: a copy of typed elements, many times quicker
        # than one of 4- or 8-byte rows of bytes.
        start = at // width
        column = rows.view(layout.dtype)[:, start:start + layout.count]
      else:
        column = rows[:, at:at + layout.nbytes]
      at += layout.nbytes
      # Always a copy of its own: a host function that keeps one call's
      # value must not keep the batch's block (every site's calls) alive,
      # and its arrays are aligned wherever the run lay in the block.
      columns.append(np.array(column, order="C").view(layout.dtype).reshape(
          (len(rows), *layout.shape)))
    return columns
  flats = []
  for _, arrays, raw in items:
    if arrays is None:
      _check_readable(target, raw)
      arrays = decode(layouts, raw)
    flats.append(arrays)
  return [np.stack(column) for column in zip(*flats)]


def _check_readable(target, raw) -> None:
  if isinstance(raw, queues.Unreadable):
    raise RuntimeError(
        f"a queued call of {target!r} ({raw.size} bytes) could not be read "
        f"into Python ({type(raw.exc).__name__}: "
        f"{errors.safe_str(raw.exc)}) and was dropped; send less at once "
        "(or free host memory).") from raw.exc


def decode(layouts, raw: bytes) -> list:
  arrays, offset = [], 0
  for layout in layouts:
    arrays.append(layout.decode(raw, offset))
    offset += layout.nbytes
  if offset != len(raw):
    raise RuntimeError(f"hostcall: a queued tap has {len(raw)} bytes where "
                       f"its call site describes {offset}")
  return arrays


class Consumer:
  """The queue and the thread that consumes it."""

  #: Seconds between two looks of the watchdog at waiting producers.
  WATCH_INTERVAL = 0.02

  def __init__(self):
    self._lock = threading.Lock()
    self._queue = None
    self._thread: threading.Thread | None = None
    self._delivered = 0
    self._done = threading.Condition()
    self.capacity = DEFAULT_CAPACITY
    self.gather = DEFAULT_GATHER
    self._delivering = False  # the consumer is inside a host function
    self._bypassing = False
    #: Whether this process is a child forked from one that started the
    #: queue (whose threads, and what they were to deliver, it lacks).
    self.forked = False

  def after_fork_in_child(self) -> None:
    """In a forked child (``os.register_at_fork``): forgets the parent's
    queue and threads. Takes no lock: one a parent's thread held at the
    fork stays held in the child for good."""
    if self._queue is None:
      return
    self.forked = True
    self._lock = threading.Lock()
    self._done = threading.Condition()
    self._queue = self._thread = None
    self._delivering = self._bypassing = False

  def start(self):
    """Starts the queue (the native library built or loaded, the consumer
    thread running) if it is not yet; returns it. Explicit: lowering an
    asynchronous tap starts it, as does the first barrier that waits."""
    if self.forked:
      raise RuntimeError(
          "hostcall: this process was forked (os.fork()) from one whose "
          "asynchronous queue ran; neither hostcall nor JAX can run here. "
          "Start worker processes with the 'spawn' or 'forkserver' method "
          "of multiprocessing instead.")
    with self._lock:
      if self._queue is None:
        lib = native.load()
        started = (queues.NativeQueue(lib, self.capacity) if lib is not None
                   else queues.PythonQueue(self.capacity))
        # Python 3.12 on starts no thread once the interpreter exits (an
        # exit handler's first call): then nothing is marked started, and
        # the RuntimeError says why.
        thread = threading.Thread(target=self._consume,
                                  name="hostcall-consumer", daemon=True)
        self._queue, self._thread = started, thread
        try:
          thread.start()
          threading.Thread(target=self._watch, name="hostcall-watchdog",
                           daemon=True).start()
        except RuntimeError:
          self._queue = self._thread = None
          raise
      return self._queue

  @property
  def started(self) -> bool:
    """Whether the queue was started (a tap lowered, a barrier waited)."""
    return self._queue is not None

  @property
  def native(self) -> bool:
    """Whether the started queue is the native one."""
    return isinstance(self._queue, queues.NativeQueue)

  @property
  def is_consumer(self) -> bool:
    """Whether the calling thread is the one delivering queued taps."""
    return threading.current_thread() is self._thread

  def set_capacity(self, given) -> None:
    try:  # any integer (a NumPy one too), never a bool or a float
      capacity = (operator.index(given) if not isinstance(given, bool)
                  else None)
    except TypeError:
      capacity = None
    if capacity is None or not _MIN_CAPACITY <= capacity <= _MAX_CAPACITY:
      raise ValueError(
          f"the queue capacity is a number of bytes, an int from "
          f"{_MIN_CAPACITY} (64 KiB) to 2**62; got {given!r}. The default "
          f"is {DEFAULT_CAPACITY} (64 MiB).")
    self.capacity = capacity
    self.start().set_capacity(capacity)

  def push(self, site: int, arrays: list) -> None:
    """The Python-callback path's producer (the runtime reuses the buffers
    it lends us once we return: keep copies)."""
    self.start().push(site, [np.array(a) for a in arrays])

  def _consume(self) -> None:
    q = self._queue
    q.become_consumer()
    while True:
      try:
        batch = q.pop_batch(0.1, self.gather)
      except BaseException:  # noqa: BLE001 - the consumer never dies
        logger.exception("hostcall: the asynchronous queue failed")
        time.sleep(0.01)
        continue
      # Each item let go of before it counts as delivered: whoever waits
      # for it (a barrier) finds its values (maybe large) released. The
      # calls of a joinable site (hostcall.jit's) go together.
      runs, batch = batch, None
      runs.reverse()
      while runs:
        run = runs.pop()
        packed = isinstance(run, queues.Packed)
        site = run.site if packed else run[0][0]
        if len(run) > 1 and sites.joinable(site):
          self._delivering_run(site, run, q)
          continue
        if packed:
          run = run.items()
        run.reverse()
        while run:
          self._delivering_run(site, [run.pop()], q)
      run = None
      try:
        self.prune()
      except BaseException:  # noqa: BLE001 - the consumer never dies
        logger.exception("hostcall: releasing call sites failed")

  def _watch(self) -> None:
    """Lets producers through a full queue while the consumer's host
    function waits for a JAX computation, directly or through a future
    (``concurrent.futures``, ``asyncio``): that computation's taps would
    wait for room only the consumer frees, a deadlock. A host function that
    computes, sleeps or waits on anything else keeps the bound (its
    back-pressure is what holds the device)."""
    q = self._queue
    while True:
      time.sleep(self.WATCH_INTERVAL)
      try:
        if (self._delivering and not self._bypassing
            and q.stats()["producers_waiting"] and self._consumer_waits()):
          self._bypassing = True
          q.set_bypass(True)
      except BaseException:  # noqa: BLE001 - the watchdog never dies
        logger.exception("hostcall: the queue's watchdog failed")

  def _consumer_waits(self) -> bool:
    """Whether the consumer thread waits inside JAX or on a future."""
    frame = sys._current_frames().get(self._thread.ident)
    while frame is not None:
      if frame.f_code.co_filename.startswith(_WAITING_DIRS):
        return True
      frame = frame.f_back
    return False

  def _delivering_run(self, site: int, items: list, q) -> None:
    """Delivers ``items`` (see ``_deliver_run``), a failure postponed to
    the barrier; then counts them delivered."""
    self._delivering = True
    try:
      self._deliver_run(site, items)
    except BaseException as exc:  # noqa: BLE001 - the consumer never dies
      errors.postpone(exc, f"delivering a queued call of site {site}")
    finally:
      n = len(items)
      items.clear()
      self._delivering = False
      if self._bypassing:
        self._bypassing = False
        q.set_bypass(False)
      with self._done:
        self._delivered += n
        self._done.notify_all()

  @staticmethod
  def _deliver_run(site: int, items: list) -> None:
    """Delivers consecutive items of one call site. Those of a joinable
    site (see ``_Sites.add``) are read at once: a vectorised target that
    joins calls (a metrics row) gets them all in one ``deliver_steps``,
    any other each in turn, in one call context, each failing alone."""
    if isinstance(items, list):  # (a Packed run is of readable calls)
      if len(items) == 1:
        Consumer._deliver(*items[0])
        return
      if queues.Unreadable in set(map(type, map(_raw_of, items))):
        # Each fails alone: the others are delivered.
        for item in items:
          try:
            Consumer._deliver(*item)
          except BaseException as exc:  # noqa: BLE001 - the consumer never dies
            errors.postpone(exc, f"delivering a queued call of site {site}")
        return
    target, contexts, layouts = sites.get(site)
    columns = _columns(target, layouts, items)
    if target.deliver_steps is not None and target.joins_calls:
      rank = len(contexts.batch_levels)
      stacked = [np.moveaxis(c, 0, rank) if rank else c for c in columns]
      calls.run(Steps(target, len(items)), stacked, contexts,
                asynchronous=True)
    else:
      # Each call's arrays: views of the columns, 0-d for a scalar one.
      at = _indices(len(items))
      if len(columns) == 1:  # (the common call: no tuple a call)
        calls.run_each(target, map(columns[0].__getitem__, at), contexts,
                       single=True)
      else:
        calls.run_each(target,
                       zip(*[map(c.__getitem__, at) for c in columns])
                       if columns else itertools.repeat((), len(items)),
                       contexts)

  @staticmethod
  def _deliver(site: int, arrays, raw) -> None:
    target, contexts, layouts = sites.get(site)
    if arrays is None:
      _check_readable(target, raw)
      arrays = decode(layouts, raw)
    if isinstance(contexts, list):
      *arrays, pid = arrays
      context = contexts[int(pid)]
    elif callable(contexts):  # a partitioned call: its shard's index
      unpacked = contexts(arrays)
      if unpacked is None:
        return
      arrays, context = unpacked
    else:
      context = contexts
    calls.run(target, arrays, context, asynchronous=True)

  def prune(self) -> None:
    """Forgets the call sites whose executables are gone, settled by a
    barrier, and whose queued taps are all delivered (see ``_Sites``)."""
    sites.prune(self._delivered)

  def stats(self) -> dict:
    stats = self.start().stats()
    with self._done:
      stats["delivered"] = self._delivered
    return stats

  def pushed(self) -> int:
    return self._queue.stats()["pushed"] if self._queue is not None else 0

  def drain(self, timeout: float | None = None, count: int | None = None
            ) -> bool:
    """Waits until every tap queued so far (or the first ``count``) has
    been delivered."""
    if self._queue is None or self.is_consumer:
      return True  # the consumer cannot wait for itself
    count = self.pushed() if count is None else count
    self._queue.hurry(1)  # no gathering while we wait
    try:
      with self._done:
        return self._done.wait_for(lambda: self._delivered >= count,
                                   timeout)
    finally:
      self._queue.hurry(-1)


consumer = Consumer()
os.register_at_fork(after_in_child=consumer.after_fork_in_child)


def wait() -> None:
  """Waits for running computations, then for their queued taps, then for
  the taps of computations their host functions ran, and so on. In a
  forked child, nothing: those computations and taps are the parent's."""
  if consumer.forked:
    return
  # Released before the computations dispatched so far end: those may
  # still queue their taps (see _Sites).
  retired = sites.take_retired()
  try:
    deferred.settle_queued()
    _jax_private.wait_for_effects()
  except BaseException:  # (Ctrl-C): the next barrier settles them
    sites.give_back(retired)
    raise
  sites.settled(retired, consumer.pushed())
  for _ in range(_MAX_BARRIER_ROUNDS):
    pushed, submitted = consumer.pushed(), deferred.submitted()
    deferred.drain(count=submitted)
    consumer.drain(count=pushed)
    deferred.settle_queued()
    _jax_private.wait_for_effects()  # what the delivered host functions ran
    if consumer.pushed() == pushed and deferred.submitted() == submitted:
      consumer.prune()  # what the barrier saw delivered is released now
      return


def wait_at_exit() -> None:
  """``wait()`` at interpreter exit (registered when hostcall is imported,
  so after the exit handlers registered later: their host calls too), where
  anything was started; JAX's own exit hook runs after it."""
  if consumer.started or deferred.started:
    wait()


def set_queue_capacity(nbytes: int) -> None:
  """Bounds the asynchronous queue to ``nbytes`` (default 64 MiB).

  A tap that would exceed it waits (the device stalls) until the host has
  delivered enough: back-pressure, never loss. One tap larger than the
  bound still goes through alone.

  Arguments:
    nbytes: an int from 65536 to 2**62.
  """
  consumer.set_capacity(nbytes)


def set_gather_window(seconds: float) -> None:
  """How long asynchronous taps may wait on the host to be delivered
  together (default 0.01 s).

  Once a tap is queued, hostcall's delivery thread waits up to this long
  for others to join it, then delivers them all in one trip. Every trip
  wakes a thread, which costs the device time (on a small machine, up to
  50 µs of its core each: a progress bar ticking every 70 µs ran 1.2x
  slower with trips every 0.3 ms than with trips every 5 ms, and a
  ``hostcall.jit`` step logging 10 metrics 1.55x its plain time with trips
  every 10 ms against 1.62x every 5 ms). The window never delays what
  someone waits for: ``hostcall.barrier()``, a full queue, a batch of 4096
  taps, a quarter of the queue's bytes, and steered
  loops with a ``stop_when`` predicate end it at once. Synchronous taps
  never wait.

  Arguments:
    seconds: from 0 (deliver every tap as soon as it comes) to 1.

  Example:
    >>> import hostcall
    >>> hostcall.set_gather_window(0.001)
    >>> hostcall.set_gather_window(0.01)  # the default
  """
  try:
    value = float(seconds)
  except (TypeError, ValueError):
    value = math.nan
  if isinstance(seconds, bool) or not 0 <= value <= _MAX_GATHER:
    raise ValueError(
        f"the gather window is a number of seconds from 0 to {_MAX_GATHER}; "
        f"got {seconds!r}. The default is {DEFAULT_GATHER}.")
  consumer.gather = value  # from the delivery thread's next trip


def queue_stats() -> dict:
  """The asynchronous queue's counters.

  Returns:
    A dict: ``pushed`` and ``delivered`` (taps so far), ``queued`` and
    ``queued_bytes`` (waiting now), ``capacity`` (the bound, bytes),
    ``producer_waits`` (times a tap waited for room), ``producers_waiting``
    (taps waiting now), ``trips`` (times the delivery thread took taps
    from the queue: see ``set_gather_window``) and ``native`` (whether the
    C++ queue is in use).

  Example:
    >>> import hostcall
    >>> hostcall.queue_stats()["capacity"]
    67108864
  """
  consumer.start()
  stats = consumer.stats()
  stats["native"] = consumer.native
  return stats

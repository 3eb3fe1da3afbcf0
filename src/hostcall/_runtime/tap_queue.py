"""Asynchronous delivery: taps queued on the host, delivered by one thread.

A tap in asynchronous mode does not call Python from the device computation.
Its operands are copied into a bounded FIFO queue (the native one of
``hostcall._runtime.queue_library``: by its XLA FFI handler, or by a Python
callback
where the emission table routes the call so) and the computation goes on;
one consumer thread delivers the taps to their host functions in queue
order, which is program order on each device.
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

import itertools
import logging
import operator
import os
import sys
import threading
import time

import jax
import numpy as np

from hostcall import _jax_private
from hostcall._runtime import (call_sites, interleaved, native_queue,
                               queue_library)
from hostcall._runtime.call_sites import sites
from hostcall._runtime.outputs_replay import deferred
from hostcall._runtime.markers import markers
from hostcall._runtime import calls, errors
from hostcall._core.targets import Steps

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
#: The default window while the main thread waits (see ``_MainThreadLoad``).
IDLE_GATHER = 0.002
MAX_GATHER = 1.0
_MIN_CAPACITY, _MAX_CAPACITY = 1 << 16, 1 << 62

# A barrier follows taps made by asynchronously delivered host functions
# (which may run computations that tap in turn) this many rounds deep.
_MAX_BARRIER_ROUNDS = 64


_raw_of = operator.itemgetter(2)


class _MainThreadLoad:
  """Whether the main thread kept its core busy since the last look (its
  CPU time against the time gone by), where the platform tells another
  thread's CPU time; else it counts as busy.

  A busy main thread (a Python loop dispatching steps) pays for each trip
  of the delivery thread with a hand-off of the GIL, so that trips are
  spaced by the whole window. One that waits (for a program's outputs, a
  barrier) pays nothing, and whatever is delivered while the program still
  runs is not left for the barrier after it (docs/performance.md, "The
  gather window": what each window costs)."""

  BUSY = 0.25  # of the time gone by, on the main thread's core

  def __init__(self):
    self._clock = None
    self._wall = self._cpu = 0.0

  def busy(self) -> bool:
    try:
      if self._clock is None:
        self._clock = time.pthread_getcpuclockid(
            threading.main_thread().ident)
      cpu = time.clock_gettime(self._clock)
    except (AttributeError, OSError, OverflowError, ValueError):
      return True  # (no such clock here; or the main thread has ended)
    wall = time.monotonic()
    busy = cpu - self._cpu > self.BUSY * (wall - self._wall)
    self._wall, self._cpu = wall, cpu
    return busy


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
    #: The window while the main thread waits (``set_gather_window``
    #: makes it ``gather``: a window given holds whatever that thread does).
    self.idle_gather = IDLE_GATHER
    self._main_thread = _MainThreadLoad()
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
    self._main_thread = _MainThreadLoad()  # (the child's main thread)

  def start(self):
    """Starts the queue (the native library loaded, the consumer thread
    running) if it is not yet; returns it. Explicit: lowering an
    asynchronous tap starts it, as does the first barrier that waits."""
    if self.forked:
      raise RuntimeError(
          "hostcall: this process was forked (os.fork()) from one whose "
          "asynchronous queue ran; neither hostcall nor JAX can run here. "
          "Start worker processes with the 'spawn' or 'forkserver' method "
          "of multiprocessing instead.")
    with self._lock:
      if self._queue is None:
        started = native_queue.NativeQueue(queue_library.load(), self.capacity)
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
    """Whether the device reaches the started queue through the native
    FFI handlers (else through JAX's Python callbacks)."""
    return self._queue is not None and queue_library.LIBRARY.ffi

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

  def flush_soon(self) -> None:
    """Delivers what is queued now without waiting out the gather window."""
    if self._queue is not None:
      self._queue.flush_soon()

  def push(self, site: int, arrays: list) -> None:
    """The Python-callback path's producer (the runtime reuses the buffers
    it lends us once we return: keep copies)."""
    self.start().push(site, [np.array(a) for a in arrays])

  def _consume(self) -> None:
    q = self._queue
    q.become_consumer()
    while True:
      try:
        batch = q.pop_batch(0.1, self._window())
      except BaseException:  # noqa: BLE001 - the consumer never dies
        logger.exception("hostcall: the asynchronous queue failed")
        time.sleep(0.01)
        continue
      if isinstance(batch, native_queue.Interleaved):
        if all(map(sites.joinable, batch.site_ids())):
          self._delivering_interleaved(batch, q)
          batch = []
        else:
          batch = batch.runs()
      # Each item let go of before it counts as delivered: whoever waits
      # for it (a barrier) finds its values (maybe large) released. The
      # calls of a joinable site (hostcall.jit's) go together.
      runs, batch = batch, None
      runs.reverse()
      while runs:
        run = runs.pop()
        packed = isinstance(run, native_queue.Packed)
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
      calls.round_ended()
      try:
        self.prune()
      except BaseException:  # noqa: BLE001 - the consumer never dies
        logger.exception("hostcall: releasing call sites failed")

  def _window(self) -> float:
    """The gather window of the next trip: ``gather``, or ``idle_gather``
    where shorter and the main thread has been waiting since the last
    trip (see ``_MainThreadLoad``)."""
    gather, idle = self.gather, self.idle_gather
    if idle < gather and not self._main_thread.busy():
      return idle
    return gather

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

  def _delivering_interleaved(self, batch, q) -> None:
    """Delivers ``batch``, an ``Interleaved`` one of joinable sites
    (``interleaved.deliver``), failures postponed to the barrier; then
    counts its calls delivered (its bytes let go of first)."""
    n = len(batch)

    def bypassed():
      self._bypassing = False
      q.set_bypass(False)

    self._delivering = True
    try:
      interleaved.deliver(batch, self, bypassed)
    except BaseException as exc:  # noqa: BLE001 - the consumer never dies
      errors.postpone(exc, "delivering queued calls")
    finally:
      batch.clear()
      self._delivering = False
      if self._bypassing:
        bypassed()
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
      if native_queue.Unreadable in set(map(type, map(_raw_of, items))):
        # Each fails alone: the others are delivered.
        for item in items:
          try:
            Consumer._deliver(*item)
          except BaseException as exc:  # noqa: BLE001 - the consumer never dies
            errors.postpone(exc, f"delivering a queued call of site {site}")
        return
    target, contexts, layouts = sites.get(site)
    columns = call_sites.read_columns(target, layouts, items)
    if target.deliver_steps is not None and target.joins_calls:
      rank = len(contexts.batch_levels)
      stacked = [np.moveaxis(c, 0, rank) if rank else c for c in columns]
      calls.run(Steps(target, len(items)), stacked, contexts,
                asynchronous=True)
    elif not calls.run_lines(target, columns, contexts):
      # Each call's arrays: views of the columns, 0-d for a scalar one.
      at = call_sites.indices(len(items))
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
      call_sites.check_readable(target, raw)
      arrays = call_sites.decode(layouts, raw)
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

  def undelivered(self) -> bool:
    """Whether a queued call is not yet delivered (no wait)."""
    if self._queue is None:
      return False
    pushed = self.pushed()
    with self._done:
      return self._delivered < pushed

  def pushed(self) -> int:
    return self._queue.stats()["pushed"] if self._queue is not None else 0

  def drain(self, timeout: float | None = None, count: int | None = None
            ) -> bool:
    """Waits until every tap queued so far (or the first ``count``) has
    been delivered."""
    if self._queue is None or self.is_consumer:
      return True  # the consumer cannot wait for itself
    count = self.pushed() if count is None else count
    self._queue.add_waiters(1)  # no gathering while we wait
    try:
      with self._done:
        return self._done.wait_for(lambda: self._delivered >= count,
                                   timeout)
    finally:
      self._queue.add_waiters(-1)


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
  # (The delivery thread's wake-up, 0.1 to 0.3 ms, overlaps the settling.)
  consumer.flush_soon()
  try:
    deferred.wait_for_queueing_programs()
    _jax_private.wait_for_effects()
  except BaseException:  # (Ctrl-C): the next barrier settles them
    sites.give_back(retired)
    raise
  sites.release_once_delivered(retired, consumer.pushed())
  for _ in range(_MAX_BARRIER_ROUNDS):
    pushed, submitted = consumer.pushed(), deferred.submitted()
    deferred.drain(count=submitted)
    consumer.drain(count=pushed)
    if markers.waiting():  # (outputs whose marker claimed another's)
      markers.replay_unclaimed()
    deferred.wait_for_queueing_programs()
    _jax_private.wait_for_effects()  # what the delivered host functions ran
    if consumer.pushed() == pushed and deferred.submitted() == submitted:
      consumer.prune()  # what the barrier saw delivered is released now
      return


def anything_to_wait_for() -> bool:
  """Whether ``wait`` would wait for anything (no wait itself): a
  queueing program dispatched since the last barrier, a queued call not
  yet delivered, a program's outputs not yet replayed."""
  if consumer.forked:
    return False
  return (deferred.queued_since_barrier or deferred.pending() > 0
          or consumer.undelivered() or markers.waiting() > 0)


def wait_at_exit() -> None:
  """``wait()`` at interpreter exit (registered when hostcall is imported,
  so after the exit handlers registered later: their host calls too), where
  anything was started; JAX's own exit hook runs after it."""
  if consumer.started or deferred.started:
    wait()

"""Asynchronous delivery: taps queued on the host, delivered by one thread.

A tap in asynchronous mode does not call Python from the device computation.
Its operands are copied into a bounded FIFO queue (the native XLA FFI
handler of ``hostcall._native``, or a Python queue when that cannot be
built) and the computation goes on; one consumer thread delivers the taps to
their host functions in queue order, which is program order on each device.
A full queue blocks the producer (back-pressure), never drops. ``barrier()``
waits until everything queued so far is delivered; an ``atexit`` hook does
the same before the interpreter exits.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import itertools
import logging
import threading
import time
import traceback
from typing import Any

import jax
import ml_dtypes
import numpy as np

from hostcall import _native
from hostcall._core import host

logger = logging.getLogger("hostcall")

#: Default bound of queued bytes (payload plus 64 bytes an item).
DEFAULT_CAPACITY = 64 << 20

# XLA FFI DataType codes (xla/ffi/api/c_api.h) to NumPy dtypes.
_DTYPES = {
    1: np.bool_, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
    6: np.uint8, 7: np.uint16, 8: np.uint32, 9: np.uint64, 10: np.float16,
    11: np.float32, 12: np.float64, 15: np.complex64, 16: ml_dtypes.bfloat16,
    18: np.complex128,
}
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}


class _Sites:
  """Call sites by id: what to deliver a queued item to."""

  def __init__(self):
    self._ids = itertools.count(1)
    self._sites: dict[int, tuple[host.HostTarget, Any]] = {}
    self._lock = threading.Lock()

  def add(self, target: host.HostTarget, contexts) -> int:
    with self._lock:
      site = next(self._ids)
      self._sites[site] = (target, contexts)
    return site

  def get(self, site: int):
    return self._sites[site]


sites = _Sites()


class _PythonQueue:
  """The fallback queue, bounded in bytes like the native one."""

  def __init__(self, capacity: int):
    self.capacity = capacity
    self._items: collections.deque = collections.deque()
    self._bytes = 0
    self.pushed = 0
    self.blocked = 0
    self._cond = threading.Condition()

  def set_capacity(self, capacity: int) -> None:
    with self._cond:
      self.capacity = capacity
      self._cond.notify_all()  # a larger bound may let a producer through

  def push(self, site: int, arrays: list) -> None:
    size = sum(a.nbytes for a in arrays) + 64
    with self._cond:
      if self._bytes and self._bytes + size > self.capacity:
        self.blocked += 1
        self._cond.wait_for(
            lambda: not self._bytes or self._bytes + size <= self.capacity)
      self._items.append((site, arrays, size))
      self._bytes += size
      self.pushed += 1
      self._cond.notify_all()

  def pop_batch(self, timeout: float) -> list:
    with self._cond:
      if not self._cond.wait_for(lambda: self._items, timeout):
        return []
      items = list(self._items)
      self._items.clear()
      self._bytes -= sum(size for _, _, size in items)
      self._cond.notify_all()
    return [(site, arrays) for site, arrays, _ in items]

  def stats(self) -> dict:
    with self._cond:
      return {"pushed": self.pushed, "queued": len(self._items),
              "queued_bytes": self._bytes, "capacity": self.capacity,
              "producer_waits": self.blocked}


class _NativeQueue:
  """The native queue, read in batches through ctypes (which releases the
  GIL while it waits)."""

  BATCH = 512
  MAX_BUFFERS = 64  # described in one call; more take a second call

  def __init__(self, lib, capacity: int):
    self.lib = lib
    self.set_capacity(capacity)
    self._handles = (ctypes.c_void_p * self.BATCH)()
    self._pending: collections.deque = collections.deque()

  def set_capacity(self, capacity: int) -> None:
    self.lib.hostcall_set_capacity(capacity)

  def push(self, site: int, arrays: list) -> None:
    metas = (ctypes.c_int64 * (20 * max(1, len(arrays))))()
    offset = 0
    for i, a in enumerate(arrays):
      m = 20 * i
      metas[m], metas[m + 1] = _CODES[a.dtype], a.ndim
      for d, size in enumerate(a.shape):
        metas[m + 2 + d] = size
      metas[m + 18], metas[m + 19] = offset, a.nbytes
      offset += a.nbytes
    data = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    self.lib.hostcall_push_host(site, len(arrays), metas, data, len(data))

  def pop_batch(self, timeout: float) -> list:
    """Up to BATCH items ``(site, arrays)``, in queue order (maybe none)."""
    lib = self.lib
    n = lib.hostcall_pop(int(timeout * 1000), self.BATCH, self._handles)
    if not n:
      return []
    handles = self._handles
    items = [self._decode(handles[i]) for i in range(n)]
    lib.held.hostcall_release_many(handles, n)
    if n < self.BATCH:
      # Let taps gather before the next trip: the device thread then rarely
      # has to wake this one.
      time.sleep(2e-4)
    return items

  def _decode(self, handle):
    desc = (ctypes.c_int64 * (4 + 20 * self.MAX_BUFFERS))()
    self.lib.held.hostcall_describe(handle, self.MAX_BUFFERS, desc)
    site, n_buffers, address, size = desc[0], desc[1], desc[2], desc[3]
    if n_buffers > self.MAX_BUFFERS:
      desc = (ctypes.c_int64 * (4 + 20 * n_buffers))()
      self.lib.held.hostcall_describe(handle, n_buffers, desc)
    data = ctypes.string_at(address, size) if size else b""
    arrays = []
    for i in range(n_buffers):
      meta = desc[4 + 20 * i: 24 + 20 * i]
      dtype, rank = _DTYPES[meta[0]], meta[1]
      count = meta[19] // np.dtype(dtype).itemsize
      arrays.append(np.frombuffer(data, dtype, count=count, offset=meta[18])
                    .reshape(tuple(meta[2:2 + rank])))
    return site, arrays

  def stats(self) -> dict:
    out = (ctypes.c_int64 * 5)()
    self.lib.held.hostcall_stats(out)
    return {"pushed": out[0], "queued": out[1], "queued_bytes": out[2],
            "capacity": out[3], "producer_waits": out[4]}


class Delivery:
  """The queue and its consumer thread."""

  def __init__(self):
    self._lock = threading.Lock()
    self._queue = None
    self._thread: threading.Thread | None = None
    self._delivered = 0
    self._done = threading.Condition()
    self.capacity = DEFAULT_CAPACITY

  @property
  def queue(self):
    with self._lock:
      if self._queue is None:
        lib = _native.load()
        self._queue = (_NativeQueue(lib, self.capacity) if lib is not None
                       else _PythonQueue(self.capacity))
        self._thread = threading.Thread(target=self._consume,
                                        name="hostcall-consumer", daemon=True)
        self._thread.start()
        # Computations still running at exit push more taps: wait for them
        # first (JAX's own exit hook runs after ours).
        atexit.register(wait)
      return self._queue

  @property
  def native(self) -> bool:
    return isinstance(self.queue, _NativeQueue)

  def set_capacity(self, capacity: int) -> None:
    if capacity < 1 << 16:
      raise ValueError(f"capacity must be at least 65536 bytes, got "
                       f"{capacity}")
    self.capacity = capacity
    self.queue.set_capacity(capacity)

  def push(self, site: int, arrays: list) -> None:
    """The Python fallback's producer (and the native path's twin)."""
    self.queue.push(site, [np.array(a) for a in arrays])

  def _consume(self) -> None:
    q = self._queue
    while True:
      for site, arrays in q.pop_batch(0.1):
        try:
          target, contexts = sites.get(site)
          if isinstance(contexts, list):
            *arrays, pid = arrays
            context = contexts[int(pid)]
          elif callable(contexts):  # a partitioned call: its shard's index
            unpacked = contexts(arrays)
            if unpacked is None:
              continue
            arrays, context = unpacked
          else:
            context = contexts
          host.run(target, arrays, context, copy=False)
        except BaseException as exc:  # noqa: BLE001 - the consumer never dies
          host.errors.record(exc, traceback.format_exc())
        finally:
          with self._done:
            self._delivered += 1
            self._done.notify_all()

  def stats(self) -> dict:
    stats = self.queue.stats()
    with self._done:
      stats["delivered"] = self._delivered
    return stats

  def drain(self, timeout: float | None = None) -> bool:
    """Waits until every tap queued so far has been delivered."""
    if self._queue is None or threading.current_thread() is self._thread:
      return True  # the consumer cannot wait for itself
    target = self._queue.stats()["pushed"]
    with self._done:
      return self._done.wait_for(lambda: self._delivered >= target, timeout)


delivery = Delivery()


def wait() -> None:
  """Waits for running computations, then for their queued taps."""
  jax.effects_barrier()
  delivery.drain()


def set_queue_capacity(nbytes: int) -> None:
  """Bounds the asynchronous queue to ``nbytes`` (default 64 MiB).

  A tap that would exceed it waits (the device stalls) until the host has
  delivered enough: back-pressure, never loss. One tap larger than the
  bound still goes through alone.
  """
  delivery.set_capacity(int(nbytes))


def queue_stats() -> dict:
  """The asynchronous queue's counters: ``pushed``, ``delivered``,
  ``queued``, ``queued_bytes``, ``capacity``, ``producer_waits`` (times a
  tap waited for room), and ``native`` (which queue is in use)."""
  stats = delivery.stats()
  stats["native"] = delivery.native
  return stats

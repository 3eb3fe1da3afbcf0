"""The queue asynchronous taps go through: the native one (C++,
``hostcall_queue.cc``, read through ctypes), bounded in bytes, handing
items over in the order they came, whether the device's FFI handler or a
Python callback (``push``) queued them. ``queue.Consumer`` owns it and the
thread that delivers."""

from __future__ import annotations

import ctypes
import itertools
import operator

import numpy as np


class NativeQueue:
  """The native queue, read in batches through ctypes (which releases the
  GIL while it waits)."""

  BATCH = 4096

  def __init__(self, lib, capacity: int):
    self.lib = lib
    self.set_capacity(capacity)
    self._handles = (ctypes.c_void_p * self.BATCH)()
    self._descriptions = (ctypes.c_int64 * (4 * self.BATCH))()
    # Arrays queued from Python, by key, until the consumer reaches them.
    self._held: dict[int, list] = {}
    self._keys = itertools.count(1)

  def become_consumer(self) -> None:
    self.lib.gil_held.hostcall_become_consumer()

  def set_bypass(self, on: bool) -> None:
    self.lib.gil_held.hostcall_set_bypass(int(on))

  def set_capacity(self, capacity: int) -> None:
    self.lib.hostcall_set_capacity(capacity)

  def push(self, site: int, arrays: list) -> None:
    key = next(self._keys)
    self._held[key] = arrays
    # Through ctypes.CDLL, which releases the GIL while a full queue makes
    # this producer wait.
    self.lib.hostcall_push_host(site, key, sum(a.nbytes for a in arrays))

  def add_waiters(self, delta: int) -> None:
    """A thread starts (+1) or stops (-1) waiting for delivery: while one
    waits, items are taken without gathering."""
    self.lib.gil_held.hostcall_add_waiters(delta)

  def flush_soon(self) -> None:
    """The items queued now are taken without gathering; later ones gather
    as usual."""
    self.lib.gil_held.hostcall_flush_soon()

  def pop_batch(self, timeout: float, gather: float = 0.0):
    """The queued items in runs (see ``runs``; maybe none): the items
    queued from Python with their ``arrays``, the others with ``raw``, the
    operands' bytes; or, where the calls of a few sites alternate (a
    program that makes several calls), an ``Interleaved`` batch. Once one
    item is there, waits up to ``gather`` seconds for more to join it,
    unless someone waits for them (see ``hostcall_pop``)."""
    lib = self.lib
    n = lib.hostcall_pop(int(timeout * 1000), self.BATCH,
                         int(gather * 1e6), self._handles)
    if not n:
      return []
    handles = self._handles
    lib.gil_held.hostcall_describe_many(handles, n, self._descriptions)
    # Every popped item gives back its room in the queue at once, whatever
    # happens while reading it.
    lib.gil_held.hostcall_uncount_many(handles, n)
    table = np.frombuffer(self._descriptions, np.int64, 4 * n).reshape(n, 4)
    sites, keys, sizes = table[:, 0], table[:, 1], table[:, 3]
    if not keys.any() and sizes.max() < ZERO_COPY_BYTES:
      # The common batch (hostcall.jit's calls): read in one copy, handed
      # over in runs of one site without a Python object an item.
      try:
        block = _new_block(int(sizes.sum()))
      except BaseException as exc:  # noqa: BLE001 - e.g. MemoryError
        return runs(self._take_one_by_one(n, exc))
      lib.gil_held.hostcall_copy_free_many(handles, n, ZERO_COPY_BYTES,
                                       block.ctypes.data)
      block.flags.writeable = False  # as bytes read from the queue were
      return Interleaved.or_runs(sites, sizes, block)
    return runs(self._items(n))

  def _items(self, n: int) -> list:
    """``(site, arrays, raw)`` for each of the ``n`` items popped, whose
    room is given back: small ones copied out together, large ones handed
    over as views."""
    lib, handles, items = self.lib, self._handles, []
    described = self._descriptions[:4 * n]
    keys, sizes = described[1::4], described[3::4]
    small = sum(size for key, size in zip(keys, sizes)
                if not key and size < ZERO_COPY_BYTES)
    try:
      # One copy for every small item, read into Python at once.
      block = _new_block(small)
    except BaseException as exc:  # noqa: BLE001 - e.g. MemoryError
      return self._take_one_by_one(n, exc)
    lib.gil_held.hostcall_copy_free_many(handles, n, ZERO_COPY_BYTES,
                                     block.ctypes.data)
    data = block.tobytes()
    at = 0
    for i in range(n):
      site, key, address, size = described[4 * i:4 * i + 4]
      if key:
        items.append((site, self._held.pop(key, None), None))
      elif size >= ZERO_COPY_BYTES:
        # Large: handed over as a view, freed when the last array dies.
        items.append((site, None, _Block.view(lib, handles[i], address,
                                              size)))
      else:
        items.append((site, None, data[at:at + size]))
        at += size
    return items

  def _take_one_by_one(self, n: int, failure: BaseException) -> list:
    """The popped items when one buffer for all could not be had: each
    read alone; one that cannot be is said so, counted and released (the
    barrier raises instead of waiting for it forever)."""
    lib, handles, items = self.lib, self._handles, []
    kept = []
    try:
      for i in range(n):
        site, key, address, size = self._descriptions[4 * i:4 * i + 4]
        if key:
          items.append((site, self._held.pop(key, None), None))
          continue
        if size >= ZERO_COPY_BYTES:
          kept.append(i)
          items.append((site, None, _Block.view(lib, handles[i], address,
                                                size)))
          continue
        try:
          raw = ctypes.string_at(address, size) if size else b""
        except BaseException as exc:  # noqa: BLE001 - e.g. MemoryError
          raw = Unreadable(size, exc)
        items.append((site, None, raw))
    finally:
      for i in range(n):
        if i not in kept:
          lib.gil_held.hostcall_free(handles[i])
    del failure
    return items

  def stats(self) -> dict:
    out = (ctypes.c_int64 * 7)()
    self.lib.gil_held.hostcall_stats(out)
    return {"pushed": out[0], "queued": out[1], "queued_bytes": out[2],
            "capacity": out[3], "producer_waits": out[4],
            "producers_waiting": out[5], "trips": out[6]}


def _new_block(size: int) -> np.ndarray:
  """Memory for the bytes of a batch's small items (the one place a pop
  allocates them: a MemoryError here has each item read alone)."""
  return np.empty(size, np.uint8)


def runs(items: list) -> list:
  """``items`` in runs of consecutive items of one call site, each a list
  (a ``Packed`` is a run of its own)."""
  return [list(run) for _, run in itertools.groupby(items, _site_of)]


_site_of = operator.itemgetter(0)


class Packed:
  """A run of consecutive queued calls of one call site, ``size`` bytes
  each, read into one block: what the consumer mostly takes (hostcall.jit's
  calls), handed over without a Python object a call."""

  __slots__ = ("site", "count", "size", "block")

  def __init__(self, site: int, count: int, size: int, block: np.ndarray):
    self.site, self.count, self.size, self.block = site, count, size, block

  @classmethod
  def runs_of(cls, sites: np.ndarray, sizes: np.ndarray, block: np.ndarray,
              bounds=None) -> list:
    """The runs of a batch whose items' bytes lie one after the other in
    ``block``: one a change of site (or of size; ``bounds_of``)."""
    if bounds is None:
      bounds = cls.bounds_of(sites, sizes)
    bounds = bounds.tolist()
    out, at = [], 0
    for start, end in zip(bounds, bounds[1:]):
      size, count = int(sizes[start]), end - start
      out.append(cls(int(sites[start]), count, size,
                     block[at:at + count * size]))
      at += count * size
    return out

  @staticmethod
  def bounds_of(sites: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Where the runs of a batch start, and its end."""
    cuts = np.flatnonzero((sites[1:] != sites[:-1])
                          | (sizes[1:] != sizes[:-1])) + 1
    return np.concatenate(([0], cuts, [len(sites)]))

  def rows(self) -> np.ndarray:
    """The calls' bytes, ``(count, size)``."""
    return self.block.reshape(self.count, self.size)

  def items(self) -> list:
    """``(site, None, raw)`` for each call, as the queue hands items."""
    raw = self.block.tobytes()
    size = self.size
    return [(self.site, None, raw[i * size:(i + 1) * size])
            for i in range(self.count)]

  def __len__(self) -> int:
    return self.count

  def clear(self) -> None:
    """Lets go of the calls' bytes (delivered)."""
    self.block = None


class Interleaved:
  """A batch read into one block (as ``Packed.runs_of``'s) where the calls
  of a few call sites alternate: a program that makes several calls queues
  them site after site, each call a run of its own. Each site's calls are
  read together (``by_site``: one ``Packed`` a site, its calls in queue
  order), to be delivered in queue order (``order``) by
  ``interleaved.deliver``."""

  __slots__ = ("sites", "sizes", "block", "bounds")

  def __init__(self, sites, sizes, block, bounds):
    self.sites, self.sizes, self.block, self.bounds = (sites, sizes, block,
                                                       bounds)

  @classmethod
  def or_runs(cls, sites: np.ndarray, sizes: np.ndarray, block: np.ndarray):
    """The batch as an ``Interleaved`` one where a site's calls lie in
    several runs, each site's calls of one size; else in runs
    (``Packed.runs_of``)."""
    bounds = Packed.bounds_of(sites, sizes)
    if len(bounds) > 2:
      starts = bounds[:-1]
      order = np.argsort(sites[starts], kind="stable")
      run_sites, run_sizes = sites[starts][order], sizes[starts][order]
      repeated = run_sites[1:] == run_sites[:-1]
      if repeated.any() and not (repeated
                                 & (run_sizes[1:] != run_sizes[:-1])).any():
        return cls(sites, sizes, block, bounds)
    return Packed.runs_of(sites, sizes, block, bounds)

  def __len__(self) -> int:
    return len(self.sites)

  def site_ids(self) -> list:
    return np.unique(self.sites).tolist()

  def runs(self) -> list:
    """The batch in runs, as ``Packed.runs_of`` hands it."""
    return Packed.runs_of(self.sites, self.sizes, self.block)

  def order(self) -> tuple[list, list]:
    """``(site, calls)`` of each run, in queue order, as two lists."""
    bounds = self.bounds
    return (self.sites[bounds[:-1]].tolist(),
            np.diff(bounds).tolist())

  def by_site(self) -> dict:
    """Each site's calls as one ``Packed``, in queue order: their bytes
    gathered from the block (one copy a site)."""
    starts = np.cumsum(self.sizes) - self.sizes
    out = {}
    for site in self.site_ids():
      which = np.flatnonzero(self.sites == site)
      size = int(self.sizes[which[0]])
      rows = self.block[starts[which][:, None] + np.arange(size)]
      out[site] = Packed(site, len(which), size, rows.reshape(-1))
    return out

  def clear(self) -> None:
    """Lets go of the calls' bytes (delivered)."""
    self.block = None


#: Items at least this large reach the host function without a copy: its
#: arrays are views on the queue's block, freed when the last one dies.
ZERO_COPY_BYTES = 64 << 10


class _Block:
  """Owns a queue block that arrays view; frees it when garbage."""

  __slots__ = ("lib", "handle")

  @classmethod
  def view(cls, lib, handle, address: int, size: int):
    owner = cls()
    owner.lib, owner.handle = lib, handle
    buffer = (ctypes.c_char * size).from_address(address)
    buffer._owner = owner  # the views keep the buffer, the buffer the block
    return buffer

  def __del__(self):
    try:
      self.lib.gil_held.hostcall_free(self.handle)
    except Exception:  # noqa: BLE001 - at interpreter exit: nothing to free
      pass


class Unreadable:
  """A queued item whose bytes could not be read into Python."""

  def __init__(self, size: int, exc: BaseException):
    self.size, self.exc = size, exc

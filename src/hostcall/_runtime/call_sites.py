"""Asynchronous call sites and what their queued bytes mean: the registry
of sites (``sites``: a site lives as long as the executables compiled from
it, and is forgotten only after a barrier has waited for what was
dispatched before its release), each operand's ``Layout``, and decoding a
queued item (or a packed run of them) back into arrays for the host
function."""

from __future__ import annotations

import collections
import itertools
import math
import threading
import weakref

import jax
import ml_dtypes
import numpy as np

from hostcall._runtime import errors, native_queue
from hostcall._core.targets import HostTarget


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
    may be delivered together (``hostcall.jit``'s queued calls, and those
    of a vectorised target that ``joins_calls``, in one
    ``deliver_steps``)."""
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
    the computations dispatched so far (see ``release_once_delivered``)."""
    seen = []
    while self._retired:
      seen.append(self._retired.popleft())
    return seen

  def give_back(self, seen: list[int]) -> None:
    """Returns ``take_retired``'s sites, not settled, for the next."""
    self._retired.extendleft(reversed(seen))

  def release_once_delivered(self, seen: list[int], pushed: int) -> None:
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


_INDICES = [(i, Ellipsis) for i in range(native_queue.NativeQueue.BATCH)]


def indices(n: int) -> list:
  """``[(0, ...), (1, ...), ...]``, ``n`` of them: each call's row of a
  column, as an array (0-d for a scalar operand)."""
  return (_INDICES[:n] if n <= len(_INDICES)
          else list(zip(range(n), itertools.repeat(Ellipsis))))


def read_columns(target, layouts, items) -> list:
  """The operands of several queued calls of one site (a list of items or
  a ``Packed`` run), each stacked ``(calls, *shape)``: read at once where
  every operand is whole bytes."""
  whole_bytes = layouts is not None and all(
      layout.bits % 8 == 0 and layout.count for layout in layouts)
  if isinstance(items, native_queue.Packed):
    if not whole_bytes:
      return read_columns(target, layouts, items.items())
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
      check_readable(target, raw)
      arrays = decode(layouts, raw)
    flats.append(arrays)
  return [np.stack(column) for column in zip(*flats)]


def check_readable(target, raw) -> None:
  if isinstance(raw, native_queue.Unreadable):
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

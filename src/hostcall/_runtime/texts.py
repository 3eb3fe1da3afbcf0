"""Columns of numbers as text, for the metrics writers and for runs of
queued prints: NumPy's ``str()`` of each value (``block.column_texts``'
words), formatted by the native extension
(``hostcall_texts.cc``, built into it with the tap queue). Only what it
does not format (columns of other dtypes, a library built without
floating-point ``std::to_chars``) is left to the caller's NumPy."""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from hostcall._runtime import queue_library

#: The formatter's column kinds, by dtype.
_KINDS = {np.dtype(np.int64): 0, np.dtype(np.float32): 1,
          np.dtype(np.float64): 2}


def _native_column(values: np.ndarray) -> np.ndarray | None:
  """``values`` (``block.plain``'s) as the formatter reads them, or None."""
  if values.ndim != 1:
    return None
  if values.dtype.kind in "iu" and np.can_cast(values.dtype, np.int64):
    values = values.astype(np.int64, copy=False)
  if values.dtype not in _KINDS:
    return None
  return np.ascontiguousarray(values)


class _Prepared:
  """What the formatter is handed for some rows: their columns as it reads
  them, and the pieces, sizes and kinds as C arrays."""

  def __init__(self, lib, pieces: list[str], arrays: list[np.ndarray]):
    k = len(arrays)
    encoded = [p.encode("ascii") for p in pieces]
    self.lib, self.arrays, self.k = lib, arrays, k
    self.sizes = (ctypes.c_int64 * (k + 1))(*map(len, encoded))
    self.kinds = (ctypes.c_int64 * k)(*(_KINDS[a.dtype] for a in arrays))
    self.texts = (ctypes.c_char_p * (k + 1))(*encoded)

  def data(self, start: int = 0):
    """The columns' addresses, from row ``start`` on."""
    return (ctypes.c_void_p * self.k)(
        *(a[start:].ctypes.data for a in self.arrays))

  def buffer(self, rows: int) -> np.ndarray:
    """A buffer that ``rows`` rows fit in."""
    return _output(self.lib.gil_held.hostcall_rows_capacity(rows, self.k,
                                                        self.sizes))


def _prepare(pieces: list[str], columns: list[np.ndarray]):
  """A ``_Prepared`` for ``columns``, or None where they cannot be
  formatted natively (see ``rows``)."""
  if not columns:
    return None
  lib = queue_library.load()
  arrays = [_native_column(c) for c in columns]
  if any(a is None for a in arrays) or len({len(a) for a in arrays}) != 1:
    return None
  return _Prepared(lib, pieces, arrays)


def rows(pieces: list[str], columns: list[np.ndarray], json: bool
         ) -> bytes | None:
  """``pieces[0] value pieces[1] value ... pieces[-1]`` for each row of the
  1-D ``columns`` (of one length; ASCII ``pieces``, one more than columns);
  non-finite floats as JSON writes them where ``json``. None where a
  column is not an int or float32/64 vector, or where the library was
  built without floating-point ``std::to_chars``: the caller formats with
  NumPy then."""
  prepared = _prepare(pieces, columns)
  if prepared is None:
    return None
  chunks = []
  # In chunks of rows: the output buffer is a bound on what they take.
  for start in range(0, max(len(prepared.arrays[0]), 1), _CHUNK_ROWS):
    n = min(len(prepared.arrays[0]) - start, _CHUNK_ROWS)
    out = prepared.buffer(n)
    # Through ``lib``, which releases the GIL while it formats.
    size = prepared.lib.hostcall_format_rows(
        n, prepared.k, prepared.kinds, prepared.data(start), prepared.texts,
        prepared.sizes, int(json), ctypes.c_char_p(out.ctypes.data))
    if size < 0:
      return None
    chunks.append(out[:size].tobytes())
  return b"".join(chunks)


def write_rows(fd: int, pieces: list[str], columns: list[np.ndarray],
               json: bool) -> bool:
  """Writes ``rows(pieces, columns, json)`` to the file ``fd``, formatted
  and written by one native call without the GIL (a chunk of rows a
  ``write``, as each reaches the file whole); False where ``rows`` would
  return None (nothing written). Raises ``OSError`` where a write fails."""
  prepared = _prepare(pieces, columns)
  if prepared is None:
    return False
  n = len(prepared.arrays[0])
  chunk = min(n, _CHUNK_ROWS)
  out = prepared.buffer(chunk)
  error = ctypes.c_int64(0)
  # Through ``lib``, which releases the GIL while it formats and writes.
  written = prepared.lib.hostcall_write_rows(
      fd, n, prepared.k, prepared.kinds, prepared.data(), prepared.texts,
      prepared.sizes, int(json), max(chunk, 1),
      ctypes.c_char_p(out.ctypes.data), ctypes.byref(error))
  if error.value:
    raise OSError(error.value, os.strerror(error.value))
  return written >= 0


#: Rows formatted in one native call at most.
_CHUNK_ROWS = 1 << 16

#: Output buffers up to this size are kept for the thread's next rows.
_KEPT_BYTES = 4 << 20
_kept = threading.local()


def _output(nbytes: int) -> np.ndarray:
  """A buffer of at least ``nbytes`` for the formatter (not zeroed: mostly
  left unwritten), the thread's kept one where it is large enough. A fresh
  one of a block's bound (180 KiB for 512 rows of 11 numbers) is mapped and
  faulted in page by page, and unmapped after: 0.4 µs a row, and the
  unmapping interrupts the other threads' cores."""
  kept = getattr(_kept, "buffer", None)
  if kept is not None and kept.size >= nbytes:
    return kept
  out = np.empty(nbytes, np.uint8)
  if nbytes <= _KEPT_BYTES:
    _kept.buffer = out
  return out


def column(values: np.ndarray, json: bool) -> list[str] | None:
  """One text per value of the 1-D ``values``, or None (as ``rows``)."""
  text = rows(["", "\n"], [values], json)
  if text is None:
    return None
  return text.decode("ascii").split("\n")[:-1]

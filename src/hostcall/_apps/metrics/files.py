"""The files of the text writers: paths as arguments, files opened afresh
for appending, a block's rows written in one ``write``."""

from __future__ import annotations

import os
import pathlib
import weakref


def as_path(value, what: str) -> pathlib.Path:
  """``value`` (a ``str`` or ``os.PathLike``) as a path, or a ``TypeError``
  naming ``what`` it is, what came and what is taken."""
  if not isinstance(value, (str, os.PathLike)):
    raise TypeError(f"{what} is a path (a str or os.PathLike, e.g. "
                    f"'runs/fit'), got {value!r} of type "
                    f"{type(value).__name__}.")
  return pathlib.Path(value)


def open_for_append(path: pathlib.Path, truncate: bool = True) -> int:
  """``path`` opened for appending (``O_APPEND``), emptied first where
  ``truncate`` (else what it holds is kept, and written after): every write
  lands at the file's end as it is then, so that a file truncated from
  outside (logrotate's ``copytruncate``) is written from its new start,
  not from the old offset over a run of NUL bytes."""
  return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND
                 | (os.O_TRUNC if truncate else 0)
                 | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0),
                 0o666)


def close_when_dropped(owner, fd: int) -> weakref.finalize:
  """Closes ``fd`` when ``owner`` is garbage-collected (a writer dropped
  without ``close()`` must not keep its file open for the life of the
  process); call the returned finalizer to close it earlier, once."""
  finalizer = weakref.finalize(owner, os.close, fd)
  # Not at interpreter exit: weakref's exit hook runs before hostcall's,
  # which still writes the last rows to the files.
  finalizer.atexit = False
  return finalizer


def write_all(fd: int, data: bytes) -> None:
  """Writes ``data`` in one ``write`` where the OS takes it whole (a block's
  rows together: a truncation from outside falls between blocks, never
  inside a row)."""
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view):]

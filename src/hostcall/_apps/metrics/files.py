"""The files of the text writers: paths as arguments, a run's directory
(its name as a path, claimed), files opened afresh for appending, a block's
rows written in one ``write``."""

from __future__ import annotations

import itertools
import os
import pathlib
import threading
import weakref
from typing import Callable


def as_path(value, what: str) -> pathlib.Path:
  """``value`` (a ``str`` or ``os.PathLike``) as a path, or a ``TypeError``
  naming ``what`` it is, what came and what is taken."""
  if not isinstance(value, (str, os.PathLike)):
    raise TypeError(f"{what} is a path (a str or os.PathLike, e.g. "
                    f"'runs/fit'), got {value!r} of type "
                    f"{type(value).__name__}.")
  return pathlib.Path(value)


def run_dir(root, name) -> pathlib.Path:
  """``root/name``, refusing a name that is not a plain relative path."""
  if not isinstance(name, str) or not name or "\0" in name:
    raise ValueError(f"a run name is a non-empty string without NUL bytes, "
                     f"e.g. Run('fit'); got {name!r}.")
  relative = pathlib.PurePath(name)
  if relative.is_absolute() or ".." in relative.parts:
    raise ValueError(
        f"a run name is a relative path inside the runs directory ({root}); "
        f"got {name!r}, which would write elsewhere. Pass root= to choose "
        "the directory, e.g. Run('fit', root='/data/runs').")
  root = as_path(root, "Run's root")
  path = root / relative
  if not path.resolve().is_relative_to(root.resolve()):
    raise ValueError(f"the run name {name!r} leads outside {root} (through "
                     "a symbolic link); choose another name or root=.")
  return path


# The directories (resolved) claimed by runs of this process not yet open.
_claim_lock = threading.Lock()
_claimed: set[pathlib.Path] = set()


def claim_run_dir(base: pathlib.Path, make: bool,
                  open_dirs: Callable[[], set]) -> pathlib.Path:
  """Claims the first free of ``base``, ``base-2``, ``base-3``, ...: not
  the directory of a run of this process open (in ``open_dirs()``,
  resolved) or being opened, and, for a run that writes files (``make``),
  made here by ``os.mkdir``, which fails where the directory exists: the
  claim is atomic between threads and processes alike. A run without files
  (no directory made) takes one that does not exist. ``release_run_dir``
  it once the run is open (or has failed to open)."""
  if make:
    base.parent.mkdir(parents=True, exist_ok=True)
  for number in itertools.count(1):
    candidate = base if number == 1 else base.with_name(
        f"{base.name}-{number}")
    with _claim_lock:
      resolved = candidate.resolve()
      if resolved in _claimed or resolved in open_dirs():
        continue
      if make:
        try:
          os.mkdir(candidate)
        except FileExistsError:  # an earlier run's, or a racing claim
          continue
      elif os.path.lexists(candidate):
        continue
      _claimed.add(resolved)
      return candidate
  raise AssertionError("unreachable")


def release_run_dir(path: pathlib.Path) -> None:
  """Ends ``claim_run_dir``'s claim of ``path`` in this process."""
  with _claim_lock:
    _claimed.discard(path.resolve())


def make_own_part(path: pathlib.Path) -> bool:
  """Makes ``path``, a process's own part (``process_<k>``) of a run whose
  directory process 0 named as new (its parents too); refuses one that
  holds files, which only an earlier job can have left, on a file system
  the processes do not share. Returns True."""
  path.mkdir(parents=True, exist_ok=True)
  if any(path.iterdir()):
    raise FileExistsError(
        f"{path} holds an earlier run's files, though process 0 of this job "
        "named the run's directory as new: the processes do not share this "
        "file system. Remove it, or pass another root= or name.")
  return True


def remove_made(run_dir: pathlib.Path, paths: list) -> None:
  """Removes ``run_dir``, made for a run that failed to open, and the
  files of ``paths`` (None skipped) its writers made in it; a directory
  that holds another file is left as it is."""
  try:
    for path in paths:
      if isinstance(path, pathlib.Path) and path.parent == run_dir:
        path.unlink(missing_ok=True)
    run_dir.rmdir()
  except OSError:  # another's file in it
    pass


def open_for_append(path: pathlib.Path, truncate: bool = True) -> int:
  """``path`` opened for appending (``O_APPEND``), emptied first where
  ``truncate`` (else what it holds is kept, and written after): every write
  lands at the file's end as it is then, so that a file truncated from
  outside (logrotate's ``copytruncate``) is written from its new start,
  not from the old offset over a run of NUL bytes."""
  # Read too: a writer going on with a file reads back its last line.
  return os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND
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


class WholeBlocks:
  """Keeps a file a run of whole blocks: a block whose write fails (a full
  disk, a file grown past ``ulimit -f``, an interrupt) is cut off the file
  at once, and where even that fails, before the next block is written. A
  write that fails part way leaves the start of a row, and the next block
  appended to it would make that row and its own first one a single line
  no reader takes."""

  def __init__(self):
    # Where the file is to be cut back to before the next block.
    self._cut_to: int | None = None

  def write(self, fd: int, write: Callable[[], None]) -> None:
    """Calls ``write`` (which appends one block to ``fd``); where it raises,
    the file is cut back to its size before, and the error raised."""
    self.repair(fd)
    before = os.fstat(fd).st_size
    try:
      write()
    except BaseException:
      self._cut_to = before
      try:
        self.repair(fd)
      except OSError:  # tried again before the next block
        pass
      raise

  def repair(self, fd: int) -> None:
    """Cuts off what a failed block left, if anything is left to cut;
    raises ``OSError`` where the file cannot be cut (the next block is
    not written after a torn row)."""
    if self._cut_to is None:
      return
    # Shorter: truncated from outside since, which took the torn row too.
    if os.fstat(fd).st_size > self._cut_to:
      os.ftruncate(fd, self._cut_to)
    self._cut_to = None

  def forget(self) -> None:
    """Nothing to cut: the file was started afresh."""
    self._cut_to = None


def cut_torn_line(fd: int, quoted: bool = False) -> int:
  """Cuts the file ``fd`` back to the end of its last whole line (one
  ending in a newline), where a process stopped while writing left the
  start of one; returns the number of bytes cut off (0 for a file that
  ends whole). ``quoted``: a CSV table, whose quoted fields may hold
  newlines: only a newline outside quotes ends a line."""
  size = os.fstat(fd).st_size
  if not size or os.pread(fd, 1, size - 1) == b"\n":
    return 0
  if quoted:  # the quotes' parity counts from the start: read it all
    data = os.pread(fd, size, 0)
    inside = data.count(b'"') % 2
    end = size
    while True:
      at = data.rfind(b"\n", 0, end)
      if at < 0:
        keep = 0
        break
      inside ^= data.count(b'"', at, end) % 2
      if not inside:
        keep = at + 1
        break
      end = at
  else:
    keep, end = 0, size
    while end:
      start = max(0, end - (1 << 16))
      at = os.pread(fd, end - start, start).rfind(b"\n")
      if at >= 0:
        keep = start + at + 1
        break
      end = start
  os.ftruncate(fd, keep)
  return size - keep


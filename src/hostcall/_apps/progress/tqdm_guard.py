"""What keeps a failing progress bar from hanging others: tqdm holds a
process-wide lock while it draws, and lets go of it only when drawing
returns. A stream whose write raised (a full disk, a closed pipe) or a
format that failed (a ``bar_format`` naming no field) left it held, and
every later bar drawn from another thread waited forever."""

from __future__ import annotations

import errno
import threading


class unlocked_on_failure:  # noqa: N801 - used as a function is
  """``with unlocked_on_failure():`` around a call of tqdm's: where it
  raises, lets go of tqdm's lock if this thread took it in the call and
  still holds it. (A class, not a generator: a bar enters it three times
  a loop, on the delivery thread's path.)"""

  __slots__ = ("locks", "held")

  def __enter__(self):
    import tqdm
    self.locks = getattr(tqdm.tqdm.get_lock(), "locks", ())
    self.held = [_held(lock) for lock in self.locks]
    return self

  def __exit__(self, kind, failure, traceback):
    if kind is not None:
      for lock, was_held in zip(self.locks, self.held):
        while was_held is False and _held(lock):
          lock.release()
    return False


def _held(lock) -> bool | None:
  """Whether this thread holds ``lock`` (a threading or multiprocessing
  RLock, as tqdm makes), or None where that cannot be told. (Private names
  of the standard library's locks: a test fails loudly if they go.)"""
  try:
    if hasattr(lock, "_is_owned"):
      return lock._is_owned()
    return lock._semlock._is_mine()
  except Exception:  # noqa: BLE001 - another lock: left alone
    return None


def make(tqdm, **options):
  """``tqdm(**options)``, and where that raises, tqdm forgets the bar: it
  registers a bar (for the rows bars take) before it draws it, and a bar
  that failed to open would keep its row, and be visited by
  ``tqdm.write`` and tqdm's monitor thread, as long as the failure's
  traceback lives."""
  bar = tqdm.__new__(tqdm)
  try:
    bar.__init__(**options)
  except BaseException:
    forget = getattr(tqdm, "_decr_instances", None)
    if forget is not None:
      forget(bar)
    raise
  return bar


def is_notebook_bar(tqdm) -> bool:
  """Whether the bar class ``tqdm`` draws a notebook's widget (in a
  notebook, tqdm.auto's class is a subclass of tqdm.notebook's)."""
  try:
    from tqdm.notebook import tqdm as notebook_tqdm
  except Exception:  # noqa: BLE001 - no notebook support, no notebook bar
    return False
  return isinstance(tqdm, type) and issubclass(tqdm, notebook_tqdm)


def _tqdm_stops_drawing_on(failure: Exception) -> bool:
  """Whether tqdm's own stream wrapper takes ``failure`` and stops drawing
  the bar: an I/O error (a terminal hung up) or a closed file, as it did
  before hostcall guarded its streams."""
  if isinstance(failure, OSError):
    return failure.errno == errno.EIO
  if isinstance(failure, ValueError):
    try:
      return "closed" in str(failure)
    except Exception:  # noqa: BLE001 - a failure whose str() fails: ours
      return False
  return False


def tqdm_class(file):
  """The bar class for ``file``: tqdm.auto's (a notebook's widget where
  there is one) for the terminal, the plain one for a stream."""
  if file is None:
    from tqdm.auto import tqdm
  else:
    from tqdm import tqdm
  return tqdm


class Guarded:
  """A bar's stream as tqdm sees it: what a write or flush raises is kept
  (``failure``), for hostcall to raise once tqdm's call has returned and
  let go of its lock."""

  def __init__(self, stream):
    self._stream = stream
    self.failure: Exception | None = None
    # After its first failure the bar draws nothing more: one report, not
    # one a tick for the rest of a long loop.
    self.failed = False

  # (write and flush written out, not through one helper: tqdm calls them
  # several times a bar, on the delivery thread's path.)
  def write(self, text):
    if self.failed:
      return None
    write = self._stream.write  # (a stream without one: raised as it is)
    try:
      return write(text)
    except Exception as exc:  # noqa: BLE001 - raised by the bar's caller
      return self._failed(exc)

  def flush(self):
    if self.failed:
      return None
    try:
      flush = self._stream.flush
    except AttributeError:  # a stream without one: nothing to flush
      return None
    try:  # (one that is not callable fails here, as under tqdm)
      return flush()
    except Exception as exc:  # noqa: BLE001 - raised by the bar's caller
      return self._failed(exc)

  def _failed(self, exc: Exception) -> None:
    if _tqdm_stops_drawing_on(exc):
      raise exc  # tqdm's wrapper takes it (and lets go of its lock)
    self.failure, self.failed = exc, True

  def raise_failure(self) -> None:
    failure, self.failure = self.failure, None
    if failure is not None:
      raise failure

  def __getattr__(self, name):  # isatty, fileno, encoding: the stream's
    return getattr(self._stream, name)

  # tqdm.write() clears the bars drawn on the stream it writes to, which
  # it finds by comparing streams. (Unhashable, as equal to the stream.)
  def __eq__(self, other):
    return self._stream == getattr(other, "_stream", other)

  __hash__ = None


class _LoopRows:
  """The rows the open bars of Python loops (``python_loops.tqdm``) take: a
  compiled loop's bar opened meanwhile is drawn below them (and, by
  default, erased when done), as tqdm nests a bar opened inside another's
  loop. Thread-safe: bars open here from the delivery thread."""

  def __init__(self):
    self._lock = threading.Lock()
    self._rows: dict[int, int] = {}  # id(bar) -> its row

  def opened(self, bar, row: int) -> None:
    with self._lock:
      self._rows[id(bar)] = row

  def closed(self, bar) -> None:
    with self._lock:
      self._rows.pop(id(bar), None)

  def rows(self) -> int:
    """The first row below every open Python loop's bar (0: none open)."""
    with self._lock:
      return max(self._rows.values(), default=-1) + 1


loop_rows = _LoopRows()

"""What keeps a failing progress bar from hanging others: tqdm holds a
process-wide lock while it draws, and lets go of it only when drawing
returns. A stream whose write raised (a full disk, a closed pipe) or a
format that failed (a ``bar_format`` naming no field) left it held, and
every later bar drawn from another thread waited forever."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def unlocked_on_failure():
  """Around a call of tqdm's: where it raises, lets go of tqdm's lock if
  this thread took it in the call and still holds it."""
  import tqdm
  locks = getattr(tqdm.tqdm.get_lock(), "locks", ())
  held = [_held(lock) for lock in locks]
  try:
    yield
  except BaseException:
    for lock, was_held in zip(locks, held):
      while was_held is False and _held(lock):
        lock.release()
    raise


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
    self.failure: BaseException | None = None

  def write(self, text):
    try:
      return self._stream.write(text)
    except Exception as exc:  # noqa: BLE001 - raised by the bar's caller
      self.failure = self.failure or exc
      return 0

  def flush(self):
    try:
      flush = self._stream.flush
    except AttributeError:
      return None
    try:
      return flush()
    except Exception as exc:  # noqa: BLE001 - raised by the bar's caller
      self.failure = self.failure or exc
      return None

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

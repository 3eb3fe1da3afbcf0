"""Host function failures: rendered safely, logged, kept for whoever waits.

A tap's failure is postponed: logged when it happens and kept for the next
barrier, which raises ``CallbackException`` (``postpone``, ``take``).

When a host function of a call with results raises, its computation fails:
the runtime turns the exception into a ``jax.errors.JaxRuntimeError`` whose
text is the exception's formatted traceback. The runtime's C++ side cannot
carry every exception: text that is not valid UTF-8 (a lone surrogate, as
``os.fsdecode`` makes of a non-UTF-8 file name) or an ``__str__`` that
raises crashes the process, and a NUL byte cuts the text short. hostcall
hands the runtime an exception it can carry (the original when it is
harmless, else a ``HostFunctionError`` with an escaped rendering) and keeps
the original, so that ``hostcall.original_errors()`` can raise it again in
the caller.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import re
import threading
import traceback

from hostcall._core.results import ResultError

logger = logging.getLogger("hostcall")

_KEEP = 64  # originals kept for the caller, newest last
_lock = threading.Lock()
_originals: collections.OrderedDict[int, BaseException] = (
    collections.OrderedDict())
_ids = itertools.count(1)
_TAG = "hostcall host error #{}"
_TAG_PATTERN = re.compile(r"hostcall host error #(\d+)")


class CallbackException(Exception):
  """A host function run by a tap raised; raised by the next barrier.

  The message carries the original exception's text and host traceback, and
  the original exception is chained as ``__cause__``.
  """


class _Pending:
  """The exceptions taps raised since the last barrier (the last one, and
  how many)."""

  def __init__(self):
    self._lock = threading.Lock()
    self._last: tuple[BaseException, str] | None = None
    self._count = 0

  def record(self, exc: BaseException, formatted: str) -> None:
    with self._lock:
      self._last = (exc, formatted)
      self._count += 1

  def take(self) -> tuple[BaseException, str, int] | None:
    with self._lock:
      last, count = self._last, self._count
      self._last, self._count = None, 0
    return None if last is None else (*last, count)


_pending = _Pending()


def postpone(exc: BaseException, what) -> None:
  """Logs ``exc`` (raised by ``what``) with its traceback and keeps it for
  the next barrier: a failure that must not stop what is running. A failed
  check of the results (``is_check_failure``) shows its message alone, not
  hostcall's frames that checked them."""
  if is_check_failure(exc):
    exc = exc.with_traceback(None)
  formatted = format_safely(exc)
  logger.error("hostcall: %s raised; the next barrier will raise "
               "CallbackException.\n%s", what, formatted)
  _pending.record(exc, formatted)


def take_postponed() -> tuple[BaseException, str, int] | None:
  """``(last exception, its formatted traceback, count)`` of the failures
  postponed since the last call, or None; forgets them."""
  return _pending.take()


def raise_postponed() -> None:
  """Raises ``CallbackException`` for the failures postponed so far."""
  failure = take_postponed()
  if failure is not None:
    exc, formatted, count = failure
    raise CallbackException(
        "There were exceptions during callback processing. Last one was: "
        f"{formatted}\n(hostcall: {count} tap function call(s) raised since "
        "the last barrier; each was logged when it happened.)") from exc


class HostFunctionError(RuntimeError):
  """Stands in, inside the runtime, for a host function's exception whose
  text the runtime cannot carry (a lone surrogate, a NUL byte, an
  ``__str__`` that raises); its message is an escaped rendering, and
  ``hostcall.original_errors()`` raises the original instead.

  Example:
    >>> import jax, hostcall
    >>> class Opaque(Exception):
    ...   def __str__(self):
    ...     raise RuntimeError
    >>> def host(x):
    ...   raise Opaque()
    >>> f = jax.jit(lambda x: hostcall.pure_callback(
    ...     host, jax.ShapeDtypeStruct((), x.dtype), x))
    >>> try:
    ...   f(1.0)
    ... except Exception as e:
    ...   print("HostFunctionError" in str(e), type(hostcall.original_error(e)).__name__)
    True Opaque
  """


def safe_str(value) -> str:
  """``str(value)``, never raising, as text any UTF-8 stream can carry
  (lone surrogates and NUL bytes escaped)."""
  try:
    text = str(value)
  except BaseException:  # noqa: BLE001 - a broken __str__ is data here
    try:
      text = object.__repr__(value)
    except BaseException:  # noqa: BLE001
      text = "<unprintable>"
    text = f"<str() failed: {text}>"
  return _escape(text)


def _escape(text: str) -> str:
  text = text.encode("utf-8", "backslashreplace").decode("utf-8")
  return text.replace("\x00", "\\x00")


def describe(exc: BaseException) -> str:
  """``TypeName: message`` of an exception, safely."""
  return f"{type(exc).__name__}: {safe_str(exc)}"


def format_safely(exc: BaseException) -> str:
  """The exception's traceback, as ``traceback`` formats it, safely."""
  try:
    text = "".join(traceback.format_exception(type(exc), exc,
                                              exc.__traceback__))
  except BaseException:  # noqa: BLE001 - a pathological exception
    text = describe(exc) + "\n"
  return _escape(text)


def _carryable(exc: BaseException) -> bool:
  """Whether the runtime can turn ``exc`` into its error text unharmed."""
  try:
    text = "".join(traceback.format_exception(type(exc), exc,
                                              exc.__traceback__))
    text.encode("utf-8")
  except BaseException:  # noqa: BLE001
    return False
  return "\x00" not in text and "<exception str() failed>" not in text


def _keep(exc: BaseException) -> int:
  with _lock:
    key = next(_ids)
    _originals[key] = exc
    while len(_originals) > _KEEP:
      _originals.popitem(last=False)
  return key


_PACKAGE_DIR = __file__.rsplit("_runtime", 1)[0]  # hostcall's own files


def _user_frames(tb):
  """``tb`` without hostcall's own frames in front of the user's."""
  while tb is not None and tb.tb_frame.f_code.co_filename.startswith(
      _PACKAGE_DIR):
    tb = tb.tb_next
  return tb


def is_check_failure(exc: BaseException) -> bool:
  """Whether ``exc`` is hostcall's own check of a host function's results
  failing (a ``ResultError``: a wrong shape, dtype or number of results),
  not the host function raising. Its message names the function and what
  it returned; as JAX's own check, it is not logged, and it carries no
  hostcall frames nor a note repeating it."""
  return isinstance(exc, ResultError)


def for_runtime(exc: BaseException, label: str) -> BaseException:
  """What to raise into the runtime for ``exc``, a host function's failure.

  The original, its traceback starting at the host function and with a note
  that names its id and how to get it back (``hostcall.original_errors()``),
  when the runtime can carry it (so the error text is the one JAX users
  know); otherwise a ``HostFunctionError`` carrying an escaped rendering
  and the same tag. A failed check of the results (``is_check_failure``)
  is raised without a traceback (its frames are hostcall's) or a note, so
  that the runtime's text shows its message once, last, as JAX's text
  shows its own check's; ``original_error`` finds it by that text.
  """
  if is_check_failure(exc) and _carryable(exc):
    exc = exc.with_traceback(None)
    _keep(exc)
    return exc
  user_tb = _user_frames(exc.__traceback__)
  if user_tb is not None:
    exc = exc.with_traceback(user_tb)
  key = _keep(exc)
  tag = _TAG.format(key)
  # (A message's closing period is dropped before the semicolon.)
  raised = describe(exc).rstrip()
  raised = raised[:-1] if raised.endswith(".") else raised
  note = (f"[{tag}: the host function of {label} raised {raised}; "
          f"`with hostcall.original_errors():` around the JAX call raises "
          f"this {type(exc).__name__} itself]")
  if _carryable(exc):
    try:
      notes = list(getattr(exc, "__notes__", None) or [])
      exc.__notes__ = [n for n in notes if not _TAG_PATTERN.search(str(n))] + [
          note]
      return exc
    except BaseException:  # noqa: BLE001 - an exception without a __dict__
      pass
  replacement = HostFunctionError(
      f"{label}: the host function raised {format_safely(exc)}{note}")
  replacement.__suppress_context__ = True
  return replacement


# The loggers and words JAX logs a failed host function with (its
# ``logger.exception`` in jax/_src/callback.py and debugging.py), so that a
# filter written for JAX's record (equinox installs one) also takes ours.
_JAX_LOGGERS = {"jax.pure_callback": "jax._src.callback",
                "jax.io_callback": "jax._src.callback",
                "jax.debug.callback": "jax._src.debugging"}


def log_failure(label: str, exc: BaseException,
                jax_name: str | None = None) -> None:
  """Logs a failed host call at ERROR, with its traceback.

  Where it stands in for a JAX function (``jax_name``), the record is
  JAX's own: on JAX's logger, the message ``"<jax_name> failed"`` and the
  exception as ``exc_info`` (hostcall's pointers ride on the exception's
  notes, which the traceback shows). Otherwise on the ``hostcall`` logger,
  naming ``label``. An exception whose text a stream cannot carry is
  logged as a ``HostFunctionError`` with an escaped rendering. A failed
  check of the results (``is_check_failure``) is not logged: the error
  the call raises says it, as JAX's own check is not logged either."""
  if is_check_failure(exc):
    return
  if not _carryable(exc):
    exc = HostFunctionError(
        f"{label}: the host function raised {format_safely(exc)}")
  if jax_name in _JAX_LOGGERS:
    logging.getLogger(_JAX_LOGGERS[jax_name]).error(
        "%s failed", jax_name, exc_info=(type(exc), exc, exc.__traceback__))
  else:
    logger.error("%s failed: %s", label, describe(exc),
                 exc_info=(type(exc), exc, exc.__traceback__))


def summary(error: BaseException) -> str | None:
  """One line saying which host function's exception failed the JAX call
  ``error`` and how to get it back, or None when no host function did."""
  original = original_error(error)
  if original is None or original is error or is_check_failure(original):
    return None  # (a failed check's message ends the error's text already)
  return (f"hostcall: the JAX call failed because a host function raised "
          f"{describe(original)}; `with hostcall.original_errors():` around "
          f"the call raises that {type(original).__name__} itself.")


def _shows(text: str, original: BaseException) -> bool:
  """Whether the runtime's error ``text`` is ``original``'s traceback."""
  if not text.rstrip().endswith(describe(original).rstrip()):
    return False
  tb = original.__traceback__
  if tb is None:
    return True
  while tb.tb_next is not None:
    tb = tb.tb_next
  code = tb.tb_frame.f_code
  # The runtime writes the frame's last line run (where a ``finally``
  # ran after the raise), Python's traceback the line that raised.
  return any(f'File "{code.co_filename}", line {line}, in {code.co_name}'
             in text for line in {tb.tb_lineno, tb.tb_frame.f_lineno})


def original_error(error: BaseException) -> BaseException | None:
  """The host function's exception behind ``error``, or None.

  Arguments:
    error: the exception a JAX call raised (usually a
      ``jax.errors.JaxRuntimeError``).

  Returns:
    The exception object the host function raised (its type, ``args`` and
    ``__traceback__`` intact), if hostcall still keeps it (the last 64).

  Example:
    >>> import jax, hostcall
    >>> def lookup(k):
    ...   raise KeyError(int(k))
    >>> f = jax.jit(lambda k: hostcall.pure_callback(
    ...     lookup, jax.ShapeDtypeStruct((), k.dtype), k))
    >>> try:
    ...   f(3)
    ... except Exception as e:
    ...   print(repr(hostcall.original_error(e)))
    KeyError(3)
  """
  if error is not None and not isinstance(error, BaseException):
    raise TypeError(
        f"original_error takes the exception a JAX call raised (as in "
        f"`except Exception as e: hostcall.original_error(e)`), got "
        f"{error!r} of type {type(error).__name__}.")
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    text = safe_str(error)
    found = _TAG_PATTERN.findall(text)
    with _lock:
      if found:
        return _originals.get(int(found[-1]))
      # The runtime's text is the original's traceback: it ends with the
      # original's last line and shows its innermost frame.
      for original in reversed(_originals.values()):
        if _shows(text, original):
          return original
    error = error.__cause__ or error.__context__
  return None


class original_errors(contextlib.ContextDecorator):  # noqa: N801 - as open()
  """Raises host functions' own exceptions out of the JAX calls they failed.

  Inside the block, a JAX call that failed because a host function raised
  re-raises that exception (say a ``KeyError``, with its host traceback),
  the runtime's ``JaxRuntimeError`` attached as its ``__context__``. Other
  errors pass unchanged. Also usable as a decorator.

  Example:
    >>> import jax, hostcall
    >>> def lookup(k):
    ...   raise KeyError(int(k))
    >>> f = jax.jit(lambda k: hostcall.pure_callback(
    ...     lookup, jax.ShapeDtypeStruct((), k.dtype), k))
    >>> try:
    ...   with hostcall.original_errors():
    ...     f(3)
    ... except KeyError as e:
    ...   print("caught", repr(e))
    caught KeyError(3)
  """

  def __enter__(self) -> "original_errors":
    return self

  def __exit__(self, exc_type, error, tb) -> bool:
    # A class, not a generator: a StopIteration the host function raised
    # comes out as itself.
    if error is None or not isinstance(error, Exception):
      return False
    original = original_error(error)
    if original is None or original is error:
      return False
    original.__context__ = error
    raise original.with_traceback(original.__traceback__)

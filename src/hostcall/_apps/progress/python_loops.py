"""Progress bars for Python loops: ``hostcall.progress.tqdm`` and ``trange``.

A tqdm bar (tqdm.auto's class: a notebook's widget where tqdm.auto draws
one) counting the iterations of the user's Python loop, whose postfix and
description also take JAX arrays that are still being computed. Reading
such an array's value waits for its computation, which would stop the loop
from dispatching its next step before the last has run: the bar keeps the
arrays instead, starts their copies to the host, and shows the newest one
that is ready whenever it redraws (at the loop's next iterations); closing
the bar waits for them. While such a bar is open, the bars of compiled
loops (``bars.py``) are drawn under it and erased when done, as tqdm's
nested bars are (``tqdm_guard.loop_rows``).
"""

from __future__ import annotations

import collections
import logging
import numbers
import sys
import threading
from typing import Iterable

import numpy as np

from hostcall import _jax_private
from hostcall._apps.progress import tqdm_guard
from hostcall._runtime.barriers import wait_without_raising
from hostcall._core.context import why_waiting_is_forbidden

logger = logging.getLogger("hostcall")

#: What a postfix value or description shows before its first array is
#: ready.
PENDING = "..."

#: Arrays of one postfix key kept waiting at most (the newest): a loop that
#: dispatches far ahead of its device shows an older value, not none.
KEPT_ARRAYS = 64


def _is_live(value) -> bool:
  """Whether ``value`` is a JAX array whose value may still be computed
  (a tracer has no value to wait for: tqdm prints it as it is)."""
  import jax
  return (isinstance(value, jax.Array)
          and not isinstance(value, _jax_private.Tracer)
          and hasattr(value, "is_ready"))


def _ready(array) -> bool | None:
  """Whether ``array``'s value is computed; None where it never will be
  (deleted or donated: it is dropped)."""
  try:
    return bool(array.is_ready())
  except Exception:  # noqa: BLE001 - a deleted array: nothing to show
    return None


class _Live:
  """One postfix value (or the description) given as JAX arrays: the
  arrays not yet shown, oldest first, and the text of the newest shown."""

  __slots__ = ("pending", "text")

  def __init__(self, text: str | None = None):
    self.pending: collections.deque = collections.deque(maxlen=KEPT_ARRAYS)
    self.text = text

  def push(self, array) -> "_Live":
    # Started now, the copy to the host is usually done when the array is
    # ready: showing it then costs no wait.
    copy = getattr(array, "copy_to_host_async", None)
    if copy is not None:
      try:
        copy()
      except Exception:  # noqa: BLE001 - shown when ready all the same
        pass
    self.pending.append(array)
    return self

  def resolve(self, show) -> str:
    """The text of the newest array that is ready (arrays are computed in
    the order they were dispatched: the older ones are dropped)."""
    newest = None
    while self.pending:
      ready = _ready(self.pending[0])
      if ready is False:
        break
      array = self.pending.popleft()
      if ready:
        newest = array
    if newest is not None:
      try:
        self.text = show(np.asarray(newest))
      except Exception as exc:  # noqa: BLE001 - its computation failed
        self.text = f"<{type(exc).__name__}>"
    return PENDING if self.text is None else self.text

  def wait(self) -> None:
    """Waits for the newest array (closing a bar that stays on screen)."""
    if self.pending:
      try:
        self.pending[-1].block_until_ready()
      except Exception:  # noqa: BLE001 - shown as failed by resolve
        pass


class tqdm:  # noqa: N801 - tqdm's name, as tqdm's users write it
  """A tqdm progress bar for a Python loop whose postfix and description
  take JAX arrays still being computed, without waiting for them.

  tqdm's API and conventions (it is tqdm.auto's class underneath: a
  notebook's widget in a notebook, the terminal's stderr elsewhere): an
  iterator, a context manager, ``update``, ``close``, ``refresh``,
  ``set_postfix``, ``set_postfix_str``, ``set_description``,
  ``set_description_str`` and ``tqdm.write``; the bar counts iterations of
  your loop and its rate is your loop's.

  Arguments:
    iterable: what the loop iterates over (None: ``update`` moves the bar).
    **tqdm_kwargs: tqdm's arguments (``total``, ``desc``, ``leave``,
      ``disable``, ``position``, ``file``, ``unit``, ``postfix``, ...),
      passed to tqdm unchanged; ``desc`` and ``postfix`` values may be JAX
      arrays, as in ``set_description`` and ``set_postfix``.

  Returns:
    The bar (an instance of tqdm.auto's class, or tqdm's own where ``file``
    is given, and of this one).

  ``set_postfix(loss=loss)`` (or ``set_postfix({"loss": loss})``) with a
  JAX array returns at once: the bar keeps the array, starts its copy to the
  host and shows its value once it is computed, at the bar's next redraw
  (until then the newest value that is, or ``...``). ``set_description``
  takes an array as well. Closing the bar (the loop's end) waits until the
  computations dispatched so far have reached the host, as
  ``hostcall.barrier()`` does but raising nothing, and, where the bar stays
  on screen, for the values it shows: its last line shows the last loss,
  its time the loop's real time, and the bars of compiled loops those
  computations ran are nested under it. While this bar is open, the bar of
  a compiled loop (``hostcall.progress.scan`` and the others) is drawn on
  the rows below it and, unless given ``leave``, erased when done (tqdm's
  convention for nested bars), so a loop calling a jitted function 100 times
  leaves one bar on screen, not 101.

  Example:
    >>> import io, jax, jax.numpy as jnp, hostcall
    >>> out = io.StringIO()
    >>> step = jax.jit(lambda w: (w * 0.5, jnp.sum(w * w)))
    >>> w = jnp.ones(3)
    >>> with hostcall.progress.tqdm(range(4), desc="fit", file=out) as bar:
    ...   for i in bar:
    ...     w, loss = step(w)
    ...     bar.set_postfix(loss=loss)   # does not wait for the step
    >>> "4/4" in out.getvalue() and "loss=0.0469" in out.getvalue()
    True
  """

  _classes: dict = {}
  _classes_lock = threading.Lock()

  def __new__(cls, *args, **kwargs):
    if cls is tqdm:
      # tqdm.auto's class is chosen when a bar is first made (a notebook
      # known by then), not when hostcall is imported.
      cls = _with_base(tqdm_guard.tqdm_class(kwargs.get("file")))
    return super(tqdm, cls).__new__(cls, *args, **kwargs)

  def __init__(self, iterable: Iterable | None = None, *args, **kwargs):
    desc = kwargs.get("desc")
    live_desc = _is_live(desc)
    if live_desc:
      kwargs["desc"] = None  # tqdm's bool(desc) would wait for it
    self._hostcall_postfix: collections.OrderedDict = (
        collections.OrderedDict())
    self._hostcall_desc: _Live | None = None
    self._hostcall_suffix = ": "
    self._hostcall_thread = threading.get_ident()
    super().__init__(iterable, *args, **kwargs)
    if live_desc:
      self.set_description(desc)
    if not self.disable:
      tqdm_guard.loop_rows.opened(self, abs(self.pos))

  # -- values ------------------------------------------------------------

  def set_postfix(self, ordered_dict=None, refresh: bool = True,
                  **kwargs) -> None:
    """tqdm's ``set_postfix``; a value that is a JAX array is shown once it
    is computed, without waiting for it."""
    if getattr(self, "disable", False):
      return  # drawn nowhere: no array kept
    items = collections.OrderedDict(
        [] if ordered_dict is None else ordered_dict)
    for key in sorted(kwargs):  # tqdm's order
      items[key] = kwargs[key]
    before = getattr(self, "_hostcall_postfix", {})
    cells = collections.OrderedDict()
    for key, value in items.items():
      if _is_live(value):
        cell = before.get(key)
        # The same key's older arrays stay: those the device reaches first.
        cells[key] = (cell if isinstance(cell, _Live) else _Live()).push(
            value)
      elif isinstance(value, numbers.Number):  # tqdm's rule: bools too
        cells[key] = self.format_num(value)
      elif isinstance(value, str):
        cells[key] = value
      else:
        cells[key] = str(value)
    self._hostcall_postfix = cells
    self._render_postfix()
    if refresh:
      self.refresh()

  def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
    """tqdm's ``set_postfix_str``: the postfix as it is."""
    self._hostcall_postfix = collections.OrderedDict()
    super().set_postfix_str(s, refresh=refresh)

  def set_description(self, desc=None, refresh: bool = True) -> None:
    """tqdm's ``set_description`` (``desc: ``); ``desc`` may be a JAX
    array, shown once computed."""
    self._describe(desc, ": ", refresh)

  def set_description_str(self, desc=None, refresh: bool = True) -> None:
    """tqdm's ``set_description_str`` (no ``": "``); ``desc`` may be a JAX
    array, shown once computed."""
    self._describe(desc, "", refresh)

  def _describe(self, desc, suffix: str, refresh: bool) -> None:
    if _is_live(desc):
      cell = getattr(self, "_hostcall_desc", None)
      self._hostcall_desc = (cell or _Live()).push(desc)
      self._hostcall_suffix = suffix
      self._render_desc()
    else:
      self._hostcall_desc = None
      self.desc = (desc + suffix if suffix else desc) if desc else ""
    if refresh:
      self.refresh()

  def _show(self, value: np.ndarray) -> str:
    if value.size == 1:
      return self.format_num(value.reshape(()).item())
    return str(value)

  def _render_postfix(self) -> None:
    cells = getattr(self, "_hostcall_postfix", None)
    if not cells:
      return
    texts = ((key, cell.resolve(self._show) if isinstance(cell, _Live)
              else cell) for key, cell in cells.items())
    self.postfix = ", ".join(f"{key}={text.strip()}" for key, text in texts)

  def _render_desc(self) -> None:
    cell = getattr(self, "_hostcall_desc", None)
    if cell is not None:
      self.desc = cell.resolve(self._show) + self._hostcall_suffix

  @property
  def format_dict(self):
    """tqdm's, with the arrays computed by now shown (tqdm reads it at
    every redraw)."""
    self._render_postfix()
    self._render_desc()
    return super().format_dict

  # -- closing -----------------------------------------------------------

  def close(self) -> None:
    """Closes the bar: first waits until the computations dispatched so far
    have reached the host (raising nothing) and, where the bar stays on
    screen, for the values it shows."""
    if not getattr(self, "disable", True):
      try:
        self._wait_without_raising()
      finally:
        tqdm_guard.loop_rows.closed(self)
    super().close()

  def _wait_without_raising(self) -> None:
    # Only the thread that made the bar waits, and not a host function
    # (its computation could not end before it) or the interpreter's exit.
    if (threading.get_ident() != getattr(self, "_hostcall_thread", None)
        or why_waiting_is_forbidden() is not None or sys.is_finalizing()):
      return
    try:
      wait_without_raising()
    except Exception:  # noqa: BLE001 - a bar's close must not fail the loop
      logger.exception("hostcall: waiting for the loop's host calls failed")
    pos = abs(getattr(self, "pos", 0))
    if (pos == 0 if self.leave is None else self.leave):
      for cell in [*getattr(self, "_hostcall_postfix", {}).values(),
                   getattr(self, "_hostcall_desc", None)]:
        if isinstance(cell, _Live):
          cell.wait()

  def __del__(self):
    # Collected unclosed (on whichever thread collects it): closed without
    # waiting for anything.
    self._hostcall_thread = None
    super().__del__()

  @classmethod
  def write(cls, s: str, file=None, end: str = "\n",
            nolock: bool = False) -> None:
    """tqdm's ``tqdm.write``: prints ``s`` above the open bars."""
    if cls is tqdm:  # called on this class, not on a bar's
      return tqdm_guard.tqdm_class(file).write(s, file=file, end=end,
                                               nolock=nolock)
    return super().write(s, file=file, end=end, nolock=nolock)


def _with_base(base) -> type:
  """``tqdm`` on top of tqdm's class ``base`` (made once a base)."""
  with tqdm._classes_lock:
    made = tqdm._classes.get(base)
    if made is None:
      made = tqdm._classes[base] = type(
          "tqdm", (tqdm, base), {"__module__": "hostcall.progress",
                                 "__doc__": tqdm.__doc__})
    return made


def trange(*args, **tqdm_kwargs) -> tqdm:
  """``hostcall.progress.tqdm(range(*args), **tqdm_kwargs)``.

  Arguments:
    *args: ``range``'s arguments.
    **tqdm_kwargs: as for ``hostcall.progress.tqdm``.

  Returns:
    The bar, an iterator over the range.

  Example:
    >>> import io, hostcall
    >>> out = io.StringIO()
    >>> sum(i for i in hostcall.progress.trange(10, file=out))
    45
    >>> "10/10" in out.getvalue()
    True
  """
  return tqdm(range(*args), **tqdm_kwargs)

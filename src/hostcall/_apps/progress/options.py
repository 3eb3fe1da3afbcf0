"""A progress bar's options: checked when the loop is traced, and gathered
into the ``BarSpec`` the host draws the bar from (``bars.py``)."""

from __future__ import annotations

import difflib
import inspect
import math
import numbers

import numpy as np

from hostcall import _jax_private
from hostcall._apps.progress import bars as _bars


def _tqdm_options() -> frozenset:
  """The keyword options a tqdm bar takes (those hostcall sets aside)."""
  import tqdm
  names = set(inspect.signature(tqdm.tqdm.__init__).parameters)
  return frozenset(names - {"self", "iterable", "kwargs", "desc", "total",
                            "unit", "position", "leave", "file"})


def _real(low, high=math.inf, *, open_low=False):
  def check(value):
    return (isinstance(value, numbers.Real)
            and not isinstance(value, (bool, np.bool_))
            and (low < value if open_low else low <= value) and value <= high)
  return check


def _of(*types):
  return lambda value: isinstance(value, types)


def _integer(value) -> bool:
  return (isinstance(value, numbers.Integral)
          and not isinstance(value, (bool, np.bool_)) and value >= 0)


def _optional(check):
  return lambda value: value is None or check(value)


def _writable(value) -> bool:
  return value is None or callable(getattr(value, "write", None))


# What each bar option takes: checked when the loop is traced, where a bad
# value would otherwise fail in tqdm on the delivery thread, the loop
# already running. tqdm's options not listed (a newer tqdm's) go unchecked.
_BAR_OPTIONS = {
    "desc": (_optional(_of(str)), "a str or None"),
    "unit": (_of(str), "a str"),
    "leave": (_optional(_of(bool)), "True, False or None (default: only "
              "outermost bars)"),
    "file": (_writable, "None (the terminal or notebook) or an object with "
             "a write() method, e.g. sys.stdout or io.StringIO()"),
    "all_processes": (_of(bool), "True or False"),
    "ncols": (_optional(_integer), "an int >= 0 or None"),
    "nrows": (_optional(_integer), "an int >= 0 or None"),
    "mininterval": (_real(0), "a number of seconds >= 0"),
    "maxinterval": (_real(0), "a number of seconds >= 0"),
    "miniters": (_optional(_real(0)), "a number >= 0 or None"),
    "ascii": (lambda v: v is None or isinstance(v, bool)
              or (isinstance(v, str) and len(v) >= 2),
              "True, False, None or a str of at least 2 characters"),
    "disable": (_optional(_of(bool)), "True, False or None"),
    "unit_scale": (lambda v: isinstance(v, bool) or _real(0, open_low=True)(v),
                   "True, False or a number > 0"),
    "dynamic_ncols": (_of(bool), "True or False"),
    "smoothing": (_real(0, 1), "a number from 0 to 1"),
    "bar_format": (_optional(_of(str)), "a str or None"),
    "initial": (_real(0), "a number >= 0"),
    "postfix": (_optional(_of(str)), "a str or None"),
    "unit_divisor": (_real(0, open_low=True), "a number > 0"),
    "write_bytes": (_of(bool), "True or False"),
    "lock_args": (_optional(_of(tuple)), "a tuple or None"),
    "colour": (_optional(_of(str)), "a colour name or hex code (str), or "
               "None"),
    "delay": (_real(0), "a number of seconds >= 0"),
    "gui": (_of(bool), "True or False"),
}


def _check_bar_options(options: dict) -> None:
  """Refuses, when the loop is traced, a bar option tqdm would refuse when
  it draws, naming the option, what came and what it takes."""
  for name, value in options.items():
    rule = _BAR_OPTIONS.get(name)
    if rule is None or rule[0](value):
      continue
    if isinstance(value, _jax_private.Tracer):
      got = (f"a traced value ({value!r}); bar options are fixed when the "
             "loop is traced: pass a Python value")
    else:
      got = f"{value!r} of type {type(value).__name__}"
    raise TypeError(f"hostcall.progress: {name}= takes {rule[1]}, got {got}.")


def spec(desc, total, unit, leave, file, all_processes, options, *,
         position: int) -> _bars.BarSpec:
  """A loop's bar, its options checked: ``position`` is the bar's row (the
  loop's nesting depth), ``options`` tqdm's further options."""
  if "total" in options:
    raise TypeError(
        f"hostcall.progress: the loop's length is the bar's total (scan and "
        f"fori_loop know it), got total={options['total']!r}; leave it out "
        "(hostcall.progress.while_loop takes total= where you know it).")
  if "position" in options:
    raise TypeError(
        f"hostcall.progress sets a bar's position itself (nested progress "
        f"loops draw nested bars), got position={options['position']!r}; "
        "leave it out.")
  _check_bar_options(dict(desc=desc, unit=unit, leave=leave, file=file,
                          all_processes=all_processes, **options))
  unknown = sorted(set(options) - _tqdm_options())
  if unknown:
    hints = []
    for name in unknown:
      close = difflib.get_close_matches(
          name, sorted(_tqdm_options()) + ["desc", "every", "unit", "leave",
                                           "file", "all_processes"], n=1)
      hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close
                                  else ""))
    raise TypeError(
        f"hostcall.progress got unknown option(s) {', '.join(hints)}. It "
        "takes desc, every, unit, leave, file, all_processes and tqdm's "
        f"options: {', '.join(sorted(_tqdm_options()))}.")
  try:
    items = tuple(sorted(options.items()))
    hash(items)
  except TypeError:
    raise TypeError(f"progress bar options must be hashable, got "
                    f"{options!r}") from None
  return _bars.BarSpec(
      desc=desc, total=total, unit=unit, position=position,
      leave=None if leave is None else bool(leave), file=file,
      all_processes=bool(all_processes), options=items)


"""The postfix of a compiled loop's bar: ``hostcall.progress.set_postfix``,
called in the loop's body while it is traced, and the text the bar shows.

A value known when the body is traced (a Python number, a str) is
formatted then, by tqdm's rules; a JAX scalar (the loss) is carried in the
loop's state and reaches the host with the bar's next tick
(``loops/tick_values.py``), where it is formatted as tqdm formats the
number it holds. Under ``vmap`` a value has one number per lane: the bar
shows their range.
"""

from __future__ import annotations

import collections
import numbers

import jax.numpy as jnp
import numpy as np

from hostcall import _jax_private
from hostcall._apps.loops import tick_values as _tick_values


def set_postfix(ordered_dict=None, refresh: bool = True, **kwargs) -> None:
  """Shows values on the bar of the progress loop whose body calls it
  (tqdm's ``set_postfix``, for a compiled loop).

  Call it in the body of ``hostcall.progress.scan``, ``fori_loop``,
  ``while_loop`` or a body decorated by ``track``, with the values of the
  step (JAX scalars such as the loss, Python numbers, text). The bar shows
  the latest step's values at each of its ticks: they ride in the loop's
  state and on the tick the bar already makes (no host call of their own).
  They are formatted as tqdm formats them: numbers with
  ``tqdm.format_num`` (3 significant digits; a bool as ``1``/``0``), text
  as it is, in tqdm's order (``ordered_dict``'s, then ``kwargs`` sorted).
  As in tqdm, each call replaces the postfix: the last call of a step
  wins.

  Arguments:
    ordered_dict: a mapping of values (kept in its order), or None.
    refresh: tqdm's; the bar redraws at its next tick either way.
    **kwargs: more values, shown sorted by key.

  Under ``vmap`` of the loop, a value has one number per lane: the bar
  shows their range, ``low..high`` (one number where every lane agrees,
  ``nan`` where a lane holds NaN). Under ``shard_map`` or ``pmap`` the
  range spans the devices too.

  Raises:
    RuntimeError: called outside the body of a progress loop (a Python
      loop's bar has its own: ``bar.set_postfix``), or in a ``cond``,
      ``vmap``, ``jit`` or inner loop inside the body (return the value to
      the body and call it there).
    TypeError: a value that is not a number or text (a JAX array of more
      than one number: reduce it first, e.g. ``jnp.mean(x)``).

  Example:
    >>> import io, jax, jax.numpy as jnp, hostcall
    >>> out = io.StringIO()
    >>> def step(w, _):
    ...   loss = jnp.sum(w * w)
    ...   hostcall.progress.set_postfix(loss=loss, phase="fit")
    ...   return w * 0.5, None
    >>> w, _ = hostcall.progress.scan(step, jnp.ones(3), length=20,
    ...                               desc="fit", file=out)
    >>> hostcall.barrier(); "20/20" in out.getvalue()
    True
    >>> "loss=1.09e-11, phase=fit" in out.getvalue()
    True
  """
  del refresh  # the bar redraws at its next tick
  frame = _frame()
  items = collections.OrderedDict(
      [] if ordered_dict is None else ordered_dict)
  for key in sorted(kwargs):  # tqdm's order
    items[key] = kwargs[key]
  frame.items = tuple((_key(key), _value(key, value, frame))
                      for key, value in items.items())


def _frame() -> _tick_values.Frame:
  """The progress loop body being traced here, which ``set_postfix``
  writes to; refuses a call anywhere else."""
  frame = _tick_values.innermost()
  if frame is None:
    raise RuntimeError(
        "hostcall.progress.set_postfix is called in the body of a progress "
        "loop (hostcall.progress.scan, fori_loop, while_loop, or a body "
        "decorated by track), while it is traced; it was called outside "
        "any. For a Python loop's bar, call the bar's own: `for i in (bar "
        ":= hostcall.progress.trange(n)): ... bar.set_postfix(loss=loss)`.")
  if frame.refusal is not None:
    raise RuntimeError(
        f"hostcall.progress.set_postfix: the loop body that calls it has no "
        f"bar to show values on: {frame.refusal}. Call it in the body of a "
        "hostcall.progress loop.")
  with _jax_private.take_current_trace() as trace:
    if trace is not frame.trace:
      raise RuntimeError(_NESTED)
  return frame


_NESTED = (
    "hostcall.progress.set_postfix is called in the body of a progress loop "
    "itself, not inside a transformation or loop within it (lax.cond, "
    "lax.scan, vmap, jit, checkpoint...): its values reach the bar from "
    "the body's own step. Return the value from the inner function and call "
    "set_postfix with it in the body.")


def _key(key) -> str:
  if not isinstance(key, str):
    raise TypeError(
        f"hostcall.progress.set_postfix: a key is a str (shown as "
        f"key=value), got {key!r} of type {type(key).__name__}.")
  return key


def _value(key: str, value, frame):
  """A value as the engine keeps it: its text where known when traced,
  else a scalar array of the body's trace."""
  if not _tick_values.is_array(value):
    return _static_text(value)
  trace = _jax_private.trace_of(value)
  if trace is not None and trace is not frame.trace:
    raise RuntimeError(_NESTED)
  dtype = jnp.result_type(value)
  if not (jnp.issubdtype(dtype, jnp.number) or dtype == jnp.bool_):
    raise TypeError(
        f"hostcall.progress.set_postfix: {key}= takes a number or text, got "
        f"an array of {dtype}.")
  if jnp.size(value) != 1:
    raise TypeError(
        f"hostcall.progress.set_postfix: {key}= takes one number (a scalar; "
        f"under vmap, one a lane), got an array of shape "
        f"{list(jnp.shape(value))}. Reduce it first, e.g. "
        f"{key}=jnp.mean(x), or pick one element.")
  return jnp.reshape(value, ())


def _static_text(value) -> str:
  """tqdm's ``set_postfix`` rule: a number through ``format_num``, text as
  it is, anything else as ``str``; stripped."""
  from tqdm import tqdm
  if isinstance(value, numbers.Number):
    return tqdm.format_num(value).strip()
  return (value if isinstance(value, str) else str(value)).strip()


def text(values: dict, format_num) -> str:
  """The postfix of a bar: ``values`` maps each device to the values of
  its latest tick, ``((key, text or array over the lanes), ...)``;
  ``format_num``: the bar's (tqdm's)."""
  merged: dict = {}
  for device_values in values.values():
    for key, value in device_values:
      if isinstance(value, str):
        merged[key] = value
      else:
        merged.setdefault(key, []).append(np.ravel(np.asarray(value)))
  texts = ((key, value if isinstance(value, str)
            else _summary(value, format_num))
           for key, value in merged.items())
  # (A value of no number, a vmap of no lane's, is not shown.)
  return ", ".join(f"{key}={text}" for key, text in texts
                   if text is not None)


def _summary(parts: list, format_num) -> str | None:
  """One value's text: the number as tqdm shows it, or, over several lanes
  or devices, their range; None where it holds no number."""
  numbers_ = np.concatenate(parts)
  if numbers_.size == 0:
    return None
  if numbers_.size == 1 or np.all(numbers_ == numbers_[0]):
    return _shown(numbers_[0], format_num)
  if numbers_.dtype != np.bool_ and np.isnan(numbers_).any():
    return "nan"  # a lane's NaN is what the user must see
  low, high = numbers_.min(), numbers_.max()
  return f"{_shown(low, format_num)}..{_shown(high, format_num)}"


def _shown(number, format_num) -> str:
  """A number as tqdm's ``set_postfix`` shows the Python number it is."""
  return format_num(np.asarray(number).item()).strip()

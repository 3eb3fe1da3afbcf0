"""Values a chunked loop's body hands to its ticks (what a progress bar
shows as its postfix): set while the body is traced, carried in the loop's
state from step to step, and sent among the operands of the tick that
follows each chunk, so that they cost no host call of their own.

A body's values are known once it is traced, and a loop's carry needs its
shape before: a loop traces its body first with no room for values, and a
body that sets some raises ``Retrace`` at the end of that trace (before
the loop binds anything), which the loop (``Slots.run``) catches to trace
it again with room for them. A loop whose body sets none is traced as
before. A body decorated by ``track`` has no carry: its values go with its
step's call, in the same trace.

What the application checks and shows is its own (``progress.postfix``):
the engine keeps, for each value, its key and either a text known when the
body was traced or a traced scalar, whose value reaches the host with the
tick.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from hostcall import _jax_private

_local = threading.local()


def _frames() -> list:
  if not hasattr(_local, "frames"):
    _local.frames = []
  return _local.frames


class Frame:
  """One loop body being traced here, and what it set.

  Attributes:
    refusal: None where the loop's ticks take values, else why they do
      not (a loop no bar draws): the application's error says it.
    trace: the JAX trace of the body (values set from another trace, a
      ``cond`` or ``vmap`` inside the body, cannot leave it).
    items: the values the body set last: ``((key, value), ...)``, each
      value a str or a scalar array of the body's trace; None until set.
  """

  __slots__ = ("refusal", "trace", "items")

  def __init__(self, refusal: str | None):
    self.refusal = refusal
    with _jax_private.take_current_trace() as trace:
      self.trace = trace
    self.items: tuple | None = None


def innermost() -> Frame | None:
  """The loop body being traced here, innermost first; None outside any."""
  frames = _frames()
  return frames[-1] if frames else None


@contextlib.contextmanager
def _framed(refusal: str | None):
  frame = Frame(refusal)
  _frames().append(frame)
  try:
    yield frame
  finally:
    _frames().pop()


@contextlib.contextmanager
def refused(why: str):
  """Around the tracing of a loop body whose ticks take no values (a loop
  no bar draws: ``why``)."""
  with _framed(why):
    yield


def layout_of(items: tuple) -> tuple:
  """What the host is told of ``items`` when traced: ``((key, text), ...)``,
  text None for a value that comes with the tick."""
  return tuple((key, value if isinstance(value, str) else None)
               for key, value in items)


def _avals(items: tuple) -> tuple:
  """Each traced value's ``(shape, dtype, varying)``: ``varying``, the
  ``shard_map`` axes it varies over, which its carry must vary over too."""
  return tuple((jnp.shape(v), jnp.result_type(v),
                tuple(sorted(_jax_private.varying_axes(jax.typeof(v)))))
               for _, v in items if not isinstance(v, str))


def _varying(value, axes: tuple):
  """``value`` varying over the ``shard_map`` axes ``axes``."""
  return _jax_private.made_varying(value, axes)


def _arrays(items: tuple, avals: tuple) -> tuple:
  """The traced values of ``items``, as ``avals`` (a weak type dropped:
  the carry's type is the same at each step)."""
  values = [v for _, v in items if not isinstance(v, str)]
  return tuple(lax.convert_element_type(jnp.reshape(v, shape), dtype)
               for v, (shape, dtype, _) in zip(values, avals))


class Retrace(Exception):  # noqa: N818 - a signal, not an error
  """A body set values its loop has no room for: ``Slots.run`` traces the
  loop again with room (``layout``, ``avals``)."""

  def __init__(self, slots: "Slots", layout: tuple, avals: tuple):
    super().__init__("hostcall: a loop body set values for its ticks; it is "
                     "traced again with room for them")
    self.slots, self.layout, self.avals = slots, layout, avals


class Step:
  """What one trace of a body leaves for the loop: ``values``, the carried
  values after the step."""

  __slots__ = ("values",)

  def __init__(self, values: tuple):
    self.values = values


class Slots:
  """One loop's room for the values its body sets.

  Arguments:
    keep: whether the loop's ticks take values (False: a bar that draws
      nothing, ``disable=True``: values set are dropped).
  """

  def __init__(self, keep: bool):
    self.keep = keep
    self.layout: tuple = ()  # known once a trace set values (``Retrace``)
    self.avals: tuple = ()
    self._known = False

  def initial(self) -> tuple:
    """The carried values before the first step: zeros (the first tick
    follows a chunk of at least one step, which set them)."""
    return tuple(_varying(jnp.zeros(shape, dtype), varying)
                 for shape, dtype, varying in self.avals)

  @contextlib.contextmanager
  def step(self, carried: tuple):
    """Around one trace of the body: yields the ``Step`` whose ``values``
    are, after it, the carried values the body set (else ``carried``)."""
    step = Step(carried)
    with _framed(None) as frame:
      yield step
    if frame.items is None or not self.keep:
      return
    layout, avals = layout_of(frame.items), _avals(frame.items)
    if not self._known:
      raise Retrace(self, layout, avals)
    if (layout, avals) != (self.layout, self.avals):
      raise ValueError(
          "hostcall.progress.set_postfix: a loop body traced twice set "
          f"{_shown(self.layout, self.avals)} the first time and "
          f"{_shown(layout, avals)} the next: the keys and the types of "
          "the values must be the same each time it is traced (JAX may "
          "trace a loop body more than once). Keep the Python state that "
          "chooses them out of the body.")
    step.values = _arrays(frame.items, avals)

  def run(self, attempt: Callable[[], Any]) -> Any:
    """``attempt()``, the loop traced, again with room for the values its
    body sets where the first trace found some."""
    try:
      return attempt()
    except Retrace as retrace:
      if retrace.slots is not self or self._known:
        raise
      self.layout, self.avals, self._known = (retrace.layout, retrace.avals,
                                              True)
    return attempt()


def _shown(layout: tuple, avals: tuple) -> str:
  kinds = iter(f"{jnp.dtype(dtype).name}{list(shape)}"
               for shape, dtype, _ in avals)
  return "{" + ", ".join(
      f"{key}: {'text ' + repr(text) if text is not None else next(kinds)}"
      for key, text in layout) + "}"


@contextlib.contextmanager
def once(keep: bool):
  """Around the trace of a body that has no carry (``track``'s): yields a
  ``Step`` whose ``values`` are, after it, the values set, and whose
  ``layout`` attribute their layout."""
  step = _Once()
  with _framed(None) as frame:
    yield step
  if frame.items is not None and keep:
    step.layout = layout_of(frame.items)
    step.values = _arrays(frame.items, _avals(frame.items))


class _Once:
  __slots__ = ("values", "layout")

  def __init__(self):
    self.values: tuple = ()
    self.layout: tuple = ()


def is_array(value) -> bool:
  """Whether ``value`` is a JAX array (traced or not): a value whose
  number reaches the host with the tick."""
  return isinstance(value, (jax.Array, _jax_private.Tracer))

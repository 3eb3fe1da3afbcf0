"""What a checked stretch of a program found, as device values.

A ``Found`` names the first value a checked program made (or was given)
that holds a NaN or an infinity: which check (a site, numbered in the host's
``sites.Sites``), what it held, at which loop steps, and when it ran among
the program's checks (the *clock*: how many checks ran before it, so that
``vmap`` members that went wrong at different places can be put in the order
they would have run). Everything here is computed on the device: the host
hears of a ``Found`` only when it holds something (``members.report``).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

#: What a check found: nothing, an infinity (and no NaN), a NaN.
NOTHING, INF, NAN = 0, 1, 2


class Found(NamedTuple):
  """The first value a stretch of a program found holding a NaN or an
  infinity (``code`` 0: none).

  Attributes:
    code: ``NOTHING``, ``INF`` or ``NAN`` (int32).
    site: the check's number in the trace's ``Sites`` (int32).
    when: how many checks ran before it (int32).
    steps: the step of each loop around the check, outermost first, -1
      past the loops that hold it (int32, one entry a nesting level).
  """

  code: jax.Array
  site: jax.Array
  when: jax.Array
  steps: jax.Array


def nothing(depth: int) -> Found:
  """A ``Found`` of nothing, with room for ``depth`` loop steps."""
  return Found(jnp.int32(NOTHING), jnp.int32(-1), jnp.int32(0),
               jnp.full((depth,), -1, jnp.int32))


def can_hold_nan(value) -> bool:
  """Whether ``value`` can hold a NaN: an inexact (float or complex),
  non-empty array. Integers and booleans cannot."""
  dtype = jnp.result_type(value)
  return (jnp.issubdtype(dtype, jnp.inexact)
          and int(np.prod(np.shape(value), dtype=np.int64)) > 0)


def code_of(value, infs: bool) -> jax.Array:
  """``NAN`` where ``value`` holds a NaN, else ``INF`` where it holds an
  infinity (and ``infs``), else ``NOTHING``: one reduction over a code per
  element (a complex element is NaN or infinite where either part is)."""
  if infs:
    codes = jnp.where(jnp.isnan(value), jnp.int8(NAN),
                      jnp.isinf(value).astype(jnp.int8))
  else:
    codes = jnp.isnan(value).astype(jnp.int8) * jnp.int8(NAN)
  return jnp.max(codes).astype(jnp.int32)


def pad(found: Found, depth: int) -> Found:
  """``found`` with room for ``depth`` loop steps (it has at most that)."""
  missing = depth - found.steps.shape[-1]
  if missing == 0:
    return found
  return found._replace(steps=jnp.concatenate(
      [found.steps, jnp.full((missing,), -1, jnp.int32)]))


def with_step(found: Found, step) -> Found:
  """``found`` inside one more loop, at ``step`` of it (the outermost)."""
  step = jnp.asarray(step, jnp.int32)
  return found._replace(steps=jnp.concatenate([step[None], found.steps]))


def earlier(first: Found, then: Found) -> Found:
  """``first`` where it found something, else ``then``: the earlier of two
  stretches that ran one after the other."""
  keep = first.code > NOTHING
  return Found(*(jnp.where(keep, a, b) for a, b in zip(first, then)))


def first_of(entries: Sequence[Found], depth: int) -> Found:
  """The first of ``entries`` (in the order they ran) that found
  something, else nothing: one ``argmax`` over their codes, not a chain of
  selections."""
  if not entries:
    return nothing(depth)
  if len(entries) == 1:
    return entries[0]
  stacked = [jnp.stack(field) for field in zip(*entries)]
  index = jnp.argmax(stacked[0] > NOTHING)
  return Found(*(field[index] for field in stacked))

"""Values as one vector of words, in concatenations that XLA fuses into
one loop: how ``threaded`` packs a queued call's operands and ``plan`` a
program's deferred values.

Words as wide as the narrowest value's elements make every bit cast
elementwise (a float32 as a uint32), fused with what computes the value,
where casts to bytes each took a kernel of their own. XLA:CPU fuses a
concatenation of up to ``ROW`` operands with what feeds them; of more, each
operand becomes a kernel of its own, which XLA compiles apart
(docs/performance.md, the compile-time target). So the pieces are concatenated ``ROW`` at a time, and those concatenations ``ROW``
at a time along a further dimension, which XLA does not merge with theirs:
one loop for any number of pieces.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

WORDS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}

#: The most operands of a concatenation that XLA:CPU fuses with what feeds
#: them.
ROW = 8


def word_of(dtypes) -> type:
  """The word of values of ``dtypes`` (whole bytes each): as wide as the
  narrowest."""
  return WORDS[min(np.dtype(d).itemsize for d in dtypes)]


def as_words(x, word) -> jax.Array:
  """``x``'s bytes as a flat vector of ``word``s (a bool as a byte)."""
  if x.dtype == np.bool_:
    x = x.astype(jnp.uint8)
  if x.dtype != word:
    x = jax.lax.bitcast_convert_type(x, word)
  return jnp.ravel(x)


def concatenated(pieces) -> jax.Array:
  """The flat ``pieces`` (one dtype) end to end, in concatenations of at
  most ``ROW`` operands, each level along a dimension of its own."""
  axis = 0
  while len(pieces) > 1:
    pieces = [jnp.concatenate(pieces[at:at + ROW], axis=axis)
              for at in range(0, len(pieces), ROW)]
    axis += 1
    if len(pieces) > 1:
      pieces = [jnp.reshape(p, (1,) * axis + (p.size,)) for p in pieces]
  return jnp.ravel(pieces[0])

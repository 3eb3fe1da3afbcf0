"""An operand that waits for a tree of values: one number read from every
leaf (``waiting_operand``), which a loop's tick, close and stop check take
so that
XLA runs them after the chunk that made the values."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def data_leaves(tree) -> list:
  """The leaves of ``tree`` as plain arrays: PRNG keys as their key data,
  symbolic-zero (float0) leaves left out."""
  leaves = []
  for leaf in jax.tree_util.tree_leaves(tree):
    leaf = jnp.asarray(leaf) if not hasattr(leaf, "dtype") else leaf
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended):
      leaf = jax.random.key_data(leaf)
    if leaf.dtype != jax.dtypes.float0:
      leaves.append(leaf)
  return leaves


def waiting_operand(tree) -> jax.Array:
  """One float32 read from every leaf of ``tree`` (shape (1,), or (0,)
  where it holds no data): an operand that waits for all of ``tree``."""
  total = jnp.zeros((0,), jnp.float32)
  for leaf in data_leaves(tree):
    leaf = jnp.ravel(leaf)
    if leaf.size:
      part = leaf[:1]
      part = jnp.abs(part) if jnp.iscomplexobj(part) else part
      total = (total if total.size else 0) + part.astype(jnp.float32)
  return total

"""The side effects a host call carries, by its ``ordering``.

* ``"ordered"``: sequenced with every other ordered hostcall (JAX threads a
  token through the program for it); never elided or duplicated.
* ``"debug_ordered"``: the same for ``debug_callback(ordered=True)`` and
  ``debug_print(ordered=True)``, with its own token, and refused by JAX in a
  computation over several devices, as JAX's ordered debug callbacks are
  ("ordered effects are not supported for more than 1 device").
* ``"unordered"``: never elided, but free to move between each other.
* ``"pure"``: no effect; elided, duplicated or moved like any pure operation.
* ``"io"`` / ``"io_ordered"``: JAX's own ``io_callback`` effects, so that
  every rule JAX applies to its io callbacks (refused in a vmap of ``cond``
  and of a ``while`` with a batched predicate, under ``checkpoint``'s partial
  evaluation, inside ``custom_jvp``) and their ordering with JAX's ordered io
  callbacks apply to hostcall's io callbacks unchanged.

hostcall's two effects are declared legal wherever JAX's callback effects
are (loops, ``cond``, ``custom_jvp``, ``checkpoint``).
"""

from __future__ import annotations


from hostcall import _jax_private


class OrderedHostEffect(_jax_private.Effect):
  """Ordered hostcalls: run in program order, never elided or duplicated."""

  __str__ = lambda self: "HostcallOrdered"  # noqa: E731


class UnorderedHostEffect(_jax_private.Effect):
  """Unordered hostcalls: never elided, but free to move between each other."""

  __str__ = lambda self: "Hostcall"  # noqa: E731


class OrderedDebugHostEffect(_jax_private.Effect):
  """Ordered debug callbacks: in program order on one device; a computation
  over several devices refuses them, as JAX refuses its own."""

  __str__ = lambda self: "HostcallOrderedDebug"  # noqa: E731


_jax_private.register_effect(OrderedHostEffect, ordered=True)
_jax_private.register_effect(UnorderedHostEffect, ordered=False)
_jax_private.register_effect(OrderedDebugHostEffect, ordered=True,
                             shardable=False)
# (JAX's runtime tokens, wrapped so that one failed computation with
# ordered effects does not fail every later one: ``jax_rules``.)

#: Each ordering's effect (None: pure).
EFFECTS = {"ordered": OrderedHostEffect(), "unordered": UnorderedHostEffect(),
           "debug_ordered": OrderedDebugHostEffect(),
           "pure": None, "io": _jax_private.IO_EFFECT,
           "io_ordered": _jax_private.ORDERED_IO_EFFECT}

#: The orderings whose calls thread a token (run in program order).
ORDERED = ("ordered", "io_ordered", "debug_ordered")

#: The effect types of hostcall's own orderings.
HOST_EFFECT_TYPES = (OrderedHostEffect, UnorderedHostEffect,
                     OrderedDebugHostEffect)

#: The effect types whose calls stay in a loop's body under ``grad``, once a
#: step: hostcall's and JAX's io effects (which hostcall's io calls carry).
KEPT_IN_LOOPS = (*HOST_EFFECT_TYPES, type(_jax_private.IO_EFFECT),
                 type(_jax_private.ORDERED_IO_EFFECT))

#: Those of its ordered orderings (one token each).
ORDERED_HOST_EFFECT_TYPES = (OrderedHostEffect, OrderedDebugHostEffect)


def effect_of(ordering: str):
  """The effect of ``ordering``, or a ``ValueError`` naming the choices."""
  if ordering not in EFFECTS:
    raise ValueError(f"ordering must be one of {sorted(EFFECTS)}, got "
                     f"{ordering!r}")
  return EFFECTS[ordering]

"""A jaxpr evaluated again in the current trace, each equation's output
checked for NaNs and infinities, wherever the equation sits.

Each equation is bound again as ``jax.core.eval_jaxpr`` binds it (its
source location kept, so that what JAX derives from it, its derivative and
that derivative's transpose, keeps the user's line), then each of its
inexact outputs is checked (``Region.check``). Where the equation runs
other jaxprs:

* a nested ``jit``, ``scan``, ``while_loop``, ``cond`` and ``checkpoint``
  are rebuilt with ``jax``'s and ``lax``'s own functions around checked
  bodies (``structured``); the loops report the step of what they find. (A
  ``jit`` is kept, not inlined: the equations of a function JAX defines,
  ``jnp.where``'s, have no user's line of their own, and their derivatives,
  in the backward pass, are then found inside the ``jit`` that has one.)
* a ``custom_jvp``/``custom_vjp`` function is bound as it is (its rules
  kept), and its body evaluated beside it, checked, on the same values with
  their gradient stopped (XLA merges the two where nothing differentiates
  them); one with a side effect is only bound, its outputs checked.

Every other equation, a ``shard_map`` or a ``pmap`` included, is bound as
it is and its outputs checked, unless it cannot make a NaN or an infinity
from finite operands (``preserving``).
"""

from __future__ import annotations

import jax
from jax.extend import core as jex_core
from jax.extend.core import primitives

from hostcall import _jax_private
from hostcall._apps.nans import preserving, structured
from hostcall._apps.nans.region import Place, Region
from hostcall._apps.nans.sites import Site, Sites

_NESTED_JIT = tuple(p for p in (getattr(primitives, "jit_p", None),
                                getattr(primitives, "pjit_p", None),
                                primitives.closed_call_p) if p is not None)
#: ``jax.checkpoint``'s primitive, by its names (``remat2`` today).
_CHECKPOINT_NAMES = ("remat2", "checkpoint")
_CUSTOM = tuple(p for p in (getattr(primitives, "custom_jvp_call_p", None),
                            getattr(primitives, "custom_vjp_call_p", None))
                if p is not None)


def _open(jaxpr):
  return getattr(jaxpr, "jaxpr", jaxpr)


def _consts(jaxpr):
  return getattr(jaxpr, "consts", ())


def kind_of(eqn) -> str:
  """How ``evaluate`` treats ``eqn``: ``"jit"``, ``"scan"``,
  ``"while"``, ``"cond"``, ``"checkpoint"``, ``"custom"`` or ``"plain"``."""
  prim, params = eqn.primitive, eqn.params
  if prim in _NESTED_JIT:
    return "jit"
  if prim is primitives.scan_p:
    return "scan" if _jax_private.scan_layout(params) else "plain"
  if prim is primitives.while_p:
    return "while"
  if prim is primitives.cond_p:
    return "plain" if "branches_platforms" in params else "cond"
  # (By name: jax.extend names checkpoint's primitive only from JAX 0.9.)
  if prim.name in _CHECKPOINT_NAMES:
    return "checkpoint"
  if prim in _CUSTOM and "call_jaxpr" in params and not eqn.effects:
    return "custom"
  return "plain"


def inner(eqn) -> list:
  """The jaxprs ``evaluate`` checks inside ``eqn`` (none for a plain
  one)."""
  kind, params = kind_of(eqn), eqn.params
  if kind == "jit":
    return [params.get("jaxpr") or params["call_jaxpr"]]
  if kind == "scan" or kind == "checkpoint":
    return [params["jaxpr"]]
  if kind == "while":
    return [params["body_jaxpr"]]
  if kind == "cond":
    return list(params["branches"])
  if kind == "custom":
    return [params["call_jaxpr"]]
  return []


def depth_of(jaxpr) -> int:
  """How many loops deep ``jaxpr``'s checks sit, at most: the room a
  region needs for their steps."""
  depth = 0
  for eqn in _open(jaxpr).eqns:
    loop = kind_of(eqn) in ("scan", "while")
    for sub in inner(eqn):
      depth = max(depth, depth_of(sub) + loop)
  return depth


def _transposed(eqn) -> bool:
  # What JAX's transposition staged (a backward pass inside the checked
  # function: find_nans(jax.grad(f))) carries it in its name stack.
  return "transpose(" in str(eqn.source_info.name_stack)


class Checker:
  """Evaluates jaxprs with checks, numbering them in ``sites``."""

  def __init__(self, sites: Sites, infs: bool):
    self.sites, self.infs = sites, infs

  def depth_of(self, jaxpr) -> int:
    return depth_of(jaxpr)

  def new_region(self, depth: int, clock=0) -> Region:
    """A region for checks ``depth`` loops deep at most, its clock
    starting at ``clock``."""
    return Region(self.sites, self.infs, depth, clock)

  def evaluate(self, jaxpr, consts, args, region: Region,
               place: Place) -> list:
    """``jaxpr`` (open) on ``consts`` and ``args``, in the current trace,
    its equations' outputs checked into ``region``."""
    env = {}

    def read(v):
      return v.val if isinstance(v, jex_core.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
      here = place._replace(
          phase="backward" if _transposed(eqn) else place.phase,
          where=_jax_private.user_frame_of(eqn) or place.where)
      outs = self.equation(eqn, [read(v) for v in eqn.invars], region, here)
      env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]

  def closed(self, closed, args, region: Region, place: Place) -> list:
    """``evaluate`` for a closed (or open, constant-free) jaxpr."""
    return self.evaluate(_open(closed), _consts(closed), args, region, place)

  def equation(self, eqn, invals: list, region: Region, place: Place
               ) -> list:
    """``eqn``'s outputs, bound in the current trace, checked."""
    kind = kind_of(eqn)
    if kind in structured.REBUILT:
      with _jax_private.source_context_of(eqn):
        return structured.REBUILT[kind](self, eqn, invals, inner(eqn),
                                        region, place)
    outs = _jax_private.bind_equation(eqn, invals)
    if not eqn.primitive.multiple_results:
      outs = [outs]
    if kind == "custom":
      # Its body, beside it, on values whose gradient is stopped: the
      # checks see what it computes inside, its rules stay as they are.
      stopped = [jax.lax.stop_gradient(v) for v in invals]
      with _jax_private.source_context_of(eqn):
        self.closed(eqn.params["call_jaxpr"], stopped, region, place)
    if kind == "plain" and not preserving.needs_check(eqn, invals, self.infs):
      return outs
    for out in outs:
      region.check(out, Site(place.phase, eqn.primitive.name,
                              where=place.where, loops=place.loops))
    return outs

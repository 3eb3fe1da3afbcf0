"""Partial evaluation (``grad``, ``linearize``, ``checkpoint``): the
rules hostcall wraps so that a host call runs once where the user wrote it."""

from __future__ import annotations

import functools
import inspect

import jax
import numpy as np
from jax.extend import core as _jex_core
from jax._src import callback as _callback
from jax._src import effects as _effects
from jax._src.interpreters import partial_eval as _pe
from jax._src.lax.control_flow import loops as _loops


def keep_io_in_partial_evaluation() -> None:
  """Keeps JAX's io callback effects through partial evaluation, as JAX
  keeps its debug callbacks: without it, an io call staged with an unknown
  operand (a loop's carry, while ``grad`` splits the loop) is dropped."""
  for effect in (_callback._IOEffect, _callback._OrderedIOEffect):
    _effects.partial_eval_kept_effects.add_type(type(effect))


def keep_calls_in_loop_bodies(moves_a_call) -> None:
  """Stops ``grad``'s split of a ``lax.scan`` from hoisting a call out of
  the loop: JAX moves out of the body every equation whose operands do not
  change from step to step (a call with no operands, or with only the
  loop's constants), so a call written once a step ran once (JAX #16637).
  Where ``moves_a_call(jaxpr, n_consts)`` (its first ``n_consts`` inputs
  are the loop's constants), the known loop is left whole, its constants
  passed in as JAX's own "to disable" path does; elsewhere JAX hoists (a
  loop-invariant value is then computed once, not stacked a step)."""
  hoist = _loops._scan_known_hoisting
  if getattr(hoist, "_hostcall_keeps", False):
    return
  def scan_known_hoisting(jaxpr_known, known_consts, num_res, *rest):
    if (not moves_a_call(jaxpr_known, len(known_consts))
        or any(isinstance(_loops.typeof(c), _loops.AbstractRef)
               for c in known_consts)):
      return hoist(jaxpr_known, known_consts, num_res, *rest)
    jaxpr = _pe.convert_constvars_jaxpr(jaxpr_known.jaxpr)
    if _hoisting_returns_closed(hoist):
      jaxpr = _pe.close_jaxpr(jaxpr)
    return (jaxpr, [*jaxpr_known.consts, *known_consts], [False] * num_res,
            [])

  scan_known_hoisting._hostcall_keeps = True
  _loops._scan_known_hoisting = scan_known_hoisting


def restage_while_without(strip) -> None:
  """Keeps the primal host calls of a ``while_loop`` out of the loop that
  ``jax.linearize`` stages for its tangents. JAX's partial evaluation of
  ``while`` runs the known (primal) loop, then stages the whole loop again
  to compute the unknown outputs, primal and all, so every call in the
  body ran twice a step, and again each time the linear function was
  applied. Where the rule split the loop (some outputs known, some
  staged), the staged loop's body becomes ``strip(body_jaxpr, unknown)``
  (None leaves it as it is), ``unknown`` saying which of the body's inputs
  (its constants, then the carry) the known loop did not have."""
  rules = _pe.custom_partial_eval_rules
  rule = rules[_loops.while_p]
  if getattr(rule, "_hostcall_restages", False):
    return

  def while_partial_eval(trace, *tracers, **params):
    outs = rule(trace, *tracers, **params)
    staged = [t for t in outs if isinstance(t, _pe.JaxprTracer)
              and not t.pval.is_known()]
    if not staged or len(staged) == len(outs):
      return outs  # not split: the loop runs once, known or staged
    recipe = staged[0].recipe
    n_cond = params["cond_nconsts"]
    body_consts = tracers[n_cond:n_cond + params["body_nconsts"]]
    unknown = ([not t.pval.is_known() for t in body_consts]
               + [any(t is s for s in staged) for t in outs])
    body = strip(recipe.params["body_jaxpr"], unknown)
    if body is None:
      return outs
    new_params = dict(recipe.params, body_jaxpr=body)
    effects = _loops._join_while_effects(
        body, new_params["cond_jaxpr"], new_params["body_nconsts"],
        new_params["cond_nconsts"])
    restaged = recipe._replace(params=new_params, effects=effects)
    for tracer in staged:
      tracer.recipe = restaged
    return outs

  while_partial_eval._hostcall_restages = True
  rules[_loops.while_p] = while_partial_eval


def explain_checkpoint_refusal(explain) -> None:
  """Adds ``explain(message)`` to JAX's refusal of an effect it cannot
  split under ``jax.checkpoint`` (``NotImplementedError: Effects not
  supported in partial-eval of `checkpoint`/`remat```), where JAX raises it:
  its partial-evaluation rule (before 0.11) or its rematerialised
  primitive's differentiability check (0.11 on)."""
  from jax._src import ad_checkpoint

  def explained(check):
    if getattr(check, "_hostcall_explains", False):
      return check

    def check_explained(*args, **kwargs):
      try:
        return check(*args, **kwargs)
      except NotImplementedError as error:
        message = str(error)
        if "checkpoint" not in message or "Effects" not in message:
          raise
        raise NotImplementedError(explain(message)) from None
    check_explained._hostcall_explains = True
    return check_explained

  rules = _pe.custom_partial_eval_rules
  if ad_checkpoint.remat_p in rules:
    rules[ad_checkpoint.remat_p] = explained(rules[ad_checkpoint.remat_p])
  traced = getattr(ad_checkpoint, "RematTraced", None)
  if traced is not None and hasattr(traced, "_check_differentiable"):
    traced._check_differentiable = explained(traced._check_differentiable)


@functools.cache
def _hoisting_returns_closed(hoist) -> bool:
  """Whether this release's ``_scan_known_hoisting`` returns a closed
  jaxpr (before 0.11) or an open one; asked of JAX once, on a loop body
  of one constant and one carry."""
  closed = jax.make_jaxpr(lambda c, x: (x + c,))(1.0, 1.0)
  n_res = len(inspect.signature(hoist).parameters) - 2
  out = hoist(closed, [np.float32(1.0)], *([0] * n_res))[0]
  return isinstance(out, _jex_core.ClosedJaxpr)


def is_recompute_policy(policy) -> bool:
  """Whether a ``jax.checkpoint`` policy's answer means "recompute, don't
  save"."""
  return isinstance(_pe.ensure_enum(policy), _pe.RecomputeType)

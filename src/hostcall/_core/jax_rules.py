"""Every rule of JAX's that importing hostcall replaces, process-wide, and
the one place that installs them.

hostcall adds rules for its own primitives wherever it defines them
(``primitive``, ``hostcall._runtime``, ``hostcall._jit.threaded``,
``hostcall._apps.control.check``) and its own effect types to JAX's effect
registries (``effects``). What it changes of JAX's is below, each
replacement installed here when ``hostcall`` (any of its modules) is
imported, for every program of the process, hostcall's calls or not; each
wraps JAX's rule or falls back on it for whatever holds none of
hostcall's calls, so that JAX's own tests pass unchanged with hostcall
imported (``lax_control_flow_test``, ``batching_test``,
``custom_api_test``: 1,517 tests, the same outcomes with and without it).
How each is made, on every supported JAX release, is in
``hostcall._jax_private`` (named in brackets).

=====================================  ====================================
replaced in JAX                        why, and what JAX does otherwise
=====================================  ====================================
``batching.fancy_primitive_batchers``  ``vmap`` of a ``while_loop`` whose
``[while_p]``: ``control_flow.``       predicate is batched: an ordered
``while_batching_rule``                call in its condition sees the
                                       condition's values once before the
                                       loop and once a step (JAX reduces
                                       the predicate with ``or`` and lanes
                                       that have finished go on stepping);
                                       gatable calls in the body are made
                                       only for the lanes still looping
                                       (JAX calls every lane, finished ones
                                       with their last values again, JAX
                                       #20628, and refuses io callbacks).
                                       Other loops: JAX's rule.
``batching.fancy_primitive_batchers``  ``vmap`` of a ``cond`` whose
``[cond_p]``: ``gating.``              predicate is batched: gatable calls
``cond_batching_rule``                 in a branch are made only for the
                                       lanes that took it (JAX runs every
                                       branch for every lane, JAX #19314,
                                       #15039, and refuses io callbacks);
                                       an unbatched predicate keeps the
                                       ``cond`` without JAX's refusal.
                                       Other ``cond``\\ s: JAX's rule.
``loops._scan_known_hoisting``,        ``grad`` of a ``lax.scan``: a body
wrapped                                where hoisting would move one of
(``keep_calls_in_loop_bodies``,        hostcall's calls out of the loop is
``control_flow.moves_a_call``)         left whole, so the call runs once a
                                       step (JAX hoists a call whose
                                       operands do not change from step to
                                       step: once in all, JAX #16637).
                                       Other bodies: JAX's hoisting.
``partial_eval.                        ``jax.linearize`` (and ``grad``) of a
custom_partial_eval_rules[while_p]``,  ``while_loop``: the loop staged for
wrapped (``restage_while_without``,    the tangents leaves out the primal
``control_flow.strip_made_calls``)     calls the known loop has made (JAX
                                       stages the whole loop again: every
                                       call in the body ran twice a step,
                                       and again each time the linear
                                       function was applied).
``effects.partial_eval_kept_effects``  JAX's io callbacks kept through
gains JAX's ``_IOEffect`` and          partial evaluation, as JAX keeps its
``_OrderedIOEffect``                   debug callbacks (JAX drops an io
(``keep_io_in_partial_evaluation``)    call whose operand is unknown, a
                                       loop's carry under ``grad``).
``partial_eval.                        JAX's refusal of an io callback
custom_partial_eval_rules[remat_p]``   under ``jax.checkpoint`` says what
(``remat2``; before JAX 0.11) and      to use instead (``control_flow.
``ad_checkpoint.RematTraced.           explain_checkpoint_refusal``); the
_check_differentiable`` (0.11 on),     same error, with JAX's message
wherever this release has them,        first, else JAX's rule unchanged.
wrapped
(``explain_checkpoint_refusal``)
``dispatch.RuntimeTokenSet.            A computation with ordered effects
get_token_input`` and                  that failed no longer fails every
``.block_until_ready``, wrapped        later one (JAX hands its errored
(``start_ordered_effects_afresh_       runtime token on, and every
after_a_failure``)                     ``jax.effects_barrier()`` raises it
                                       again, JAX #37587); after JAX's wait
                                       the hooks of ``on_effects_barrier``
                                       run (``_runtime/barriers.py``: the
                                       host calls hostcall took out of
                                       JAX's effects are waited for too).
=====================================  ====================================

``REPLACED`` spells the same list out for ``tests/test_jax_rules.py``,
which compares JAX's rule tables, registries and classes before and after
importing hostcall, in a fresh interpreter: an entry changed but not
listed here (or listed but unchanged) fails it.
"""

from __future__ import annotations

from jax.extend.core import primitives

from hostcall import _jax_private
from hostcall._core import control_flow, gating

#: ``(module, name, key)`` of each replacement above: ``key`` a primitive's
#: name in a table, an effect type's name in a registry, None for a
#: module's function; ``name`` ``Class.attribute`` for a class's method.
#: Of the two ``remat`` entries, the ones this JAX release has.
REPLACED = (
    ("jax._src.interpreters.batching", "fancy_primitive_batchers", "while"),
    ("jax._src.interpreters.batching", "fancy_primitive_batchers", "cond"),
    ("jax._src.lax.control_flow.loops", "_scan_known_hoisting", None),
    ("jax._src.interpreters.partial_eval", "custom_partial_eval_rules",
     "while"),
    ("jax._src.effects", "partial_eval_kept_effects", "IOEffect"),
    ("jax._src.effects", "partial_eval_kept_effects", "OrderedIOEffect"),
    ("jax._src.interpreters.partial_eval", "custom_partial_eval_rules",
     "remat2"),
    ("jax._src.ad_checkpoint", "RematTraced._check_differentiable", None),
    ("jax._src.dispatch", "RuntimeTokenSet.get_token_input", None),
    ("jax._src.dispatch", "RuntimeTokenSet.block_until_ready", None),
)


def _install() -> None:
  # Each replacement reads JAX's rule first and falls back on it
  # (``control_flow`` and ``gating`` read theirs when imported, above).
  _jax_private.start_ordered_effects_afresh_after_a_failure()
  _jax_private.keep_io_in_partial_evaluation()
  _jax_private.keep_calls_in_loop_bodies(control_flow.moves_a_call)
  _jax_private.restage_while_without(control_flow.strip_made_calls)
  _jax_private.explain_checkpoint_refusal(
      control_flow.explain_checkpoint_refusal)
  _jax_private.fancy_primitive_batchers[primitives.while_p] = (
      control_flow.while_batching_rule)
  _jax_private.fancy_primitive_batchers[primitives.cond_p] = (
      gating.cond_batching_rule)


_install()

"""The one mechanism every hostcall flavour sits on, at trace time.

``primitive``: ``hostcall_p`` and its transformation rules; ``effects``:
what a call's ordering means to JAX; ``delivery``: which delivery a call
gets when traced; ``targets``: the host side of a call site; ``context``:
what the host function may learn about its call; ``checks``, ``results``:
what is checked when traced and when results come back; ``lifting``,
``tangents``: derivative rules over ``vmap`` levels, symbolic zeros;
``collecting``: a loop body's taps gathered instead of staged;
``control_flow``: calls kept where they were written under ``grad`` and
``linearize`` of loops, and ``vmap`` of a ``while`` whose condition calls
the host; ``gating``: ``vmap`` of a ``cond`` (calls only for the lanes
that took their branch) and of a ``while_loop`` whose predicate is batched
(calls in the body only for the lanes still looping); ``rewriting``: a
jaxpr evaluated again with some equations rewritten; ``jax_rules``: every
rule of JAX's that hostcall replaces, installed there (and only there)
when hostcall is imported. What runs the calls (lowering, eager
evaluation, the run path, errors, barriers, the queue, the native
extension) is ``hostcall._runtime``.
"""

from hostcall._core.context import CallContext, call_context
from hostcall._core.primitive import bind, hostcall_p
from hostcall._core import jax_rules  # noqa: F401  (installs JAX's rules)
from hostcall._core.targets import (CallTarget, HostTarget, PostponingTarget,
                                    target)

__all__ = [
    "CallContext",
    "CallTarget",
    "HostTarget",
    "PostponingTarget",
    "bind",
    "call_context",
    "hostcall_p",
    "target",
]

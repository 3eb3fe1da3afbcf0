"""The one mechanism every hostcall flavour sits on.

``primitive``: ``hostcall_p`` and its transformation rules; ``effects``:
what a call's ordering means to JAX; ``emission``: how each call is emitted
(a table); ``lowering``: where the host function is called from the
compiled program; ``targets``: the host side of a call site; ``context``:
what the host function may learn about its call; ``calls``: the one run
path and failure policy; ``errors``: failures rendered safely, postponed or
carried into the runtime; ``barriers``: waiting for everything sent to the
host; ``checks``, ``results``: what is checked when traced and when results
come back; ``lifting``, ``tangents``: derivative rules over ``vmap`` levels,
symbolic zeros; ``collecting``: a loop body's taps gathered instead of
staged; ``partitioned``: one call per shard; ``control_flow``: ``vmap`` of a
``while`` whose condition calls the host; ``libraries``: hostcall's native
libraries built from their C++ sources, cached, verified and loaded.
"""

from hostcall._core.barriers import barrier
from hostcall._core.context import CallContext, call_context
from hostcall._core.errors import CallbackException
from hostcall._core.primitive import bind, hostcall_p
from hostcall._core.targets import (CallTarget, HostTarget, PostponingTarget,
                                    target)

__all__ = [
    "CallContext",
    "CallTarget",
    "CallbackException",
    "HostTarget",
    "PostponingTarget",
    "barrier",
    "bind",
    "call_context",
    "hostcall_p",
    "target",
]

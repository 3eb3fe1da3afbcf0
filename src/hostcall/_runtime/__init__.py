"""What runs hostcall's calls: the lowering and eager evaluation of
``hostcall_p`` (registered here, as JAX's ``mlir`` and ``dispatch``
modules register theirs), the one run path, errors, barriers, asynchronous
delivery and the native extension.

``lowering``: where the host function is called from the compiled program
(registered as ``hostcall_p``'s lowering); ``eager``: a call outside
``jit`` (``hostcall_p``'s impl); ``emission``: how each call is emitted
(the platform table); ``partitioned``: one call per shard; ``calls``: the
one run path and failure policy; ``errors``: failures rendered safely,
postponed or carried into the runtime; ``barriers``: waiting for
everything sent to the host; ``enqueue``: the emitter of queued taps;
``tap_queue``: the bounded queue and its consumer thread;
``call_sites``: the call sites and the decoding of what they queued;
``native_queue``: the native queue it reads; ``outputs_replay``: the
replay of ``hostcall.jit``'s outputs; ``markers``: a global view's place
in the queue; ``texts``: columns of numbers as text, in one native call;
``libraries``, ``queue_library``: the native
extension (``hostcall_queue.cc`` and the others, built when the package is
installed), loaded.
"""

from hostcall._runtime import eager, lowering  # noqa: F401 - register rules
from hostcall._runtime.barriers import barrier
from hostcall._runtime.errors import CallbackException

__all__ = ["CallbackException", "barrier"]

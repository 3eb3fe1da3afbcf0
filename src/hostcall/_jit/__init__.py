"""``hostcall.jit``: ``jax.jit`` whose program's host calls are taken out of
its JAX effects, so that it runs on JAX's fast path.

``jitted``: the public function, ``jit`` (tracing, the routes, the
warning naming the call that keeps a program as ``jax.jit`` has it);
``deferring``: which programs can be deferred, and evaluating one with its
calls queued or made outputs; ``plan``: how the host replays the calls
made outputs; ``threaded``: the queued route's primitives (a call ordered
by a value threaded through the program instead of an effect);
``jax_callbacks``: JAX's own ``jax.debug.print``, ``jax.debug.callback``
and result-less ``io_callback`` rewritten into hostcall's calls. The
replay of the outputs route runs in ``hostcall._runtime.outputs_replay``.
"""

from hostcall._jit.jitted import jit

__all__ = ["jit"]

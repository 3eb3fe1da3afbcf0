"""``hostcall.jit``: ``jax.jit`` whose program's host calls are taken out of
its JAX effects, so that it runs on JAX's fast path.

``jitted``: the public function, ``jit`` (tracing, the warning naming the
call that keeps a program as ``jax.jit`` has it, the dispatch to a route);
``routes``: the routes, one interface and four implementations, chosen in
one place; ``deferrable``: which programs can be deferred; ``deferring``:
evaluating one with its calls queued or made outputs; ``plan``: how the
host replays the calls made outputs; ``threaded``: the queued route's
primitives (a call ordered by a value threaded through the program
instead of an effect); ``marker``: a global view's place in the queue;
``packing``: values as one vector of words;
``jax_callbacks``: JAX's own ``jax.debug.print``, ``jax.debug.callback``
and result-less ``io_callback`` rewritten into hostcall's calls. The
replay of the outputs route runs in ``hostcall._runtime.outputs_replay``.
"""

from hostcall._jit.jitted import jit

__all__ = ["jit"]

"""``hostcall.jit``: ``jax.jit`` whose taps become outputs.

Any JAX effect sends a compiled call off JAX's C++ dispatch path, and an
ordered one adds a token per call: a jitted step with one print costs many
times a plain one. ``hostcall.jit`` compiles the same program with its
deferrable host calls (see ``hostcall._core.deferring``) taken out: their
operands become extra outputs of a program without effects, which dispatch
runs on the fast path, and the host functions run on the
``hostcall-deferred`` thread once those outputs are ready, in program order
(``hostcall._async.deferred``). A program with a host call that cannot be
deferred is compiled as ``jax.jit`` compiles it, unchanged.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

import jax

from hostcall import _jax_private
from hostcall._async import queue
from hostcall._async.deferred import deferred
from hostcall._core import deferring
from hostcall._core.checks import check_callable


@jax.tree_util.register_pytree_node_class
class _DeferredOutputs:
  """The packed deferred values of one call, with their plan as the
  pytree's static part (so that each cached executable keeps its own)."""

  def __init__(self, packs, plan):
    self.packs, self.plan = list(packs), plan

  def tree_flatten(self):
    return self.packs, self.plan

  @classmethod
  def tree_unflatten(cls, plan, packs):
    return cls(packs, plan)


#: The plan of a program whose calls were queued (``threaded``), not
#: deferred to outputs.
_QUEUED = "queued"


def _queues_on_this_device() -> bool:
  """Whether programs are compiled for the one device of a CPU-only
  process with the native tap queue: their deferrable calls are then
  queued from the program itself without a JAX effect
  (``hostcall._core.threaded``); elsewhere (an accelerator, several
  devices) they become outputs."""
  if (mode != "auto" or jax.default_backend() != "cpu"
      or jax.device_count() != 1):
    return False
  queue.consumer.start()
  return queue.consumer.native


#: ``"auto"`` (queued where ``_queues_on_this_device`` says so) or
#: ``"outputs"`` (always deferred to outputs; for tests and comparison).
mode = "auto"


class Jitted:
  """What ``hostcall.jit`` returns: call it as the ``jax.jit`` function.

  ``lower``, ``trace`` and ``eval_shape`` are ``jax.jit``'s, on the program
  with its host calls where they are (an AOT-compiled program keeps them).
  """

  def __init__(self, fun: Callable, jit_kwargs: dict):
    self._fun = fun
    self._plain = jax.jit(fun, **jit_kwargs)
    kwargs = dict(jit_kwargs)
    if "out_shardings" in kwargs:  # the deferred outputs: left to XLA
      kwargs["out_shardings"] = (kwargs["out_shardings"], None)

    def traced(*args, **kwargs):
      return self._traced(*args, **kwargs)

    # fun's signature (through __wrapped__): jax.jit finds static and
    # donated arguments by name or position in it, passed either way.
    functools.update_wrapper(traced, fun)
    self._deferring = jax.jit(traced, **kwargs)
    functools.update_wrapper(self, fun)

  def __call__(self, *args, **kwargs):
    if not _jax_private.is_top_level() or jax.config.jax_disable_jit:
      # Under a transformation (vmap, grad, an enclosing jit), the host
      # calls are staged into the enclosing program, as jax.jit's are;
      # under jax.disable_jit() they run as the function runs.
      return self._plain(*args, **kwargs)
    outs, extra = self._deferring(*args, **kwargs)
    plan = extra.plan
    if plan is not None:
      if plan is _QUEUED:
        deferred.queued_since_barrier = True
      else:
        deferred.submit(plan, extra.packs)
    return outs

  def _traced(self, *args, **kwargs):
    if _jax_private.is_top_level():
      # Called as it is, not traced: jax_debug_nans' de-optimized rerun of
      # a call whose outputs had a NaN. Its host calls run as it runs, as
      # in jax.jit's rerun.
      return self._fun(*args, **kwargs), _DeferredOutputs([], None)
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    dynamic = [i for i, leaf in enumerate(leaves)
               if isinstance(leaf, _jax_private.Tracer)]

    def flat_fun(*values):
      filled = list(leaves)
      for i, value in zip(dynamic, values):
        filled[i] = value
      fargs, fkwargs = jax.tree_util.tree_unflatten(tree, filled)
      return self._fun(*fargs, **fkwargs)

    values = [leaves[i] for i in dynamic]
    closed, shapes = jax.make_jaxpr(flat_fun, return_shape=True)(*values)
    out_tree = jax.tree_util.tree_structure(shapes)
    # Across processes, each process makes its own calls during the
    # program, as under jax.jit (a deferred value may live elsewhere).
    alone = jax.process_count() == 1
    if (alone and deferring.analyse(closed, queued=True)
        and _queues_on_this_device()):
      outs = deferring.evaluate_threaded(closed, values)
      return (jax.tree_util.tree_unflatten(out_tree, outs),
              _DeferredOutputs([], _QUEUED))
    if not alone or not deferring.analyse(closed):
      outs = jax.extend.core.jaxpr_as_fun(closed)(*values)
      return (jax.tree_util.tree_unflatten(out_tree, outs),
              _DeferredOutputs([], None))
    outs, extra, nodes = deferring.evaluate(closed, values)
    packs, plan = deferring.pack(extra, nodes)
    return (jax.tree_util.tree_unflatten(out_tree, outs),
            _DeferredOutputs(packs, plan))

  def lower(self, *args, **kwargs):
    return self._plain.lower(*args, **kwargs)

  def trace(self, *args, **kwargs):
    return self._plain.trace(*args, **kwargs)

  def eval_shape(self, *args, **kwargs):
    return self._plain.eval_shape(*args, **kwargs)

  def clear_cache(self) -> None:
    self._plain.clear_cache()
    self._deferring.clear_cache()

  def __repr__(self):
    return f"hostcall.jit({getattr(self._fun, '__name__', self._fun)!r})"

  def __get__(self, instance, owner=None):
    # A method decorated with @hostcall.jit binds as a function does (a
    # bound method, as jax.jit's: its name, __self__, clear_cache).
    if instance is None:
      return self
    return types.MethodType(self, instance)


def jit(fun: Callable | None = None, /, **jit_kwargs: Any):
  """``jax.jit``, with the host calls whose results are unused compiled as
  outputs: dispatch takes JAX's fast path.

  Taps, prints and metrics rows (``debug_callback``, ``debug_print``,
  ``io_callback`` without results, ``id_tap``/``id_print``,
  ``metrics.Run.log``, ``hostcall.scan``'s flushes) at the top level of the
  function, of a ``jax.jit`` inside it or in a ``lax.scan`` body (stacked)
  become extra outputs of a program without JAX effects. Their host
  functions run in program order on the ``hostcall-deferred`` thread once
  the call's outputs are ready; the call returns at once, as ``jax.jit``'s
  does, and ``hostcall.barrier()`` waits for them. A failing host function
  is reported by the next barrier, as an asynchronous tap's is.

  A program with a host call that must run where it is (a call with
  results that has an effect, a tap in a ``while_loop`` or ``cond``, a
  progress bar's event, a steered loop) is compiled exactly as ``jax.jit``
  compiles it: its host calls run during the call, in their order.

  Arguments:
    fun: the function to compile (or omit it: ``@hostcall.jit(...)``
      decorates).
    **jit_kwargs: ``jax.jit``'s keyword arguments (``static_argnums``,
      ``donate_argnums``, ``in_shardings``, ``out_shardings``, ...).

  Returns:
    The compiled function, called as ``jax.jit``'s; its ``lower`` is
    ``jax.jit``'s (host calls kept where they are).

  Example:
    >>> import hostcall, jax.numpy as jnp
    >>> @hostcall.jit
    ... def step(x):
    ...   hostcall.debug_print("x = {}", x)
    ...   return jnp.tanh(x)
    >>> y = step(jnp.float32(0.5))
    >>> hostcall.barrier()
    x = 0.5
  """
  if fun is None:
    return functools.partial(jit, **jit_kwargs)
  check_callable(fun, "hostcall.jit's fun")
  return Jitted(fun, jit_kwargs)

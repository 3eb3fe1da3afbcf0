"""``hostcall.jit``: ``jax.jit`` whose taps carry no JAX effect.

Any JAX effect sends a compiled call off JAX's C++ dispatch path, and an
ordered one adds a token per call: a jitted step with one print costs many
times a plain one. ``hostcall.jit`` compiles the same program with its
deferrable host calls (see ``hostcall._jit.deferrable``) taken out of its
effects, so that dispatch runs it on the fast path. How they are taken out
and who delivers them is the call's route (``hostcall._jit.routes``: queued
from the device on CPU devices with the native queue, outputs of the
program elsewhere), chosen there in one place. This module traces the
function, says once why a program stays as ``jax.jit`` compiles it, and
dispatches a call to its route.

A program with a host call that cannot be taken out is compiled as
``jax.jit`` compiles it, unchanged.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import warnings
from typing import Any, Callable

import jax

from hostcall import _jax_private
from hostcall._core.checks import check_callable
from hostcall._jit import deferrable, jax_callbacks, routes
from hostcall._runtime import waiting_frames


class HostcallJitWarning(UserWarning):
  """``hostcall.jit`` left a program as ``jax.jit`` compiles it (once per
  function): which call kept it so, and what to write instead."""


_dispatching_at_top_level = _jax_private.dispatching_at_top_level
_keys = itertools.count()


class Jitted:
  """A ``hostcall.jit`` function's state: the function, ``jax.jit``'s own
  compilation of it (``plain``), and its routes (``hostcall._jit.routes``),
  each built the first time a call takes it.

  ``lower``, ``trace`` and ``eval_shape`` are ``jax.jit``'s, on the program
  with its host calls where they are (an AOT-compiled program keeps them).
  """

  def __init__(self, fun: Callable, jit_kwargs: dict):
    self.fun = fun
    self.key = next(_keys)  # (its markers' line)
    self._jit_kwargs = jit_kwargs
    self._warned = False  # said once why the program stays as it is
    self.plain = jax.jit(fun, **jit_kwargs)
    self._routes: dict[type[routes.Route], routes.Route] = {}

  def route(self, kind: type[routes.Route]) -> routes.Route:
    """This function's route of ``kind``, built the first time."""
    built = self._routes.get(kind)
    if built is None:
      built = self._routes[kind] = kind(self, self._jit_kwargs)
    return built

  def function(self) -> Callable:
    """What ``hostcall.jit`` returns: a Python function (which binds as a
    method, as ``jax.jit``'s functions do) with ``lower``, ``trace``,
    ``eval_shape`` and ``clear_cache``. A function, not this object made
    callable: a call of an instance's ``__call__`` costs 0.1 to 0.3 us more
    than a function's, a tenth of what this wrapper may add to a call."""
    plain, current = self.plain, routes.current
    # (the route kind this function last took, and its route's call: the
    # kind compared with the process's in one step, a call's one check)
    taken = [object(), None]

    def jitted(*args, **kwargs):
      if _dispatching_at_top_level():
        if taken[0] is not current[0]:
          kind = routes.chosen()
          taken[:] = kind, self.route(kind).call
        return taken[1](args, kwargs)
      # Under a transformation (vmap, grad, an enclosing jit), the host
      # calls are staged into the enclosing program, as jax.jit's are;
      # under jax.disable_jit() they run as the function runs.
      return plain(*args, **kwargs)

    # (A barrier in another thread leaves the loops of a computation this
    # call still waits for running: the frame tells it.)
    waiting_frames.add_dispatch_code(jitted.__code__)
    functools.update_wrapper(jitted, self.fun)
    jitted.lower, jitted.trace = self.lower, self.trace
    jitted.eval_shape, jitted.clear_cache = self.eval_shape, self.clear_cache
    jitted._hostcall_jitted = self
    return jitted

  @property
  def _active(self):
    """The ``jax.jit`` function a call of this one runs here (a call
    whose arguments lie on several devices runs another, ``Marked``)."""
    return self.route(routes.chosen()).program

  def trace_dynamic(self, args, kwargs):
    """``(closed jaxpr, its dynamic arguments, the output tree)`` of fun
    on ``args`` and ``kwargs``.

    Traced as ``fun`` itself, its static arguments (those ``jax.jit``
    passed in as they are, no tracer among their leaves) given as static,
    so that an error while tracing names the user's function and
    arguments, as ``jax.jit``'s does."""
    static_argnums = tuple(i for i, a in enumerate(args) if _is_static(a))
    static_kwargs = {k: v for k, v in kwargs.items() if _is_static(v)}
    fun = (functools.partial(self.fun, **static_kwargs) if static_kwargs
           else self.fun)
    dynamic_kwargs = {k: v for k, v in kwargs.items()
                      if k not in static_kwargs}
    closed, shapes = jax.make_jaxpr(
        fun, static_argnums=static_argnums, return_shape=True)(
            *args, **dynamic_kwargs)
    values = jax.tree_util.tree_leaves(
        ([a for i, a in enumerate(args) if i not in static_argnums],
         dynamic_kwargs))
    return closed, values, jax.tree_util.tree_structure(shapes)

  def deferrable(self, closed, rules: deferrable.Rules):
    """The program to defer the host calls of (``closed``, JAX's own
    callbacks made hostcall's), or None where it must run as it is; then
    says once which call kept it so. Across processes, None: each process
    makes its own calls during the program, as under jax.jit (a deferred
    value, or a chosen device, may be another process's)."""
    if jax.process_count() > 1:
      return None
    rewritten = jax_callbacks.as_hostcalls(closed)
    verdict = rules.analyse(rewritten)
    body_call = None
    if (verdict and rules.queued
        and jax_callbacks.first_kept(rewritten, deferrable.runs_live)):
      body_call = jax_callbacks.first_kept(rewritten,
                                           deferrable.is_loop_body_call)
    if verdict and body_call is None:
      return rewritten
    if body_call is not None and not self._warned:
      self._warned = True
      warnings.warn(
          f"hostcall.jit: {getattr(self.fun, '__name__', 'the function')}"
          f" runs as jax.jit runs it, because it has a steered loop and "
          f"host calls it would queue ({body_call}): a queued call's "
          "failure would reach the host after the loop's checks, which "
          "must stop the loop at it. A steered loop alone (a bar, a time "
          "limit, a predicate) takes the fast path; see "
          "docs/performance.md.", HostcallJitWarning,
          stacklevel=_user_stacklevel())
      return None
    if verdict is None and not self._warned:
      self._warned = True
      rewritable = jax_callbacks.picker(rewritten)
      kept = jax_callbacks.first_kept(
          rewritten, lambda eqn: (rules.keeps_live(eqn)
                                  and not rewritable(eqn)),
          why=rules.why_kept)
      warnings.warn(
          f"hostcall.jit: {getattr(self.fun, '__name__', 'the function')}"
          f" runs as jax.jit runs it, its host calls inside the program "
          f"(JAX's effects, its slower dispatch), because of {kept}. "
          "hostcall.debug_print / debug_callback / "
          "io_callback without results (and JAX's jax.debug.print, "
          "jax.debug.callback, io_callback whose results are unused) are "
          "taken out; see docs/performance.md.", HostcallJitWarning,
          stacklevel=_user_stacklevel())
    return None

  def lower(self, *args, **kwargs):
    return self.plain.lower(*args, **kwargs)

  def trace(self, *args, **kwargs):
    return self.plain.trace(*args, **kwargs)

  def eval_shape(self, *args, **kwargs):
    return self.plain.eval_shape(*args, **kwargs)

  def clear_cache(self) -> None:
    self.plain.clear_cache()
    for built in self._routes.values():
      built.clear_cache()


# hostcall's own files
_PACKAGE_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep


def _user_stacklevel() -> int:
  """The ``stacklevel`` of a warning raised here that points at the user's
  line (the first frame outside hostcall and JAX), which called the
  function whose tracing raises it."""
  frame, level = sys._getframe(1), 1
  while frame is not None and (frame.f_code.co_filename.startswith(
      _PACKAGE_DIR) or _jax_private.is_jax_frame(frame)):
    frame, level = frame.f_back, level + 1
  return level if frame is not None else 2


def _is_static(value) -> bool:
  """Whether ``jax.jit`` passed ``value`` in as it is (a static argument):
  it has leaves, none of them a tracer."""
  leaves = jax.tree_util.tree_leaves(value)
  return bool(leaves) and not any(
      isinstance(leaf, _jax_private.Tracer) for leaf in leaves)


def jit(fun: Callable | None = None, /, **jit_kwargs: Any):
  """``jax.jit``, with the host calls whose results are unused taken out of
  the program's JAX effects: dispatch takes JAX's fast path.

  Taps, prints and metrics rows (``debug_callback``, ``debug_print``,
  ``io_callback`` without results, ``id_tap``/``id_print``,
  ``metrics.Run.log``, ``hostcall.scan``'s flushes) at the top level of the
  function, of a ``jax.jit`` inside it or in a ``lax.scan`` body are
  compiled without an effect. For a program on one CPU device (of one or
  several) the device queues their values as it runs (``while_loop`` bodies and ``cond``
  branches too), and hostcall's consumer thread delivers them in program
  order, in order with other programs' asynchronous taps; elsewhere (an
  accelerator, a program over several devices) they become extra outputs,
  delivered once the call's outputs are ready.
  The call returns at once, as ``jax.jit``'s does, and
  ``hostcall.barrier()`` waits for the host functions. A failing host
  function is reported by the next barrier, as an asynchronous tap's is.

  There a progress bar's events are queued too (its open answers "this
  device's latest invocation"), and so are a steered loop's (its open a
  live call without an effect). A program with a host call that must run
  where it is (a call with results that has an effect, a steered loop
  whose body calls the host, and where calls become outputs a progress
  bar or a tap in a ``while_loop`` or ``cond``) is compiled exactly as
  ``jax.jit`` compiles it: its host calls run during the call, in their
  order.

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
  return Jitted(fun, jit_kwargs).function()

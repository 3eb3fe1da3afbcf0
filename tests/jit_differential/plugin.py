"""A pytest plugin: ``jax.jit`` called from a test module is ``hostcall.jit``,
whose call then waits for the host calls it took out (deferred to outputs
or queued from the device), so that a test that checks the host right
after the call checks what was delivered. ``HOSTCALL_JIT_MODE=outputs``
makes hostcall.jit defer to outputs everywhere."""

import functools
import os
import sys

import jax

import hostcall
from hostcall._runtime import tap_queue
from hostcall._runtime.outputs_replay import deferred
from hostcall._core.context import why_waiting_is_forbidden
from hostcall._jit import routes

routes.set_outputs_only(
    os.environ.get("HOSTCALL_JIT_MODE", "auto") == "outputs")

_jax_jit = jax.jit


class _Waiting:
  def __init__(self, jitted):
    self._jitted = jitted
    functools.update_wrapper(self, jitted)

  def __call__(self, *args, **kwargs):
    out = self._jitted(*args, **kwargs)
    deferred.drain()
    if why_waiting_is_forbidden() is None:  # not inside a host function
      deferred.wait_for_queueing_programs()
      tap_queue.consumer.drain()
    return out

  def __getattr__(self, name):
    return getattr(self._jitted, name)

  def __get__(self, instance, owner=None):
    return self if instance is None else functools.partial(self, instance)


def _jit(fun=None, /, **kwargs):
  caller = sys._getframe(1).f_globals.get("__name__", "")
  if not caller.startswith("tests."):
    return _jax_jit(fun, **kwargs) if fun is not None else _jax_jit(**kwargs)
  if fun is None:
    return lambda f: _Waiting(hostcall.jit(f, **kwargs))
  return _Waiting(hostcall.jit(fun, **kwargs))


jax.jit = _jit

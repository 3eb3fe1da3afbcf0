"""``hostcall_marker_p``: a program on the outputs route queues its place.

Bound once, at the top level of a program whose host calls become its
outputs where the queue's consumer delivers the devices' taps (a global
view of several CPU devices): as the program runs, the device that makes a
global view's calls queues a marker item, and the queue's consumer replays
the calls of the dispatch it marks when it reaches it
(``hostcall._runtime.markers``), so that they keep their place among other
programs' asynchronous taps.

A JAX Python callback makes the marker: under a global view, XLA's
partitioner keeps the chosen device only for JAX's own callbacks (a custom
call of ours lost its sharding and was refused). It takes no operand and
returns nothing: the program gains no transfer between devices.

Bound only when a program is compiled; no transformation ever sees it.
"""

from __future__ import annotations

import jax
from jax.extend import core as jex_core

from hostcall import _jax_private
from hostcall._core import effects
from hostcall._core.context import make_context
from hostcall._runtime import call_sites, emission, tap_queue
from hostcall._runtime.markers import MarkerTarget

hostcall_marker_p = jex_core.Primitive("hostcall_marker")
hostcall_marker_p.multiple_results = True

# An effect, so that the program is dispatched as JAX dispatches programs
# with callbacks: the dispatching thread then lets go of the interpreter
# lock while the devices run, which the chosen device needs for its marker
# (JAX's faster path for effect-free programs kept it while it waited for
# the previous program's collectives: the rendezvous deadlocked).
_EFFECT = effects.EFFECTS["unordered"]


def bind(function: int) -> None:
  """Stages the marker of a dispatch of the ``hostcall.jit`` function
  numbered ``function``. (Not a parameter named ``key``: JAX 0.8's
  lowering cache takes its own argument of that name.)"""
  hostcall_marker_p.bind(function=function)


def _abstract_eval(*, function):
  del function
  return [], {_EFFECT}


def _lowering(ctx, *, function):
  device, _ = emission.caller(ctx, 0)
  tap_queue.consumer.start()
  site = call_sites.sites.add(MarkerTarget(function),
                              make_context((), device), ())

  def callback():
    tap_queue.consumer.push(site.site, [])
    return ()
  # (JAX's executable owns the callback, the callback the site.)
  _jax_private.emit_python_callback(
      ctx, callback, None, [], [], [], has_side_effect=True,
      returns_token=False, sharding=emission.op_sharding(
          ctx.module_context.axis_context,
          jax.sharding.SingleDeviceSharding(device), []))
  return []


def _impl(*, function):
  raise NotImplementedError(
      f"hostcall: hostcall_marker (of function {function}) is bound only "
      "inside hostcall.jit's compilation")


hostcall_marker_p.def_effectful_abstract_eval(_abstract_eval)
hostcall_marker_p.def_impl(_impl)
_jax_private.register_lowering(hostcall_marker_p, _lowering)
_jax_private.keep_when_unused(hostcall_marker_p)
# Made by one device of the program's: the lowering needs them.
_jax_private.require_devices_during_lowering(hostcall_marker_p)

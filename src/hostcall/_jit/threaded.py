"""``hostcall_threaded_p``: a queued host call without a JAX effect.

``hostcall.jit`` rebinds each deferrable host call (see ``deferring``) of
a program it compiles for CPU devices as this primitive: the operands
are copied into the native tap queue by an XLA custom call with a side
effect (under a global view of several devices, or with
``HOSTCALL_NATIVE=0``, a JAX Python callback pushing into the same queue),
and the consumer thread delivers them as it delivers asynchronous
taps. The program then carries no JAX effect (dispatch takes JAX's C++
fast path) and has no extra output (on several devices, one: the value
its last call returned, which a barrier waits for). What keeps the calls
in program order is a value each call returns and the next one takes,
threaded through the program and its ``lax.scan`` carries, as the removed
``host_callback`` module threaded its tokens; the programs' calls reach
the queue in the order the devices run them, with other programs'
asynchronous taps.

``hostcall_threaded_live_p`` is its live sibling: a call the program waits
for (a steered loop's open, pace and finish: ``live_without_effect``),
run as a JAX Python callback without a JAX effect, in the same order.

The equations are kept by JAX's dead-code elimination although nothing
uses their results (``_jax_private.keep_when_unused``). They are bound only
when a program is compiled; no transformation ever sees them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from hostcall import _jax_private
from hostcall._jit import packing
from hostcall._runtime import call_sites, enqueue, lowering

hostcall_threaded_p = jex_core.Primitive("hostcall_threaded")
hostcall_threaded_p.multiple_results = True


def start_order():
  """The value the program's first call takes."""
  return jnp.zeros((), jnp.uint8)


def end(order) -> None:
  """Marks ``order``, the value the program's last call returned, as used:
  JAX's dead-code elimination would otherwise take out a ``cond``, a
  ``while_loop`` or a ``scan`` whose only use was to queue calls (they have
  no JAX effect). Compiles to nothing: XLA keeps what has a side effect."""
  order_end_p.bind(order)


def bind(order, operands, *, target, transforms, device_index: int = 0,
         returns: bool = True):
  """Stages the queueing of ``operands`` for ``target`` after the call
  that returned ``order``; returns the value the next call takes, or with
  ``returns=False`` (the program's last call: nothing follows it) None.
  A call that returns nothing spares the program a buffer to allocate
  each time it runs, a fifth of what one call costs it.

  A few operands of whole bytes (up to ``PACKED_OPERANDS``) are packed
  into one buffer of bytes (one fusion on the device; the custom call then
  takes one operand, which costs less than several); ``packed`` keeps
  their shapes and dtypes, by which the host reads them back. More are
  handed over as they are, as ``jax.jit`` hands a callback its operands
  (the handler copies them into the queue one after another: the same
  bytes, read by the same layouts). Packing many would fuse each value's
  computation with its piece of the buffer, a kernel that XLA:CPU
  compiles on its own, where ``jax.jit``'s program may leave that
  computation as one operation that XLA compiles once for all the values
  alike (``x + k`` for many constants ``k``)."""
  avals = tuple(_jax_private.ShapedArray(np.shape(x), x.dtype)
                for x in operands)
  packed = None
  if (1 < len(operands) <= PACKED_OPERANDS
      and all(_packable(a.dtype) for a in avals)):
    operands, packed = [_pack(operands)], avals
  outs = hostcall_threaded_p.bind(order, *operands, target=target,
                                  transforms=transforms,
                                  device_index=device_index, packed=packed,
                                  returns=returns)
  return outs[0] if returns else None


#: The most operands one call packs into one buffer: packing costs compile
#: time with each operand, and saves run time only while they are few
#: (docs/performance.md, the compile-time target).
PACKED_OPERANDS = 2 * packing.ROW


def _packable(dtype) -> bool:
  dtype = np.dtype(dtype)
  # Bytes as they are in the buffer: no sub-byte type (stored otherwise),
  # no complex number (which has no bit cast).
  return (dtype.kind != "c"
          and call_sites.element_bits(dtype) == 8 * dtype.itemsize)


def _pack(operands):
  """The operands' bytes in one vector of words (``packing``): one loop
  with what computes them."""
  word = packing.word_of(x.dtype for x in operands)
  return packing.concatenated([packing.as_words(x, word) for x in operands])


def new_handle(answer: int):
  """What a queued call with an ``answer`` (a bar's open,
  ``Schedule.answer``) gets from its device each time it runs: ``int32[5]``,
  a handle its results hold, when and by which thread it was made, queued
  with the call for the host to adopt (``enqueue.emit_new_handle``; where
  the device makes none, ``answer``)."""
  return new_handle_p.bind(answer=answer)


def _abstract_eval(order, *operands, returns, **_):
  del operands
  return [order] if returns else []


def _lower(ctx, order, *operands, target, transforms, device_index, packed,
           returns):
  out = enqueue.emit_threaded(ctx, target, transforms, device_index,
                              order, list(operands), packed, returns)
  return [out] if returns else []


hostcall_threaded_live_p = jex_core.Primitive("hostcall_threaded_live")
hostcall_threaded_live_p.multiple_results = True


def bind_live(order, operands, *, target, transforms, device_index: int,
              result_avals) -> tuple:
  """Stages a live call of ``target`` (the program waits for its host
  function, which may answer: ``HostTarget.live_without_effect``) after
  the call that returned ``order``, without a JAX effect; returns the
  value the next call takes and the call's results."""
  order, *results = hostcall_threaded_live_p.bind(
      order, *operands, target=target, transforms=transforms,
      device_index=device_index, result_avals=tuple(result_avals))
  return order, results


def _abstract_eval_live(order, *operands, result_avals, **_):
  del operands
  return [order, *result_avals]


def _lower_live(ctx, order, *operands, target, transforms, device_index,
                result_avals):
  return lowering.emit_threaded_live(ctx, target, transforms, device_index,
                                     order, list(operands), result_avals)


def _impl(*args, **params):
  raise NotImplementedError(
      "hostcall: hostcall_threaded is bound only inside hostcall.jit's "
      f"compilation (got {len(args)} operands for {params['target']!r})")


new_handle_p = jex_core.Primitive("hostcall_new_handle")


def _lower_new_handle(ctx, *, answer):
  return [enqueue.emit_new_handle(ctx, answer)]


new_handle_p.def_abstract_eval(
    lambda **_: _jax_private.ShapedArray((5,), np.int32))
new_handle_p.def_impl(_impl)
_jax_private.register_lowering(new_handle_p, _lower_new_handle)

order_end_p = jex_core.Primitive("hostcall_order_end")
order_end_p.multiple_results = True
order_end_p.def_abstract_eval(lambda order: [])
order_end_p.def_impl(lambda order: [])
_jax_private.register_lowering(order_end_p, lambda ctx, order: [])
_jax_private.keep_when_unused(order_end_p)

hostcall_threaded_p.def_abstract_eval(_abstract_eval)
hostcall_threaded_p.def_impl(_impl)
_jax_private.register_lowering(hostcall_threaded_p, _lower)
_jax_private.keep_when_unused(hostcall_threaded_p)
# Each call is told its device: the lowering needs the program's devices
# (on several, the one a call was committed to).
_jax_private.require_devices_during_lowering(hostcall_threaded_p)

hostcall_threaded_live_p.def_abstract_eval(_abstract_eval_live)
hostcall_threaded_live_p.def_impl(_impl)
_jax_private.register_lowering(hostcall_threaded_live_p, _lower_live)
_jax_private.keep_when_unused(hostcall_threaded_live_p)
_jax_private.require_devices_during_lowering(hostcall_threaded_live_p)

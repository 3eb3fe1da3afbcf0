"""The emitter of queued taps: the device copies operands into the tap_queue.

Where ``hostcall._runtime.emission`` routes ``"enqueue"`` to the native library
(CPU, the library loaded, not a global view), an XLA FFI custom call copies
the operands (as many bytes as the call site's layouts say) into the queue
and returns; the consumer thread reads them by the same layouts. Elsewhere
(and for an operand of an extended dtype) a runtime Python callback pushes
copies of the operands instead. An
ordered tap threads JAX's token through either.
"""

from __future__ import annotations

import itertools
import threading
import time

import jax
import numpy as np

from hostcall import _jax_private
from hostcall._runtime import call_sites, emission, tap_queue
from hostcall._core.context import CallContext, make_context
from hostcall._core.targets import HostTarget


def emit(ctx, target: HostTarget, contexts, token, operands, operand_avals,
         op_sharding):
  """Emits the queueing of ``operands``; returns the new token (or None)."""
  consumer = tap_queue.consumer
  consumer.start()  # loads (or builds) the native library on first use
  layouts = call_sites.layouts_of(operand_avals)
  # A run of consecutive calls of a site whose target joins calls (a bar's
  # ticks, a metrics row) is delivered at once, as hostcall.jit's are: a
  # short loop's hundred ticks cost one delivery, not a hundred.
  joinable = (target.joins_calls and target.deliver_steps is not None
              and isinstance(contexts, CallContext))
  # An operand without a layout (an extended dtype) is pushed from Python.
  if (layouts is None
      or emission.route(ctx, "enqueue", consumer.native) == "python"):
    return _emit_python_push(
        ctx, call_sites.sites.add(target, contexts, joinable=joinable),
        token, operands, operand_avals, op_sharding)
  site = call_sites.sites.add(target, contexts, layouts, joinable=joinable)
  if token is not None:
    name = "hostcall_enqueue_ordered"
    operands = [token, *operands]
    avals_in = [_jax_private.abstract_token, *operand_avals]
    avals_out = [_jax_private.abstract_token]
  else:
    name, avals_in, avals_out = "hostcall_enqueue", operand_avals, []
  op = _native_enqueue(ctx.replace(avals_in=avals_in, avals_out=avals_out),
                       name, site, operands,
                       [layout.nbytes for layout in layouts])
  if op_sharding is not None:
    _jax_private.set_sharding(ctx.module_context, op, op_sharding)
  return op.results[0] if token is not None else None


def emit_threaded(ctx, target: HostTarget, transforms, device_index: int,
                  order, operands, packed=None, returns: bool = True):
  """Emits the queueing of ``operands`` ordered by the value ``order``
  (``hostcall._jit.threaded``); returns the value the next call takes
  (with ``returns=False``, none: None). ``packed``: the avals of the values
  packed into the one operand of bytes, if they were. The native handler
  where the emission table routes ``"enqueue"`` to it, else a runtime
  Python callback that pushes copies (and returns zero). A target with a
  ``thin_interval`` gets the handlers that may drop a call
  (``hostcall_thinned.cc``); the Python callback queues each."""
  consumer = tap_queue.consumer
  consumer.start()
  order_aval, *operand_avals = ctx.avals_in
  axis_context = ctx.module_context.axis_context
  device, _ = emission.caller(ctx, device_index)
  chosen = None
  if emission.global_view(axis_context):
    # One call, made by the chosen device (as hostcall's own calls under a
    # global view: ``lowering.lower``), its order value replicated.
    chosen = jax.sharding.SingleDeviceSharding(device)
  contexts = make_context(transforms, device)
  layouts = call_sites.layouts_of(packed or operand_avals)
  if (layouts is None
      or emission.route(ctx, "enqueue", consumer.native) == "python"):
    site = call_sites.sites.add(target, contexts, joinable=True)
    push = push_callback(site)
    zero = np.zeros((), np.uint8)

    def callback(_, *flat):
      if packed:
        flat = call_sites.decode(layouts, np.asarray(flat[0]).tobytes())
      push(*flat)
      return (zero,) if returns else ()
    result_avals = [order_aval] if returns else []
    results, _, _ = _jax_private.emit_python_callback(
        ctx, callback, None, [order, *operands],
        [order_aval, *operand_avals], result_avals,
        has_side_effect=True, returns_token=False,
        sharding=emission.op_sharding(axis_context, chosen, result_avals))
    if chosen is not None:
      results = [_jax_private.replicated(ctx, r, a)
                 for r, a in zip(results, result_avals)]
    return results[0] if returns else None
  site = call_sites.sites.add(target, contexts, layouts, joinable=True)
  nbytes = [layout.nbytes for layout in layouts]
  name = "hostcall_enqueue_threaded" if returns else "hostcall_enqueue_after"
  attributes = {}
  if target.thin_interval is not None and layouts:
    # The handler may drop the call (``hostcall_thinned.cc``), thinned
    # by its site (one device's: ``contexts``).
    name = ("hostcall_enqueue_thinned" if returns
            else "hostcall_enqueue_thinned_after")
    attributes = {"interval_ns": np.int64(round(target.thin_interval * 1e9))}
  op = _native_enqueue(ctx, name, site, [order, *operands],
                       [sum(nbytes)] if packed else nbytes, **attributes)
  return op.results[0] if returns else None


def emit_new_handle(ctx, answer: int):
  """What the device makes for a queued call's answer (``threaded.
  new_handle``): ``int32[5]``, a handle, when it was made and the thread
  that made it, the computation's (``made_at``); the native
  ``hostcall_new_handle``'s where ``emit_threaded`` queues natively, else a
  Python callback's from the same range; under a global view of several
  devices, ``answer`` (the target's, which the host resolves: a bar's open
  answers "this device's latest open of the site"), no time and no
  thread."""
  consumer = tap_queue.consumer
  consumer.start()
  if emission.route(ctx, "enqueue", consumer.native) == "ffi":
    return jax.ffi.build_ffi_lowering_function(
        "hostcall_new_handle", has_side_effect=True)(ctx).results[0]
  if emission.global_view(ctx.module_context.axis_context):
    return _jax_private.ir_constant(np.array([answer, 0, 0, 0, 0], np.int32))
  results, _, _ = _jax_private.emit_python_callback(
      ctx, _new_handle, None, [], [], list(ctx.avals_out),
      has_side_effect=True, returns_token=False, sharding=None)
  return results[0]


#: The first handle a device makes (``hostcall_queue.cc``'s
#: ``kDeviceHandles``); the host's registry makes its own below it.
DEVICE_HANDLES = 0x40000000
_handles_made = itertools.count()


def _new_handle():
  # (next() of a count is atomic under the interpreter lock.)
  made = next(_handles_made) % (0x7FFFFFFF - DEVICE_HANDLES)
  ns, thread = time.monotonic_ns(), threading.get_ident()
  return (np.array([DEVICE_HANDLES + made, ns & 0xFFFFFFFF, ns >> 32,
                    thread & 0xFFFFFFFF, thread >> 32],
                   np.uint64).astype(np.uint32).view(np.int32),)


def made_at(made) -> tuple[int, float | None, int | None]:
  """``(handle, when, thread)`` from what ``emit_new_handle``'s call made:
  when in ``time.monotonic()``'s seconds, the thread as ``threading.
  get_ident()`` names it; None where it says none."""
  handle, *words = np.asarray(made).ravel().tolist()[:5]
  ns, thread = (((high & 0xFFFFFFFF) << 32) | (low & 0xFFFFFFFF)
                for low, high in (words[0:2], words[2:4]))
  return handle, ns / 1e9 if ns else None, thread or None


def _native_enqueue(ctx, name: str, site: call_sites.SiteRef, operands, nbytes,
                    **attributes):
  """The FFI custom call ``name`` that copies ``nbytes`` of each queued
  operand into the queue for ``site`` (a leading token or order value,
  not queued, is not counted); ``attributes``: the handler's others."""
  # The custom call names the site by number only: the executable owns what
  # keeps it registered, and releases it with itself.
  _jax_private.keep_with_executable(ctx, site)
  return jax.ffi.build_ffi_lowering_function(name, has_side_effect=True)(
      ctx, *operands, site=np.int64(site.site),
      nbytes=np.array(nbytes, np.int64), **attributes)


def push_callback(site: call_sites.SiteRef):
  """A runtime callback that queues copies of its operands for ``site``
  (JAX's executable owns the callback, so the callback owns the site)."""
  def callback(*flat):
    tap_queue.consumer.push(site.site, list(flat))
    return ()
  return callback


def _emit_python_push(ctx, site, token, operands, operand_avals,
                      op_sharding):
  call_ctx = ctx.replace(avals_in=operand_avals, avals_out=[])
  _, token, _ = _jax_private.emit_python_callback(
      call_ctx, push_callback(site), token, operands, operand_avals, [],
      has_side_effect=True, returns_token=token is not None,
      sharding=op_sharding)
  return token

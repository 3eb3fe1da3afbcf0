"""The legacy ``jax.experimental.host_callback`` API, restored on modern JAX.

Replace ``from jax.experimental import host_callback as hcb`` with
``from hostcall import host_callback as hcb`` and old code runs unchanged:

* ``id_tap(tap_func, arg)`` is the identity on ``arg`` and calls
  ``tap_func(arg, transforms)`` on the host with the runtime value (NumPy
  arrays in the same pytree). Under ``vmap`` the tap receives the whole batch
  and ``transforms`` says so: ``(('batch', {'batch_dims': (0,)}),)``. Under
  ``jvp``/``grad`` it sees primal values only, once per primal evaluation.
* ``id_print(arg, what=...)`` prints the value on the host.
* ``call(fn, arg, result_shape=...)`` returns ``fn(arg)`` into the computation.
* ``barrier_wait()`` waits for every tap started before it and raises
  ``CallbackException`` if a tap function raised.

Taps run in program order (per device under ``pmap``/``shard_map``) and are
never dropped, even when their result is unused.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from hostcall import host_callback as hcb
  >>> def power3(x):
  ...   y = x * x
  ...   hcb.id_print((x, y), what="x,x^2")
  ...   return y * x
  >>> _ = jax.vmap(power3)(jnp.array([2., 3.])); hcb.barrier_wait()
  transforms: [('batch', {'batch_dims': (0, 0)})] what: x,x^2
  ( [2. 3.] [4. 9.] )
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import threading
from typing import Any, Callable

import jax

from hostcall import _printing
from hostcall._core import CallTarget, PostponingTarget, bind, results, target
from hostcall._core.checks import (check_arguments, check_callable,
                                   check_operands)
from hostcall._core.context import CallContext
from hostcall._core.targets import key_of
from hostcall._runtime import CallbackException, barrier, dispatch_stdout

__all__ = [
    "CallbackException",
    "CallbackFlavor",
    "TapFunctionException",
    "barrier_wait",
    "call",
    "id_print",
    "id_tap",
    "stop_outfeed_receiver",
]

#: The legacy module's older name for ``CallbackException``.
TapFunctionException = CallbackException



class CallbackFlavor(enum.Enum):
  """The last legacy releases' choice of JAX callback under the hood.

  Accepted by ``id_tap``, ``id_print`` and ``call`` (``callback_flavor=``) for
  old code; hostcall has one implementation, so it changes nothing.
  """

  IO_CALLBACK = 1
  PURE = 2
  DEBUG = 3


# Keyword arguments that tutorials pass and that change nothing here:
# transforms are always given to the tap function.
_ACCEPTED_NO_OP_KWARGS = frozenset({"tap_with_transform"})


@target
class _Tap(PostponingTarget):
  """``tap_func(arg, transforms[, device=dev])`` for ``id_tap``."""

  fn: Callable = dataclasses.field(compare=False)
  in_tree: Any
  with_device: bool
  fn_key: Any = key_of("fn")

  @functools.cached_property
  def single_leaf(self) -> bool:
    return self.in_tree == jax.tree_util.tree_structure(0)

  def deliver(self, flat_args, context: CallContext):
    if self.single_leaf:
      arg = flat_args[0]
    else:
      arg = self.in_tree.unflatten(flat_args)
    if self.with_device:
      self.fn(arg, context.transforms, device=context.device)
    else:
      self.fn(arg, context.transforms)
    return ()

  def __repr__(self):
    return f"id_tap({getattr(self.fn, '__name__', self.fn)!r})"


@target
class _Call(CallTarget):
  """``callback_func(arg[, device=dev])`` for ``call``, results checked."""

  fn: Callable = dataclasses.field(compare=False)
  in_tree: Any
  result_tree: Any
  result_avals: tuple
  with_device: bool
  unpack: bool
  fn_key: Any = key_of("fn")

  def deliver(self, flat_args, context: CallContext):
    arg = jax.tree_util.tree_unflatten(self.in_tree, flat_args)
    args = tuple(arg) if self.unpack else (arg,)
    kwargs = {"device": context.device} if self.with_device else {}
    result = self.fn(*args, **kwargs)
    return results.check_results(
        result, self.result_tree, self.result_avals, repr(self.name),
        legacy=True)

  def vmap_method(self) -> str:
    raise NotImplementedError(
        "batching rules are implemented only for id_tap, not for call. "
        f"hostcall: vmap of a host call that returns results ({self!r}) is "
        "not supported by host_callback.call, as in the legacy module: call "
        "the host function on the whole batch yourself, or use "
        "hostcall.pure_callback with a vmap_method.")

  @property
  def name(self) -> str:
    return getattr(self.fn, "__name__", repr(self.fn))

  def __repr__(self):
    return f"call({self.name!r})"

  @property
  def label(self) -> str:
    return f"host_callback.call of {self.name!r}"


def _unpack_tuple_arg(fn, arg, with_device: bool) -> bool:
  """Whether ``call`` should spread a tuple ``arg`` over ``fn``'s parameters.

  The legacy ``call`` passes one argument. Tutorials also pass a tuple
  ``(x, p)`` to a host function of two parameters; we spread it exactly when
  the function cannot take one argument but can take the tuple's elements.
  """
  if not isinstance(arg, (tuple, list)) or len(arg) < 2:
    return False
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):
    return False
  extra = {"device": None} if with_device else {}
  try:
    signature.bind(arg, **extra)
    return False
  except TypeError:
    pass
  try:
    signature.bind(*arg, **extra)
    return True
  except TypeError:
    return False


def id_tap(tap_func: Callable, arg, *, result=None, tap_with_device=False,
           device_index=0, callback_flavor=CallbackFlavor.IO_CALLBACK,
           delivery: str | None = None, partitioned: bool = False,
           **kwargs):
  """Identity on ``arg`` that calls ``tap_func`` on the host with its value.

  Arguments:
    tap_func: called as ``tap_func(arg, transforms)``, or
      ``tap_func(arg, transforms, device=dev)`` with ``tap_with_device``.
      ``arg`` holds NumPy arrays in the pytree structure given; ``transforms``
      is a tuple of ``(name, params)``, e.g. ``('batch', {'batch_dims': (0,)})``
      under ``vmap``. Its return value is ignored; if it raises, the exception
      is logged and the next ``barrier_wait`` raises ``CallbackException``.
    arg: a pytree of arrays (or Python numbers) to send to the host.
    result: if given, returned instead of ``arg`` (and not sent to the host).
    tap_with_device: pass the calling device to ``tap_func`` as ``device=``.
    device_index: under ``jit`` over several devices, the device (index in
      the computation's device assignment) that makes the one call.
    callback_flavor: accepted for old code (``CallbackFlavor``); changes
      nothing.
    delivery: hostcall's extra: ``"sync"`` or ``"async"`` (see
      ``hostcall.set_delivery``); None: the mode in force.
    partitioned: hostcall's extra: under ``jit`` of arrays sharded over
      several devices, one call per shard with the local shard instead of
      one with the gathered value; the shard's place is in
      ``hostcall.call_context().shard_indices``. Not ordered.
    **kwargs: ``tap_with_transform`` (from tutorials) is accepted and changes
      nothing; anything else raises ``TypeError``, as in the legacy module.

  Returns:
    ``arg``, or ``result`` if given.

  Example:
    >>> import jax
    >>> from hostcall import host_callback as hcb
    >>> jax.jit(lambda x: hcb.id_tap(lambda v, tr: print("got", v), x) * 2)(3.)
    got 3.0
    Array(6., dtype=float32, weak_type=True)
  """
  del callback_flavor
  unknown = set(kwargs) - _ACCEPTED_NO_OP_KWARGS
  if unknown:
    raise TypeError(
        "Support for **kwargs in ``id_tap`` has been removed. Instead, "
        "pre-apply keyword arguments, either by using a closure or by passing "
        f"``functools.partial(tap_func, **kwargs)``. Got {sorted(unknown)}.")
  check_callable(tap_func, "id_tap's tap_func")
  check_arguments(
      tap_func, ["arg", "transforms"],
      {"device": None} if tap_with_device else {}, "id_tap",
      "A tap function takes the tapped value and the transformations applied "
      "to it: def tap(arg, transforms" + (", *, device" if tap_with_device
                                          else "") + "), or wrap yours, "
      "e.g. id_tap(lambda arg, transforms: f(arg), x).")
  flat, in_tree = jax.tree_util.tree_flatten(arg)
  check_operands(flat, "id_tap")
  if result is not None:
    check_operands(jax.tree_util.tree_leaves(result), "id_tap's result")
  outs = bind(flat, target=_Tap(tap_func, in_tree, bool(tap_with_device)),
              kind="tap", device_index=device_index, delivery=delivery,
              partitioned=partitioned)
  if result is not None:
    return result
  return jax.tree_util.tree_unflatten(in_tree, outs)


_print_lock = threading.Lock()


def _print_tap(arg, transforms, *, device=None, output_stream=None,
               threshold=None, **kwargs):
  lines = _printing.format_tap(arg, transforms, device=device,
                               threshold=threshold, **kwargs)
  with _print_lock:
    for line in lines:
      if output_stream is not None:
        output_stream.write(line + "\n")
      else:
        dispatch_stdout.stream().write(line + "\n")


def id_print(arg, *, result=None, tap_with_device=False, device_index=0,
             output_stream=None, threshold=None,
             callback_flavor=CallbackFlavor.IO_CALLBACK,
             delivery: str | None = None, partitioned: bool = False,
             **kwargs):
  """Like ``id_tap`` with a tap function that prints ``arg`` on the host.

  Prints first the keyword arguments sorted by key (``what: ...``), with
  ``transforms`` when non-empty and ``device`` with ``tap_with_device``, then
  the value: tuples as ``( a b )``, lists as ``[ a b ]``, dicts as
  ``{ k=v }``, arrays with ``numpy.array2string(threshold=threshold)``.

  Arguments:
    arg: the pytree to print; it is also returned (unless ``result``).
    result, tap_with_device, device_index, callback_flavor, delivery,
      partitioned: as for ``id_tap``.
    output_stream: an object with ``write(str)``; ``sys.stdout`` if None.
    threshold: passed to ``numpy.array2string``.
    **kwargs: printed before the value (``tap_with_transform`` excepted, for
      old code).

  Returns:
    ``arg``, or ``result`` if given.

  Example:
    >>> import jax.numpy as jnp
    >>> from hostcall import host_callback as hcb
    >>> _ = hcb.id_print(jnp.arange(3.), what="y"); hcb.barrier_wait()
    what: y
    [0. 1. 2.]
  """
  del callback_flavor
  for name in _ACCEPTED_NO_OP_KWARGS:
    kwargs.pop(name, None)
  printer = functools.partial(_print_tap, output_stream=output_stream,
                              threshold=threshold, **kwargs)
  return id_tap(printer, arg, result=result, tap_with_device=tap_with_device,
                device_index=device_index, delivery=delivery,
                partitioned=partitioned)


def call(callback_func: Callable, arg, *, result_shape=None,
         call_with_device=False, device_index=0,
         callback_flavor=CallbackFlavor.IO_CALLBACK, result_shape_dtypes=None):
  """Calls ``callback_func`` on the host and returns its result to the device.

  Arguments:
    callback_func: called as ``callback_func(arg)`` (or
      ``callback_func(arg, device=dev)`` with ``call_with_device``). When
      ``arg`` is a tuple and the function takes its elements as separate
      parameters (and cannot take one argument), it is called as
      ``callback_func(*arg)``. Must return NumPy-compatible values matching
      ``result_shape``.
    arg: a pytree of arrays sent to the host.
    result_shape: a pytree of numeric scalars or objects with ``.shape`` and
      ``.dtype`` (``jax.ShapeDtypeStruct``, an array) describing the result;
      ``None`` or ``()`` when there is none.
    call_with_device: pass the calling device to ``callback_func``.
    device_index: under ``jit`` over several devices, which device calls.
    callback_flavor: accepted for old code; changes nothing.
    result_shape_dtypes: a synonym of ``result_shape``.

  Returns:
    The host function's result, as JAX arrays in the ``result_shape`` pytree.
    A result of another structure, shape or dtype, and any exception of the
    host function, fail the JAX computation with an error naming both.

  Example:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from hostcall import host_callback as hcb
    >>> jax.jit(lambda m: hcb.call(np.linalg.eigvalsh, m,
    ...     result_shape=jax.ShapeDtypeStruct((2,), m.dtype)))(jnp.eye(2))
    Array([1., 1.], dtype=float32)
  """
  del callback_flavor
  if result_shape_dtypes is not None:
    if result_shape is not None:
      raise TypeError("call: pass result_shape or result_shape_dtypes (a "
                      "synonym), not both.")
    result_shape = result_shape_dtypes
  check_callable(callback_func, "call's callback_func")
  flat, in_tree = jax.tree_util.tree_flatten(arg)
  check_operands(flat, "call")
  result_tree, result_avals = results.avals_from_shapes(
      result_shape, "result_shape", legacy=True)
  unpack = _unpack_tuple_arg(callback_func, arg, bool(call_with_device))
  if not unpack:
    check_arguments(
        callback_func, ["arg"],
        {"device": None} if call_with_device else {}, "host_callback.call",
        "call passes its argument as one value (a tuple stays a tuple)" +
        (" and the device as device=" if call_with_device else "") + ".")
  host_target = _Call(callback_func, in_tree, result_tree,
                      tuple(result_avals), bool(call_with_device), unpack)
  outs = bind(flat, target=host_target, kind="call", result_avals=result_avals,
              device_index=device_index)
  return jax.tree_util.tree_unflatten(result_tree, outs)


def barrier_wait(logging_name: str | None = None) -> None:
  """Blocks until every callback started before it has run on the host.

  Raises ``CallbackException`` (with the last exception's text and traceback)
  if any tap function raised since the last barrier.

  Arguments:
    logging_name: a name for this barrier in hostcall's debug log.

  Example:
    >>> import jax
    >>> from hostcall import host_callback as hcb
    >>> _ = jax.jit(lambda x: hcb.id_tap(lambda v, t: 1 / 0, x))(1.0)
    >>> try:
    ...   hcb.barrier_wait()
    ... except hcb.CallbackException as e:
    ...   print(type(e.__cause__).__name__)
    ZeroDivisionError
  """
  barrier(logging_name)


def stop_outfeed_receiver() -> None:
  """Does nothing: there is no outfeed receiver to stop. Kept for old code.

  The legacy module received taps through outfeed with a receiver thread
  that this stopped; hostcall's taps need none (asynchronous ones are
  delivered by a thread that ``barrier_wait`` and interpreter exit drain).
  """

"""Every JAX name beyond ``jax`` and ``jax.extend`` that hostcall uses.

Two kinds, gathered in one place so that a JAX release that moves one breaks
here, loudly (``tests/test_jax_private.py`` checks each name), and nowhere
else:

* the interpreter APIs a primitive needs (``jax.interpreters`` and
  ``jax.core``): rule registries, symbolic zeros, abstract values, the
  MLIR helpers;
* private names (``jax._src``), for what JAX's public API cannot say: a new
  side effect legal inside ``scan``/``while``/``cond``, ``custom_jvp`` and
  ``checkpoint``; the sharding JAX gives its own callbacks; JAX's io
  callback effects; the batching of a ``while`` loop; a few sharding
  annotations; the key-value store of ``jax.distributed``'s coordination
  service.
"""

from __future__ import annotations

import functools
import inspect
import itertools

import jax
import numpy as np
from jax import core as _public_core
from jax.extend import core as _jex_core
from jax.extend.mlir.dialects import sdy as _sdy
from jax._src import callback as _callback
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import distributed as _distributed
from jax._src import effects as _effects
from jax._src import literals as _literals
from jax._src import named_sharding as _named_sharding
from jax._src import sharding_impls as _sharding_impls
from jax._src import source_info_util as _source_info_util
from jax._src import traceback_util as _traceback_util
from jax._src import util as _util
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import mlir as _private_mlir
from jax._src.interpreters import partial_eval as _pe
from jax._src.lax.control_flow import loops as _loops
from jax._src.lib import xla_client as _xc
from jax.interpreters import ad as _ad
from jax.interpreters import batching as _public_batching
from jax.interpreters import mlir as _mlir
from jax.interpreters import partial_eval as _public_pe

try:  # gone from JAX 0.11.2, with ``jax.experimental.shard_alike``
  from jax._src import shard_alike as _shard_alike
except ImportError:
  _shard_alike = None

# --- interpreter APIs (jax.interpreters, jax.core) --------------------------

#: Abstract values: the shape and dtype of an array; a tracer's class.
ShapedArray = _public_core.ShapedArray
Tracer = _public_core.Tracer

#: Automatic differentiation: a symbolic zero tangent, the marker of an
#: operand being transposed, and the rule registries.
Zero = _ad.Zero
UndefinedPrimal = _ad.UndefinedPrimal
is_undefined_primal = _ad.is_undefined_primal
primitive_jvps = _ad.primitive_jvps
primitive_transposes = _ad.primitive_transposes

#: ``vmap``: the rule registries (``fancy`` rules receive the axis data).
primitive_batchers = _public_batching.primitive_batchers
fancy_primitive_batchers = _public_batching.fancy_primitive_batchers

#: ``jax.checkpoint``: how a primitive is split between saved and
#: rematerialised computation.
partial_eval_jaxpr_custom_rules = _public_pe.partial_eval_jaxpr_custom_rules

#: MLIR lowering: the rule registry, effect tokens, constants
#: (``emit_python_callback`` and ``aval_to_ir_types``: below, with what
#: older releases need).
register_lowering = _mlir.register_lowering
TokenSet = _mlir.TokenSet
ir_constant = _mlir.ir_constant

#: The base class of effects, and the current trace: public in
#: ``jax.extend.core`` from JAX 0.10, the same objects in ``jax._src`` before.
Effect = getattr(_jex_core, "Effect", None) or _effects.Effect
take_current_trace = (getattr(_jex_core, "take_current_trace", None)
                      or _core.take_current_trace)

# Before JAX 0.10, ``aval_to_ir_types(aval)``, without the module context.
_AVAL_TO_IR_TYPES_TAKES_CONTEXT = len(
    inspect.signature(_mlir.aval_to_ir_types).parameters) == 2


def aval_to_ir_types(module_context, aval):
  """The IR types of ``aval`` (``mlir.aval_to_ir_types``), on every JAX."""
  if _AVAL_TO_IR_TYPES_TAKES_CONTEXT:
    return _mlir.aval_to_ir_types(module_context, aval)
  return _mlir.aval_to_ir_types(aval)


#: Host constants JAX may hand a primitive that are not ``np.ndarray``:
#: JAX 0.8-0.9's ``TypedNdArray`` wraps one (from 0.10 it subclasses it).
_TYPED = getattr(_literals, "TypedNdArray", None)
HOST_CONSTANT_TYPES: tuple[type, ...] = (
    (_TYPED,) if _TYPED is not None and not issubclass(_TYPED, np.ndarray)
    else ())

# Before JAX 0.8.2, no ``returns_token``: a token is returned exactly when
# one is passed, which is what hostcall always asks for.
_EMIT_TAKES_RETURNS_TOKEN = "returns_token" in inspect.signature(
    _mlir.emit_python_callback).parameters

# Before JAX 0.10, the token of an ordered callback with results is
# annotated as replicated, which XLA refuses on several devices ("side-effect
# HLO cannot have a replicated sharding"); 0.10 puts it on the callback's
# device, as hostcall then does.
_TOKEN_SHARDING_IS_REPLICATED = jax.__version_info__ < (0, 10)

# Before JAX 0.10, sub-byte arrays crossing a Python callback are garbled
# when their size is not a multiple of the packing (JAX's own callbacks
# too): hostcall widens them around the callback there.
_WIDER = ({"int2": np.int8, "int4": np.int8, "uint2": np.uint8,
           "uint4": np.uint8, "float4_e2m1fn": np.float32}
          if jax.__version_info__ < (0, 10) else {})


def _widened(aval):
  wider = _WIDER.get(getattr(aval.dtype, "name", None))
  return aval if wider is None else aval.update(dtype=np.dtype(wider))


def emit_python_callback(ctx, callback, token, operands, operand_avals,
                         result_avals, *, returns_token: bool = True,
                         sharding=None, **kwargs):
  """JAX's runtime Python callback (``mlir.emit_python_callback``): returns
  ``(results, token, keep_alive)``, the same on every supported JAX."""
  wide_in = [_widened(a) for a in operand_avals]
  wide_out = [_widened(a) for a in result_avals]
  if wide_in != list(operand_avals) or wide_out != list(result_avals):
    return _emit_widened(ctx, callback, token, operands, operand_avals,
                         result_avals, wide_in, wide_out,
                         returns_token=returns_token, sharding=sharding,
                         **kwargs)
  if _EMIT_TAKES_RETURNS_TOKEN:
    kwargs["returns_token"] = returns_token
  results, token_out, keep = _mlir.emit_python_callback(
      ctx, callback, token, operands, operand_avals, result_avals,
      sharding=sharding, **kwargs)
  if (_TOKEN_SHARDING_IS_REPLICATED and token_out is not None and result_avals
      and isinstance(sharding, _sharding_impls.SdyArrayList)):
    device = _named_sharding.SdyArray(
        mesh_shape=(), dim_shardings=[],
        logical_device_ids=sharding.shardings[0].logical_device_ids)
    _private_mlir.set_sharding(token_out.owner, _sharding_impls.SdyArrayList(
        [device, *sharding.shardings]))
  return results, token_out, keep


def _emit_widened(ctx, callback, token, operands, operand_avals,
                  result_avals, wide_in, wide_out, **kwargs):
  """The callback on widened sub-byte operands and results (JAX < 0.10)."""
  narrow_in = [a.dtype for a in operand_avals]
  narrow_out = list(result_avals)

  def widened_callback(*flat):
    outs = callback(*[np.asarray(x).astype(d, copy=False)
                      for x, d in zip(flat, narrow_in)])
    return tuple(np.asarray(o).astype(w.dtype) if w is not n else o
                 for o, w, n in zip(outs, wide_out, narrow_out))

  operands = [x if w is a else _private_mlir.convert_hlo(ctx, x, a, w)
              for x, a, w in zip(operands, operand_avals, wide_in)]
  ctx = ctx.replace(avals_in=wide_in, avals_out=wide_out)
  results, token_out, keep = emit_python_callback(
      ctx, widened_callback, token, operands, wide_in, wide_out, **kwargs)
  results = [r if w is n else _private_mlir.convert_hlo(ctx, r, w, n)
             for r, w, n in zip(results, wide_out, narrow_out)]
  return results, token_out, keep

# --- private names (jax._src) ------------------------------------------------

#: Axis context of a ``shard_map`` body (manual, per-device semantics).
SPMDAxisContext = _sharding_impls.SPMDAxisContext
#: Axis context of a ``jit`` over one or more devices (global semantics).
ShardingContext = _sharding_impls.ShardingContext

#: ``callback_op_sharding(axis_context, sharding, avals_out)``: the op sharding
#: JAX gives its own callbacks (MAXIMAL on one device under ``jit``, MANUAL
#: under ``shard_map``), or None on one device.
callback_op_sharding = _callback._callback_op_sharding

# Before JAX 0.10, ``set_sharding(op, sharding)``, without the context.
_SET_SHARDING_TAKES_CONTEXT = len(
    inspect.signature(_private_mlir.set_sharding).parameters) == 3


def set_sharding(module_context, op, sharding) -> None:
  """Annotates a custom call we emit ourselves with the sharding
  ``callback_op_sharding`` chose."""
  if _SET_SHARDING_TAKES_CONTEXT:
    _private_mlir.set_sharding(module_context, op, sharding)
  else:
    _private_mlir.set_sharding(op, sharding)

def cache_weakly(cls: type) -> None:
  """Makes JAX's caches keyed by a primitive's parameters (its abstract
  evaluation's, eager dispatch's: ``util.multi_weakref_lru_cache``) hold
  instances of exactly ``cls`` weakly, as they hold jaxprs: an entry then
  goes with its key instead of keeping it (and what it refers to) alive
  for the next 2,048 entries. Before JAX 0.7, no such caches: nothing to
  do."""
  types = getattr(_util, "weakref_cache_key_types", None)
  if types is not None:
    types.add(cls)


def keep_with_executable(ctx, obj) -> None:
  """Makes the Python executable compiled from the module being lowered
  own ``obj`` (``keepalives``), and release it with itself.

  Not ``host_callbacks``, which the runtime executable would own: on CPU a
  program with host callbacks runs synchronously, so that every call
  carrying a queued tap would wait for its program to end (measured: a
  2000-step scan's call returned after 100% of its run instead of 5%).
  The Python executable may go before a computation it started ends (or,
  for a program JAX's C++ dispatch keeps, while that still runs it):
  ``hostcall._async.queue.sites`` forgets a released site only after a
  barrier has waited for what was dispatched before the release."""
  keepalives = getattr(ctx.module_context, "keepalives", None)
  if keepalives is None:  # a JAX without them: owned, but synchronously
    ctx.module_context.add_host_callback(obj)
  else:
    keepalives.append(obj)


#: The token aval, compared by identity when lowering custom calls.
abstract_token = _core.abstract_token

#: ``jax.experimental.io_callback``'s effects (unordered, ordered). JAX's
#: rules for io callbacks test for these very objects: vmap of ``cond`` and of
#: a ``while_loop`` with a batched predicate refuse them, ``checkpoint``'s
#: partial evaluation and ``custom_jvp`` do not allow them.
IO_EFFECT = _callback._IOEffect
ORDERED_IO_EFFECT = _callback._OrderedIOEffect


def replicated(ctx, value, aval):
  """``value`` annotated as replicated on every device of a global view.

  A callback's result lives on the one device that made the call; without
  this, XLA leaves it there (a "maximal" array that reads as zeros from any
  other device and that later computations refuse).
  """
  if _config.use_shardy_partitioner.value:
    sharding = _named_sharding.SdyArray(
        mesh_shape=None, dim_shardings=tuple(
            _named_sharding.SdyDim(axes=(), is_open=True)
            for _ in range(aval.ndim)))
  else:
    sharding = _xc.HloSharding.replicate().to_proto()
  return _private_mlir.wrap_with_sharding_op(ctx, value, aval, sharding)


#: Sharding group ids, where JAX has no ``shard_alike`` counting them.
_shard_group_ids = itertools.count()


def shard_alike(ctx, x, y, x_aval, y_aval):
  """``y``, kept in one sharding group with ``x`` (what
  ``jax.experimental.shard_alike`` lowers to), so XLA shards them alike."""
  if _shard_alike is not None:  # JAX's, whose group ids its own calls share
    return _shard_alike._group_shard(ctx, x, y, x_aval, y_aval)[1]
  # From JAX 0.11.2, the same annotations (JAX's ``_group_shard`` of 0.11.1).
  group = next(_shard_group_ids)
  if _config.use_shardy_partitioner.value:
    _sdy.sharding_group(x, group)
    _sdy.sharding_group(y, group)
    return y
  sharding = _xc.OpSharding()
  sharding.type = _xc.OpSharding.Type.UNKNOWN
  sharding.is_shard_group = True
  sharding.shard_group_id = group
  sharding.shard_group_type = _xc.OpSharding.ShardGroupType.AS
  _private_mlir.wrap_with_sharding_op(ctx, x, x_aval, sharding,
                                      has_side_effect=True)
  return _private_mlir.wrap_with_sharding_op(ctx, y, y_aval, sharding,
                                             has_side_effect=True)


def split_over_devices(ctx, value, aval, num_devices: int):
  """``value`` (of shape ``(num_devices,)``) annotated so that device ``k``
  of the computation holds element ``k``."""
  if _config.use_shardy_partitioner.value:
    sharding = _named_sharding.SdyArray(
        mesh_shape=(("_hostcall_devices", num_devices),),
        dim_shardings=(_named_sharding.SdyDim(
            axes=("_hostcall_devices",), is_open=False),),
        logical_device_ids=None)
  else:
    sharding = _xc.OpSharding()
    sharding.type = _xc.OpSharding.Type.OTHER
    sharding.tile_assignment_dimensions = [num_devices]
    sharding.tile_assignment_devices = list(range(num_devices))
  return _private_mlir.wrap_with_sharding_op(ctx, value, aval, sharding)


def batch_jaxpr_axes(closed_jaxpr, axis_data, in_axes, out_axes_dest):
  """A jaxpr batched as a batching rule's operands are (``axis_data`` is the
  rule's own), its outputs moved to ``out_axes_dest``."""
  return _batching.batch_jaxpr_axes(closed_jaxpr, axis_data, in_axes,
                                    out_axes_dest)[0]


#: ``batch_jaxpr(closed_jaxpr, axis_data, in_batched, instantiate)``:
#: ``(jaxpr, out_batched)``, as JAX's control-flow batching rules use it.
batch_jaxpr = _batching.batch_jaxpr


#: Effects that are no side effect (named axes, a function's own mutable
#: arrays): a branch holding only these is as pure as JAX's rules see it.
NOT_REALLY_EFFECTS = tuple(
    t for t in (getattr(_core, "NamedAxisEffect", None),
                getattr(_core, "InternalMutableArrayEffect", None))
    if t is not None)


#: ``io_callback_impl(*args, callback, result_avals, sharding, ordered)``:
#: what ``jax.experimental.io_callback`` does outside ``jit`` (values put on
#: the CPU, the callback called, its failure logged as JAX logs it); None
#: where this release has no such function.
io_callback_impl = getattr(_callback, "io_callback_impl", None)


def is_ordered_effect(effect) -> bool:
  """Whether JAX sequences ``effect`` with a token (an ordered effect)."""
  return _effects.ordered_effects.contains(effect)


def is_dropped(var) -> bool:
  """Whether an equation's output ``var`` is read by nothing (JAX writes a
  ``DropVar`` there)."""
  return type(var).__name__ == "DropVar"


def user_frame_of(eqn) -> str | None:
  """``file:line`` of the user's code that staged ``eqn``, where known."""
  package = __file__.rsplit("/", 1)[0]
  for frame in _source_info_util.user_frames(eqn.source_info.traceback):
    if not frame.file_name.startswith(package):
      return f"{frame.file_name}:{frame.start_line}"
  return None


def varying_axes(aval) -> frozenset:
  """The ``shard_map`` axes an abstract value varies over: its manual axis
  type's ``varying`` (JAX 0.10 on) or its ``vma`` (before)."""
  manual = getattr(aval, "manual_axis_type", None)
  if manual is not None:
    return frozenset(getattr(manual, "varying", ()) or ())
  return frozenset(getattr(aval, "vma", ()) or ())


def broadcast_batched(x, axis_data, dim):
  """``x`` (batched at ``dim``, or not at all when None) batched at 0."""
  if dim is None:
    return _batching.broadcast(x, axis_data.size, 0,
                               axis_data.explicit_mesh_axis)
  return _batching.moveaxis(x, dim, 0)


def register_effect(effect_type: type, *, ordered: bool,
                    shardable: bool = True) -> None:
  """Declares ``effect_type`` legal everywhere a JAX callback effect is
  (``shardable``: an ordered effect allowed in a computation over several
  devices, as JAX's ordered io callbacks; JAX's ordered debug callbacks are
  not)."""
  for registry in (
      _effects.lowerable_effects,
      _effects.control_flow_allowed_effects,
      _effects.custom_derivatives_allowed_effects,
      _effects.remat_allowed_effects,
      # Kept through partial evaluation (grad of a loop body), as JAX keeps
      # its debug callbacks.
      _effects.partial_eval_kept_effects,
  ):
    registry.add_type(effect_type)
  if ordered:
    _effects.ordered_effects.add_type(effect_type)
    if shardable:
      _effects.shardable_ordered_effects.add_type(effect_type)


def keep_io_in_partial_evaluation() -> None:
  """Keeps JAX's io callback effects through partial evaluation, as JAX
  keeps its debug callbacks: without it, an io call staged with an unknown
  operand (a loop's carry, while ``grad`` splits the loop) is dropped."""
  for effect in (_callback._IOEffect, _callback._OrderedIOEffect):
    _effects.partial_eval_kept_effects.add_type(type(effect))


def keep_calls_in_loop_bodies(moves_a_call) -> None:
  """Stops ``grad``'s split of a ``lax.scan`` from hoisting a call out of
  the loop: JAX moves out of the body every equation whose operands do not
  change from step to step (a call with no operands, or with only the
  loop's constants), so a call written once a step ran once (JAX #16637).
  Where ``moves_a_call(jaxpr, n_consts)`` (its first ``n_consts`` inputs
  are the loop's constants), the known loop is left whole, its constants
  passed in as JAX's own "to disable" path does; elsewhere JAX hoists (a
  loop-invariant value is then computed once, not stacked a step)."""
  hoist = _loops._scan_known_hoisting
  if getattr(hoist, "_hostcall_keeps", False):
    return
  def scan_known_hoisting(jaxpr_known, known_consts, num_res, *rest):
    if (not moves_a_call(jaxpr_known, len(known_consts))
        or any(isinstance(_loops.typeof(c), _loops.AbstractRef)
               for c in known_consts)):
      return hoist(jaxpr_known, known_consts, num_res, *rest)
    jaxpr = _pe.convert_constvars_jaxpr(jaxpr_known.jaxpr)
    if _hoisting_returns_closed(hoist):
      jaxpr = _pe.close_jaxpr(jaxpr)
    return (jaxpr, [*jaxpr_known.consts, *known_consts], [False] * num_res,
            [])

  scan_known_hoisting._hostcall_keeps = True
  _loops._scan_known_hoisting = scan_known_hoisting


def restage_while_without(strip) -> None:
  """Keeps the primal host calls of a ``while_loop`` out of the loop that
  ``jax.linearize`` stages for its tangents. JAX's partial evaluation of
  ``while`` runs the known (primal) loop, then stages the whole loop again
  to compute the unknown outputs, primal and all, so every call in the
  body ran twice a step, and again each time the linear function was
  applied. Where the rule split the loop (some outputs known, some
  staged), the staged loop's body becomes ``strip(body_jaxpr, unknown)``
  (None leaves it as it is), ``unknown`` saying which of the body's inputs
  (its constants, then the carry) the known loop did not have."""
  rules = _pe.custom_partial_eval_rules
  rule = rules[_loops.while_p]
  if getattr(rule, "_hostcall_restages", False):
    return

  def while_partial_eval(trace, *tracers, **params):
    outs = rule(trace, *tracers, **params)
    staged = [t for t in outs if isinstance(t, _pe.JaxprTracer)
              and not t.pval.is_known()]
    if not staged or len(staged) == len(outs):
      return outs  # not split: the loop runs once, known or staged
    recipe = staged[0].recipe
    n_cond = params["cond_nconsts"]
    body_consts = tracers[n_cond:n_cond + params["body_nconsts"]]
    unknown = ([not t.pval.is_known() for t in body_consts]
               + [any(t is s for s in staged) for t in outs])
    body = strip(recipe.params["body_jaxpr"], unknown)
    if body is None:
      return outs
    new_params = dict(recipe.params, body_jaxpr=body)
    effects = _loops._join_while_effects(
        body, new_params["cond_jaxpr"], new_params["body_nconsts"],
        new_params["cond_nconsts"])
    restaged = recipe._replace(params=new_params, effects=effects)
    for tracer in staged:
      tracer.recipe = restaged
    return outs

  while_partial_eval._hostcall_restages = True
  rules[_loops.while_p] = while_partial_eval


def explain_checkpoint_refusal(explain) -> None:
  """Adds ``explain(message)`` to JAX's refusal of an effect it cannot
  split under ``jax.checkpoint`` (``NotImplementedError: Effects not
  supported in partial-eval of `checkpoint`/`remat```), where JAX raises it:
  its partial-evaluation rule (before 0.11) or its rematerialised
  primitive's differentiability check (0.11 on)."""
  from jax._src import ad_checkpoint

  def explained(check):
    if getattr(check, "_hostcall_explains", False):
      return check

    def check_explained(*args, **kwargs):
      try:
        return check(*args, **kwargs)
      except NotImplementedError as error:
        message = str(error)
        if "checkpoint" not in message or "Effects" not in message:
          raise
        raise NotImplementedError(explain(message)) from None
    check_explained._hostcall_explains = True
    return check_explained

  rules = _pe.custom_partial_eval_rules
  if ad_checkpoint.remat_p in rules:
    rules[ad_checkpoint.remat_p] = explained(rules[ad_checkpoint.remat_p])
  traced = getattr(ad_checkpoint, "RematTraced", None)
  if traced is not None and hasattr(traced, "_check_differentiable"):
    traced._check_differentiable = explained(traced._check_differentiable)


@functools.cache
def _hoisting_returns_closed(hoist) -> bool:
  """Whether this release's ``_scan_known_hoisting`` returns a closed
  jaxpr (before 0.11) or an open one; asked of JAX once, on a loop body
  of one constant and one carry."""
  closed = jax.make_jaxpr(lambda c, x: (x + c,))(1.0, 1.0)
  n_res = len(inspect.signature(hoist).parameters) - 2
  out = hoist(closed, [np.float32(1.0)], *([0] * n_res))[0]
  return isinstance(out, _jex_core.ClosedJaxpr)


def require_devices_during_lowering(primitive) -> None:
  """Makes JAX hand the concrete device assignment to ``primitive``'s
  lowering."""
  _dispatch.prim_requires_devices_during_lowering.add(primitive)


def is_recompute_policy(policy) -> bool:
  """Whether a ``jax.checkpoint`` policy's answer means "recompute, don't
  save"."""
  return isinstance(_pe.ensure_enum(policy), _pe.RecomputeType)


def hide_frames_of(directory: str) -> None:
  """Leaves the frames of files under ``directory`` out of the tracebacks
  JAX filters (``JAX_TRACEBACK_FILTERING``), as JAX leaves out its own: an
  error raised while tracing a user's function points at that function."""
  _traceback_util.register_exclusion(directory)


# The modules whose frames call a host callback from the runtime (JAX's
# wrappers between the runtime and the Python function).
_CALLBACK_FILES = frozenset({_callback.__file__, _private_mlir.__file__})


def is_callback_frame(frame) -> bool:
  """Whether ``frame`` is JAX's, calling a host callback for the runtime:
  the frames below such a frame (if any) are those of the thread that waits
  for the computation."""
  return frame.f_code.co_filename in _CALLBACK_FILES


_JAX_DIR = jax.__file__.rsplit("__init__.py", 1)[0]


def is_jax_frame(frame) -> bool:
  """Whether ``frame`` runs JAX's code (its dispatch, say)."""
  return frame.f_code.co_filename.startswith(_JAX_DIR)


def trace_of(value):
  """The trace a tracer belongs to (None for a concrete value or a value
  JAX does not trace). Raises when JAX's tracers stop keeping it."""
  if not isinstance(value, _core.Tracer):
    return None
  try:  # not getattr: a tracer forwards unknown attributes to its aval
    return object.__getattribute__(value, "_trace")
  except AttributeError:
    raise RuntimeError(
        "hostcall: JAX tracers no longer keep their trace in `_trace`; this "
        "JAX release is not supported yet (update "
        "hostcall._jax_private.trace_of).") from None


def collective_axis_names() -> tuple:
  """The named axes a collective may reduce over where a value is traced
  (``shard_map``, ``pmap`` and named ``vmap`` axes; not the explicit mesh
  axes of a global view, which name no collective)."""
  env = _core.get_axis_env()
  explicit = getattr(env, "explicit_mesh_axis_names", frozenset())
  return tuple(n for n in env.axis_names() if n not in explicit)


def wait_for_effects() -> None:
  """``jax.effects_barrier()``, except that a computation that failed ends
  its wait like any other. JAX's stops at the first failed computation's
  token and keeps it, so that every later effects barrier raises that old
  error again (seen on several devices), and waits for no other token."""
  tokens = _dispatch.runtime_tokens
  for token in [*tokens.current_tokens.values(),
                *tokens.output_runtime_tokens.values()]:
    try:
      token.block_until_ready()
    except jax.errors.JaxRuntimeError:
      pass  # its error reached whoever waits for its results
  tokens.clear()


def start_ordered_effects_afresh_after_a_failure() -> None:
  """Keeps one failed computation from failing every later one (JAX #37587).

  JAX threads a runtime token through every computation with ordered
  effects; a computation that failed leaves an errored token, which the
  next one takes as input and fails with, without running, and so on, and
  ``jax.effects_barrier()`` (and JAX's exit hook) raise it again every
  time. Here a token known to have failed (ready, with an error: whoever
  waited for the failed computation was told) is not handed on: the next
  computation starts a fresh sequence; and waiting for the tokens forgets
  them even when one failed, so a failure is raised once.
  """
  token_set = type(_dispatch.runtime_tokens)
  if getattr(token_set.get_token_input, "_hostcall_afresh", False):
    return
  get_token_input = token_set.get_token_input
  block_until_ready = token_set.block_until_ready

  def get_token_input_afresh(self, eff, devices):
    token = self.current_tokens.get(eff)
    if token is not None and _has_failed(token):
      del self.current_tokens[eff]
    return get_token_input(self, eff, devices)

  def block_until_ready_once(self):
    try:
      block_until_ready(self)
    finally:
      self.clear()

  get_token_input_afresh._hostcall_afresh = True
  token_set.get_token_input = get_token_input_afresh
  token_set.block_until_ready = block_until_ready_once


def _has_failed(token) -> bool:
  """Whether a runtime token is ready and holds an error (never waits)."""
  buffer = getattr(token, "_buf", token)
  is_ready = getattr(buffer, "is_ready", None)
  if is_ready is None or not is_ready():
    return False
  try:
    buffer.block_until_ready()
  except jax.errors.JaxRuntimeError:
    return True
  return False


# Frames of JAX's loops, while they trace a body: lax.scan and the
# functions its body is traced in (lax.map and a fori_loop of static bounds
# go through them), lax.while_loop (a fori_loop of traced bounds too).
_SCAN_CODES = frozenset(
    inspect.unwrap(getattr(_loops, name)).__code__
    for name in ("scan", "scan_nocarry") if hasattr(_loops, name))
_WHILE_CODES = frozenset({inspect.unwrap(_loops.while_loop).__code__})


def loop_of_frame(frame) -> tuple[str, int | None] | None:
  """``("scan", length)`` where ``frame`` is ``lax.scan`` (its number of
  steps, where known), ``("while", None)`` where it is
  ``lax.while_loop``, None for any other frame. Walking up from a loop
  body being traced, the first one found is the loop that runs it."""
  if frame.f_code in _SCAN_CODES:
    length = frame.f_locals.get("length")
    return "scan", (length if isinstance(length, int) else None)
  if frame.f_code in _WHILE_CODES:
    return "while", None
  return None


def scan_layout(params) -> tuple[int, int] | None:
  """``(num_consts, num_carry)`` of a ``scan`` equation's operands (consts,
  then carry, then xs), from its parameters; None where this release lays
  them out in a way not known here."""
  if "num_consts" in params and "num_carry" in params:
    return params["num_consts"], params["num_carry"]
  flat = params.get("ft_in")  # JAX 0.12: a flat tree (consts, carry, xs)
  parts = getattr(flat, "elts", None)
  if parts is None or len(parts) != 3:
    return None
  return _leaf_count(parts[0]), _leaf_count(parts[1])


def _leaf_count(flat_tree) -> int:
  elts = getattr(flat_tree, "elts", None)
  return 1 if elts is None else sum(_leaf_count(e) for e in elts)


def is_top_level() -> bool:
  """Whether no transformation traces the caller (no ``jit``, ``vmap``,
  ``grad`` around it): values are concrete arrays."""
  return _core.trace_ctx.is_top_level()


def _dispatching_at_top_level_reader():
  """The quickest test of ``is_top_level() and not jax_disable_jit`` this
  JAX release allows: its config states read directly (checked per call by
  ``hostcall.jit``, a dispatch of a few microseconds)."""
  disable = getattr(_config, "disable_jit", None)
  if getattr(disable, "value", None) is None:
    return lambda: is_top_level() and not jax.config.jax_disable_jit
  try:  # JAX 0.10 and later (as tested): the trace in config states
    strong, axis = _core.trace_state_strong_ref, _core.axis_env_state
    strong.value, axis.value  # noqa: B018 - both readable
    # What they hold at the top level, both made once when JAX's core is
    # imported.
    evaluating, no_axes = _core.eval_trace, _core.top_axis_env
  except AttributeError:  # JAX 0.8: in a thread-local TracingContext
    context = _core.trace_ctx

    def dispatching_at_top_level_in_context() -> bool:
      return context.is_top_level() and not disable.value
    return dispatching_at_top_level_in_context

  def dispatching_at_top_level() -> bool:
    return (strong.value is evaluating and axis.value is no_axes
            and not disable.value)
  return dispatching_at_top_level


#: ``dispatching_at_top_level()``: whether a jitted call made now is
#: dispatched as a compiled program (no transformation traces the caller,
#: ``jax.disable_jit`` is off).
dispatching_at_top_level = _dispatching_at_top_level_reader()


def bind_equation(eqn, invals):
  """Binds ``eqn``'s primitive on ``invals`` in the current trace, as
  ``jax.core.eval_jaxpr`` does (its parameters made bindable, its source
  location and context kept)."""
  params = eqn.primitive.get_bind_params(eqn.params)
  subfuns = ()
  if isinstance(params, tuple):  # JAX before 0.9: (subfuns, params)
    subfuns, params = params
  name_stack = (_source_info_util.current_name_stack()
                + eqn.source_info.name_stack)
  with _source_info_util.user_context(eqn.source_info.traceback,
                                      name_stack=name_stack), \
      eqn.ctx.manager:
    return eqn.primitive.bind(*subfuns, *invals, **params)


def device_assignment(sharding) -> tuple:
  """The devices of ``sharding`` in the order of the computation's device
  assignment (what a call's ``device_index`` counts), by id where the
  sharding does not keep it."""
  devices = getattr(sharding, "_device_assignment", None)
  return tuple(devices) if devices else tuple(
      sorted(sharding.device_set, key=lambda d: d.id))


def distributed_client():
  """``(client, process_id, num_processes)`` of ``jax.distributed``, or None
  where it is not initialized; read without starting JAX's backends. The
  client's key-value store (``key_value_set_bytes``,
  ``blocking_key_value_get_bytes``, ``key_value_delete``) is the
  coordination service's, which every process of the job reaches."""
  state = _distributed.global_state
  if state.client is None:
    return None
  return state.client, state.process_id, state.num_processes


def keep_when_unused(primitive) -> None:
  """Makes JAX's dead-code elimination keep every equation of
  ``primitive`` although it has no effect and its results may go unused
  (``pe.dce_rules``): its side effect lives in the compiled program only
  (an XLA custom call with a side effect, which XLA keeps)."""
  def keep(*args):
    # (used_outputs, eqn), or (used_outputs, live_inputs, eqn) since 0.12.
    eqn = args[-1]
    return [True] * len(eqn.invars), eqn
  _pe.dce_rules[primitive] = keep

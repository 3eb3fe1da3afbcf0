"""Batching, effects and equations: ``vmap``'s helpers, the registration
of hostcall's effects, JAX's io callback effects, and reading a traced
equation or value."""

from __future__ import annotations

import functools
import inspect

import jax
from jax._src import callback as _callback
from jax._src import config as _config
from jax._src import core as _core
from jax._src import debugging as _debugging
from jax._src import effects as _effects
from jax._src import source_info_util as _source_info_util
from jax._src import util as _util
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import partial_eval as _pe


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

#: ``jax.experimental.io_callback``'s effects (unordered, ordered). JAX's
#: rules for io callbacks test for these very objects: vmap of ``cond`` and of
#: a ``while_loop`` with a batched predicate refuse them, ``checkpoint``'s
#: partial evaluation and ``custom_jvp`` do not allow them.
IO_EFFECT = _callback._IOEffect
ORDERED_IO_EFFECT = _callback._OrderedIOEffect


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


def varying_axes(aval) -> frozenset:
  """The ``shard_map`` axes an abstract value varies over: its manual axis
  type's ``varying`` (JAX 0.10 on) or its ``vma`` (before)."""
  manual = getattr(aval, "manual_axis_type", None)
  if manual is not None:
    return frozenset(getattr(manual, "varying", ()) or ())
  return frozenset(getattr(aval, "vma", ()) or ())


def made_varying(value, axes: tuple):
  """``value`` made varying over the ``shard_map`` axes ``axes``:
  ``jax.lax.pcast(..., to="varying")`` from JAX 0.9, ``jax.lax.pvary``
  before."""
  if not axes:
    return value
  pcast = getattr(jax.lax, "pcast", None)
  if pcast is not None:
    return pcast(value, axes, to="varying")
  return jax.lax.pvary(value, axes)


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


def source_context_of(eqn):
  """A context in which what is bound has ``eqn``'s source location (the
  user's file and line, where ``eqn`` was staged) and name stack, as
  ``jax.core.eval_jaxpr`` binds each equation."""
  name_stack = (_source_info_util.current_name_stack()
                + eqn.source_info.name_stack)
  return _source_info_util.user_context(eqn.source_info.traceback,
                                        name_stack=name_stack)


def bind_equation(eqn, invals):
  """Binds ``eqn``'s primitive on ``invals`` in the current trace, as
  ``jax.core.eval_jaxpr`` does (its parameters made bindable, its source
  location and context kept)."""
  params = eqn.primitive.get_bind_params(eqn.params)
  subfuns = ()
  if isinstance(params, tuple):  # JAX before 0.9: (subfuns, params)
    subfuns, params = params
  with source_context_of(eqn), eqn.ctx.manager:
    return eqn.primitive.bind(*subfuns, *invals, **params)


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


def flat_debug_callback(params: dict, callback):
  """``callback(*args, **kwargs)`` as a function of a ``debug_print`` or
  ``debug_callback`` equation's flat dynamic values (its ``in_tree`` and
  ``static_args`` put back together, as JAX's own impl does)."""
  return _debugging._make_flat_callback(params["in_tree"], callback,
                                        params["static_args"])


def debug_print_writer(params: dict):
  """What ``jax.debug.print`` does on the host for a ``debug_print``
  equation's ``params``, as a function of its flat dynamic values: JAX's own
  formatting (``_format_print_callback``: the format, NumPy's print options,
  a message without placeholders, a logging record where this release has
  them) on the values it is given, without placing them on a device
  first (``debug_print_impl`` does, then calls the same function)."""
  write = _debugging._format_print_callback
  leading = [name for name, p in inspect.signature(write).parameters.items()
             if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
  values = [dict(params[name]) if name == "np_printoptions" else params[name]
            for name in leading]
  return flat_debug_callback(params, functools.partial(write, *values))

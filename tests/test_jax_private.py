"""Fails loudly when a JAX name hostcall relies on moves or changes.

Every name beyond ``jax`` and ``jax.extend`` is in the package
src/hostcall/_jax_private/, and each has a test here (a test checks that
none is missing). If one fails after a JAX upgrade, update that package
(and the JAX range in pyproject.toml).
"""

import inspect
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.sharding import SingleDeviceSharding

import hostcall
from hostcall import _jax_private
from hostcall._core import hostcall_p

F32 = jax.ShapeDtypeStruct((), jnp.float32)


def _params(fn) -> list[str]:
  return list(inspect.signature(fn).parameters)


# --- interpreter APIs ---------------------------------------------------------

def test_abstract_values_and_tracers():
  aval = _jax_private.ShapedArray((2, 3), jnp.float32)
  assert aval.shape == (2, 3) and aval.dtype == jnp.float32
  seen = []
  jax.jit(lambda x: seen.append(isinstance(x, _jax_private.Tracer)) or x)(1.0)
  assert seen == [True]
  assert not isinstance(np.float32(1), _jax_private.Tracer)


def test_symbolic_zeros_and_undefined_primals():
  aval = _jax_private.ShapedArray((), jnp.float32)
  assert _jax_private.Zero(aval).aval == aval
  assert _jax_private.is_undefined_primal(_jax_private.UndefinedPrimal(aval))
  assert not _jax_private.is_undefined_primal(1.0)


@pytest.mark.parametrize("registry", [
    "primitive_jvps", "primitive_transposes",
    "partial_eval_jaxpr_custom_rules"])
def test_rule_registries_hold_hostcalls_rules(registry):
  rules = getattr(_jax_private, registry)
  assert callable(rules[hostcall_p])


def test_batching_registries():
  from jax.extend.core import primitives
  # A rule registered through primitive_batchers: in JAX 0.10 it lands,
  # wrapped, among the fancy ones (which receive the axis data); in 0.8 it
  # stays where it was registered. vmap finds it either way.
  assert callable(_jax_private.fancy_primitive_batchers.get(hostcall_p) or
                  _jax_private.primitive_batchers[hostcall_p])
  assert hasattr(_jax_private.primitive_batchers, "__setitem__")
  assert callable(_jax_private.fancy_primitive_batchers[primitives.while_p])


def test_lowering_helpers():
  assert "rule" in " ".join(_params(_jax_private.register_lowering))
  assert hasattr(_jax_private.TokenSet, "update_tokens")
  assert _params(_jax_private.ir_constant)[0] == "val"
  lowered = jax.jit(lambda x: io_callback(lambda v: v, F32, x,
                                          ordered=True)).lower(1.0).as_text()
  assert "custom_call" in lowered


def test_register_lowering_and_ir_constant_are_jaxs_mlir_helpers():
  # What _jit/threaded.py (register_lowering) and _apps/control/check.py
  # (ir_constant) use, imported from here rather than jax.interpreters.mlir.
  from jax.extend.core import Primitive
  mlir = jax.interpreters.mlir
  assert _jax_private.register_lowering is mlir.register_lowering
  assert _jax_private.ir_constant is mlir.ir_constant
  probe = Primitive("hostcall_test_ir_constant")
  probe.def_abstract_eval(
      lambda x: _jax_private.ShapedArray((), jnp.int32))
  _jax_private.register_lowering(
      probe, lambda ctx, x: [_jax_private.ir_constant(np.int32(7))])
  assert int(jax.jit(probe.bind)(1.0)) == 7


def test_emit_python_callback_takes_what_hostcall_passes():
  params = _params(jax.interpreters.mlir.emit_python_callback)
  for name in ("ctx", "callback", "token", "operands", "operand_avals",
               "result_avals", "has_side_effect", "sharding", "partitioned"):
    assert name in params
  # returns_token since JAX 0.8.2 (the wrapper drops it before).
  assert ("returns_token" in params) == (jax.__version_info__ >= (0, 8, 2))
  assert callable(_jax_private.emit_python_callback)


def test_aval_to_ir_types_takes_the_module_context_or_not():
  params = _params(jax.interpreters.mlir.aval_to_ir_types)
  assert len(params) in (1, 2)
  assert callable(_jax_private.aval_to_ir_types)


def test_effects_and_the_current_trace():
  class ProbeEffect(_jax_private.Effect):
    pass

  assert isinstance(ProbeEffect(), jax.extend.core.Effect
                    if hasattr(jax.extend.core, "Effect") else object)
  traces = []

  def f(x):
    with _jax_private.take_current_trace() as trace:
      traces.append((trace, _jax_private.trace_of(x)))
    return x

  jax.jit(f)(1.0)
  ((current, of_x),) = traces
  assert current is of_x and current is not None


def test_host_constant_types_are_classes():
  assert isinstance(_jax_private.HOST_CONSTANT_TYPES, tuple)
  assert all(inspect.isclass(t) for t in _jax_private.HOST_CONSTANT_TYPES)


# --- private names (jax._src) -------------------------------------------------

def test_axis_context_types_exist():
  assert inspect.isclass(_jax_private.SPMDAxisContext)
  assert inspect.isclass(_jax_private.ShardingContext)
  ctx = _jax_private.ShardingContext(1, (jax.devices()[0],))
  assert ctx.num_devices == 1 and ctx.device_assignment == (jax.devices()[0],)


def test_callback_op_sharding_signature_and_results():
  assert _params(_jax_private.callback_op_sharding) == [
      "axis_context", "sharding", "avals_out"]
  one = _jax_private.ShardingContext(1, (jax.devices()[0],))
  # On one device there is nothing to annotate; with a chosen device, there
  # is; outside any sharding context, nothing.
  assert _jax_private.callback_op_sharding(object(), None, ()) is None
  assert _jax_private.callback_op_sharding(
      one, SingleDeviceSharding(jax.devices()[0]), ()) is not None


def test_set_sharding_takes_the_module_context_or_not():
  from jax._src.interpreters import mlir as private_mlir
  assert len(_params(private_mlir.set_sharding)) in (2, 3)
  assert _params(_jax_private.set_sharding) == [
      "module_context", "op", "sharding"]


def test_keep_with_executable_lives_and_dies_with_the_executable():
  import gc
  import weakref
  from jax.extend.core import Primitive

  class Kept:
    def __call__(self, *args):
      raise AssertionError("never called")

  kept = []
  probe = Primitive("hostcall_test_keep_with_executable")
  probe.def_abstract_eval(lambda x: x)

  def lower(ctx, x):
    obj = Kept()
    kept.append(weakref.ref(obj))
    _jax_private.keep_with_executable(ctx, obj)
    return [x]

  _jax_private.register_lowering(probe, lower)
  f = jax.jit(lambda x: probe.bind(x) + 1.0)
  assert float(f(1.0)) == 2.0
  gc.collect()
  assert len(kept) == 1 and kept[0]() is not None  # owned by the executable
  # Owned without being a host callback: on CPU a program with host
  # callbacks runs synchronously, and its call would wait for its end.
  assert not f.lower(1.0).compile()._executable.unsafe_call.has_host_callbacks
  del f
  jax.clear_caches()
  gc.collect()
  assert kept[0]() is None  # and released with it


def test_cache_weakly_makes_jaxs_parameter_caches_hold_weakly():
  import gc
  import weakref
  from jax._src import util

  class Key:
    pass

  _jax_private.cache_weakly(Key)
  cached = util.multi_weakref_lru_cache(lambda key, n: n + 1)
  key = Key()
  assert cached(key, 1) == 2 and cached(key, 1) == 2
  ref = weakref.ref(key)
  del key
  gc.collect()
  assert ref() is None


def test_abstract_token_is_the_aval_of_a_token():
  jaxpr = jax.make_jaxpr(lambda: jax.lax.create_token())()
  assert jaxpr.out_avals[0] == _jax_private.abstract_token


def test_io_callback_effects_are_jaxs_own():
  def effects(ordered):
    return jax.make_jaxpr(lambda x: io_callback(
        lambda v: v, F32, x, ordered=ordered))(1.0).effects

  assert _jax_private.IO_EFFECT in effects(False)
  assert _jax_private.ORDERED_IO_EFFECT in effects(True)


@pytest.mark.parametrize("name, params", [
    ("replicated", ["ctx", "value", "aval"]),
    ("shard_alike", ["ctx", "x", "y", "x_aval", "y_aval"]),
    ("split_over_devices", ["ctx", "value", "aval", "num_devices"]),
])
def test_sharding_annotations(name, params):
  # Exercised on 4 devices by tests/multidevice; here their JAX sides.
  from jax._src.interpreters import mlir as private_mlir
  from jax._src.lib import xla_client
  from jax.extend.mlir.dialects import sdy
  assert _params(getattr(_jax_private, name)) == params
  assert callable(private_mlir.wrap_with_sharding_op)
  try:  # JAX's own sharding groups, up to JAX 0.11.1
    from jax._src import shard_alike
    assert callable(shard_alike._group_shard)
  except ImportError:  # from JAX 0.11.2, hostcall's, with the same ops
    assert callable(sdy.sharding_group)
    assert hasattr(xla_client.OpSharding, "ShardGroupType")


def test_batching_of_jaxprs():
  from jax._src.interpreters import batching
  assert _jax_private.batch_jaxpr is batching.batch_jaxpr
  assert _params(batching.batch_jaxpr_axes)[:4] == [
      "closed_jaxpr", "axis_data", "in_axes", "out_axes_dest"]
  assert callable(batching.broadcast) and callable(batching.moveaxis)
  assert callable(_jax_private.batch_jaxpr_axes)
  assert callable(_jax_private.broadcast_batched)


def test_effect_registries_accept_a_new_effect():
  from jax._src import effects

  class ProbeEffect(_jax_private.Effect):
    pass

  _jax_private.register_effect(ProbeEffect, ordered=True)
  probe = ProbeEffect()
  for registry in (effects.lowerable_effects,
                   effects.control_flow_allowed_effects,
                   effects.custom_derivatives_allowed_effects,
                   effects.remat_allowed_effects, effects.ordered_effects,
                   effects.partial_eval_kept_effects,
                   effects.shardable_ordered_effects):
    assert registry.contains(probe)


def test_require_devices_during_lowering_registry():
  from jax._src import dispatch
  assert hostcall_p in dispatch.prim_requires_devices_during_lowering
  assert callable(_jax_private.require_devices_during_lowering)


def test_recompute_policy_reading():
  assert _jax_private.is_recompute_policy(False)
  assert not _jax_private.is_recompute_policy(True)
  policy = jax.checkpoint_policies.nothing_saveable
  assert _jax_private.is_recompute_policy(
      policy(jax.lax.add_p, _jax_private.ShapedArray((), jnp.float32)))


def test_hide_frames_of_registers_an_exclusion(tmp_path):
  from jax._src import traceback_util
  _jax_private.hide_frames_of(str(tmp_path))
  assert str(tmp_path) in traceback_util._exclude_paths


def test_host_callbacks_are_called_through_callback_frames():
  # On CPU, JAX runs a computation with a host callback in the calling
  # thread: below JAX's callback frames lies the frame that called it.
  seen = []

  def host(x):
    frame = sys._getframe(1)
    callback = []
    while frame is not None:
      if _jax_private.is_callback_frame(frame):
        callback.append(frame)
      elif callback:
        break
      frame = frame.f_back
    seen.append((bool(callback), frame.f_code.co_name if frame else None))
    return x

  jax.jit(lambda x: jax.pure_callback(host, F32, x))(np.float32(1))
  assert seen == [(True, "__call__")]  # ExecuteReplicated.__call__
  assert not _jax_private.is_callback_frame(sys._getframe())


def test_jax_frames_are_told_from_others():
  frames = []
  jax.jit(lambda x: jax.pure_callback(
      lambda v: (frames.append(sys._getframe(1)), v)[1], F32, x))(
          np.float32(1))
  frame, kinds = frames[0], []
  while frame is not None:
    kinds.append(_jax_private.is_jax_frame(frame))
    frame = frame.f_back
  # JAX's callback and dispatch frames, then this test's (and pytest's).
  assert kinds[0] and not kinds[-1] and kinds.index(False) > 1
  assert not _jax_private.is_jax_frame(sys._getframe())


def test_trace_of_a_concrete_value_is_none():
  assert _jax_private.trace_of(np.float32(1)) is None
  assert _jax_private.trace_of(jnp.float32(1)) is None


def test_trace_of_fails_loudly_when_a_tracer_keeps_no_trace():
  class Bare(_jax_private.Tracer):
    pass

  bare = object.__new__(Bare)  # a tracer whose trace was never set
  with pytest.raises(RuntimeError, match="no longer keep their trace"):
    _jax_private.trace_of(bare)


def test_a_loops_lowering_frame_is_told_from_others(monkeypatch):
  from hostcall._runtime import lowering
  seen, emit = [], lowering.emit_sync

  def spy(ctx, *args, **kwargs):
    frame, found = sys._getframe(), False
    while frame is not None:
      found = found or _jax_private.is_loop_lowering_frame(frame)
      frame = frame.f_back
    seen.append(found)
    return emit(ctx, *args, **kwargs)

  monkeypatch.setattr(lowering, "emit_sync", spy)

  def call(x):
    hostcall.debug_callback(lambda v: None, x)  # lowered by emit_sync
    return x + 1

  jax.jit(call).lower(np.float32(1))
  jax.jit(lambda x: jax.lax.scan(lambda c, _: (call(c), None), x, None,
                                 length=2)[0]).lower(np.float32(1))
  jax.jit(lambda x: jax.lax.while_loop(lambda c: c < 2, call, x)).lower(
      np.float32(1))
  jax.jit(lambda x: jax.lax.cond(x > 0, call, lambda c: c, x)).lower(
      np.float32(1))
  assert seen == [False, True, True, False]


def test_every_name_has_a_test_here():
  names = {name for name, value in vars(_jax_private).items()
           if not name.startswith("_") and not inspect.ismodule(value)
           and name != "annotations"}
  source = pathlib.Path(__file__).read_text()
  untested = sorted(n for n in names if f"_jax_private.{n}" not in source
                    and f'"{n}"' not in source)
  assert not untested, f"add a test for each of {untested}"


def test_collective_axis_names_are_those_in_scope():
  assert _jax_private.collective_axis_names() == ()
  seen = []

  def f(x):
    seen.append(_jax_private.collective_axis_names())
    return jax.lax.pmax(x, seen[-1])

  out = jax.vmap(jax.vmap(f, axis_name="j"), axis_name="i")(
      jnp.arange(6.0).reshape(2, 3))
  assert set(seen[0]) == {"i", "j"}
  np.testing.assert_array_equal(out, np.full((2, 3), 5.0))


def test_runtime_tokens_are_what_wait_for_effects_reads():
  from jax._src import dispatch
  tokens = dispatch.runtime_tokens
  assert isinstance(tokens.current_tokens, dict)
  assert isinstance(tokens.output_runtime_tokens, dict)
  jax.jit(lambda x: io_callback(lambda v: v, F32, x, ordered=True))(1.0)
  assert tokens.current_tokens  # an ordered effect's token is kept
  _jax_private.wait_for_effects()
  assert not tokens.current_tokens and not tokens.output_runtime_tokens

def test_loop_of_frame_finds_the_loop_tracing_a_body():
  import sys

  def innermost():
    frame = sys._getframe(1)
    while frame is not None:
      found = _jax_private.loop_of_frame(frame)
      if found is not None:
        return found
      frame = frame.f_back
    return None

  seen = []

  def scan_body(c, _):
    seen.append(innermost())
    return c, None

  def while_body(c):
    seen.append(innermost())
    return c + 1

  jax.lax.scan(scan_body, 0, jnp.ones(6))
  jax.lax.scan(scan_body, 0, None, length=4)
  jax.lax.fori_loop(0, 9, lambda i, c: scan_body(c, None)[0], 0)
  jax.lax.while_loop(lambda c: c < 3, while_body, 0)
  jax.jit(lambda n: jax.lax.fori_loop(0, n, lambda i, c: while_body(c),
                                      0))(3)   # traced bounds: a while
  assert seen == [("scan", 6), ("scan", 4), ("scan", 9), ("while", None),
                  ("while", None)]
  assert innermost() is None


def test_scan_layout_counts_consts_and_carry():
  k = jnp.float32(2)

  def f(x, c0):
    return jax.lax.scan(lambda c, a: ((c[0] + a * k, c[1] * 2.0), a * k),
                        c0, x)

  closed = jax.make_jaxpr(f)(jnp.ones(3), (jnp.float32(0), jnp.float32(1)))
  scan, = [e for e in closed.eqns if e.primitive.name == "scan"]
  num_consts, num_carry = _jax_private.scan_layout(scan.params)
  assert num_carry == 2
  assert num_consts + num_carry + 1 == len(scan.invars)
  assert _jax_private.scan_layout({"length": 3}) is None


def test_bind_equation_rebinds_as_eval_jaxpr_does():
  def f(x):
    y = jax.jit(jnp.sin)(x)
    return jax.lax.cond(x > 0, lambda v: v * 2, lambda v: v, y)

  closed = jax.make_jaxpr(f)(1.0)
  env = {closed.jaxpr.invars[0]: jnp.float32(0.5)}
  for eqn in closed.jaxpr.eqns:
    outs = _jax_private.bind_equation(eqn, [
        getattr(v, "val", None) if not isinstance(v, jax.extend.core.Var)
        else env[v] for v in eqn.invars])
    outs = outs if eqn.primitive.multiple_results else [outs]
    env.update(zip(eqn.outvars, outs))
  assert float(env[closed.jaxpr.outvars[0]]) == pytest.approx(
      float(f(0.5)))


def test_is_top_level_is_false_under_a_transformation():
  assert _jax_private.is_top_level()
  seen = []
  jax.vmap(lambda x: seen.append(_jax_private.is_top_level()) or x)(
      jnp.ones(2))
  jax.jit(lambda x: seen.append(_jax_private.is_top_level()) or x)(1.0)
  assert seen == [False, False]


def test_dispatching_at_top_level_reads_jax_s_own_states():
  # The quick reader, not its fallback: JAX's config states are still
  # where it reads them (else hostcall.jit pays ~0.5 us a call).
  assert _jax_private.dispatching_at_top_level.__name__ in (
      "dispatching_at_top_level", "dispatching_at_top_level_in_context")
  seen = [_jax_private.dispatching_at_top_level()]
  jax.vmap(lambda x: seen.append(_jax_private.dispatching_at_top_level())
           or x)(jnp.ones(2))
  jax.jit(lambda x: seen.append(_jax_private.dispatching_at_top_level())
          or x)(1.0)
  jax.grad(lambda x: seen.append(_jax_private.dispatching_at_top_level())
           or x)(1.0)
  with jax.disable_jit():
    seen.append(_jax_private.dispatching_at_top_level())
  seen.append(_jax_private.dispatching_at_top_level())
  assert seen == [True, False, False, False, False, True]


def test_device_assignment_orders_a_sharding_s_devices():
  device = jax.devices()[0]
  assert _jax_private.device_assignment(
      SingleDeviceSharding(device)) == (device,)


def test_distributed_client_is_none_until_jax_distributed_is_initialized():
  # This process never initializes jax.distributed; the two processes of
  # tests/test_multiprocess.py send metrics rows through the client.
  assert _jax_private.distributed_client() is None
  from jax._src import distributed
  state = distributed.global_state
  assert (state.client, state.process_id, state.num_processes) == (None, 0, 1)
  assert callable(distributed.State.initialize)


def test_an_ordered_effect_that_is_not_shardable():
  from jax._src import effects

  class OneDeviceProbeEffect(_jax_private.Effect):
    pass

  _jax_private.register_effect(OneDeviceProbeEffect, ordered=True,
                               shardable=False)
  probe = OneDeviceProbeEffect()
  assert effects.ordered_effects.contains(probe)
  assert not effects.shardable_ordered_effects.contains(probe)


def test_keep_when_unused_keeps_an_effect_free_equation():
  from jax.extend import core as jex_core
  from jax.interpreters import mlir
  prim = jex_core.Primitive("kept_for_test")
  prim.multiple_results = True
  prim.def_abstract_eval(lambda x: [])
  mlir.register_lowering(prim, lambda ctx, x: [])
  unkept = jex_core.Primitive("unkept_for_test")
  unkept.multiple_results = True
  unkept.def_abstract_eval(lambda x: [])
  mlir.register_lowering(unkept, lambda ctx, x: [])
  _jax_private.keep_when_unused(prim)

  def program(x):
    prim.bind(x)
    unkept.bind(x)
    return x

  closed = jax.make_jaxpr(program)(1.0)
  kept, _ = _jax_private._pe.dce_jaxpr(closed.jaxpr, [True])
  # JAX's dead-code elimination (which jit's lowering runs) keeps the
  # equation of a primitive with the rule, drops the other.
  assert [e.primitive.name for e in kept.eqns] == ["kept_for_test"]


def test_io_effects_are_kept_through_partial_evaluation():
  from jax._src import effects
  _jax_private.keep_io_in_partial_evaluation()  # installed already: idempotent
  for effect in (_jax_private.IO_EFFECT, _jax_private.ORDERED_IO_EFFECT):
    assert effects.partial_eval_kept_effects.contains(effect)


def test_keep_calls_in_loop_bodies_wraps_jaxs_scan_hoisting():
  from jax._src.lax.control_flow import loops
  hoist = loops._scan_known_hoisting
  assert getattr(hoist, "_hostcall_keeps", False), (
      "JAX's scan no longer hoists through loops._scan_known_hoisting: "
      "find where grad's split of a scan hoists loop-invariant equations")
  _jax_private.keep_calls_in_loop_bodies(lambda j, n: True)  # idempotent
  assert loops._scan_known_hoisting is hoist
  # Left whole: a body with a call whose operand is a constant keeps it.
  import hostcall

  def body(c, x):
    hostcall.debug_callback(lambda v: None, c)
    return (x + c,)
  closed = jax.make_jaxpr(body)(1.0, 1.0)
  n_counts = len(inspect.signature(
      next(c.cell_contents for c in hoist.__closure__
           if getattr(c.cell_contents, "__name__", "")
           == "_scan_known_hoisting")).parameters) - 2
  jaxpr, consts, hoisted, res = hoist(closed, [np.float32(1.0)],
                                      *([0] * n_counts))
  assert hoisted == [] and res == [] and len(consts) == 1
  assert len(getattr(jaxpr, "jaxpr", jaxpr).invars) == 2


def test_restage_while_without_wraps_jaxs_while_partial_evaluation():
  from jax._src.interpreters import partial_eval as pe
  from jax._src.lax.control_flow import loops
  rule = pe.custom_partial_eval_rules[loops.while_p]
  assert getattr(rule, "_hostcall_restages", False), (
      "hostcall's wrapper of while's partial evaluation rule is gone")
  _jax_private.restage_while_without(lambda *a: None)  # idempotent
  assert pe.custom_partial_eval_rules[loops.while_p] is rule
  # What the wrapper reads of JAX: a split loop's staged outputs are
  # JaxprTracers sharing one recipe (a NamedTuple with params and effects),
  # its body in params["body_jaxpr"]; its known outputs are not
  # JaxprTracers; a rebuilt loop's effects come from _join_while_effects.
  assert "recipe" in pe.JaxprTracer.__slots__
  assert {"params", "effects"} <= set(pe.JaxprEqnRecipe._fields)
  assert callable(loops._join_while_effects)
  outs_seen = []

  def spying(trace, *tracers, **params):
    outs = rule(trace, *tracers, **params)
    outs_seen.append(outs)
    return outs

  pe.custom_partial_eval_rules[loops.while_p] = spying
  try:
    jax.linearize(lambda x: jax.lax.while_loop(
        lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1],
        1.0)
  finally:
    pe.custom_partial_eval_rules[loops.while_p] = rule
  (outs,) = outs_seen  # counter and primal known, the tangent staged
  staged = [isinstance(t, pe.JaxprTracer) and not t.pval.is_known()
            for t in outs]
  assert staged == [False, False, True]
  assert "body_jaxpr" in outs[2].recipe.params


def test_debug_print_writer_writes_what_jaxs_print_writes(capsys):
  # JAX's own formatting of a debug_print equation, on NumPy values.
  def program(x, y):
    jax.debug.print("x={x:.2f} y={y}", x=x, y=y)
    return x
  args = (jnp.float32(1.5), jnp.arange(3))
  (eqn,) = [e for e in jax.make_jaxpr(program)(*args).eqns
            if e.primitive.name == "debug_print"]
  _jax_private.debug_print_writer(eqn.params)(*map(np.asarray, args))
  jax.jit(program)(*args)
  jax.effects_barrier()
  ours, jaxs = capsys.readouterr().out.splitlines()
  assert ours == jaxs == "x=1.50 y=[0 1 2]"
  # The equation's values put back as the print's arguments.
  seen = []
  _jax_private.flat_debug_callback(
      eqn.params, lambda *a, **k: seen.append((a, sorted(k))))(*args)
  assert seen == [((), ["x", "y"])]


def test_debug_callback_on_cpu_does_what_jaxs_implementation_does(caplog):
  # JAX's debug_callback implementation: committed CPU arrays, the CPU the
  # default device, no abstract mesh (0.8.1 on), a failure logged in JAX's
  # words on JAX's logger, then raised.
  from jax._src import debugging
  seen = []

  def callback(*args):
    seen.append([(type(a), a.dtype, a.shape, a._committed, a.weak_type,
                  np.asarray(a).tolist()) for a in args]
                + [str(jax.config.jax_default_device),
                   str(jax.sharding.get_abstract_mesh())])
  avals = [_jax_private.ShapedArray((), jnp.float32),
           _jax_private.ShapedArray((2,), jnp.int8)]
  values = (np.float32(1.5), np.array([1, 2], np.int8))
  _jax_private.debug_callback_on_cpu(callback, avals)(*values)
  debugging.debug_callback_impl(*values, callback=callback, effect=None,
                                partitioned=False)
  assert seen[0] == seen[1] and seen[0][0][0] is type(jnp.zeros(()))
  key_aval = jax.typeof(jax.random.key(0))
  assert _jax_private.debug_callback_on_cpu(callback, [key_aval]) is None

  def failing(*args):
    raise ValueError("no")
  with pytest.raises(ValueError, match="no"):
    _jax_private.debug_callback_on_cpu(failing, avals)(*values)
  assert caplog.records[-1].name == debugging.logger.name
  assert caplog.records[-1].getMessage() == "jax.debug.callback failed"


@pytest.mark.parametrize("guard", ["disallow", "disallow_explicit"])
def test_debug_callback_on_cpu_meets_a_transfer_guard_as_jax_does(guard):
  # Its values are placed as JAX's device_put places them, explicitly: a
  # guard that disallows implicit transfers lets them through, one that
  # disallows explicit ones too stops both, in the same words.
  from jax._src import debugging
  avals = [_jax_private.ShapedArray((), jnp.int32)]
  value = np.int32(3)
  outcomes = []
  for call in (
      _jax_private.debug_callback_on_cpu(outcomes.append, avals),
      lambda v: debugging.debug_callback_impl(
          v, callback=outcomes.append, effect=None, partitioned=False)):
    before = jax.config.jax_transfer_guard
    jax.config.update("jax_transfer_guard", guard)
    try:
      call(value)
    except Exception as exc:  # noqa: BLE001 - compared below
      outcomes.append(str(exc).split("\n")[0])
    finally:
      jax.config.update("jax_transfer_guard", before)
  ours, jaxs = outcomes
  if guard == "disallow":
    assert int(ours) == int(jaxs) == 3
  else:
    assert ours == jaxs and "Disallowed host-to-device transfer" in ours


def test_a_debug_callback_on_cpu_placed_apart_from_its_call():
  # Its placement and its call apart do what the function does: each value
  # a committed CPU array, the user's function called with them.
  seen = []
  avals = [_jax_private.ShapedArray((), jnp.float32),
           _jax_private.ShapedArray((2,), jnp.int8)]
  values = (np.float32(1.5), np.array([1, 2], np.int8))
  call = _jax_private.debug_callback_on_cpu(
      lambda *a: seen.append([(a_.dtype, a_._committed,
                               np.asarray(a_).tolist()) for a_ in a]), avals)
  places, call_with = _jax_private.placement_of(call)
  call_with(*places(*values))
  call(*values)
  assert seen[0] == seen[1] == [(np.float32, True, 1.5),
                                (np.int8, True, [1, 2])]
  (one,) = avals[:1]
  single = _jax_private.debug_callback_on_cpu(lambda a: seen.append(
      float(a)), [one])
  places, call_with = _jax_private.placement_of(single)
  call_with(*places(np.float32(2.5)))
  assert seen[-1] == 2.5
  # Any other function (a user's, whatever its attributes): none.
  assert _jax_private.placement_of(lambda v: v) is None
  assert _jax_private.placement_of(len) is None  # (not weakly referable)


def test_debug_callback_on_cpu_calls_one_after_another_as_jax_does(caplog):
  # Calls one after another, JAX's settings swapped in and put back by each:
  # each call sees what it sees in its own, one that fails is logged and
  # raised alone, a call a callback makes after changing the default
  # device still gets the CPU, and what a callback left in force is put
  # back, as under JAX's implementation.
  from jax._src import debugging
  seen = []

  def state(args):
    return ([(type(a), a.dtype, a.shape, a._committed,
              np.asarray(a).tolist()) for a in args]
            + [str(jax.config.jax_default_device),
               str(jax.sharding.get_abstract_mesh())])

  avals = [_jax_private.ShapedArray((), jnp.float32)]
  call = _jax_private.debug_callback_on_cpu(
      lambda *a: seen.append(state(a)), avals)

  jax_nested = []

  def nesting(*args):
    seen.append(state(args))
    with jax.default_device(None), jax.sharding.use_abstract_mesh(
        jax.sharding.AbstractMesh((1,), ("i",))):
      call(np.float32(7))
      debugging.debug_callback_impl(
          np.float32(7), callback=lambda *a: jax_nested.append(state(a)),
          effect=None, partitioned=False)
  nested = _jax_private.debug_callback_on_cpu(nesting, avals)

  def failing(*args):
    raise ValueError("no")
  failing_call = _jax_private.debug_callback_on_cpu(failing, avals)

  def changing(*args):
    # What a call of its own would undo: a mesh set as a plain call (JAX's
    # implementation empties the meshes from 0.8.1 on), a default device
    # entered and never left.
    if jax.__version_info__[:3] >= (0, 8, 1):
      jax.set_mesh(jax.make_mesh((1,), ("i",)))
    jax.default_device(None).__enter__()
  changing_call = _jax_private.debug_callback_on_cpu(changing, avals)
  debugging.debug_callback_impl(np.float32(1), callback=lambda *a: seen.append(
      state(a)), effect=None, partitioned=False)
  expected = seen.pop()
  default_before = str(jax.config.jax_default_device)
  mesh_before = str(jax.sharding.get_abstract_mesh())
  call(np.float32(1))
  with pytest.raises(ValueError, match="no"):
    failing_call(np.float32(1))
  nested(np.float32(1))
  call(np.float32(1))
  changing_call(np.float32(1))
  call(np.float32(1))
  assert seen[0] == seen[1] == seen[3] == seen[4] == expected
  assert seen[2][0][-1] == 7 and seen[2] == jax_nested[0]
  assert caplog.records[-1].getMessage() == "jax.debug.callback failed"
  # After the calls, nothing of them is left in force.
  assert str(jax.config.jax_default_device) == default_before
  assert str(jax.sharding.get_abstract_mesh()) == mesh_before


def test_debug_callback_on_cpu_keeps_64_bit_values_traced_under_x64():
  # A program traced under enable_x64 while x64 is off in the delivering
  # thread: its float64 and int64 values arrive whole, as under jax.jit.
  seen = []
  call = _jax_private.debug_callback_on_cpu(
      lambda a, b: seen.append((a.dtype, a.item(), b.dtype, b.item())),
      [_jax_private.ShapedArray((), np.float64),
       _jax_private.ShapedArray((), np.int64)])
  assert not jax.config.jax_enable_x64
  call(np.float64(1.0000000001), np.int64(2**40 + 1))
  call(np.array(1.0000000001), np.array(2**40 + 1, np.int64))
  assert seen == [(np.float64, 1.0000000001, np.int64, 2**40 + 1)] * 2


def test_not_really_effects_are_jaxs_effect_types():
  assert _jax_private.NOT_REALLY_EFFECTS
  assert all(isinstance(t, type) for t in _jax_private.NOT_REALLY_EFFECTS)


def test_varying_axes_of_a_shard_map_value():
  from jax.sharding import Mesh, PartitionSpec as P
  mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
  seen = []

  def f(block):
    seen.append((_jax_private.varying_axes(jax.typeof(block)),
                 _jax_private.varying_axes(jax.typeof(jnp.float32(1)))))
    return block

  jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))(
      jnp.arange(2.0))
  assert seen == [(frozenset({"x"}), frozenset())]


def test_made_varying_makes_a_value_vary_over_the_axes_given():
  from jax.sharding import Mesh, PartitionSpec as P
  mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
  seen = []

  def f(block):
    one = jnp.float32(1)
    made = _jax_private.made_varying(one, ("x",))
    seen.append((_jax_private.varying_axes(jax.typeof(made)),
                 _jax_private.made_varying(one, ()) is one))
    return block + made

  out = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"),
                              out_specs=P("x")))(jnp.arange(2.0))
  assert seen == [(frozenset({"x"}), True)]
  assert out.tolist() == [1.0, 2.0]


def test_explain_checkpoint_refusal_adds_to_jaxs_words():
  import hostcall
  # Installed by hostcall: JAX's refusal of an io callback in checkpoint
  # under grad carries hostcall's explanation after JAX's own words.
  _jax_private.explain_checkpoint_refusal(lambda m: m + " EXTRA")  # idempotent
  f = jax.checkpoint(lambda x: (hostcall.io_callback(
      lambda v: None, None, x), jnp.sin(x))[1])
  with pytest.raises(NotImplementedError) as info:
    jax.grad(f)(1.0)
  text = str(info.value)
  assert "Effects not supported in" in text and "hostcall:" in text
  assert "EXTRA" not in text


def test_ordered_effects_start_afresh_after_a_failed_computation():
  from jax._src import dispatch
  token_set = type(dispatch.runtime_tokens)
  assert getattr(token_set.get_token_input, "_hostcall_afresh", False), (
      "JAX's runtime tokens moved: find where a computation with ordered "
      "effects takes the previous one's token")
  _jax_private.start_ordered_effects_afresh_after_a_failure()  # idempotent
  seen = []

  def host(v):
    if float(v) < 0:
      raise ValueError("negative")
    seen.append(float(v))

  f = jax.jit(lambda x: io_callback(host, None, x, ordered=True))
  with pytest.raises(Exception, match="negative"):
    f(-1.0)
    jax.effects_barrier()
  f(2.0)  # runs: not failed by the earlier computation's token
  jax.effects_barrier()
  jax.effects_barrier()
  assert seen == [2.0]


def test_what_hostcall_jit_reads_of_jaxs_callbacks():
  def f(x):
    io_callback(lambda v: None, None, x, ordered=True)
    y = io_callback(lambda v: v, F32, x)   # result unused: a DropVar
    del y
    return x

  eqns = jax.make_jaxpr(f)(1.0).jaxpr.eqns
  ordered, unused = eqns
  assert _jax_private.is_ordered_effect(next(iter(ordered.effects)))
  assert not _jax_private.is_ordered_effect(next(iter(unused.effects)))
  # A result JAX writes nowhere is a DropVar; a traced one is a variable.
  from jax._src import core
  assert _jax_private.is_dropped(core.DropVar(unused.outvars[0].aval))
  assert not _jax_private.is_dropped(unused.invars[0])
  assert _jax_private.user_frame_of(ordered).startswith(__file__)
  # JAX's eager io callback: the callback called with the values.
  seen = []
  _jax_private.io_callback_impl(
      np.float32(3), callback=lambda v: (seen.append(float(v)), v)[1],
      result_avals=(), sharding=None, ordered=False)
  assert seen == [3.0]


def test_jaxs_effects_barrier_runs_the_hooks_after_its_wait():
  # jax.effects_barrier() is dispatch.runtime_tokens.block_until_ready(),
  # which hostcall wraps (so that it waits for the calls hostcall.jit takes
  # out of JAX's effects): a JAX that waits elsewhere fails here.
  seen = []
  hook = lambda: seen.append("hook")  # noqa: E731
  _jax_private.on_effects_barrier(hook)
  try:
    jax.effects_barrier()
    assert seen == ["hook"]
    _jax_private.on_effects_barrier(hook)  # registered once
    jax.effects_barrier()
    assert seen == ["hook", "hook"]
  finally:
    _jax_private.runtime._effects_barrier_hooks.remove(hook)


def test_pmap_default_axis_name_is_the_one_jax_gives_an_unnamed_pmap():
  # call_context().axis_indices keys this axis None (issue 52): a JAX that
  # names it otherwise would show its internal name again.
  seen = []

  def body(x):
    seen.append(_jax_private.collective_axis_names())
    return x

  jax.pmap(body)(jnp.zeros(1))
  assert len(seen) == 1 and len(seen[0]) == 1
  assert _jax_private.is_unnamed_pmap_axis(seen[0][0])
  assert not _jax_private.is_unnamed_pmap_axis("i")
  # Since JAX 0.9 the name is this string.
  assert _jax_private.is_unnamed_pmap_axis(
      _jax_private.PMAP_DEFAULT_AXIS_NAME)


def test_source_context_of_stages_with_the_equations_user_frame():
  def users_line(x):
    return jnp.sin(x)

  eqn, = jax.make_jaxpr(users_line)(1.0).eqns
  where = _jax_private.user_frame_of(eqn)
  assert where == f"{__file__}:{users_line.__code__.co_firstlineno + 1}"

  def elsewhere(x):
    with _jax_private.source_context_of(eqn):
      return jnp.cos(x)

  staged, = jax.make_jaxpr(elsewhere)(1.0).eqns
  assert _jax_private.user_frame_of(staged) == where

"""A host call written once a step runs once a step, whatever wraps it.

Each test here was found failing (issue 39): a result-less io callback in a
loop under ``grad`` was dropped; a call whose operands do not change from
step to step was hoisted out of the loop under ``grad`` (JAX #16637); an io
callback in a ``custom_vjp`` forward rule inside a loop was dropped, so the
backward rule found nothing (JAX #23614); io callbacks in ``checkpoint``
under ``grad`` were refused with JAX's words only; and ``vmap`` of a host
function that waits ran its lanes one after the other (JAX #24756). The
``cond`` under ``vmap`` cases are in ``test_fidelity.py``; the several-device
ones in ``multidevice/test_compositions.py``; the full table of cells in
``test_composition_matrix.py``.
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcall
from hostcall import host_callback as hcb

F32 = jax.ShapeDtypeStruct((), jnp.float32)
STEPS = 5


def _scan(body, x):
  return lax.scan(lambda c, _: (body(c), None), x, length=STEPS)[0]


def _fori(body, x):
  return lax.fori_loop(0, STEPS, lambda i, c: body(c), x)


LOOPS = {"scan": _scan, "fori_loop": _fori}
WRAPS = {"grad": jax.grad, "jit(grad)": lambda f: jax.jit(jax.grad(f)),
         "value_and_grad": lambda f: lambda x: jax.value_and_grad(f)(x)[1],
         "vjp": lambda f: lambda x: jax.vjp(f, x)[1](1.0)[0]}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("ordered", [True, False])
def test_a_result_less_io_callback_of_the_carry_runs_once_a_step(
    loop, wrap, ordered):
  seen = []

  def body(c):
    hostcall.io_callback(lambda v: seen.append(float(v)), None, c,
                         ordered=ordered)
    return c * 2.0

  grad = WRAPS[wrap](lambda x: LOOPS[loop](body, x))(1.0)
  hostcall.barrier()
  assert float(grad) == 2.0 ** STEPS
  # The primal values, once each, in step order where ordered.
  expected = [2.0 ** i for i in range(STEPS)]
  assert (seen if ordered else sorted(seen)) == expected


CALLS_WITHOUT_CARRY = {
    "debug_callback, no operand": lambda seen, k: hostcall.debug_callback(
        lambda: seen.append("step")),
    "debug_callback of a constant": lambda seen, k: hostcall.debug_callback(
        lambda v: seen.append(float(v)), k),
    "debug_print of a constant": lambda seen, k: hostcall.debug_print(
        "k={}", k),
    "io_callback, no operand": lambda seen, k: hostcall.io_callback(
        lambda: seen.append("step"), None, ordered=True),
    "io_callback of a constant": lambda seen, k: hostcall.io_callback(
        lambda v: seen.append(float(v)), None, k),
    "id_tap of a constant": lambda seen, k: hcb.id_tap(
        lambda v, t: seen.append(float(v)), k),
}


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("wrap", ["jit", *WRAPS])
@pytest.mark.parametrize("call", CALLS_WITHOUT_CARRY)
def test_a_call_whose_operands_do_not_change_runs_once_a_step(
    loop, wrap, call, capfd):
  seen = []
  k = jnp.float32(3.0)

  def body(c):
    CALLS_WITHOUT_CARRY[call](seen, k)
    return c * 2.0

  f = lambda x: LOOPS[loop](body, x)
  transform = jax.jit if wrap == "jit" else WRAPS[wrap]
  out = transform(f)(1.0)
  hostcall.barrier()
  assert float(out) == 2.0 ** STEPS
  if call.startswith("debug_print"):
    assert capfd.readouterr().out == "k=3.0\n" * STEPS
  else:
    assert seen == ([3.0] * STEPS if "constant" in call else ["step"] * STEPS)


def test_jaxs_own_debug_callback_is_still_hoisted_as_jax_does():
  # The deliberate difference in docs/compatibility.md: hostcall leaves
  # JAX's own debug callbacks as JAX runs them (hoisted: once, not 5
  # times). If JAX stops hoisting, this fails and the docs change.
  seen = []

  def body(c):
    jax.debug.callback(lambda: seen.append(1))
    return c * 2.0

  jax.jit(jax.grad(lambda x: _scan(body, x)))(1.0)
  jax.effects_barrier()
  assert seen == [1]


def test_an_io_callback_in_a_custom_vjp_forward_rule_in_a_loop_is_kept():
  # JAX #23614: the forward rule stores what the backward rule loads.
  store, loads = [], []

  @jax.custom_vjp
  def double(x):
    return x * 2.0

  def forward(x):
    hostcall.io_callback(lambda v: store.append(float(v)), None, x,
                         ordered=True)
    return x * 2.0, None

  def backward(_, g):
    saved = hostcall.io_callback(
        lambda: (loads.append(store[-1]), np.float32(store.pop()))[1], F32,
        ordered=True)
    return (g * (saved + 1.0),)

  double.defvjp(forward, backward)
  grad = jax.jit(jax.grad(lambda x: _scan(double, x)))(1.0)
  hostcall.barrier()
  # Forward values 1, 2, 4, 8, 16, loaded in reverse, each used once.
  assert loads == [16.0, 8.0, 4.0, 2.0, 1.0]
  assert float(grad) == 17.0 * 9.0 * 5.0 * 3.0 * 2.0
  assert store == []


@pytest.mark.parametrize("ordered", [True, False])
def test_io_callback_in_checkpoint_under_grad_is_refused_with_the_way_out(
    ordered):
  f = jax.checkpoint(lambda x: (hostcall.io_callback(
      lambda v: None, None, x, ordered=ordered), jnp.sin(x))[1])
  with pytest.raises(NotImplementedError) as info:
    jax.grad(f)(1.0)
  message = str(info.value)
  # JAX's words, then which call and what to write instead; no addresses.
  assert "Effects not supported in" in message and "checkpoint" in message
  assert "hostcall: an io_callback inside jax.checkpoint" in message
  assert "hostcall.debug_callback" in message and "id_tap" in message
  assert " at 0x" not in message


# --- vmap_method="concurrent" -------------------------------------------------

def test_concurrent_lanes_run_at_the_same_time_and_keep_lane_order():
  lanes = 4
  # Every lane waits for all the others: only lanes run at once get past
  # it (one after the other, the first would wait out the timeout).
  meeting = threading.Barrier(lanes, timeout=60)
  contexts = []

  def host(v):
    meeting.wait()
    contexts.append(hostcall.call_context().transforms)
    return (v * 10).astype(np.float32)

  f = jax.jit(jax.vmap(lambda x: hostcall.pure_callback(
      host, F32, x, vmap_method="concurrent")))
  np.testing.assert_array_equal(f(jnp.arange(4.0)), [0, 10, 20, 30])
  # Each thread ran in the call's context.
  assert contexts == [(("batch", {"batch_dims": (0,)}),)] * lanes


def test_concurrent_lanes_nest_and_stack_as_sequential():
  host = lambda v: np.stack([v, -v]).astype(np.float32)
  spec = jax.ShapeDtypeStruct((2,), jnp.float32)
  xs = jnp.arange(6.0).reshape(2, 3)
  outs = [jax.jit(jax.vmap(jax.vmap(lambda x: hostcall.pure_callback(
      host, spec, x, vmap_method=m))))(xs) for m in ("sequential",
                                                      "concurrent")]
  assert outs[0].shape == (2, 3, 2)
  np.testing.assert_array_equal(outs[0], outs[1])


def test_a_failing_concurrent_lane_raises_the_first_failure_in_lane_order():
  release = threading.Event()

  def host(v):
    if float(v) == 3.0:
      release.wait(60)  # fails last in time, after lane 1 has failed
      raise KeyError("lane 3")
    if float(v) == 1.0:
      try:
        raise ValueError("lane 1")
      finally:
        release.set()
    return np.float32(v)

  f = jax.jit(jax.vmap(lambda x: hostcall.pure_callback(
      host, F32, x, vmap_method="concurrent")))
  with pytest.raises(ValueError, match="lane 1"), hostcall.original_errors():
    f(jnp.arange(4.0)).block_until_ready()
  # The next call runs.
  np.testing.assert_array_equal(f(jnp.array([0.0, 2.0])), [0.0, 2.0])


def test_concurrent_is_refused_where_jax_names_the_methods():
  with pytest.raises(ValueError, match="vmap_method must be one of"):
    hostcall.pure_callback(np.sin, F32, 1.0, vmap_method="threads")


def test_nested_concurrent_calls_run_their_lanes_without_deadlock():
  # A lane's host function that runs a concurrent call itself: more outer
  # lanes than the pool has threads (at most 32) must not leave them all
  # waiting on inner lanes queued behind them.
  def inner(v):
    return (np.asarray(v) ** 2).astype(np.float32)

  def outer(x):
    y = jax.vmap(lambda v: hostcall.pure_callback(
        inner, F32, v, vmap_method="concurrent"))(jnp.full((2,), x))
    return np.asarray(y[0])

  f = jax.jit(jax.vmap(lambda x: hostcall.pure_callback(
      outer, F32, x, vmap_method="concurrent")))
  np.testing.assert_array_equal(f(jnp.arange(40.0)),
                                np.arange(40.0) ** 2)


def test_a_call_of_the_carry_keeps_jaxs_hoisting_of_the_rest():
  # Only a call that would itself be hoisted keeps the body whole; one
  # that reads the carry leaves JAX to hoist the loop-invariant values
  # (computed once, not stacked a step: the memory of the plain loop).
  w = jnp.full((50_000,), 0.5)

  def memory(call):
    def f(w, c0):
      def body(c, _):
        call(c)
        h = jnp.tanh(w * 2.0)  # loop-invariant
        return c * jnp.mean(h * h), None
      return lax.scan(body, c0, None, length=100)[0]
    compiled = jax.jit(jax.grad(f)).lower(w, 1.0).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  plain = memory(lambda c: None)
  of_carry = memory(lambda c: hostcall.debug_callback(lambda v: None, c))
  assert of_carry <= plain * 1.5 + 4096


# --- linearize of a while_loop ---------------------------------------------

def _by_kind(seen):
  # Each flavour's calls in order (calls of different flavours have no
  # order among them, as JAX's different effects have none).
  out = {}
  for kind, value in seen:
    out.setdefault(kind, []).append(value)
  return out


def _while_body_calls(seen, consts):
  """A while body making every result-less flavour's call once a step:
  on the counter, in a cond branch, and a tap on the carry."""
  def body(c):
    i, y = c
    hostcall.debug_callback(lambda v: seen.append(("debug", int(v))), i)
    hostcall.io_callback(lambda v: seen.append(("io", int(v))), None, i,
                         ordered=True)
    y = lax.cond(i > 0, lambda y: (hostcall.debug_callback(
        lambda v: seen.append(("branch", float(v))), y), y)[1],
        lambda y: y, y)
    y = hcb.id_tap(lambda a, t: seen.append(("tap", float(a.sum()))),
                   y + consts)[0]
    return i + 1, y * 2.0
  return body


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("jit", [False, True])
def test_linearize_of_a_while_loop_makes_each_call_once_a_step(direct, jit):
  # JAX's partial evaluation of a while_loop runs the primal loop, then
  # stages the whole loop again for the tangents: every call ran twice a
  # step, and again each time the linear function was applied.
  seen = []
  consts = jnp.array([1.0, 0.0, 0.0])
  body = _while_body_calls(seen, consts)
  f = lambda x: lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]
  linearize = lambda x: jax.linearize(f, x)
  was = jax.config.jax_use_direct_linearize
  jax.config.update("jax_use_direct_linearize", direct)
  try:
    y, lin = (jax.jit(linearize) if jit else linearize)(1.0)
    hostcall.barrier()
    # y: 1 -> 4 -> 10 -> 22, the tap seeing sum(y + [1, 0, 0]) = 3y + 1
    assert _by_kind(seen) == {"debug": [0, 1, 2], "io": [0, 1, 2],
                              "branch": [4.0, 10.0],
                              "tap": [4.0, 13.0, 31.0]}
    assert float(y) == 22.0
    seen.clear()
    assert float(lin(1.0)) == 8.0
    assert float(lin(2.0)) == 16.0
    hostcall.barrier()
  finally:
    jax.config.update("jax_use_direct_linearize", was)
  assert seen == []


def test_linearize_of_a_while_loop_in_a_scan_makes_each_call_once_a_step():
  # Here partial evaluation also meets the while_loop with its carry
  # unknown (the scan's hoisting of loop-invariant values): the call on
  # the counter alone was hoisted out of the scan and ran once more, and
  # the calls on the carry must not be taken out of the staged loop.
  seen = []
  consts = jnp.array([1.0, 0.0, 0.0])
  body = _while_body_calls(seen, consts)
  inner = lambda x: lax.while_loop(lambda c: c[0] < 2, body, (0, x))[1]
  f = lambda x: lax.scan(lambda c, _: (inner(c), None), x, length=2)[0]
  plain = float(f(1.0))
  hostcall.barrier()
  once, seen[:] = list(seen), []
  assert _by_kind(once) == {"debug": [0, 1, 0, 1], "io": [0, 1, 0, 1],
                            "branch": [4.0, 22.0],
                            "tap": [4.0, 13.0, 31.0, 67.0]}
  y, lin = jax.linearize(f, 1.0)
  hostcall.barrier()
  assert _by_kind(seen) == _by_kind(once)
  assert float(y) == plain == 46.0
  seen.clear()
  assert float(lin(1.0)) == 16.0
  hostcall.barrier()
  assert seen == []


def test_jaxs_own_debug_callback_runs_twice_under_linearize_of_while():
  # The deliberate difference in docs/compatibility.md: JAX's own
  # callbacks stay as JAX runs them (the staged loop repeats them).
  seen = []

  def body(c):
    jax.debug.callback(lambda v: seen.append(int(v)), c[0])
    return c[0] + 1, c[1] * 2.0
  f = lambda x: lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]
  y, lin = jax.linearize(f, 1.0)
  lin(1.0)
  jax.effects_barrier()
  assert seen == [0, 1, 2, 0, 1, 2]


# An ordered host call in both branches of a switch, one plain and one under
# shard_map (of one device), under grad: the known branches of the partially
# evaluated switch returned only the ordering token, each the token of its
# call, and XLA's verifier refused the branches' different shardings
# (MAXIMAL on device 0, replicated under shard_map): "Inconsistent
# conditional sharding among instructions". vjp and linearize leave the
# same known branches.
_ONE_DEVICE_MESH = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))


def _ordered_call(flavour, seen, site):
  record = lambda v: seen.append((site, np.asarray(v).tolist()))
  if flavour == "io_callback ordered":
    def call(x):
      hostcall.io_callback(record, None, x, ordered=True)
      return x
  elif flavour == "id_tap":
    call = lambda x: hcb.id_tap(lambda v, t: record(v), x)
  else:
    call = lambda x: hcb.id_tap(lambda v, t: record(v), x,
                                delivery="async")
  return call


def _switch_plain_or_shard_map(flavour, seen):
  plain = _ordered_call(flavour, seen, "plain")
  mapped = jax.shard_map(_ordered_call(flavour, seen, "shard_map"),
                         mesh=_ONE_DEVICE_MESH,
                         in_specs=jax.sharding.PartitionSpec(),
                         out_specs=jax.sharding.PartitionSpec())
  return lambda x: lax.switch(jnp.int32(jnp.sum(x)) % 2, [plain, mapped], x)


BRANCH_DIFFS = {
    "grad": lambda f: jax.grad(
        lambda x: jnp.sum(3.0 * f(x)) + jnp.sum(x ** 2)),
    "vjp": lambda f: lambda x: jax.vjp(f, x)[1](jnp.full_like(x, 3.0))[0]
    + 2 * x,
    "linearize": lambda f: lambda x: jax.linearize(f, x)[1](
        jnp.full_like(x, 3.0)) + 2 * x,
}


@pytest.mark.parametrize("diff", list(BRANCH_DIFFS))
@pytest.mark.parametrize("flavour", ["io_callback ordered", "id_tap",
                                     "id_tap async"])
def test_ordered_calls_in_plain_and_shard_map_branches_under_grad(
    flavour, diff):
  seen = []
  g = jax.jit(BRANCH_DIFFS[diff](_switch_plain_or_shard_map(flavour, seen)))
  x = jnp.arange(4.0, dtype=jnp.float32)
  for x_in, site in ((x, "plain"), (x + 0.25, "shard_map")):
    # sum 6 takes the plain branch, sum 7 the shard_map one
    out = g(x_in)
    hostcall.barrier()
    np.testing.assert_array_equal(np.asarray(out), 3.0 + 2 * np.asarray(x_in))
  assert seen == [("plain", [0.0, 1.0, 2.0, 3.0]),
                  ("shard_map", [0.25, 1.25, 2.25, 3.25])]


def test_ordered_calls_in_branches_returning_nothing_from_two_kinds():
  # Without grad, the same composition where the branches return nothing
  # but the token; with JAX's own ordered io_callback in the other branch
  # (which leaves its sharding on its op, as JAX does).
  seen = []
  ours = _ordered_call("io_callback ordered", seen, "ours")

  def jaxs(x):
    jax.experimental.io_callback(
        lambda v: seen.append(("jax", np.asarray(v).tolist())), None, x,
        ordered=True)
    return x
  for plain, mapped in ((ours, jaxs), (jaxs, ours)):
    mapped_ = jax.shard_map(mapped, mesh=_ONE_DEVICE_MESH,
                            in_specs=jax.sharding.PartitionSpec(),
                            out_specs=jax.sharding.PartitionSpec())

    def f(x, plain=plain, mapped_=mapped_):
      lax.switch(jnp.int32(jnp.sum(x)) % 2,
                 [lambda x: [plain(x)][:0], lambda x: [mapped_(x)][:0]], x)
      return x
    f = jax.jit(f)
    f(jnp.arange(4.0))
    f(jnp.arange(4.0) + 0.25)
  jax.effects_barrier()
  assert seen == [("ours", [0.0, 1.0, 2.0, 3.0]),
                  ("jax", [0.25, 1.25, 2.25, 3.25]),
                  ("jax", [0.0, 1.0, 2.0, 3.0]),
                  ("ours", [0.25, 1.25, 2.25, 3.25])]

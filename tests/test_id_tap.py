"""id_tap: values, order and transforms seen by the host, under every transform."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hostcall import host_callback as hcb

BATCH0 = ("batch", {"batch_dims": (0,)})


def test_identity_outside_jit(recorder):
  out = hcb.id_tap(recorder, jnp.float32(3.0))
  hcb.barrier_wait()
  assert float(out) == 3.0
  assert recorder.values == [3.0]
  assert recorder.transforms == [()]


def test_jit_receives_numpy_and_returns_identity(recorder):
  out = jax.jit(lambda x: hcb.id_tap(recorder, x * 2) + 1)(jnp.arange(3.0))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [1.0, 3.0, 5.0])
  (arg, transforms, _), = recorder.calls
  assert isinstance(arg, np.ndarray) and arg.dtype == np.float32
  np.testing.assert_array_equal(arg, [0.0, 2.0, 4.0])
  assert transforms == ()


def test_result_is_returned_and_not_sent(recorder):
  out = jax.jit(lambda x: hcb.id_tap(recorder, x, result=x * 10))(2.0)
  hcb.barrier_wait()
  assert float(out) == 20.0
  assert recorder.values == [2.0]


def test_pytree_with_empty_none_and_scalars(recorder):
  arg = {"a": jnp.zeros((0, 3)), "b": None, "c": (1.5, jnp.int32(7)),
         "d": [jnp.ones((2,), jnp.bool_)]}
  out = jax.jit(lambda t: hcb.id_tap(recorder, t))(arg)
  hcb.barrier_wait()
  assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(arg)
  (got, _, _), = recorder.calls
  assert got["a"].shape == (0, 3) and got["b"] is None
  assert got["c"][0].tolist() == 1.5 and got["c"][1].tolist() == 7
  assert got["d"][0].dtype == np.bool_ and got["d"][0].tolist() == [True, True]


def test_unused_tap_still_runs(recorder):
  def f(x):
    hcb.id_tap(recorder, x)  # result dropped
    return x + 1
  jax.jit(f)(5.0)
  hcb.barrier_wait()
  assert recorder.values == [5.0]


def test_program_order_of_several_taps_in_a_step(recorder):
  def step(c, _):
    for k in range(4):
      hcb.id_tap(recorder, (k, c))
    return c + 1, None
  jax.jit(lambda: lax.scan(step, 0, None, length=3))()
  hcb.barrier_wait()
  assert recorder.values == [(k, i) for i in range(3) for k in range(4)]


def test_nested_jit(recorder):
  inner = jax.jit(lambda x: hcb.id_tap(recorder.labelled("inner"), x) * 2)
  outer = jax.jit(lambda x: inner(hcb.id_tap(recorder.labelled("outer"), x)) + 1)
  assert float(outer(1.0)) == 3.0
  hcb.barrier_wait()
  assert [v[0] for v in recorder.values] == ["outer", "inner"]


def test_taps_across_calls_in_dispatch_order(recorder):
  f = jax.jit(lambda x: hcb.id_tap(recorder, x))
  for i in range(20):
    f(i)
  hcb.barrier_wait()
  assert recorder.values == list(range(20))


def test_while_loop_taps_in_body_and_cond(recorder):
  def cond(c):
    hcb.id_tap(recorder.labelled("cond"), c)
    return c < 2
  def body(c):
    hcb.id_tap(recorder.labelled("body"), c)
    return c + 1
  assert int(jax.jit(lambda x: lax.while_loop(cond, body, x))(0)) == 2
  hcb.barrier_wait()
  assert recorder.values == [("cond", 0), ("body", 0), ("cond", 1),
                             ("body", 1), ("cond", 2)]


def test_fori_loop(recorder):
  jax.jit(lambda: lax.fori_loop(
      0, 3, lambda i, c: hcb.id_tap(recorder, c + i), 0))()
  hcb.barrier_wait()
  assert recorder.values == [0, 1, 3]


@pytest.mark.parametrize("pred,expected", [(True, "true"), (False, "false")])
def test_cond_runs_only_the_taken_branch(recorder, pred, expected):
  def f(p, x):
    return lax.cond(p, lambda x: hcb.id_tap(recorder.labelled("true"), x),
                    lambda x: hcb.id_tap(recorder.labelled("false"), x), x)
  jax.jit(f)(pred, 1.0)
  hcb.barrier_wait()
  assert recorder.values == [(expected, 1.0)]


def test_switch(recorder):
  branches = [functools.partial(lambda k, x: hcb.id_tap(recorder, (k, x))[1],
                                k) for k in range(3)]
  jax.jit(lambda i, x: lax.switch(i, branches, x))(2, 4.0)
  hcb.barrier_wait()
  assert recorder.values == [(2, 4.0)]


def test_named_call(recorder):
  f = jax.named_call(lambda x: hcb.id_tap(recorder, x) * 2, name="tapped")
  assert float(jax.jit(f)(3.0)) == 6.0
  hcb.barrier_wait()
  assert recorder.values == [3.0]


def test_odeint(recorder):
  from jax.experimental.ode import odeint

  def dynamics(y, t):
    hcb.id_tap(lambda a, tr: recorder(a, tr), t)
    return -y

  ys = jax.jit(lambda y0: odeint(dynamics, y0, jnp.array([0.0, 1.0])))(1.0)
  hcb.barrier_wait()
  np.testing.assert_allclose(ys[-1], np.exp(-1.0), rtol=1e-5)
  assert len(recorder.calls) > 2
  ts = [v for v in recorder.values]
  assert ts[0] == 0.0 and all(0.0 <= t <= 2.0 for t in ts)


# --- vmap -------------------------------------------------------------------

def test_vmap_whole_batch_and_transforms(recorder):
  out = jax.vmap(lambda x: hcb.id_tap(recorder, x) * 2)(jnp.arange(3.0))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [0.0, 2.0, 4.0])
  assert recorder.values == [[0.0, 1.0, 2.0]]
  assert recorder.transforms == [(BATCH0,)]


def test_vmap_unbatched_argument_has_none(recorder):
  jax.vmap(lambda x: hcb.id_tap(recorder, (x, 7.0)), in_axes=0)(
      jnp.arange(2.0))
  hcb.barrier_wait()
  assert recorder.values == [([0.0, 1.0], 7.0)]
  assert recorder.transforms == [(("batch", {"batch_dims": (0, None)}),)]


def test_vmap_nonzero_axis(recorder):
  jax.vmap(lambda x: hcb.id_tap(recorder, x), in_axes=1, out_axes=1)(
      jnp.arange(6.0).reshape(2, 3))
  hcb.barrier_wait()
  assert recorder.transforms == [(("batch", {"batch_dims": (1,)}),)]
  assert recorder.values == [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]]


def test_nested_vmap_stacks_entries(recorder):
  jax.vmap(jax.vmap(lambda x: hcb.id_tap(recorder, x)))(
      jnp.arange(6.0).reshape(2, 3))
  hcb.barrier_wait()
  assert recorder.transforms == [(BATCH0, BATCH0)]
  assert np.shape(recorder.values[0]) == (2, 3)


def test_vmap_of_jit_of_scan(recorder):
  def f(x):
    return lax.scan(lambda c, _: (hcb.id_tap(recorder, c) + 1, None), x,
                    None, length=2)[0]
  jax.vmap(jax.jit(f))(jnp.array([10, 20]))
  hcb.barrier_wait()
  assert recorder.values == [[10, 20], [11, 21]]
  assert recorder.transforms == [(BATCH0,)] * 2


def test_vmap_while_loop_with_batched_predicate(recorder):
  def f(limit):
    def body(c):
      hcb.id_tap(recorder, c)
      return c + 1
    return lax.while_loop(lambda c: c < limit, body, 0)
  out = jax.vmap(f)(jnp.array([1, 3]))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [1, 3])
  # The tap sees the whole batch at every iteration, finished lanes included.
  assert recorder.values == [[0, 0], [1, 1], [1, 2]]
  assert recorder.transforms == [(BATCH0,)] * 3


def test_vmap_cond_with_batched_predicate_runs_both_branches(recorder):
  def f(p, x):
    return lax.cond(p, lambda x: hcb.id_tap(recorder.labelled("t"), x),
                    lambda x: hcb.id_tap(recorder.labelled("f"), x), x)
  out = jax.vmap(f)(jnp.array([True, False]), jnp.array([1.0, 2.0]))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [1.0, 2.0])
  assert sorted(v[0] for v in recorder.values) == ["f", "t"]
  assert all(v[1] == [1.0, 2.0] for v in recorder.values)


# --- autodiff ---------------------------------------------------------------

def _power3(recorder):
  def power3(x):
    y = x * x
    hcb.id_tap(recorder, (x, y))
    return y * x
  return power3


def test_jvp_taps_primals_once(recorder):
  primal, tangent = jax.jvp(_power3(recorder), (3.0,), (0.1,))
  hcb.barrier_wait()
  assert (float(primal), pytest.approx(float(tangent))) == (27.0, 2.7)
  assert recorder.values == [(3.0, 9.0)]
  assert recorder.transforms == [()]


def test_grad_taps_primals_once(recorder):
  assert float(jax.grad(_power3(recorder))(3.0)) == 27.0
  hcb.barrier_wait()
  assert recorder.values == [(3.0, 9.0)]


def test_grad_of_grad(recorder):
  assert float(jax.grad(jax.grad(_power3(recorder)))(3.0)) == 18.0
  hcb.barrier_wait()
  assert recorder.values == [(3.0, 9.0)]


def test_vmap_of_grad(recorder):
  out = jax.vmap(jax.grad(_power3(recorder)))(jnp.array([2.0, 3.0]))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [12.0, 27.0])
  assert recorder.values == [([2.0, 3.0], [4.0, 9.0])]
  assert recorder.transforms == [(("batch", {"batch_dims": (0, 0)}),)]


def test_gradient_flows_through_tap_and_result():
  f = lambda x: hcb.id_tap(lambda *a: None, x * 3.0) ** 2
  assert float(jax.grad(f)(1.0)) == 18.0
  g = lambda x: hcb.id_tap(lambda *a: None, x, result=x * 5.0)
  assert float(jax.grad(g)(1.0)) == 5.0


def test_integer_inputs_float0_tangents(recorder):
  def f(x, n):
    x, n = hcb.id_tap(recorder, (x, n))
    return x * n
  assert float(jax.grad(f)(2.0, 3)) == 3.0
  hcb.barrier_wait()
  assert recorder.values == [(2.0, 3)]


def test_checkpoint_taps_run_again_when_rematerialised(recorder):
  power3 = _power3(recorder)
  out = jax.grad(lambda x: power3(jax.checkpoint(power3)(x)))(3.0)
  hcb.barrier_wait()
  assert float(out) == pytest.approx(9 * 3.0 ** 8)
  assert recorder.values == [(3.0, 9.0), (27.0, 729.0), (3.0, 9.0)]


def test_grad_of_scan(recorder):
  def f(x):
    return lax.scan(lambda c, _: (hcb.id_tap(recorder, c) * 2.0, None), x,
                    None, length=3)[0]
  assert float(jax.grad(f)(1.0)) == 8.0
  hcb.barrier_wait()
  assert recorder.values == [1.0, 2.0, 4.0]


# --- devices and errors -------------------------------------------------------

def test_tap_with_device(recorder):
  jax.jit(lambda x: hcb.id_tap(recorder, x, tap_with_device=True))(1.0)
  hcb.barrier_wait()
  assert recorder.calls[0][2] == jax.devices()[0]


def test_exception_is_logged_later_taps_run_and_barrier_raises(recorder,
                                                                caplog):
  def fails(arg, transforms):
    raise ValueError(f"bad value {arg}")
  f = jax.jit(lambda x: hcb.id_tap(recorder, hcb.id_tap(fails, x)))
  assert float(f(1.0)) == 1.0
  f(2.0)
  with pytest.raises(hcb.CallbackException) as info:
    hcb.barrier_wait()
  assert "ValueError: bad value 2.0" in str(info.value)
  assert "Traceback" in str(info.value)
  assert isinstance(info.value.__cause__, ValueError)
  assert recorder.values == [1.0, 2.0]
  assert "bad value 1.0" in caplog.text
  hcb.barrier_wait()  # the error was reported once
  assert float(f(3.0)) == 3.0  # and the function keeps working
  with pytest.raises(hcb.CallbackException, match="bad value 3.0"):
    hcb.barrier_wait()
  assert hcb.TapFunctionException is hcb.CallbackException


def test_jax_effects_barrier_suffices(recorder):
  f = jax.jit(lambda x: lax.fori_loop(0, 50, lambda i, c: hcb.id_tap(
      recorder, c + 1), x))
  f(0)
  jax.effects_barrier()
  assert recorder.values == list(range(1, 51))


def test_unknown_kwargs_raise_type_error():
  with pytest.raises(TypeError, match="Support for \\*\\*kwargs"):
    hcb.id_tap(lambda *a: None, 1.0, what="x")


def test_tutorial_kwargs_are_accepted(recorder):
  hcb.id_tap(recorder, 1.0, tap_with_transform=True)
  hcb.barrier_wait()
  assert recorder.values == [1.0]


def test_non_callable_is_rejected():
  with pytest.raises(TypeError, match="must be callable, got 3"):
    hcb.id_tap(3, 1.0)


def test_non_array_leaf_is_rejected():
  with pytest.raises(TypeError, match="got 'text' of type str"):
    hcb.id_tap(lambda *a: None, ("text", 1.0))


def test_stop_outfeed_receiver_is_harmless(recorder):
  hcb.stop_outfeed_receiver()
  hcb.id_tap(recorder, 1.0)
  hcb.barrier_wait()
  assert recorder.values == [1.0]


def test_host_receives_a_copy_it_may_keep(recorder):
  f = jax.jit(lambda: lax.fori_loop(0, 3, lambda i, c: hcb.id_tap(
      recorder, jnp.full((4,), i)), jnp.zeros(4, jnp.int32)))
  f()
  hcb.barrier_wait()
  assert recorder.values == [[0] * 4, [1] * 4, [2] * 4]


def test_disable_jit_runs_taps_inline(recorder):
  with jax.disable_jit():
    out = jax.vmap(lambda x: hcb.id_tap(recorder, x * 2))(jnp.arange(2.0))
    res = hcb.call(lambda v: v + 1, jnp.float32(1), result_shape=1.0)
  np.testing.assert_array_equal(out, [0.0, 2.0])
  assert float(res) == 2.0
  assert recorder.values == [[0.0, 2.0]]
  assert recorder.transforms == [(BATCH0,)]


def test_context_reports_process_index():
  from hostcall import CallContext
  ctx = CallContext((), jax.devices()[0])
  assert ctx.process_index == 0


def test_unused_tap_in_loop_under_grad_still_runs(recorder):
  # The tap's output is dropped; partial evaluation must keep it anyway.
  def f(x):
    def body(i, c):
      hcb.id_tap(recorder, c)
      return c * 2.0
    return lax.fori_loop(0, 3, body, x)
  assert float(jax.grad(f)(1.0)) == 8.0
  hcb.barrier_wait()
  assert recorder.values == [1.0, 2.0, 4.0]

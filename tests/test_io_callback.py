"""hostcall.io_callback: JAX's behaviour by default, and its walls removed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback as jax_io_callback

import hostcall


def _like(x):
  return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


class Log:
  """Records its arguments; returns the first (``returns=True``) or None."""

  def __init__(self, returns=True):
    self.calls, self.returns = [], returns

  def __call__(self, *args):
    self.calls.append(tuple(np.asarray(a).tolist() for a in args))
    return args[0] if self.returns and args else None


@pytest.mark.parametrize("impl", [jax_io_callback, hostcall.io_callback])
def test_no_result_declared_but_value_returned_is_an_error_like_jax(impl):
  log = Log(returns=True)
  with pytest.raises(Exception, match="Mismatched number of outputs from "
                     "callback. Expected: 0, Actual: 1"):
    jax.jit(lambda x: impl(log, None, x))(1.0)
    hostcall.barrier()


@pytest.mark.parametrize("impl", [jax_io_callback, hostcall.io_callback])
def test_runs_even_when_result_unused(impl):
  log = Log()
  jax.jit(lambda x: (impl(log, _like(x), x), x + 1)[1])(3.0)
  jax.effects_barrier()
  assert log.calls == [(3.0,)]


def test_unordered_vmap_calls_once_per_element_like_jax():
  results = {}
  for name, impl in (("jax", jax_io_callback),
                     ("hostcall", hostcall.io_callback)):
    log = Log()
    out = jax.vmap(lambda x: impl(log, _like(x), x))(jnp.arange(3.0))
    jax.effects_barrier()
    results[name] = (sorted(log.calls), np.asarray(out).tolist())
  assert results["jax"] == results["hostcall"] == (
      [(0.0,), (1.0,), (2.0,)], [0.0, 1.0, 2.0])


@pytest.mark.parametrize("impl", [jax_io_callback, hostcall.io_callback])
def test_ordered_vmap_raises_jax_error_by_default(impl):
  with pytest.raises(ValueError, match="Cannot `vmap` ordered IO callback"):
    jax.vmap(lambda x: impl(Log(), _like(x), x, ordered=True))(jnp.ones(2))


def test_ordered_vmap_sequential_keeps_global_order():
  log = Log(returns=False)

  def f(x):
    hostcall.io_callback(log, None, -1.0, ordered=True)
    y = hostcall.io_callback(lambda v: (log(v), v)[1], _like(x), x,
                             ordered=True, vmap_method="sequential")
    hostcall.io_callback(log, None, -2.0, ordered=True)
    return y

  out = jax.jit(jax.vmap(f))(jnp.arange(3.0))
  hostcall.barrier()
  np.testing.assert_array_equal(out, [0.0, 1.0, 2.0])
  assert log.calls == [(-1.0,), (0.0,), (1.0,), (2.0,), (-2.0,)]


def test_ordered_vmap_expand_dims_gets_the_whole_batch():
  log = Log(returns=False)
  jax.vmap(lambda x, y: hostcall.io_callback(
      log, None, x, y, ordered=True, vmap_method="expand_dims"),
      in_axes=(0, None))(jnp.arange(3.0), 5.0)
  hostcall.barrier()
  assert log.calls == [([0.0, 1.0, 2.0], [5.0])]


def test_scan_of_ordered_callback():
  log = Log()

  def body(c, x):
    return c, hostcall.io_callback(log, _like(x), x, ordered=True)

  ys = jax.jit(lambda xs: lax.scan(body, None, xs)[1])(jnp.arange(5.0))
  np.testing.assert_array_equal(ys, np.arange(5.0))
  assert log.calls == [(float(i),) for i in range(5)]


def test_callback_without_result_under_grad_runs_on_primal_once(capsys):
  @jax.jit
  def f(x):
    hostcall.io_callback(lambda: print("hello"), None)
    return x

  assert float(jax.grad(f)(1.0)) == 1.0
  jax.effects_barrier()
  assert capsys.readouterr().out == "hello\n"


def test_callback_of_differentiated_value_without_result_runs_once():
  log = Log(returns=False)
  g = jax.grad(lambda x: (hostcall.io_callback(log, None, x * 2), x * x)[1])
  assert float(g(3.0)) == 6.0
  jax.effects_barrier()
  assert log.calls == [(6.0,)]


@pytest.mark.parametrize("impl", [jax_io_callback, hostcall.io_callback])
def test_result_feeding_a_derivative_raises_jax_error(impl):
  with pytest.raises(ValueError, match="IO callbacks do not support JVP"):
    jax.grad(lambda x: impl(Log(), _like(x), x))(1.0)


def test_error_names_the_options():
  with pytest.raises(ValueError, match="differentiable=False"):
    jax.grad(lambda x: hostcall.io_callback(Log(), _like(x), x))(1.0)


def test_nondifferentiable_results_are_constants():
  log = Log()
  g = jax.grad(lambda x: x * hostcall.io_callback(
      log, _like(x), x, differentiable=False))
  assert float(g(3.0)) == 3.0
  jax.effects_barrier()
  assert log.calls == [(3.0,)]


def test_io_callback_with_rules_runs_once_per_primal_evaluation():
  log = Log()

  def host(x):
    log(x)
    return np.exp(x)

  f = lambda x: hostcall.io_callback(host, _like(x), x, ordered=True,
                                     vjp=lambda p, ct: (np.exp(p[0]) * ct,))
  assert float(jax.grad(f)(0.5)) == pytest.approx(np.exp(0.5), rel=1e-6)
  jax.effects_barrier()
  assert log.calls == [(0.5,)]


@pytest.mark.parametrize("impl,returns", [(jax_io_callback, False),
                                          (jax_io_callback, True),
                                          (hostcall.io_callback, True)])
def test_while_loop_with_batched_predicate_is_refused_like_jax(impl, returns):
  # Lanes that have finished would still run an impure callback: refused,
  # with JAX's error, before anything runs (hostcall's, only where it has a
  # result, which the body would go on with for every lane).
  log = Log(returns=returns)

  def f(limit):
    def body(c):
      if returns:
        return impl(log, _like(c), c) + 1
      impl(log, None, c)
      return c + 1
    return lax.while_loop(lambda c: c < limit, body, 0)

  with pytest.raises(Exception, match="Unordered IO effects not supported in "
                     "while_loop with batched predicate"):
    jax.vmap(f)(jnp.array([1, 3]))
  assert log.calls == []


def test_result_less_io_callback_in_batched_while_runs_for_lanes_looping():
  # hostcall gives a result-less io callback in the body the lanes whose
  # predicate still holds (gating): lane 0 finishes after one step.
  log = Log(returns=False)

  def f(limit):
    def body(c):
      hostcall.io_callback(log, None, limit, c)
      return c + 1
    return lax.while_loop(lambda c: c < limit, body, 0)

  np.testing.assert_array_equal(jax.vmap(f)(jnp.array([1, 3])), [1, 3])
  hostcall.barrier()
  assert sorted(log.calls) == [(1, 0), (3, 0), (3, 1), (3, 2)]


@pytest.mark.parametrize("impl", [jax_io_callback, hostcall.io_callback])
def test_while_loop_with_unbatched_predicate_under_vmap_runs_like_jax(impl):
  log = Log(returns=False)

  def f(x):
    def body(c):
      i, v = c
      impl(log, None, v)
      return i + 1, v + 1
    return lax.while_loop(lambda c: c[0] < 2, body, (0, x))[1]

  out = jax.vmap(f)(jnp.array([10, 20]))
  hostcall.barrier()
  np.testing.assert_array_equal(out, [12, 22])
  assert log.calls == [(10,), (20,), (11,), (21,)]


def test_rng_state_advances_between_runs(capsys):
  rng = np.random.default_rng(0)

  def host_side_random_like(x):
    print(f"generating {x.dtype}{list(x.shape)}")
    return rng.uniform(size=x.shape).astype(x.dtype)

  f = jax.jit(lambda x: hostcall.io_callback(host_side_random_like, x, x))
  a, b = f(jnp.zeros(5)), f(jnp.zeros(5))
  assert capsys.readouterr().out == "generating float32[5]\n" * 2
  assert not np.array_equal(a, b)
  expected = np.random.default_rng(0).uniform(size=10).astype(np.float32)
  np.testing.assert_array_equal(np.concatenate([a, b]), expected)


def test_exception_fails_the_call_and_process_stays_usable():
  def boom(x):
    raise RuntimeError("disk full")
  with pytest.raises(Exception, match="RuntimeError: disk full"):
    jax.jit(lambda x: hostcall.io_callback(boom, _like(x), x))(1.0
                                                              ).block_until_ready()
  log = Log()
  assert float(jax.jit(lambda x: hostcall.io_callback(log, _like(x), x))(2.0)) == 2.0


def test_sharding_argument_is_accepted():
  s = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  out = jax.jit(lambda x: hostcall.io_callback(lambda v: v * 2, _like(x), x,
                                               sharding=s))(2.0)
  assert float(out) == 4.0

"""hostcall.pure_callback: JAX's behaviour by default, derivatives on request."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

import hostcall


def _like(x):
  return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


# --- drop-in: the same results and errors as jax.pure_callback ----------------

@pytest.mark.parametrize("impl", [jax.pure_callback, hostcall.pure_callback])
def test_multi_output_example(impl):
  def host(x):
    return np.sum(x), np.mean(x)

  def f(arr):
    shapes = (jax.ShapeDtypeStruct((), arr.dtype),) * 2
    s, m = impl(host, shapes, arr)
    return s * 2, m * 3

  res1, res2 = jax.jit(f)(jnp.arange(5.0))
  assert (float(res1), float(res2)) == (20.0, 6.0)


@pytest.mark.parametrize("method", ["sequential", "sequential_unrolled",
                                    "expand_dims", "broadcast_all"])
def test_vmap_methods_match_jax(method):
  received = {"jax": [], "hostcall": []}

  def host(log, x, y):
    log.append((np.shape(x), np.shape(y)))
    return np.asarray(x) + np.asarray(y)

  def run(name, impl):
    f = lambda x, y: impl(functools.partial(host, received[name]), _like(x),
                          x, y, vmap_method=method)
    return jax.vmap(f, in_axes=(0, None))(jnp.arange(6.0).reshape(3, 2),
                                          jnp.ones(2))

  np.testing.assert_array_equal(run("jax", jax.pure_callback),
                                run("hostcall", hostcall.pure_callback))
  assert received["jax"] == received["hostcall"]


def test_nested_vmap_sequential_matches_jax():
  def run(impl):
    f = lambda x: impl(lambda v: np.asarray(v) * 10, _like(x), x,
                       vmap_method="sequential")
    return jax.vmap(jax.vmap(f), in_axes=1)(jnp.arange(6.0).reshape(2, 3))
  np.testing.assert_array_equal(run(jax.pure_callback),
                                run(hostcall.pure_callback))


def test_kwargs_are_passed_to_the_callback():
  out = jax.jit(lambda x: hostcall.pure_callback(
      lambda a, *, scale: a * scale, _like(x), x, scale=jnp.float32(3)))(2.0)
  assert float(out) == 6.0


def test_callback_receives_numpy_arrays():
  kinds = []
  jax.jit(lambda x: hostcall.pure_callback(
      lambda v: (kinds.append(type(v)), v)[1], _like(x), x))(1.0)
  assert kinds == [np.ndarray]


def test_errors_match_jax():
  f = lambda impl: (lambda x: impl(np.sin, _like(x), x))
  for impl in (jax.pure_callback, hostcall.pure_callback):
    with pytest.raises(NotImplementedError, match="vmap_method=None"):
      jax.vmap(f(impl))(jnp.ones(2))
    with pytest.raises(ValueError, match="Pure callbacks do not support JVP"):
      jax.grad(f(impl))(1.0)
    with pytest.raises(ValueError, match="vmap_method must be on"
                       if impl is jax.pure_callback else "vmap_method must be"):
      impl(np.sin, _like(1.0), 1.0, vmap_method="nope")


def test_grad_error_names_the_options():
  with pytest.raises(ValueError, match="finite_differences=True"):
    jax.grad(lambda x: hostcall.pure_callback(np.sin, _like(x), x))(1.0)


def test_wrong_result_shape_fails_the_call_clearly():
  f = jax.jit(lambda x: hostcall.pure_callback(lambda v: v[:1], _like(x), x))
  with pytest.raises(Exception, match=r"the callback '<lambda>' \(defined "
                     r"at .*\) returned a wrong result\. Incorrect output "
                     r"shape for return value #0: Expected: \(3,\), Actual: "
                     r"\(1,\)\. "):
    f(jnp.ones(3)).block_until_ready()


# --- derivatives --------------------------------------------------------------

def _jv_vjp(primals, ct):
  v, z = primals
  return None, ct * 0.5 * (scipy.special.jv(v - 1, z) - scipy.special.jv(v + 1, z))


def _jv_jvp(primals, tangents):
  v, z = primals
  _, dz = tangents
  return dz * 0.5 * (scipy.special.jv(v - 1, z) - scipy.special.jv(v + 1, z))


def _jv_reference_grad(v, z):
  return 0.5 * (scipy.special.jv(v - 1, z) - scipy.special.jv(v + 1, z))


def _host_jv(v, z):
  return scipy.special.jv(v, z).astype(z.dtype)


RULES = {
    "vjp only": dict(vjp=_jv_vjp),
    "jvp only": dict(jvp=_jv_jvp),
    "both": dict(jvp=_jv_jvp, vjp=_jv_vjp),
}


def _jv(rules):
  def jv(v, z):
    return hostcall.pure_callback(_host_jv, _like(z), v, z,
                                  vmap_method="sequential", **rules)
  return jv


@pytest.mark.parametrize("name", list(RULES))
def test_bessel_grad_jacfwd_jacrev_vmap_grad(name):
  jv = _jv(RULES[name])
  z = jnp.linspace(0.5, 4.0, 4)
  expected = _jv_reference_grad(3, np.asarray(z))
  np.testing.assert_allclose(jax.grad(lambda z: jv(3, z).sum())(z), expected,
                             rtol=1e-5)
  np.testing.assert_allclose(jax.jacfwd(lambda z: jv(3, z))(z),
                             np.diag(expected), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(jax.jacrev(lambda z: jv(3, z))(z),
                             np.diag(expected), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(jax.vmap(jax.grad(lambda z: jv(3, z)))(z),
                             expected, rtol=1e-5)
  np.testing.assert_allclose(jax.jit(jax.grad(lambda z: jv(3, z).sum()))(z),
                             expected, rtol=1e-5)


def test_jvp_gives_primal_and_tangent():
  jv = _jv(RULES["jvp only"])
  y, t = jax.jvp(lambda z: jv(2, z), (1.5,), (2.0,))
  assert float(y) == pytest.approx(scipy.special.jv(2, 1.5), rel=1e-6)
  assert float(t) == pytest.approx(2 * _jv_reference_grad(2, 1.5), rel=1e-5)


def test_rules_are_called_on_the_host_with_numpy():
  seen = []

  def vjp(primals, ct):
    seen.append((type(primals[0]).__name__, np.shape(ct)))
    return (np.cos(primals[0]) * ct,)

  jax.grad(lambda x: hostcall.pure_callback(np.sin, _like(x), x,
                                            vjp=vjp).sum())(jnp.ones(3))
  assert seen == [("ndarray", (3,))]


def test_finite_differences_matches_analytic_gradient():
  def f(x):
    return hostcall.pure_callback(lambda v: np.sin(v) * np.exp(v), _like(x),
                                  x, finite_differences=True)
  x = jnp.linspace(-1.0, 1.0, 5)
  expected = np.cos(x) * np.exp(x) + np.sin(x) * np.exp(x)
  np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(x), expected,
                             rtol=1e-5)
  np.testing.assert_allclose(jax.jacfwd(f)(x), np.diag(expected), rtol=1e-5,
                             atol=1e-6)


def test_fd_step_balances_truncation_and_rounding():
  h = hostcall.fd_step(np.array([3.0]), np.array([1.0]))
  assert h == pytest.approx(3.0 * np.finfo(np.float64).eps ** (1 / 3))


def test_second_order_with_rules_of_rules():
  # d/dx sin = cos, as a host rule that is itself differentiable.
  cos_vjp = hostcall.HostFunction(
      lambda primals, ct: (np.cos(primals[0]) * ct,),
      vjp=lambda p, c: ((-np.sin(p[0][0]) * p[1] * c[0],),
                        np.cos(p[0][0]) * c[0]))
  sin = hostcall.HostFunction(np.sin, vjp=cos_vjp)
  f = lambda x: hostcall.pure_callback(sin, _like(x), x,
                                       vmap_method="sequential")
  x = 0.7
  assert float(jax.grad(jax.grad(f))(x)) == pytest.approx(-np.sin(x), rel=1e-6)
  # Hessian-vector product, forward-over-reverse (jax issue 16650).
  _, hvp = jax.jvp(jax.grad(f), (x,), (2.0,))
  assert float(hvp) == pytest.approx(-2 * np.sin(x), rel=1e-6)
  xs = jnp.array([0.1, 0.2])
  np.testing.assert_allclose(jax.hessian(lambda v: f(v).sum())(xs),
                             np.diag(-np.sin(xs)), rtol=1e-6, atol=1e-7)


def test_too_high_order_without_rules_of_rules_is_a_clear_error():
  f = lambda x: hostcall.pure_callback(np.sin, _like(x), x,
                                       vjp=lambda p, ct: (np.cos(p[0]) * ct,))
  with pytest.raises(NotImplementedError, match="too high an order"):
    jax.grad(jax.grad(f))(1.0)


def test_integer_argument_and_keyword_constants():
  def host(x, n, *, scale):
    return (x * n * scale).astype(x.dtype)

  def vjp(primals, ct, *, scale):
    x, n = primals
    return ct * n * scale, None

  f = lambda x: hostcall.pure_callback(host, _like(x), x, 3, vjp=vjp,
                                       scale=jnp.float32(2))
  assert float(jax.grad(f)(1.0)) == 6.0


def test_host_function_object_carries_rules():
  sin = hostcall.HostFunction(np.sin, jvp=lambda p, t: np.cos(p[0]) * t[0])
  assert sin(0.0) == 0.0 and sin.__name__ == "sin"
  f = lambda x: hostcall.pure_callback(sin, _like(x), x)
  assert float(jax.grad(f)(0.0)) == 1.0
  with pytest.raises(TypeError, match="needs a derivative"):
    hostcall.HostFunction(np.sin)
  with pytest.raises(TypeError, match="not both"):
    hostcall.HostFunction(np.sin, vjp=lambda p, c: c, finite_differences=True)


def test_vjp_rule_with_wrong_arity_is_a_clear_error():
  f = lambda x: hostcall.pure_callback(np.sin, _like(x), x,
                                       vjp=lambda p, ct: np.cos(p[0]) * ct)
  with pytest.raises(Exception, match="must return a tuple with one "
                     "cotangent per positional argument"):
    jax.grad(f)(1.0).block_until_ready()


@pytest.mark.parametrize("method", ["sequential", "broadcast_all"])
def test_derivatives_of_vmapped_calls(method):
  calls = []

  def host(x, y):
    calls.append(np.shape(x))
    return (np.sin(x) * y).astype(x.dtype)

  def vjp(primals, ct):
    x, y = primals
    return ct * np.cos(x) * y, np.sum(ct * np.sin(x)) * np.ones_like(y)

  f = lambda x, y: hostcall.pure_callback(host, _like(x), x, y,
                                          vmap_method=method, vjp=vjp)
  xs, y = jnp.array([0.1, 0.2, 0.3]), jnp.float32(2.0)
  batched = lambda xs: jax.vmap(f, in_axes=(0, None))(xs, y).sum()
  np.testing.assert_allclose(jax.grad(batched)(xs), np.cos(xs) * 2,
                             rtol=1e-6)
  _, t = jax.jvp(lambda xs: jax.vmap(f, in_axes=(0, None))(xs, y), (xs,),
                 (jnp.ones(3),))
  np.testing.assert_allclose(t, np.cos(xs) * 2, rtol=1e-6)
  gy = jax.grad(lambda y: jax.vmap(f, in_axes=(0, None))(xs, y).sum())(y)
  assert float(gy) == pytest.approx(float(np.sin(xs).sum()), rel=1e-6)

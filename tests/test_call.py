"""call: results returned to the device, checked, and clear errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hostcall import host_callback as hcb


def test_host_eig_example():
  def host_eig(m):
    return np.linalg.eigvalsh(m).astype(m.dtype)

  def device_fun(m):
    return hcb.call(host_eig, m,
                    result_shape=jax.ShapeDtypeStruct(m.shape[:-1], m.dtype))

  m = jnp.array([[2.0, 1.0], [1.0, 2.0]])
  np.testing.assert_allclose(jax.jit(device_fun)(m), [1.0, 3.0], rtol=1e-6)
  np.testing.assert_allclose(device_fun(m), [1.0, 3.0], rtol=1e-6)


def test_pytree_result_and_scalar_result_shape():
  def host(arg):
    x, n = arg
    return {"double": x * 2, "count": np.int32(n + 1)}

  out = jax.jit(lambda x, n: hcb.call(
      host, (x, n), result_shape={"double": x, "count": 1}))(
          jnp.arange(3.0), 4)
  np.testing.assert_array_equal(out["double"], [0.0, 2.0, 4.0])
  assert out["count"].dtype == jnp.int32 and int(out["count"]) == 5


@pytest.mark.parametrize("no_result", [None, ()])
def test_no_result(no_result):
  seen = []
  out = jax.jit(lambda x: hcb.call(seen.append, x, result_shape=no_result))(
      2.0)
  assert out == no_result
  assert [float(v) for v in seen] == [2.0]


def test_result_shape_dtypes_synonym():
  out = jax.jit(lambda x: hcb.call(lambda v: v + 1, x,
                                   result_shape_dtypes=x))(jnp.ones(2))
  np.testing.assert_array_equal(out, [2.0, 2.0])
  with pytest.raises(TypeError, match="not both"):
    hcb.call(lambda v: v, 1.0, result_shape=1.0, result_shape_dtypes=1.0)


def test_call_with_device():
  devices = []

  def host(x, *, device):
    devices.append(device)
    return x

  jax.jit(lambda x: hcb.call(host, x, result_shape=x,
                             call_with_device=True))(1.0)
  assert devices == [jax.devices()[0]]


def test_tuple_argument_spread_over_two_parameter_host_function():
  def external(data, parameter):
    return (np.tanh(data) + parameter).astype(data.dtype)

  x = jnp.linspace(-2.0, 2.0, 5, dtype=jnp.float32)
  out = jax.jit(lambda x, p: hcb.call(external, (x, p),
                                      result_shape_dtypes=x))(x, 0.5)
  np.testing.assert_allclose(out, np.tanh(np.asarray(x)) + 0.5, rtol=1e-6)


def test_one_parameter_host_function_still_receives_the_tuple():
  out = jax.jit(lambda x, y: hcb.call(lambda t: t[0] + t[1], (x, y),
                                      result_shape=x))(1.0, 2.0)
  assert float(out) == 3.0


def test_call_inside_scan_in_order():
  seen = []

  def host(c):
    seen.append(int(c))
    return c * 2

  out = jax.jit(lambda: lax.scan(lambda c, _: (hcb.call(
      host, c, result_shape=c), None), jnp.int32(1), None, length=4)[0])()
  assert int(out) == 16 and seen == [1, 2, 4, 8]


@pytest.mark.parametrize("returned,match", [
    (lambda x: x[:1], r"should have returned a result with abstract values "
                      r"float32\[2\] but returned float32\[1\]"),
    (lambda x: x.astype(np.int32), r"should have returned a result with "
                                   r"abstract values float32\[2\] but "
                                   r"returned int32\[2\]"),
    (lambda x: (x, x), r"should have returned a result with pytree "
                       r"PyTreeDef\(\*\) but returned PyTreeDef\(\(\*, \*\)\)"),
])
def test_wrong_result_fails_the_call_with_expected_and_received(returned,
                                                                match):
  f = jax.jit(lambda x: hcb.call(returned, x, result_shape=x))
  with pytest.raises(Exception, match=match):
    f(jnp.ones(2)).block_until_ready()
  # The process stays usable.
  ok = jax.jit(lambda x: hcb.call(lambda v: v, x, result_shape=x))
  np.testing.assert_array_equal(ok(jnp.ones(2)), [1.0, 1.0])


def test_exception_fails_the_call_with_type_message_and_traceback():
  def divide(x):
    return x / 0 if False else 1 // 0

  f = jax.jit(lambda x: hcb.call(divide, x, result_shape=x))
  with pytest.raises(Exception) as info:
    f(1.0).block_until_ready()
  text = str(info.value)
  assert "ZeroDivisionError" in text and "divide" in text
  assert "Traceback" in text


def test_python_scalars_and_lists_are_converted():
  out = jax.jit(lambda x: hcb.call(lambda v: [1.0, 2.0], x,
                                   result_shape=jax.ShapeDtypeStruct(
                                       (2,), jnp.float32)))(0.0)
  np.testing.assert_array_equal(out, [1.0, 2.0])


def test_bad_result_shape_is_a_clear_value_error():
  with pytest.raises(ValueError, match="result_shape should be a pytree.*'x'"):
    hcb.call(lambda v: v, 1.0, result_shape="x")


def test_vmap_of_call_is_not_implemented():
  with pytest.raises(NotImplementedError, match="vmap of a host call"):
    jax.vmap(lambda x: hcb.call(lambda v: v, x, result_shape=x))(jnp.ones(2))


def test_grad_of_call_names_the_remedy():
  with pytest.raises(NotImplementedError, match="custom_jvp"):
    jax.grad(lambda x: hcb.call(lambda v: v, x, result_shape=x))(1.0)


def test_grad_with_stop_gradient_works():
  f = lambda x: x * hcb.call(lambda v: v, lax.stop_gradient(x),
                             result_shape=x)
  assert float(jax.grad(f)(3.0)) == 3.0


def test_non_callable_is_rejected():
  with pytest.raises(TypeError, match="must be callable"):
    hcb.call("np.sin", 1.0, result_shape=1.0)

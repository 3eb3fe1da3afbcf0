"""id_print: the exact output of the legacy module's documented examples."""

import jax
import jax.numpy as jnp
import numpy as np

from hostcall import host_callback as hcb


def _power3(stream):
  def power3(x):
    y = x * x
    hcb.id_print((x, y), what="x,x^2", output_stream=stream)
    return y * x
  return power3


def _printed(stream):
  hcb.barrier_wait()
  return stream.getvalue()


PRIMAL = "what: x,x^2\n( 3. 9. )\n"


def test_power3(stream):
  _power3(stream)(3.0)
  assert _printed(stream) == PRIMAL


def test_power3_jvp(stream):
  jax.jvp(_power3(stream), (3.0,), (0.1,))
  assert _printed(stream) == PRIMAL


def test_power3_grad(stream):
  jax.grad(_power3(stream))(3.0)
  assert _printed(stream) == PRIMAL


def test_power3_vmap(stream):
  jax.vmap(_power3(stream))(np.array([2.0, 3.0]))
  assert _printed(stream) == (
      "transforms: [('batch', {'batch_dims': (0, 0)})] what: x,x^2\n"
      "( [2. 3.] [4. 9.] )\n")


def test_power3_checkpoint(stream):
  power3 = _power3(stream)
  jax.grad(lambda x: power3(jax.checkpoint(power3)(x)))(3.0)
  assert _printed(stream) == (
      "what: x,x^2\n( 3. 9. )\n"
      "what: x,x^2\n( 27. 729. )\n"
      "what: x,x^2\n( 3. 9. )\n")


def test_print_tangents_with_custom_jvp(stream):
  @jax.custom_jvp
  def print_tangents(arg):
    return None

  @print_tangents.defjvp
  def print_tangents_jvp(primals, tangents):
    arg_dot, = tangents
    hcb.id_print(arg_dot, what="tangents", output_stream=stream)
    return primals, tangents

  def power3_with_tangents(x):
    y = x * x
    hcb.id_print((x, y), what="x,x^2", output_stream=stream)
    print_tangents((x, y))
    return y * x

  jax.jvp(power3_with_tangents, (3.0,), (0.1,))
  assert _printed(stream) == PRIMAL + "what: tangents\n( 0.1 0.6 )\n"


def test_print_cotangents_with_custom_vjp(stream):
  @jax.custom_vjp
  def print_cotangents(arg):
    return arg

  def fwd(arg):
    return print_cotangents(arg), None

  def bwd(residual, ct_b):
    hcb.id_print(ct_b, what="cotangents", output_stream=stream)
    return ct_b,

  print_cotangents.defvjp(fwd, bwd)

  def power3_with_cotangents(x):
    y = x * x
    hcb.id_print((x, y), what="x,x^2", output_stream=stream)
    (x1, y1) = print_cotangents((x, y))
    return y1 * x1

  jax.grad(power3_with_cotangents)(3.0)
  assert _printed(stream) == PRIMAL + "what: cotangents\n( 9. 3. )\n"


def test_simple_print_to_stdout(capsys):
  out = jax.jit(lambda x: hcb.id_print(x + 5.0, what="y") * 2.0)(
      jnp.arange(3.0))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [10.0, 12.0, 14.0])
  assert capsys.readouterr().out == "what: y\n[5. 6. 7.]\n"


def test_containers_and_sorted_kwargs(stream):
  hcb.id_print({"b": [jnp.int32(1), jnp.int32(2)], "a": (jnp.float32(0.5),)},
               zeta=1, alpha="first", output_stream=stream)
  assert _printed(stream) == "alpha: first zeta: 1\n{ a=( 0.5 ) b=[ 1 2 ] }\n"


def test_no_kwargs_prints_value_only(stream):
  hcb.id_print(jnp.int32(4), output_stream=stream)
  assert _printed(stream) == "4\n"


def test_threshold_summarises_large_arrays(stream):
  hcb.id_print(jnp.arange(10), threshold=4, output_stream=stream)
  assert _printed(stream) == "[0 1 2 ... 7 8 9]\n"


def test_long_tuple_breaks_one_element_per_line(stream):
  hcb.id_print((jnp.arange(12.0), jnp.arange(12.0) + 100),
               output_stream=stream)
  assert _printed(stream) == (
      "( [ 0.  1.  2.  3.  4.  5.  6.  7.  8.  9. 10. 11.]\n"
      "  [100. 101. 102. 103. 104. 105. 106. 107. 108. 109. 110. 111.] )\n")


def test_print_with_device(stream):
  jax.jit(lambda x: hcb.id_print(x, what="v", tap_with_device=True,
                                 output_stream=stream))(2.0)
  assert _printed(stream) == f"device: {jax.devices()[0]} what: v\n2.\n"


def test_print_returns_result(stream):
  out = jax.jit(lambda x: hcb.id_print(x, result=x + 1, output_stream=stream))(
      1.0)
  assert float(out) == 2.0
  assert _printed(stream) == "1.\n"


def test_tap_with_transform_kwarg_is_not_printed(stream):
  hcb.id_print(jnp.float32(1.0), what="a", tap_with_transform=True,
               output_stream=stream)
  assert _printed(stream) == "what: a\n1.\n"

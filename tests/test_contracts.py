"""Contracts every flavour keeps, written once and run for each.

Calls with results (``pure_callback``, ``io_callback``, the legacy
``call``): what the host function receives, what comes back, what a failure
or a wrong result does, ``vmap`` and ``grad``. Taps (``id_tap``,
``debug_callback``, a result-less ``io_callback``): what they see under
``jit``, ``vmap`` and ``grad``, and where their failures go.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import host_callback as hcb

F32 = jax.ShapeDtypeStruct((3,), jnp.float32)


def _pure(fn, x, spec=F32):
  return hostcall.pure_callback(fn, spec, x, vmap_method="sequential")


def _io(fn, x, spec=F32):
  return hostcall.io_callback(fn, spec, x)


def _call(fn, x, spec=F32):
  return hcb.call(fn, x, result_shape=spec)


CALLS = {"pure_callback": _pure, "io_callback": _io, "call": _call}


@pytest.mark.parametrize("flavour", sorted(CALLS))
def test_the_host_gets_numpy_and_the_program_gets_the_declared_result(
    flavour):
  received = []

  def host(v):
    received.append((type(v), v.dtype, v.tolist()))
    return np.sin(v)

  x = jnp.arange(3.0)
  out = jax.jit(lambda x: CALLS[flavour](host, x) * 2)(x)
  assert out.dtype == jnp.float32 and out.shape == (3,)
  np.testing.assert_allclose(out, 2 * np.sin(np.arange(3.0)), rtol=1e-6)
  assert received == [(np.ndarray, np.dtype("float32"), [0.0, 1.0, 2.0])]


@pytest.mark.parametrize("flavour", sorted(CALLS))
def test_a_host_failure_fails_the_call_and_gives_back_the_original(flavour):
  def host(v):
    raise LookupError("no row", int(v[0]))

  f = jax.jit(lambda x: CALLS[flavour](host, x))
  with pytest.raises(LookupError) as info:
    with hostcall.original_errors():
      f(jnp.full(3, 7.0))
  assert info.value.args == ("no row", 7)
  hostcall.barrier()  # nothing was postponed: the call failed at once


@pytest.mark.parametrize("flavour", sorted(CALLS))
@pytest.mark.parametrize("returned, words", [
    (np.zeros(3, np.int32), ("int32", "float32")),  # came, declared
    (np.zeros(4, np.float32), ("(4,)", "(3,)")),
])
def test_a_wrong_result_is_an_error_naming_what_came(flavour, returned, words):
  f = jax.jit(lambda x: CALLS[flavour](lambda v: returned, x))
  with pytest.raises(Exception) as info:
    f(jnp.zeros(3))
  assert all(w in str(info.value) for w in words)


@pytest.mark.parametrize("flavour", ["pure_callback", "io_callback"])
def test_vmap_calls_the_host_once_per_element_in_order(flavour):
  seen = []

  def host(v):
    seen.append(v.tolist())
    return v + 1

  out = jax.jit(jax.vmap(lambda x: CALLS[flavour](host, x)))(
      jnp.arange(6.0).reshape(2, 3))
  assert seen == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
  np.testing.assert_array_equal(out, np.arange(6.0).reshape(2, 3) + 1)


def test_the_legacy_call_refuses_vmap_in_the_legacy_words():
  with pytest.raises(NotImplementedError,
                     match="batching rules are implemented only for id_tap"):
    jax.vmap(lambda x: _call(lambda v: v, x))(jnp.zeros((2, 3)))


@pytest.mark.parametrize("flavour", sorted(CALLS))
def test_grad_without_derivative_rules_is_refused_before_the_host_runs(
    flavour):
  ran = []

  def host(v):
    ran.append(1)
    return v

  with pytest.raises(Exception) as info:
    jax.grad(lambda x: CALLS[flavour](host, x).sum())(jnp.ones(3))
  assert ran == []
  assert any(word in str(info.value) for word in (
      "custom_jvp", "derivative", "JVP", "differentiat"))


# --- taps ----------------------------------------------------------------------

def _id_tap(fn, x):
  return hcb.id_tap(lambda v, transforms: fn(v), x)


def _debug(fn, x):
  hostcall.debug_callback(fn, x)
  return x


def _io_tap(fn, x):
  hostcall.io_callback(fn, None, x, ordered=True, vmap_method="sequential")
  return x


TAPS = {"id_tap": _id_tap, "debug_callback": _debug,
        "io_callback (no result)": _io_tap}


@pytest.mark.parametrize("flavour", sorted(TAPS))
def test_a_tap_sees_the_primal_value_once_and_changes_nothing(flavour):
  seen = []
  tap = TAPS[flavour]

  def f(x):
    return jnp.sum(tap(lambda v: seen.append(np.asarray(v).tolist()),
                       x * 2) ** 2)

  value = jax.jit(f)(jnp.arange(3.0))
  hostcall.barrier()
  assert seen == [[0.0, 2.0, 4.0]] and float(value) == 20.0
  if flavour != "io_callback (no result)":  # JAX refuses io under grad
    seen.clear()
    grad = jax.jit(jax.grad(f))(jnp.arange(3.0))
    hostcall.barrier()
    assert seen == [[0.0, 2.0, 4.0]]
    np.testing.assert_array_equal(grad, [0.0, 8.0, 16.0])


@pytest.mark.parametrize("flavour", sorted(TAPS))
def test_a_tap_under_vmap_sees_every_member(flavour):
  seen = []
  out = jax.jit(jax.vmap(lambda x: TAPS[flavour](
      lambda v: seen.append(np.asarray(v).tolist()), x)))(
          jnp.arange(4.0).reshape(2, 2))
  hostcall.barrier()
  members = ([row for batch in seen for row in batch] if flavour == "id_tap"
             else seen)  # id_tap gets the whole batch at once
  assert members == [[0.0, 1.0], [2.0, 3.0]]
  np.testing.assert_array_equal(out, np.arange(4.0).reshape(2, 2))


def test_a_tap_failure_waits_for_the_barrier_a_debug_failure_does_not():
  def boom(v):
    raise ValueError("tap failed")

  assert float(jax.jit(lambda x: _id_tap(boom, x))(1.0)) == 1.0
  with pytest.raises(hcb.CallbackException, match="tap failed"):
    hostcall.barrier()
  with pytest.raises(Exception, match="tap failed"):
    jax.jit(lambda x: _debug(boom, x))(1.0)
  hostcall.barrier()

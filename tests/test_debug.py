"""hostcall.debug_callback / debug_print: what jax.debug does, call for call."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcall


def _program(callback):
  def f(x):
    callback(x, "label")
    y = jnp.sin(x)
    callback(y, "after sin")
    return lax.fori_loop(0, 2, lambda i, c: (callback(c, "loop"), c * 2)[1],
                         y).sum()
  return f


TRANSFORMS = {
    "jit": (lambda f: jax.jit(f), (3,)),
    "vmap": (lambda f: jax.vmap(f), (3,)),
    "grad": (lambda f: jax.grad(lambda x: f(x).sum()), (3,)),
    "vmap of grad": (lambda f: jax.vmap(jax.grad(f)), (3,)),
    "jit of nested vmap": (lambda f: jax.jit(jax.vmap(jax.vmap(f))), (2, 2)),
}


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_debug_callback_sees_what_jax_debug_callback_sees(name, ordered):
  transform, shape = TRANSFORMS[name]
  x = jnp.arange(float(np.prod(shape))).reshape(shape)
  logs = {"jax": [], "hostcall": []}
  for key, impl in (("jax", jax.debug.callback),
                    ("hostcall", hostcall.debug_callback)):
    def record(v, label, key=key):
      logs[key].append((label, np.asarray(v).tolist()))
    cb = lambda v, label, impl=impl, record=record: impl(
        record, v, label, ordered=ordered)
    try:
      transform(_program(cb))(x)
    except ValueError as exc:  # JAX refuses ordered callbacks under vmap
      assert ordered and "vmap" in name and key == "jax", exc
      logs[key] = None
    jax.effects_barrier()
  if logs["jax"] is None:
    # hostcall keeps the per-element order JAX cannot promise under vmap.
    assert logs["hostcall"]
    return
  if ordered and name != "jit of nested vmap":
    assert logs["hostcall"] == logs["jax"]
  else:  # unordered: JAX may reorder; the same calls must arrive
    assert sorted(map(repr, logs["hostcall"])) == sorted(map(repr,
                                                             logs["jax"]))
  assert logs["hostcall"]


def test_two_call_form_and_ordered(capsys):
  jax.jit(lambda x: hostcall.debug_callback(ordered=True)(print, "v", x))(1)
  jax.effects_barrier()
  assert capsys.readouterr().out == "v 1\n"
  with pytest.raises(TypeError, match="unexpected arguments"):
    hostcall.debug_callback(None, 1)


def test_debug_print_matches_jax_debug_print(capsys):
  def program(printer):
    def f(x):
      printer("x = {} and {y}", x, y=x * 2)
      printer("no placeholders")
      printer("array {}", jnp.stack([x, x]))
      return x
    return f

  outputs = []
  for impl in (jax.debug.print, hostcall.debug_print):
    jax.vmap(jax.jit(program(impl)))(jnp.array([1.5, 2.5]))
    jax.effects_barrier()
    outputs.append(capsys.readouterr().out)
  assert outputs[0] == outputs[1]
  assert "x = 1.5 and 3.0" in outputs[1].splitlines()


def test_debug_print_format_errors_match_jax():
  for impl in (jax.debug.print, hostcall.debug_print):
    with pytest.raises(ValueError, match="Unused positional arguments"):
      impl("{}", 1, 2)
    with pytest.raises(ValueError, match="Unused keyword arguments"):
      impl("{x}", x=1, y=2)


def test_debug_print_uses_numpy_printoptions_of_the_trace(capsys):
  with np.printoptions(precision=2):
    f = jax.jit(lambda x: hostcall.debug_print("{}", x))
    f(jnp.array([1.23456, 2.0]))
  jax.effects_barrier()
  assert capsys.readouterr().out == "[1.23 2.  ]\n"


def test_exception_in_debug_callback_fails_the_call():
  def boom(x):
    raise KeyError("nope")
  with pytest.raises(Exception, match="KeyError"):
    jax.jit(lambda x: (hostcall.debug_callback(boom, x), x)[1])(1.0
                                                                ).block_until_ready()


def test_nested_vmap_calls_in_row_major_index_order():
  # JAX unrolls the inner vmap outermost, calling (0,0), (1,0), (0,1), (1,1);
  # hostcall calls in index order.
  seen = []
  jax.vmap(jax.vmap(lambda v: hostcall.debug_callback(
      lambda a: seen.append(int(a)), v, ordered=True)))(
          jnp.arange(4).reshape(2, 2))
  jax.effects_barrier()
  assert seen == [0, 1, 2, 3]

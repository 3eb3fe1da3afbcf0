"""hostcall.jit with many values in one call: the program it compiles grows
with them as jax.jit's does (no operation of its own per value, which
XLA would compile as a kernel of its own), and every value arrives exactly.
The compile times themselves are measured by ``make bench`` (the
compile-time rows), not here."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall._jit import packing, routes, threaded

#: Counts of values: one over the few a call packs into one buffer, and one
#: whose bytes are past the size up to which the few are packed by padding.
FEW, MANY = threaded.PACKED_OPERANDS + 32, 320

_OP = re.compile(r"^\s+(?:%[^=]+= )?\"?([a-z_]+\.[a-z_]+)", re.MULTILINE)


def _operations(lowered) -> int:
  """The operations of a lowered program (StableHLO, one per line)."""
  return len(_OP.findall(lowered.as_text()))


def _growth(lower) -> int:
  """The operations a program gains from ``FEW`` values to ``MANY``."""
  return _operations(lower(MANY)) - _operations(lower(FEW))


def _queued_program(function):
  """The program hostcall.jit compiles for ``function`` where calls are
  queued from the device (as ``jax.jit.lower`` gives jax.jit's)."""
  compiled = hostcall.jit(function)._hostcall_jitted
  if not routes.queues():
    pytest.skip("no native tap queue here: calls become outputs")
  return compiled._active


def _callback_step(count):
  def step(x):
    hostcall.debug_callback(lambda *values: None,
                            *[x + k for k in range(count)])
    return x * 2
  return step


def test_a_callback_of_many_values_adds_no_operation_per_value():
  x = jnp.float32(1)
  plain = _growth(lambda n: jax.jit(_callback_step(n)).lower(x))
  queued = _growth(lambda n: _queued_program(_callback_step(n)).lower(x))
  assert plain == 2 * (MANY - FEW)  # a constant and an add a value
  assert queued <= plain


def test_a_metrics_row_of_many_values_adds_no_operation_per_value(tmp_path):
  with hostcall.metrics.Run("many", root=str(tmp_path),
                            writers=["memory"]) as run:
    def row_step(count):
      def step(x, i):
        run.log({f"m{k}": x + k for k in range(count)}, step=i)
        return x * 2
      return step

    x, i = jnp.float32(1), jnp.int32(0)
    plain = _growth(lambda n: jax.jit(row_step(n)).lower(x, i))
    queued = _growth(lambda n: _queued_program(row_step(n)).lower(x, i))
  assert plain >= 2 * (MANY - FEW)
  assert queued <= plain


_CONCATENATE = re.compile(r"stablehlo\.concatenate ([^:]*?), dim = ")


def _widest_concatenation(lowered) -> int:
  """The most operands of a concatenation in a lowered program."""
  return max((len(operands.split(", ")) for operands in
              _CONCATENATE.findall(lowered.as_text())), default=0)


@pytest.mark.parametrize("count", [threaded.PACKED_OPERANDS, MANY])
def test_values_are_packed_in_concatenations_xla_fuses(jit_route, count):
  # XLA:CPU fuses a concatenation of up to packing.ROW operands with what
  # computes them; of more, each operand is a kernel of its own, compiled
  # apart. Queued, a call packs its few values; as outputs, the program
  # packs all of them.
  function = hostcall.jit(_callback_step(count))._hostcall_jitted
  program = (function.route(routes.AsOutputs).program
             if jit_route == "outputs" else function._active)
  widest = _widest_concatenation(program.lower(jnp.float32(1)))
  assert 0 < widest <= packing.ROW or (jit_route == "queued"
                                        and count == MANY and widest == 0)


def _mixed(x, count: int, kinds: str):
  """``count`` values of many dtypes. ``kinds``: "bytes", of whole bytes,
  which a call may pack; "wide", of two bytes or more (packed in wider
  words); "any", with a complex number and a sub-byte type too."""
  if kinds == "wide":
    values = [x, x.astype(jnp.int16), x.astype(jnp.bfloat16),
              jnp.zeros((0, 3), jnp.float16), x.astype(jnp.uint32)[0],
              (x + 1j).astype(jnp.complex64), x.astype(jnp.int32)]
  else:
    values = [x, x.astype(jnp.int8), x > 0, x.astype(jnp.bfloat16),
              x.astype(jnp.int16), jnp.zeros((0, 3), jnp.float16),
              x.astype(jnp.uint8)[0]]
  if kinds == "any":
    values += [x.astype(jnp.int4), (x + 1j).astype(jnp.complex64)]
  return values + [x[k % 2] * (k + 1) for k in range(count - len(values))]


@pytest.mark.parametrize("count, kinds", [
    (threaded.PACKED_OPERANDS, "bytes"),  # packed, in two rows
    (threaded.PACKED_OPERANDS + 1, "bytes"),  # as they are
    (threaded.PACKED_OPERANDS + 9, "any"),
    (100, "wide")])
@pytest.mark.parametrize("route", ["ffi", "python"])
def test_many_values_of_every_dtype_arrive_exactly(jit_route, route, count,
                                                   kinds, monkeypatch):
  # The values reach the queue packed into one buffer, or past the few a
  # call packs as they are (through the native handler, or where the
  # emission table says so a runtime callback), or the program's outputs
  # (packed in words as wide as the narrowest value's): each exactly as
  # jax.jit's callback gets it.
  if route == "python":
    if jit_route != "queued":
      pytest.skip("the emitter chooses how queued calls travel")
    from hostcall._runtime import emission
    monkeypatch.setattr(emission, "route", lambda *args: "python")
  got = {}

  def step(x, name):
    hostcall.debug_callback(
        lambda *values: got.setdefault(name, []).append(
            [np.asarray(v) for v in values]), *_mixed(x, count, kinds))
    return x

  x = np.float32([-1.5, 2.0])
  for name, jit in (("jax", jax.jit), ("hostcall", hostcall.jit)):
    for i in range(2):
      jit(lambda v: step(v, name))(x + i)
  hostcall.barrier()
  assert len(got["hostcall"]) == len(got["jax"]) == 2
  for mine, theirs in zip(got["hostcall"], got["jax"]):
    assert len(mine) == len(theirs) == count
    for a, b in zip(mine, theirs):
      assert a.dtype == b.dtype and a.shape == b.shape
      np.testing.assert_array_equal(a, b)
  last = count - len(_mixed(x, 0, kinds)) - 1  # (its k)
  assert got["jax"][1][-1] == (x + 1)[last % 2] * (last + 1)


def test_a_metrics_row_of_many_values_is_written_as_jax_jit_writes_it(
    jit_route, tmp_path):
  names = [f"layer{k}.norm" for k in range(3 * threaded.PACKED_OPERANDS)]
  rows = {}
  for label, jit in (("jax", jax.jit), ("hostcall", hostcall.jit)):
    with hostcall.metrics.Run(label, root=str(tmp_path),
                              writers=["memory"]) as run:
      step = jit(lambda x, i: run.log(
          {n: x * (k + 1) for k, n in enumerate(names)}, step=i))
      for i in range(3):
        step(jnp.float32(0.5 + i), i)
      hostcall.barrier()
      rows[label] = run.records()
  assert rows["hostcall"] == rows["jax"]
  assert [r["step"] for r in rows["jax"]] == [0, 1, 2]
  assert rows["jax"][2][names[-1]] == pytest.approx(2.5 * len(names))

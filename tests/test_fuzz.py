"""Fuzzing every entry point: random dtypes, ranks, shapes, pytrees,
exceptions (odd ones too) and metric names, synchronous and asynchronous.

Whatever comes, the process survives, nothing hangs, and every tap or row
is delivered, or a clear error says why not.
"""

import os

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import hostcall
from hostcall import host_callback as hcb, metrics

DTYPES = ["bool", "int2", "uint2", "int4", "uint4", "int8", "uint8", "int16",
          "uint16", "int32", "uint32", "float4_e2m1fn", "float8_e4m3fn",
          "float8_e5m2", "float8_e8m0fnu", "bfloat16", "float16", "float32",
          "complex64"]
EXAMPLES = int(os.environ.get("HOSTCALL_FUZZ_EXAMPLES", "40"))


class BadStr(Exception):
  def __str__(self):
    raise RuntimeError("no text")


EXCEPTIONS = [
    None, None, None,  # mostly: the host function succeeds
    lambda: ValueError("plain"),
    lambda: KeyError(os.fsdecode(b"\xffname")),
    lambda: BadStr(),
    lambda: RuntimeError("nul\x00inside"),
    lambda: ArithmeticError(*range(5)),
]


@st.composite
def arrays(draw):
  dtype = draw(st.sampled_from(DTYPES))
  shape = tuple(draw(st.lists(st.integers(0, 3), max_size=5)))
  values = np.arange(int(np.prod(shape))) % 5
  return jnp.asarray(values.reshape(shape)).astype(dtype)


trees = st.recursive(
    arrays(), lambda children: st.one_of(
        st.lists(children, max_size=3).map(tuple),
        st.lists(children, max_size=3),
        st.dictionaries(st.text(max_size=5), children, max_size=3)),
    max_leaves=5)


def _same(a, b) -> bool:
  la, ta = jax.tree_util.tree_flatten(a)
  lb, tb = jax.tree_util.tree_flatten(b)
  return ta == tb and all(
      np.asarray(x).dtype == np.asarray(y).dtype
      and np.asarray(x).shape == np.asarray(y).shape
      and np.asarray(x).tobytes() == np.asarray(y).tobytes()
      for x, y in zip(la, lb))


def _settings(examples):
  return hypothesis.settings(max_examples=examples, deadline=None,
                             derandomize=True,
                             suppress_health_check=list(
                                 hypothesis.HealthCheck))


def taps_deliver_or_explain(tree, failure, delivery, jit):
  got = []

  def tap(arg, transforms):
    got.append(arg)
    if failure is not None:
      raise failure()

  f = lambda t: hcb.id_tap(tap, t, delivery=delivery)
  out = (jax.jit(f) if jit else f)(tree)
  assert _same(out, tree)
  if failure is None:
    hostcall.barrier()
  else:
    with pytest.raises(hcb.CallbackException):
      hostcall.barrier()
  assert len(got) == 1 and _same(got[0], tree)


def calls_return_or_explain(tree, failure, flavour):
  def host(*args):
    if failure is not None:
      raise failure()
    return args[0]

  spec = jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)
  staged = {
      "pure_callback": lambda t: hostcall.pure_callback(host, spec, t),
      "io_callback": lambda t: hostcall.io_callback(host, spec, t),
      "call": lambda t: hcb.call(host, t, result_shape=spec),
  }[flavour]
  # A pure callback with nothing to return is never called (XLA removes
  # it, as any pure computation of an empty or unused result).
  hypothesis.assume(flavour != "pure_callback" or any(
      a.size for a in jax.tree_util.tree_leaves(tree)))
  try:
    with hostcall.original_errors():
      out = jax.jit(staged)(tree)
  except Exception as exc:  # noqa: BLE001 - judged below
    assert failure is not None, f"{type(exc).__name__}: {exc}"
    assert isinstance(exc, (type(failure()), hostcall.HostFunctionError)), (
        type(exc))
    return
  assert failure is None
  assert _same(out, tree)


def rows_are_written_or_explained(names, tree, delivery, tmp_root):
  run = metrics.Run("fuzz", root=tmp_root, writers=["jsonl", "memory"])
  leaves = jax.tree_util.tree_leaves(tree)
  values = {name: leaves[i % len(leaves)] if leaves else 0.0
            for i, name in enumerate(names)}
  with hostcall.delivery(delivery):
    jax.jit(lambda: run.log(3, **values))()
  try:
    rows = run.records()
  finally:
    run.close()
  assert len(rows) == 1 and rows[0]["step"] == 3
  assert set(rows[0]) == {"step", *names}
  on_disk = metrics.read(run.dir).to_dict("records")
  assert len(on_disk) == 1 and set(on_disk[0]) >= {"step"}


FAILURES = st.sampled_from(EXCEPTIONS)


def _tests(examples):
  s = _settings(examples)
  return (
      s(hypothesis.given(trees, FAILURES, st.sampled_from(["sync", "async"]),
                         st.booleans())(taps_deliver_or_explain)),
      s(hypothesis.given(trees, FAILURES, st.sampled_from(
          ["pure_callback", "io_callback", "call"]))(
              calls_return_or_explain)),
  )


test_taps_deliver_or_explain, test_calls_return_or_explain = _tests(EXAMPLES)
_heavy = _tests(20 * EXAMPLES)
test_taps_at_length = pytest.mark.heavy(_heavy[0])
test_calls_at_length = pytest.mark.heavy(_heavy[1])


@_settings(EXAMPLES)
@hypothesis.given(st.lists(st.text(max_size=12), min_size=1, max_size=4,
                           unique=True), trees,
                  st.sampled_from(["sync", "async"]))
def test_rows_are_written_or_explained(tmp_path_factory, names, tree,
                                       delivery):
  rows_are_written_or_explained(names, tree, delivery,
                                tmp_path_factory.mktemp("runs"))

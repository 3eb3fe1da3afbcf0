"""Property tests: random pytrees of every dtype, rank and zero-size shape go
through tap (sync and async) and call bit-exactly, under jit and vmap."""

import os
import subprocess
import sys
import textwrap

import hypothesis.extra.numpy as hnp
import jax
import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import hostcall
from hostcall import host_callback as hcb

DTYPES_32 = [np.bool_, np.int8, np.int16, np.int32, np.uint8, np.uint16,
             np.uint32, np.float16, ml_dtypes.bfloat16, np.float32,
             np.complex64]

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def arrays(dtypes):
  shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)
  return st.sampled_from(dtypes).flatmap(
      lambda dt: hnp.arrays(np.dtype(dt), shapes, elements=_elements(dt)))


def _elements(dt):
  if np.dtype(dt) == np.dtype(ml_dtypes.bfloat16):
    return st.floats(-100, 100, width=16).map(lambda v: ml_dtypes.bfloat16(v))
  if np.issubdtype(np.dtype(dt), np.floating):
    return st.floats(allow_nan=False, width=np.dtype(dt).itemsize * 8)
  return None


def pytrees(dtypes):
  leaf = arrays(dtypes)
  return st.recursive(
      leaf, lambda children: st.one_of(
          st.lists(children, max_size=3).map(tuple),
          st.dictionaries(st.sampled_from("abc"), children, max_size=3)),
      max_leaves=5)


def _same(a, b):
  a, b = np.asarray(a), np.asarray(b)
  return (a.dtype == b.dtype and a.shape == b.shape
          and a.tobytes() == b.tobytes())


def _check_tree(got, expected):
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(
      expected)
  for g, e in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(expected)):
    assert _same(g, e), (g, e)


@SETTINGS
@given(tree=pytrees(DTYPES_32), delivery=st.sampled_from(["sync", "async"]))
def test_tap_round_trip_under_jit(tree, delivery):
  seen = []
  out = jax.jit(lambda t: hcb.id_tap(lambda v, tr: seen.append(v), t,
                                     delivery=delivery))(tree)
  hostcall.barrier()
  _check_tree(seen[0], tree)
  _check_tree(out, tree)


@SETTINGS
@given(tree=pytrees(DTYPES_32))
def test_call_round_trip_under_jit(tree):
  shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape,
                                                                 a.dtype), tree)
  out = jax.jit(lambda t: hcb.call(lambda v: v, t, result_shape=shapes))(tree)
  _check_tree(out, tree)


@SETTINGS
@given(batch=arrays(DTYPES_32).filter(lambda a: a.ndim >= 1 and a.shape[0]),
       delivery=st.sampled_from(["sync", "async"]))
def test_tap_and_pure_call_round_trip_under_vmap(batch, delivery):
  seen = []
  jax.vmap(lambda v: hcb.id_tap(lambda a, tr: seen.append(a), v,
                                delivery=delivery))(batch)
  hostcall.barrier()
  assert _same(seen[0], batch)
  out = jax.vmap(lambda v: hostcall.pure_callback(
      lambda a: a, jax.ShapeDtypeStruct(v.shape, v.dtype), v,
      vmap_method="sequential"))(batch)
  assert _same(out, batch)


def test_64_bit_dtypes_round_trip_with_x64(tmp_path):
  script = tmp_path / "x64.py"
  script.write_text(textwrap.dedent("""
      import jax, numpy as np, hostcall
      from hostcall import host_callback as hcb
      values = {str(np.dtype(d)): np.arange(6, dtype=d).reshape(2, 3) * 3
                for d in (np.int64, np.uint64, np.float64, np.complex128)}
      values["empty"] = np.zeros((0, 2), np.float64)
      for delivery in ("sync", "async"):
        seen = []
        out = jax.jit(lambda t: hcb.id_tap(lambda v, tr: seen.append(v), t,
                                           delivery=delivery))(values)
        hostcall.barrier()
        for k, v in values.items():
          assert seen[0][k].dtype == v.dtype and seen[0][k].tobytes() == \\
              v.tobytes(), k
          assert np.asarray(out[k]).tobytes() == v.tobytes(), k
      shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype)
                for k, v in values.items()}
      back = jax.jit(lambda t: hcb.call(lambda v: v, t, result_shape=shapes))(
          values)
      assert all(np.asarray(back[k]).tobytes() == v.tobytes()
                 for k, v in values.items())
      print("ok")
  """))
  env = dict(os.environ, JAX_ENABLE_X64="1")
  proc = subprocess.run([sys.executable, str(script)], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr

"""Programs run side by side against the legacy module and hostcall.

Each ``prog_<name>(hcb, jax, jnp, np, lax)`` exercises one behaviour that the
removed ``jax.experimental.host_callback`` test-suite (jax-v0.4.34,
tests/host_callback_test.py) specified, rewritten here from scratch. ``hcb``
is either ``jax.experimental.host_callback`` (jax 0.4.34, legacy outfeed
implementation) or ``hostcall.host_callback``. A program returns a
JSON-serialisable dict: results as nested lists with their dtypes and
shapes, the host calls recorded by its tap functions (values, pytree
structure, leaf kinds, transforms, device), printed output, and the errors it
provoked on purpose (type and whether key words appear in the message).

Only APIs present in both jax 0.4.34 and jax 0.10.x are used. Programs with
``DEVICES = 4`` need four CPU devices; the runner runs them in a separate
process.

Nothing here may depend on hostcall: the legacy side imports this module in
a virtual environment where hostcall is not installed.
"""

from __future__ import annotations

import contextlib
import functools
import io
import time

import numpy as _np

# ---------------------------------------------------------------------------
# Encoding helpers
# ---------------------------------------------------------------------------


def _float0():
  import jax
  return jax.dtypes.float0


def _is_float0(a) -> bool:
  return getattr(a, "dtype", None) == _float0()


def enc(x):
  """Values as nested lists (tuples and lists alike; see ``tree``)."""
  if x is None:
    return None
  if isinstance(x, dict):
    return {str(k): enc(v) for k, v in sorted(x.items())}
  if isinstance(x, (tuple, list)):
    return [enc(v) for v in x]
  if isinstance(x, str):
    return x
  if _is_float0(x):
    return "float0" + str(list(_np.shape(x)))
  a = _np.asarray(x)
  if a.dtype.kind == "V":  # e.g. an opaque key array
    return f"opaque{list(a.shape)}"
  if a.dtype.name == "bfloat16" or a.dtype == _np.float16:
    a = a.astype(_np.float32)
  if a.dtype.kind == "c":
    return {"re": a.real.tolist(), "im": a.imag.tolist()}
  return a.tolist()


def _type_name(x) -> str:
  """The Python type of a pytree node as the host received it; arrays and
  scalars by kind (the leaf dtypes are recorded separately)."""
  if isinstance(x, _np.ndarray):
    return "ndarray"
  if isinstance(x, _np.generic):
    return "np-scalar"
  return type(x).__name__


def tree(x) -> str:
  """The pytree structure, distinguishing tuples, lists, dicts and None."""
  if x is None:
    return "None"
  if isinstance(x, tuple):
    return "(" + ",".join(tree(v) for v in x) + ")"
  if isinstance(x, list):
    return "[" + ",".join(tree(v) for v in x) + "]"
  if isinstance(x, dict):
    return "{" + ",".join(f"{k}:{tree(v)}" for k, v in sorted(x.items())) + "}"
  return "*"


def _leaves(x):
  if x is None:
    return []
  if isinstance(x, dict):
    return [l for _, v in sorted(x.items()) for l in _leaves(v)]
  if isinstance(x, (tuple, list)):
    return [l for v in x for l in _leaves(v)]
  return [x]


def sig(x, kind=True) -> str:
  """dtype and shape of a leaf; with ``kind``, what Python type it has."""
  if _is_float0(x):
    dt = "float0"
  else:
    try:
      dt = str(_np.asarray(x).dtype)
    except Exception:  # pragma: no cover - exotic leaves
      dt = "?"
  shape = list(_np.shape(x)) if dt != "?" else []
  prefix = ""
  if kind:
    if isinstance(x, _np.ndarray):
      prefix = ""
    elif isinstance(x, _np.generic):
      prefix = "np."
    elif isinstance(x, (bool, int, float, complex)):
      prefix = "py."
    else:
      prefix = type(x).__name__ + "."
  return f"{prefix}{dt}{shape}"


def out(x) -> dict:
  """A result returned by JAX: values, structure and dtypes/shapes."""
  return {"value": enc(x), "tree": tree(x),
          "dtypes": [sig(l, kind=False) for l in _leaves(x)]}


def _enc_transforms(transforms):
  res = []
  for t in transforms:
    name, params = t
    res.append([name, {k: enc(v) for k, v in sorted(dict(params).items())}])
  return res


class Rec:
  """A tap function recording what the host received, in order."""

  def __init__(self):
    self.calls = []

  def record(self, arg, transforms, device=None, label=None):
    c = {"arg": enc(arg), "tree": tree(arg), "type": _type_name(arg),
         "leaves": [sig(l) for l in _leaves(arg)],
         "transforms": _enc_transforms(transforms),
         "device": None if device is None else str(device)}
    if label is not None:
      c["label"] = label
    self.calls.append(c)

  def tap(self, arg, transforms, device=None):
    self.record(arg, transforms, device)

  def labelled(self, label):
    def tap(arg, transforms, device=None):
      self.record(arg, transforms, device, label)
    return tap


def catch(jax, fn, *keywords):
  """Runs ``fn()``; its result, or its error's type and which key words the
  message holds (case-insensitive)."""
  try:
    v = fn()
    v = jax.block_until_ready(v)
    return {"ok": out(v)}
  except Exception as e:  # noqa: BLE001
    msg = str(e).lower()
    return {"error": type(e).__name__,
            "keywords": {k: k.lower() in msg for k in keywords}}


def barrier(hcb, *keywords):
  """``barrier_wait()``: ``"ok"`` or the error's type and key words."""
  try:
    hcb.barrier_wait()
    return "ok"
  except Exception as e:  # noqa: BLE001
    msg = str(e).lower()
    return {"error": type(e).__name__,
            "keywords": {k: k.lower() in msg for k in keywords}}


def isolated(fn):
  """Marks a program whose ``call`` fails on purpose: the legacy runner runs
  it in a process of its own, since after one failed ``call`` the legacy CPU
  outfeed runtime keeps a stale infeed buffer and aborts the process at the
  next ``call``."""
  fn.ISOLATE = True
  return fn


def _pr(hcb, stream, arg, **kw):
  return hcb.id_print(arg, output_stream=stream, **kw)


# ---------------------------------------------------------------------------
# id_print / id_tap basics
# ---------------------------------------------------------------------------


def _twice_then_thrice(hcb, s, a):
  y = hcb.id_print(a * 2., what="a * 2", output_stream=s)
  y = hcb.id_print(y * 3., what="y * 3", output_stream=s, result=y)
  return y ** 2


def prog_print_eager(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = _twice_then_thrice(hcb, s, 5.)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_print_tuple(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(x):
    a, b = _pr(hcb, s, (x * 2., x * 3.))
    return a + b
  r = f(3.)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_print_dict(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(x):
    d = _pr(hcb, s, {"b": x * 3., "a": x * 2.})
    return d["a"] - d["b"]
  r = f(3.)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_print_with_result(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.jit(lambda x: _pr(hcb, s, (x * 2., x * 3.), result=x * 4.))(3.)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_tap_none_with_result(hcb, jax, jnp, np, lax):
  rec = Rec()
  r1 = hcb.id_tap(rec.tap, None, result=3.)
  r2 = jax.jit(lambda x: hcb.id_tap(rec.tap, None, result=x + 1.))(3.)
  hcb.barrier_wait()
  return {"r1": out(r1), "r2": out(r2), "calls": rec.calls}


def prog_tap_result_unused(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    hcb.id_tap(rec.tap, None)
    hcb.id_tap(rec.tap, x * 2)
    return x
  r1 = f(3.)
  r2 = jax.jit(f)(4.)
  hcb.barrier_wait()
  return {"r1": out(r1), "r2": out(r2), "calls": rec.calls}


def prog_print_empty(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  rec = Rec()
  _pr(hcb, s, ())
  _pr(hcb, s, (1., np.ones((2, 0), np.float32)), what="second")
  r = jax.jit(lambda x: hcb.id_tap(rec.tap, (x, jnp.zeros((0, 3)))))(2.)
  hcb.barrier_wait()
  return {"printed": s.getvalue(), "calls": rec.calls, "result": out(r)}


def prog_jit_simple(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.jit(lambda x: 3. * _pr(hcb, s, 2. * x, what="here"))(5.)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_jit_no_invars(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.jit(lambda: _pr(hcb, s, 42))()
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_jit_two_invars(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.jit(lambda a, b: _pr(hcb, s, a + b))(40, 2)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_jit_constant_arg(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.jit(lambda x: _pr(hcb, s, 42, result=x))(5)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_jit_sequence_twice(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(x):
    a = _pr(hcb, s, x, where="first")
    return _pr(hcb, s, a + 1, where="second")
  g = jax.jit(f)
  r = [g(1), g(10)]
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_jit_results_unused(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(x):
    _pr(hcb, s, x, where="a")
    _pr(hcb, s, x + 1, where="b")
    return x * 7
  g = jax.jit(f)
  r = [g(1), g(10)]
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_jit_nested(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(x):
    a = _pr(hcb, s, x, where="outer1")
    b = jax.jit(lambda y: _pr(hcb, s, y + 1, where="inner"))(a)
    return _pr(hcb, s, b + 1, where="outer2")
  r = jax.jit(f)(1)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def _pytrees(x, which):
  if which == "one_and_x":
    return (1, x)
  if which == "x_and_2x":
    return (x, 2 * x)
  return {"p": 2 * x, "q": [3 * x, (x,)]}


def prog_tap_pytrees_eager(hcb, jax, jnp, np, lax):
  rec = Rec()
  res = []
  for which in ("one_and_x", "x_and_2x", "dict"):
    res.append(out(hcb.id_tap(rec.labelled(which), _pytrees(5, which),
                              result=_pytrees(10, which))))
  hcb.barrier_wait()
  return {"results": res, "calls": rec.calls}


def prog_tap_pytrees_jit(hcb, jax, jnp, np, lax):
  rec = Rec()
  res = []
  for which in ("one_and_x", "x_and_2x", "dict"):
    f = jax.jit(lambda x, which=which: hcb.id_tap(
        rec.labelled(which), _pytrees(x, which), result=_pytrees(x * 2, which)))
    res.append(out(f(5)))
  hcb.barrier_wait()
  return {"results": res, "calls": rec.calls}


def prog_tap_identity_values(hcb, jax, jnp, np, lax):
  """id_tap returns its argument: ints, bools, pytrees, eager and jit."""
  rec = Rec()
  arg = {"i": np.arange(3, dtype=np.int32), "b": np.array([True, False]),
         "f": (np.float32(1.5), [np.ones((2, 2), np.float32)])}
  r1 = hcb.id_tap(rec.tap, arg)
  r2 = jax.jit(lambda a: hcb.id_tap(rec.tap, a))(arg)
  r3 = hcb.id_tap(rec.tap, 3)
  hcb.barrier_wait()
  return {"r1": out(r1), "r2": out(r2), "r3": out(r3), "calls": rec.calls}


def _cond_prog(hcb, lax, s, x):
  a = _pr(hcb, s, x, where="1")
  b = _pr(hcb, s, a + 1, where="2")
  c = lax.cond(b % 2 == 0,
               lambda v: _pr(hcb, s, v, where="cond_t"),
               lambda v: _pr(hcb, s, -1, where="cond_f", result=v),
               b + 1)
  return _pr(hcb, s, c + 1, where="end")


def prog_cond_eager(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = _cond_prog(hcb, lax, s, 1)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_cond_jit(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  f = jax.jit(lambda x: _cond_prog(hcb, lax, s, x))
  r = [f(1), f(2)]
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_switch_jit(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(i, x):
    return lax.switch(i, [
        lambda v: hcb.id_tap(rec.labelled("b0"), v),
        lambda v: hcb.id_tap(rec.labelled("b1"), v * 10),
        lambda v: hcb.id_tap(rec.labelled("b2"), (v, -v))[1],
    ], x)
  g = jax.jit(f)
  r = [g(0, 1.), g(1, 2.), g(2, 3.), g(7, 4.)]
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def _while_cond_prog(hcb, lax, s, x):
  a = _pr(hcb, s, x, where="1")
  b = _pr(hcb, s, a + 1, where="2")
  def body(v):
    w = _pr(hcb, s, v, where="w_b_1")
    u = lax.cond(w % 2 == 0,
                 lambda t: _pr(hcb, s, t, where="w_b_t"),
                 lambda t: _pr(hcb, s, -1, where="w_b_f", result=t),
                 w + 1)
    return _pr(hcb, s, u, where="w_b_2")
  c = lax.while_loop(lambda v: v <= 3, body, b)
  return _pr(hcb, s, c, where="end")


def prog_while_cond_eager(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = _while_cond_prog(hcb, lax, s, 1)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_while_cond_jit(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.jit(lambda x: _while_cond_prog(hcb, lax, s, x))(1)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_while_pred_tap_jit(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(x):
    return _pr(hcb, s, lax.while_loop(
        lambda v: _pr(hcb, s, v < 3, where="pred"),
        lambda v: _pr(hcb, s, v + 1, where="body"), x), where="after")
  r = jax.jit(f)(1)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_while_captured_const_eager(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  y = jnp.ones(5)
  def f(x):
    return lax.while_loop(
        lambda c: c[1] < 5,
        lambda c: (y, _pr(hcb, s, c[1]) + 1), (x, 1))
  r = f(y)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def _scan_cond_prog(hcb, jnp, lax, s, x):
  a = _pr(hcb, s, x, where="1")
  b = _pr(hcb, s, a + 1, where="2")
  def body(c, v):
    w = _pr(hcb, s, v, where="s_1")
    u = lax.cond(v % 2 == 0,
                 lambda t: _pr(hcb, s, t, where="s_t"),
                 lambda t: _pr(hcb, s, -1, where="s_f", result=t),
                 w + 1)
    return c, _pr(hcb, s, u, where="s_2")
  _, ys = lax.scan(body, b, jnp.arange(3))
  return _pr(hcb, s, ys, where="10")


def prog_scan_cond_eager(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = _scan_cond_prog(hcb, jnp, lax, s, 1)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_scan_cond_jit(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.jit(lambda x: _scan_cond_prog(hcb, jnp, lax, s, x))(1)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_fori_loop_jit(hcb, jax, jnp, np, lax):
  rec = Rec()
  def body(i, acc):
    i2, acc2 = hcb.id_tap(rec.tap, (i, acc))
    return acc2 * 2 + i2
  r = jax.jit(lambda x: lax.fori_loop(0, 4, body, x))(1)
  r2 = jax.jit(lambda n, x: lax.fori_loop(0, n, body, x))(3, 2)
  hcb.barrier_wait()
  return {"result": out((r, r2)), "calls": rec.calls}


def prog_named_call_scan(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def run(init, do_print):
    @functools.partial(jax.named_call, name="step")
    def step(acc, i):
      if do_print:
        _pr(hcb, s, i, what="step_nr")
      return acc + i, None
    return lax.scan(step, init, np.arange(2))
  a = run(3, False)
  b = run(3, True)
  hcb.barrier_wait()
  return {"plain": out(a), "tapped": out(b), "printed": s.getvalue()}


def prog_dtypes_jit(hcb, jax, jnp, np, lax):
  rec = Rec()
  res = []
  for dt in ("int8", "int16", "int32", "uint8", "uint32", "float16",
             "bfloat16", "float32"):
    for shape in ((), (2,), (2, 3)):
      x = jnp.arange(int(np.prod(shape)), dtype=dt).reshape(shape)
      r = jax.jit(lambda xs: hcb.id_tap(rec.labelled(f"{dt}{shape}"), xs))(
          [x, x])
      res.append(out(r))
  hcb.barrier_wait()
  return {"results": res, "calls": rec.calls}


def prog_bool_jit(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.jit(lambda b: hcb.id_tap(rec.tap, b))(np.array([True, False, True]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_print_large(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  rec = Rec()
  arg = jnp.arange(10000, dtype=jnp.int32).reshape((10, 10, 5, -1))
  jax.jit(lambda a: _pr(hcb, s, a))(arg)
  def tap(a, transforms):
    rec.record({"shape": list(a.shape), "sum": int(a.sum())}, transforms)
  jax.jit(lambda a: hcb.id_tap(tap, a))(arg)
  hcb.barrier_wait()
  return {"printed": s.getvalue(), "calls": rec.calls}


def prog_print_threshold(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  jax.jit(lambda a: _pr(hcb, s, a, threshold=5, what="thr"))(
      jnp.arange(20.))
  jax.jit(lambda a: _pr(hcb, s, a * 2, threshold=100))(jnp.arange(20))
  hcb.barrier_wait()
  return {"printed": s.getvalue()}


def prog_print_nested_structures(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(x):
    return _pr(hcb, s, {"z": (x, [x + 1, {"k": x * 2}]), "a": [(), x - 1]},
               what="nested", zeta="last", alpha=1)
  r = jax.jit(f)(jnp.arange(3.))
  _pr(hcb, s, [np.int32(3), (np.float32(2.5),)])
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_print_stdout(hcb, jax, jnp, np, lax):
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    jax.jit(lambda x: hcb.id_print(x * 2, what="to stdout"))(np.arange(3))
    hcb.barrier_wait()
  return {"printed": buf.getvalue()}


def prog_several_together(hcb, jax, jnp, np, lax):
  rec = Rec()
  arg = jnp.arange(50, dtype=jnp.int32).reshape((10, 5))
  r = jax.jit(lambda x, y: hcb.id_tap(rec.tap, (x, y, x * 2)))(
      arg, jnp.ones(100, dtype=jnp.int32))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_interleaving(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    for i in range(4):
      x = hcb.id_tap(rec.tap, [x + j for j in range(3)])[-1] + i
    return x
  g = jax.jit(f)
  total = 0
  for k in range(5):
    total = total + g(jnp.int32(k))
  hcb.barrier_wait()
  return {"result": out(total), "calls": rec.calls}


def prog_barrier_waits_for_slow_taps(hcb, jax, jnp, np, lax):
  seen = []
  def slow(a, transforms):
    time.sleep(0.02)
    seen.append(a.tolist())
  def f(x):
    for i in range(1, 4):
      x = hcb.id_tap(slow, x * i)
    return x
  r = jax.jit(f)(np.arange(3, dtype=np.float32))
  hcb.barrier_wait()
  first = list(seen)
  jax.jit(f)(np.arange(3, dtype=np.float32) + 1)
  hcb.barrier_wait()
  return {"result": out(r), "after_first": first, "after_second": seen}


def prog_barrier_nothing_pending(hcb, jax, jnp, np, lax):
  return {"first": barrier(hcb), "second": barrier(hcb)}


def prog_tap_removed_kwargs(hcb, jax, jnp, np, lax):
  def tap(x, transforms, y):
    pass
  return {"eager": catch(jax, lambda: hcb.id_tap(tap, 1, y=2), "kwargs"),
          "jit": catch(jax, lambda: jax.jit(
              lambda x: hcb.id_tap(tap, x, y=2))(1), "kwargs")}


def prog_tap_with_transform_kwarg(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = catch(jax, lambda: jax.jit(
      lambda x: hcb.id_tap(rec.tap, x, tap_with_transform=True))(1.),
      "kwargs")
  hcb.barrier_wait()
  return {"result": r, "calls": rec.calls}


def prog_tap_typed_key_as_result(hcb, jax, jnp, np, lax):
  rec = Rec()
  def tap(a, transforms):
    rec.record(None, transforms)
  k = jax.random.key(123)
  r = jax.jit(lambda key: hcb.id_tap(tap, None, result=key))(k)
  same = bool(np.all(np.asarray(jax.random.key_data(r))
                     == np.asarray(jax.random.key_data(k))))
  hcb.barrier_wait()
  return {"same_key": same, "calls": rec.calls}


def prog_tap_typed_key_as_arg(hcb, jax, jnp, np, lax):
  rec = Rec()
  def tap(a, transforms):
    rec.record(None, transforms)
  k = jax.random.key(123)
  r = catch(jax, lambda: jax.random.key_data(
      jax.jit(lambda key: hcb.id_tap(tap, key, result=key))(k)))
  hcb.barrier_wait()
  return {"result": r, "calls": rec.calls}


# ---------------------------------------------------------------------------
# Differentiation
# ---------------------------------------------------------------------------


def prog_jvp_print(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  p, t = jax.jvp(lambda a: _twice_then_thrice(hcb, s, a),
                 (jnp.float32(5.),), (jnp.float32(0.1),))
  hcb.barrier_wait()
  return {"primal": out(p), "tangent": out(t), "printed": s.getvalue()}


def prog_jvp_tap_pytree(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x, y):
    a, b = hcb.id_tap(rec.tap, (x * 2., {"y": y}))
    return a * b["y"]
  r = jax.jit(lambda x, y, tx, ty: jax.jvp(f, (x, y), (tx, ty)))(
      2., 3., 1., 0.5)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_grad_primal_unused(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  g = jax.grad(lambda x: 2. * _pr(hcb, s, x * 3., what="x * 3"))
  jax.make_jaxpr(g)(jnp.float32(5.))
  hcb.barrier_wait()
  after_jaxpr = s.getvalue()
  r = g(jnp.float32(5.))
  hcb.barrier_wait()
  return {"result": out(r), "after_make_jaxpr": after_jaxpr,
          "printed": s.getvalue()}


def prog_grad_simple(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(x):
    y = _pr(hcb, s, x * 2., what="x * 2")
    return x * _pr(hcb, s, y * 3., what="y * 3")
  r = jax.grad(f)(jnp.float32(5.))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_grad_jit(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    y = hcb.id_tap(rec.labelled("y"), jnp.sin(x))
    return jnp.sum(hcb.id_tap(rec.labelled("z"), y * x))
  r = jax.jit(jax.grad(f))(jnp.array([0., 1., 2.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_grad_of_grad(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(x):
    y = _pr(hcb, s, x * 2., what="x * 2")
    return x * (y * 3.)
  gg = jax.grad(jax.grad(f))
  jax.make_jaxpr(gg)(5.)
  hcb.barrier_wait()
  after_jaxpr = s.getvalue()
  r = gg(jnp.float32(5.))
  hcb.barrier_wait()
  return {"result": out(r), "after_make_jaxpr": after_jaxpr,
          "printed": s.getvalue()}


def prog_grad_pytree_result(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(x):
    a, b = _pr(hcb, s, (x * 2., x * 3.), what="pair",
               result=(x * 4., x * 5.))
    return a + 2. * b
  r = jax.grad(f)(jnp.float32(5.))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_jvp_float0(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x, k):
    x, k = hcb.id_tap(rec.tap, (x, k))
    return x * k
  r = jax.jvp(f, (2., 3), (0.2, np.zeros((), jax.dtypes.float0)))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_grad_int_arg(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(x, k):
    x, k = _pr(hcb, s, (x, k), what="pair")
    return x * k.astype(x.dtype)
  r = jax.grad(f)(jnp.float32(5.), jnp.int32(2))
  r2 = jax.grad(f, argnums=(0, 1), allow_int=True)(jnp.float32(5.),
                                                   jnp.int32(2))
  hcb.barrier_wait()
  return {"result": out(r), "both": out(r2), "printed": s.getvalue()}


def _make_ct(jax, np, r):
  if getattr(r, "dtype", None) == jax.dtypes.float0:
    return r
  if np.issubdtype(np.result_type(r), np.floating):
    return np.ones(np.shape(r), np.result_type(r))
  return np.zeros(np.shape(r), jax.dtypes.float0)


def prog_vjp_float0_result(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  x = (np.array([.7, .8], np.float32), np.array([11, 12, 13], np.int32))
  def f(x):
    x = _pr(hcb, s, x, result=x)
    return (3. * x[0], x[1])
  _, pull = jax.vjp(f, x)
  g, = pull((np.ones(2, np.float32), np.zeros(3, jax.dtypes.float0)))
  hcb.barrier_wait()
  return {"result": out(g), "printed": s.getvalue()}


def prog_vjp_higher_order_float0(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  x = (np.array([.7, .8], np.float32), np.array([11, 12, 13], np.int32))
  def f(x):
    x = _pr(hcb, s, x, result=x)
    return (jnp.sin(x[0]), x[1])
  def lift(fun, args, res):
    cts = jax.tree.map(functools.partial(_make_ct, jax, np), res)
    def fun_vjp(args, cts):
      _, pull = jax.vjp(fun, *args)
      return pull(cts)
    return fun_vjp, (args, cts)
  r0 = f(x)
  hcb.barrier_wait()
  p0 = s.getvalue()
  f1, a1 = lift(f, (x,), r0)
  r1 = f1(*a1)
  hcb.barrier_wait()
  p1 = s.getvalue()
  f2, a2 = lift(f1, a1, r1)
  r2 = f2(*a2)
  hcb.barrier_wait()
  return {"r0": out(r0), "r1": out(r1), "r2": out(r2), "printed0": p0,
          "printed1": p1, "printed2": s.getvalue()}


def _tap_tangent(hcb, jax, tap):
  """An identity whose JVP taps the tangent (and uses the tapped value)."""
  @jax.custom_jvp
  def ident(x):
    return x
  @ident.defjvp
  def ident_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return x, hcb.id_tap(tap, t)
  return ident


def prog_custom_jvp_tangent_tap_jvp(hcb, jax, jnp, np, lax):
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  r = jax.jvp(lambda x: ident(x * x) * 2., (3.,), (0.5,))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_custom_jvp_tangent_tap_grad(hcb, jax, jnp, np, lax):
  """Under grad the tap of a tangent is transposed: it taps the cotangent."""
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  r = jax.grad(lambda x: ident(x * x) * 2.)(3.)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_custom_jvp_tangent_tap_grad_jit(hcb, jax, jnp, np, lax):
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  r = jax.jit(jax.grad(lambda x: jnp.sum(ident(x * x) * 2.)))(
      jnp.array([1., 2.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_custom_jvp_tangent_tap_vmap_grad(hcb, jax, jnp, np, lax):
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  r = jax.vmap(jax.grad(lambda x: ident(x * x) * 2.))(jnp.array([1., 2.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_doc_custom_jvp_print_tangents(hcb, jax, jnp, np, lax):
  """A tap of the tangents whose result is not used, under jvp."""
  s = io.StringIO()
  @jax.custom_jvp
  def show_tangents(arg):
    return arg
  @show_tangents.defjvp
  def show_tangents_jvp(primals, tangents):
    _pr(hcb, s, tangents[0], what="tangents")
    return primals[0], tangents[0]
  def power3(x):
    y = x * x
    _pr(hcb, s, (x, y), what="x,x^2")
    show_tangents((x, y))
    return y * x
  r = jax.jvp(power3, (3.,), (0.1,))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def _power3(hcb, s):
  def power3(x):
    y = x * x
    _pr(hcb, s, (x, y), what="x,x^2")
    return y * x
  return power3


def _power3_with_cotangents(hcb, jax, s):
  @jax.custom_vjp
  def show_ct(arg):
    return arg
  def fwd(arg):
    return show_ct(arg), None
  def bwd(_, ct):
    _pr(hcb, s, ct, what="cotangents")
    return ct,
  show_ct.defvjp(fwd, bwd)
  def power3c(x):
    y = x * x
    _pr(hcb, s, (x, y), what="x,x^2")
    x1, y1 = show_ct((x, y))
    return y1 * x1
  return power3c


def prog_doc_power3_eager(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = _power3(hcb, s)(3.)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_doc_power3_jvp(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.jvp(_power3(hcb, s), (3.,), (0.1,))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_doc_power3_grad(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.grad(_power3(hcb, s))(3.)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_doc_power3_grad_cotangents(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.grad(_power3_with_cotangents(hcb, jax, s))(3.)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_doc_power3_vmap(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.vmap(_power3(hcb, s))(np.array([2., 3.], np.float32))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_doc_power3_vmap_grad(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.vmap(jax.grad(_power3(hcb, s)))(np.array([2., 3.], np.float32))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_doc_power3_vmap_grad_cotangents(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.vmap(jax.grad(_power3_with_cotangents(hcb, jax, s)))(
      np.array([2., 3.], np.float32))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_doc_power3_grad_remat(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  p3 = _power3(hcb, s)
  r = jax.grad(lambda x: p3(jax.checkpoint(p3)(x)))(3.)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_remat_fori_loop(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(i, k):
    return k * _pr(hcb, s, k + i)
  r = lax.fori_loop(0, 2, jax.remat(f), 3)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_remat_grad_scan(hcb, jax, jnp, np, lax):
  rec = Rec()
  @jax.checkpoint
  def step(c, x):
    c = hcb.id_tap(rec.tap, c * x)
    return jnp.sin(c), None
  r = jax.grad(lambda c: lax.scan(step, c, jnp.array([1., 2.]))[0])(0.5)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_grad_scan(hcb, jax, jnp, np, lax):
  rec = Rec()
  def step(c, x):
    c = hcb.id_tap(rec.tap, c * x)
    return c, c
  r = jax.jit(jax.grad(lambda c: jnp.sum(lax.scan(
      step, c, jnp.array([1., 2., 3.]))[1])))(0.5)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_grad_fori_loop(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.grad(lambda x: lax.fori_loop(
      0, 3, lambda i, c: hcb.id_tap(rec.tap, c * 2.) + i, x))(1.)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_jvp_while(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.jvp(lambda x: lax.while_loop(
      lambda c: c < 10., lambda c: hcb.id_tap(rec.tap, c * 2.), x),
      (1.,), (1.,))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_odeint_grad(hcb, jax, jnp, np, lax):
  from jax.experimental.ode import odeint
  n = [0]
  def tap(a, transforms):
    n[0] += 1
  def f(x, t, k):
    x = hcb.id_tap(tap, x)
    return -k * x
  def loss(k=1.0):
    return odeint(f, 1.0, jnp.linspace(0, 0.001, num=2), k)[-1]
  r = jax.grad(loss)(1.0)
  hcb.barrier_wait()
  return {"result": {"value": round(float(r), 5)}, "tapped": n[0] > 0}


def prog_rk4_grad(hcb, jax, jnp, np, lax):
  """A fixed-step integrator under jit and grad, tapping every step."""
  rec = Rec()
  def rhs(y, k):
    return -k * y
  def integrate(k, y0, dt=0.1, n=3):
    def step(i, y):
      y = hcb.id_tap(rec.tap, (i, y))[1]
      a = rhs(y, k)
      b = rhs(y + dt / 2 * a, k)
      c = rhs(y + dt / 2 * b, k)
      d = rhs(y + dt * c, k)
      return y + dt / 6 * (a + 2 * b + 2 * c + d)
    return lax.fori_loop(0, n, step, y0)
  v = jax.jit(integrate)(1., 1.)
  g = jax.jit(jax.grad(integrate))(1., 1.)
  hcb.barrier_wait()
  return {"value": out(v), "grad": out(g), "calls": rec.calls}


# ---------------------------------------------------------------------------
# vmap
# ---------------------------------------------------------------------------


def prog_vmap_print(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.vmap(lambda a: _twice_then_thrice(hcb, s, a))(
      jnp.array([4., 5.], jnp.float32))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_vmap_not_batched(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(y):
    _, y = _pr(hcb, s, (3., y))
    return 3. + y
  r = jax.vmap(f)(jnp.array([4., 5.], jnp.float32))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_vmap_vmap_in_axes_none(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  rec = Rec()
  def add(x, y):
    return hcb.id_tap(rec.tap, _pr(hcb, s, x + y))
  rows = lambda xv, y: jax.vmap(add, in_axes=(0, None))(xv, y)
  both = lambda xv, yv: jax.vmap(rows, in_axes=(None, 0))(xv, yv)
  r = both(jnp.arange(5, dtype=jnp.int32), jnp.arange(3, dtype=jnp.int32))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue(), "calls": rec.calls}


def prog_vmap_in_axes_1(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.vmap(lambda c: hcb.id_tap(rec.tap, c) * 2, in_axes=1)(
      jnp.arange(6.).reshape((2, 3)))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_out_axes_1(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.vmap(lambda c: hcb.id_tap(rec.tap, (c, c.sum())), in_axes=0,
               out_axes=(1, 0))(jnp.arange(6.).reshape((2, 3)))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_tap_dict_partly_batched(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x, y):
    return hcb.id_tap(rec.tap, {"x": x, "y": y, "c": 7})["x"]
  r = jax.jit(jax.vmap(f, in_axes=(0, None)))(jnp.arange(3.), 10.)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def _vmap_while_body_prog(hcb, lax, s, x):
  a = _pr(hcb, s, x, where="before:x")
  b = lax.while_loop(lambda v: v < 2,
                     lambda v: _pr(hcb, s, v + 1, where="body:x+1"), a)
  return _pr(hcb, s, b, where="after:x")


def prog_vmap_while_tap_body(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.jit(jax.vmap(lambda x: _vmap_while_body_prog(hcb, lax, s, x)))(
      np.arange(5, dtype=np.int32))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_vmap_while_tap_cond(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  def f(x):
    a = _pr(hcb, s, x, where="1")
    b = lax.while_loop(lambda v: _pr(hcb, s, v < 2, where="w_c"),
                       lambda v: _pr(hcb, s, v + 1, where="w_b"), a)
    return _pr(hcb, s, b, where="3")
  r = jax.jit(jax.vmap(f))(np.arange(5, dtype=np.int32))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_vmap_while_tap_cond_eager(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.vmap(lambda x: lax.while_loop(
      lambda v: hcb.id_tap(rec.tap, v < 2), lambda v: v + 1, x))(
          np.arange(5))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_while_unbatched_pred(hcb, jax, jnp, np, lax):
  """A batched carry with an unbatched predicate (a counter)."""
  rec = Rec()
  def f(x):
    def body(c):
      i, v = c
      return i + 1, hcb.id_tap(rec.tap, v * 2)
    return lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]
  r = jax.vmap(f)(jnp.array([1., 2.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_cond_batched_pred(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    return lax.cond(x > 1,
                    lambda v: hcb.id_tap(rec.labelled("true"), v * 10),
                    lambda v: hcb.id_tap(rec.labelled("false"), -v), x)
  r = jax.jit(jax.vmap(f))(jnp.arange(4))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_cond_unbatched_pred(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(p, x):
    return lax.cond(p, lambda v: hcb.id_tap(rec.labelled("true"), v * 10),
                    lambda v: hcb.id_tap(rec.labelled("false"), -v), x)
  r = jax.vmap(f, in_axes=(None, 0))(True, jnp.arange(3))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_scan(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    def step(c, i):
      c = hcb.id_tap(rec.tap, (i, c + x))[1]
      return c, c
    return lax.scan(step, 0., jnp.arange(2.))
  r = jax.vmap(f)(jnp.array([1., 10., 100.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_of_jvp(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    return hcb.id_tap(rec.tap, jnp.sin(x))
  r = jax.vmap(lambda x, t: jax.jvp(f, (x,), (t,)))(
      jnp.array([0., 1.]), jnp.array([1., 1.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_jvp_of_vmap(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    return hcb.id_tap(rec.tap, x * 3.)
  r = jax.jvp(jax.vmap(f), (jnp.array([1., 2.]),), (jnp.array([1., 0.]),))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_grad_jit(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    return hcb.id_tap(rec.tap, x * x) * x
  r = jax.jit(jax.vmap(jax.grad(f)))(jnp.array([1., 2., 3.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_tap_with_device(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.vmap(lambda x: hcb.id_tap(rec.tap, x, tap_with_device=True))(
      jnp.arange(3))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


# ---------------------------------------------------------------------------
# Devices
# ---------------------------------------------------------------------------


def prog_tap_with_device(hcb, jax, jnp, np, lax):
  rec = Rec()
  s = io.StringIO()
  r = jax.jit(lambda x: hcb.id_tap(rec.tap, x * 2, tap_with_device=True))(3)
  r2 = hcb.id_tap(rec.tap, 4., tap_with_device=True)
  jax.jit(lambda x: _pr(hcb, s, x, tap_with_device=True, what="dev"))(5)
  hcb.barrier_wait()
  return {"result": out((r, r2)), "calls": rec.calls, "printed": s.getvalue()}


def prog_call_with_device(hcb, jax, jnp, np, lax):
  seen = []
  def host(x, device=None):
    seen.append(str(device))
    return x * 2
  r = jax.jit(lambda x: hcb.call(host, x, result_shape=x,
                                 call_with_device=True))(np.arange(3))
  hcb.barrier_wait()
  return {"result": out(r), "devices": seen}


# ---------------------------------------------------------------------------
# Errors in taps
# ---------------------------------------------------------------------------


def prog_tap_exception_jit(hcb, jax, jnp, np, lax):
  rec = Rec()
  def bad(a, transforms):
    raise ValueError("tap boom")
  def f(x):
    x = hcb.id_tap(bad, x)
    return hcb.id_tap(rec.tap, x + 1)
  r = catch(jax, lambda: jax.jit(f)(1.))
  b1 = barrier(hcb, "tap boom", "ValueError")
  b2 = barrier(hcb)
  return {"result": r, "barrier1": b1, "barrier2": b2, "calls": rec.calls}


def prog_tap_exception_eager(hcb, jax, jnp, np, lax):
  def bad(a, transforms):
    raise ValueError("eager boom")
  r = catch(jax, lambda: hcb.id_tap(bad, 3.) * 2)
  return {"result": r, "barrier1": barrier(hcb, "eager boom"),
          "barrier2": barrier(hcb)}


def prog_tap_exception_in_loop_later_taps_run(hcb, jax, jnp, np, lax):
  rec = Rec()
  def maybe_bad(a, transforms):
    if int(a) % 2:
      raise RuntimeError(f"odd {int(a)}")
  def body(i, c):
    hcb.id_tap(maybe_bad, i)
    return hcb.id_tap(rec.tap, c + i)
  r = catch(jax, lambda: jax.jit(lambda x: lax.fori_loop(0, 4, body, x))(0))
  return {"result": r, "barrier1": barrier(hcb, "odd 3", "odd 1"),
          "barrier2": barrier(hcb), "calls": rec.calls}


def prog_tap_exception_then_ok_computation(hcb, jax, jnp, np, lax):
  rec = Rec()
  def bad(a, transforms):
    raise KeyError("bad key")
  r1 = catch(jax, lambda: jax.jit(lambda x: hcb.id_tap(bad, x))(1))
  r2 = catch(jax, lambda: jax.jit(lambda x: hcb.id_tap(rec.tap, x + 1))(1))
  return {"r1": r1, "r2": r2, "barrier1": barrier(hcb, "bad key"),
          "calls": rec.calls}


# ---------------------------------------------------------------------------
# call
# ---------------------------------------------------------------------------


def prog_call_simple(hcb, jax, jnp, np, lax):
  seen = []
  def host(x):
    seen.append(sig(x))
    return 2 * x
  def f(x):
    return 3 * (1 + hcb.call(host, x + 1, result_shape=x))
  arg = np.arange(24, dtype=np.int32).reshape((2, 3, 4))
  r1 = f(arg)
  r2 = jax.jit(f)(arg)
  hcb.barrier_wait()
  return {"r1": out(r1), "r2": out(r2), "host_args": seen}


@isolated
def prog_call_types(hcb, jax, jnp, np, lax):
  res = {}
  for dt in ("int8", "int16", "int32", "uint8", "uint32", "float16",
             "bfloat16", "float32"):
    arg = np.arange(6).astype(jnp.dtype(dt)).reshape((2, 3))
    res[dt] = catch(jax, lambda: jax.jit(
        lambda x: hcb.call(lambda v: v + v, x + x, result_shape=x))(arg))
  arg = np.array([[True, False, True]])
  res["bool"] = catch(jax, lambda: jax.jit(
      lambda x: hcb.call(np.invert, x, result_shape=x))(arg))
  hcb.barrier_wait()
  return res


@isolated
def prog_call_float64_result_x32(hcb, jax, jnp, np, lax):
  """x64 disabled: result_shape float64 means float32; the host returns
  float64."""
  arg = np.arange(3, dtype=np.float64)
  r = catch(jax, lambda: jax.jit(lambda x: hcb.call(
      lambda v: np.asarray(v, np.float64) * 2, x, result_shape=arg))(arg),
      "float64", "float32")
  return {"result": r, "barrier": barrier(hcb)}


def prog_call_tuples(hcb, jax, jnp, np, lax):
  def swap(args):
    a, b = args
    return b, a
  def f(x):
    p = hcb.call(swap, (x, x + 1), result_shape=(x, x))
    return 2 * p[0] + 3 * p[1]
  r = jax.jit(f)(np.arange(6, dtype=np.int32))
  hcb.barrier_wait()
  return {"result": out(r)}


@isolated
def prog_call_tuple_two_params(hcb, jax, jnp, np, lax):
  """A host function of two parameters given a tuple argument."""
  def host(a, b):
    return a * b
  r = catch(jax, lambda: jax.jit(lambda x: hcb.call(
      host, (x, x + 1), result_shape=x))(np.float32(3.)))
  return {"result": r, "barrier": barrier(hcb, "positional")}


def prog_call_dict_result(hcb, jax, jnp, np, lax):
  def host(x):
    return {"double": x * 2, "neg": -x, "first": x[:1]}
  shape = {"double": jax.ShapeDtypeStruct((3,), np.float32),
           "neg": jax.ShapeDtypeStruct((3,), np.float32),
           "first": jax.ShapeDtypeStruct((1,), np.float32)}
  r = jax.jit(lambda x: hcb.call(host, x, result_shape=shape))(
      np.arange(3, dtype=np.float32))
  hcb.barrier_wait()
  return {"result": out(r)}


def prog_call_scalar_result_shape(hcb, jax, jnp, np, lax):
  seen = []
  def host(x):
    seen.append(sig(x))
    return np.float32(x) + 1
  r1 = jax.jit(lambda x: hcb.call(host, x, result_shape=1.))(2.)
  r2 = jax.jit(lambda x: hcb.call(lambda v: np.int32(7), x,
                                  result_shape=0))(2.)
  r3 = jax.jit(lambda x: hcb.call(
      host, x, result_shape=np.float32(0.)))(3.)
  hcb.barrier_wait()
  return {"r1": out(r1), "r2": out(r2), "r3": out(r3), "host_args": seen}


def prog_call_no_arg(hcb, jax, jnp, np, lax):
  seen = []
  val = np.ones((2,), np.float32)
  def host(arg):
    seen.append(tree(arg))
    return val
  r = jax.jit(lambda x: x + hcb.call(
      host, (), result_shape=jax.ShapeDtypeStruct((2,), np.float32)))(2.)
  hcb.barrier_wait()
  return {"result": out(r), "host_args": seen}


def prog_call_empty_arg(hcb, jax, jnp, np, lax):
  seen = []
  def host(x):
    seen.append(sig(x))
    return np.full((2,), 3., np.float32)
  empty = np.ones((2, 0), np.float32)
  r = (lambda x: x + hcb.call(
      host, empty, result_shape=jax.ShapeDtypeStruct((2,), np.float32)))(2.)
  def host2(t):
    seen.append([sig(l) for l in t])
    return t[1]
  r2 = jax.jit(lambda x: x + hcb.call(
      host2, (empty, np.full((2,), 3., np.float32)),
      result_shape=jax.ShapeDtypeStruct((2,), np.float32)))(2.)
  hcb.barrier_wait()
  return {"r1": out(r), "r2": out(r2), "host_args": seen}


def prog_call_empty_results(hcb, jax, jnp, np, lax):
  def host1(_):
    return np.ones((2, 0), np.float32)
  def host2(_):
    return (np.ones((2, 0), np.float32), np.ones((1,), np.float32),
            np.ones((0,), np.float32))
  r1 = jax.jit(lambda x: x + hcb.call(
      host1, 1., result_shape=jax.ShapeDtypeStruct((2, 0), np.float32)))(2.)
  def g(x):
    a, b, c = hcb.call(host2, 1., result_shape=(
        jax.ShapeDtypeStruct((2, 0), np.float32),
        jax.ShapeDtypeStruct((1,), np.float32),
        jax.ShapeDtypeStruct((0,), np.float32)))
    return a, x + b, c
  r2 = jax.jit(g)(2.)
  def host3(_):
    return (np.ones((2, 0), np.float32), np.ones((2, 0), np.float32))
  r3 = jax.jit(lambda x: x + sum(hcb.call(host3, 1., result_shape=(
      jax.ShapeDtypeStruct((2, 0), np.float32),) * 2)))(2.)
  hcb.barrier_wait()
  return {"r1": out(r1), "r2": out(r2), "r3": out(r3)}


@isolated
def prog_call_no_result(hcb, jax, jnp, np, lax):
  seen = []
  def host(arg):
    seen.append(enc(arg))
  r = hcb.call(host, (3., 4.), result_shape=None)
  b1 = barrier(hcb)
  r2 = catch(jax, lambda: jax.jit(
      lambda x: hcb.call(host, x, result_shape=()))(5.), "pytree")
  b2 = barrier(hcb, "pytree")
  return {"r1": out(r), "barrier1": b1, "r2": r2, "barrier2": b2,
          "host_args": seen}


def prog_call_in_cond_loop(hcb, jax, jnp, np, lax):
  def host(args):
    x, i = args
    return x * i.astype(np.float32)
  def loop(x, outside):
    def body(i, acc):
      return lax.cond(i % 2 == 1,
                      lambda _: (hcb.call(host, (acc, i), result_shape=acc)
                                 if outside else acc * i.astype(np.float32)),
                      lambda _: acc, None)
    return lax.fori_loop(0, 8, body, x)
  want = loop(np.float32(1.2), False)
  got = jax.jit(lambda x: loop(x, True))(np.float32(1.2))
  hcb.barrier_wait()
  return {"want": out(want), "got": out(got)}


def prog_call_in_scan(hcb, jax, jnp, np, lax):
  seen = []
  def host(i):
    seen.append(int(i))
    return i
  def body(c, i):
    return c + hcb.call(host, i, result_shape=i), None
  r = jax.jit(lambda x: lax.scan(body, 0, x))(np.arange(5, dtype=np.int32))
  hcb.barrier_wait()
  return {"result": out(r), "host_order": seen}


def prog_call_eigvalsh(hcb, jax, jnp, np, lax):
  m = np.stack([np.eye(3, dtype=np.float32) * (k + 1) for k in range(2)])
  f = lambda a: hcb.call(np.linalg.eigvalsh, a, result_shape=jax.ShapeDtypeStruct(
      a.shape[:-1], a.dtype))
  r = jax.jit(f)(m)
  hcb.barrier_wait()
  return {"result": out(r)}


def prog_call_vmap(hcb, jax, jnp, np, lax):
  f = lambda x: hcb.call(lambda v: v, x, result_shape=x)
  return {"result": catch(jax, lambda: jax.vmap(f)(np.ones((2, 3), np.float32)),
                          "batching", "call"),
          "barrier": barrier(hcb)}


def prog_call_grad(hcb, jax, jnp, np, lax):
  f = lambda x: hcb.call(lambda v: v * 2, x, result_shape=x)
  return {"grad": catch(jax, lambda: jax.grad(f)(3.), "call"),
          "jvp": catch(jax, lambda: jax.jvp(f, (3.,), (1.,)), "call"),
          "barrier": barrier(hcb)}


def prog_call_bad_result_shape_arg(hcb, jax, jnp, np, lax):
  kws = ("result_shape", "shape", "dtype")
  return {
      "string": catch(jax, lambda: hcb.call(lambda x: x, 3.,
                                            result_shape="string"), *kws),
      "lambda": catch(jax, lambda: hcb.call(lambda x: x, 3.,
                                            result_shape=lambda x: x), *kws),
      "barrier": barrier(hcb)}


def _call_failure(hcb, jax, np, host, shape, *kws):
  arg = np.ones(2, np.float32)
  r = catch(jax, lambda: jax.jit(lambda x: hcb.call(
      host, x, result_shape=shape))(arg), *kws)
  return {"result": r, "barrier": barrier(hcb, *kws)}


@isolated
def prog_call_wrong_shape(hcb, jax, jnp, np, lax):
  return _call_failure(hcb, jax, np, lambda v: np.ones((3,), np.float32),
                       jax.ShapeDtypeStruct((2,), np.float32), "shape")


@isolated
def prog_call_wrong_dtype(hcb, jax, jnp, np, lax):
  return _call_failure(hcb, jax, np, lambda v: np.ones((2,), np.int32),
                       jax.ShapeDtypeStruct((2,), np.float32), "int32")


@isolated
def prog_call_wrong_structure(hcb, jax, jnp, np, lax):
  return _call_failure(hcb, jax, np, lambda v: (v, v),
                       jax.ShapeDtypeStruct((2,), np.float32), "pytree")


@isolated
def prog_call_raises(hcb, jax, jnp, np, lax):
  def host(v):
    raise ValueError("call boom")
  return _call_failure(hcb, jax, np, host,
                       jax.ShapeDtypeStruct((2,), np.float32), "call boom")


@isolated
def prog_call_raises_eager(hcb, jax, jnp, np, lax):
  def host(v):
    raise ValueError("eager call boom")
  r = catch(jax, lambda: hcb.call(host, np.ones(2, np.float32),
                                  result_shape=np.ones(2, np.float32)),
            "eager call boom")
  return {"result": r, "barrier": barrier(hcb, "eager call boom")}


@isolated
def prog_call_result_shape_dtypes_kwarg(hcb, jax, jnp, np, lax):
  r = catch(jax, lambda: jax.jit(lambda x: hcb.call(
      lambda v: v, x, result_shape_dtypes=x))(1.), "result_shape_dtypes")
  return {"result": r, "barrier": barrier(hcb)}


# ---------------------------------------------------------------------------
# More combinations
# ---------------------------------------------------------------------------


def prog_api_surface(hcb, jax, jnp, np, lax):
  names = ("id_tap", "id_print", "call", "barrier_wait",
           "stop_outfeed_receiver", "CallbackException",
           "TapFunctionException", "CallbackFlavor")
  return {"has": {n: hasattr(hcb, n) for n in names},
          "alias": hcb.TapFunctionException is hcb.CallbackException,
          "exception_base": issubclass(hcb.CallbackException, Exception),
          "flavors": sorted(f.name for f in hcb.CallbackFlavor)}


def prog_callback_flavor_accepted(hcb, jax, jnp, np, lax):
  rec = Rec()
  s = io.StringIO()
  r = jax.jit(lambda x: hcb.id_tap(
      rec.tap, x, callback_flavor=hcb.CallbackFlavor.DEBUG) + _pr(
          hcb, s, x, callback_flavor=hcb.CallbackFlavor.IO_CALLBACK))(2.)
  r2 = jax.jit(lambda x: hcb.call(
      lambda v: v * 3, x, result_shape=x,
      callback_flavor=hcb.CallbackFlavor.IO_CALLBACK))(2.)
  hcb.barrier_wait("named barrier")
  return {"result": out((r, r2)), "calls": rec.calls, "printed": s.getvalue()}


def prog_print_python_scalars_eager(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  _pr(hcb, s, 3.)
  _pr(hcb, s, 7)
  _pr(hcb, s, True)
  _pr(hcb, s, (np.float32(1.25), np.int32(-2)), what="np scalars")
  hcb.barrier_wait()
  return {"printed": s.getvalue()}


def prog_print_bool_int_arrays(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  jax.jit(lambda x: _pr(hcb, s, (x > 1, x, x.astype(jnp.uint8),
                                 x.astype(jnp.float16))))(jnp.arange(4))
  hcb.barrier_wait()
  return {"printed": s.getvalue()}


def prog_doc_custom_jvp_print_tangents_grad(hcb, jax, jnp, np, lax):
  """A tap of the tangents whose result is unused, under grad."""
  s = io.StringIO()
  @jax.custom_jvp
  def show_tangents(arg):
    return arg
  @show_tangents.defjvp
  def show_tangents_jvp(primals, tangents):
    _pr(hcb, s, tangents[0], what="tangents")
    return primals[0], tangents[0]
  def power3(x):
    y = x * x
    _pr(hcb, s, (x, y), what="x,x^2")
    show_tangents((x, y))
    return y * x
  r = jax.grad(power3)(3.)
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_custom_jvp_tangent_tap_vjp_twice(hcb, jax, jnp, np, lax):
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  p, pull = jax.vjp(lambda x: ident(x * 3.), 2.)
  a = pull(1.)
  b = pull(10.)
  hcb.barrier_wait()
  return {"primal": out(p), "a": out(a), "b": out(b), "calls": rec.calls}


def prog_custom_jvp_tangent_tap_grad_of_vmap(hcb, jax, jnp, np, lax):
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  r = jax.grad(lambda xs: jnp.sum(jax.vmap(lambda x: ident(x * x))(xs) *
                                  jnp.array([1., 2., 3.])))(
      jnp.array([1., 2., 3.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_custom_jvp_tangent_tap_jacrev(hcb, jax, jnp, np, lax):
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  r = jax.jacrev(lambda x: ident(x * 2.))(jnp.array([1., 2.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_custom_jvp_tangent_tap_jacfwd(hcb, jax, jnp, np, lax):
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  r = jax.jacfwd(lambda x: ident(x * 2.))(jnp.array([1., 2.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_custom_jvp_tangent_tap_zero_tangent(hcb, jax, jnp, np, lax):
  """jvp with respect to the other argument: the tapped tangent is zero."""
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  r = jax.jvp(lambda x, y: ident(x) + y, (2., 3.), (0., 1.))
  r2 = jax.grad(lambda x, y: ident(x) * 0. + y, argnums=1)(2., 3.)
  hcb.barrier_wait()
  return {"result": out((r, r2)), "calls": rec.calls}


def prog_custom_jvp_tangent_tap_in_scan_grad(hcb, jax, jnp, np, lax):
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  def step(c, x):
    c = ident(c * x)
    return c, None
  r = jax.grad(lambda c: lax.scan(step, c, jnp.array([2., 3.]))[0])(1.)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_linear_transpose_tap(hcb, jax, jnp, np, lax):
  rec = Rec()
  f = lambda x: hcb.id_tap(rec.tap, x * 2.)
  t = jax.linear_transpose(f, 1.)
  r = t(5.)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_jacrev_primal_tap(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.jacrev(lambda x: hcb.id_tap(rec.tap, x * x))(jnp.array([1., 2.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_jacfwd_primal_tap(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.jacfwd(lambda x: hcb.id_tap(rec.tap, x * x))(jnp.array([1., 2.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_hessian_tap(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.hessian(lambda x: jnp.sum(hcb.id_tap(rec.tap, x ** 3)))(
      jnp.array([1., 2.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_unbatched_tap(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.vmap(lambda x: hcb.id_tap(rec.tap, 3.) + x)(jnp.arange(3.))
  r2 = jax.vmap(lambda x: hcb.id_tap(rec.tap, 4., result=x * 2))(
      jnp.arange(2.))
  hcb.barrier_wait()
  return {"result": out((r, r2)), "calls": rec.calls}


def prog_vmap_eager_op_by_op(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  r = jax.vmap(lambda x: _pr(hcb, s, {"x": x, "sq": x * x}, what="eager"))(
      jnp.arange(3))
  hcb.barrier_wait()
  return {"result": out(r), "printed": s.getvalue()}


def prog_vmap_switch_batched_index(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(i, x):
    return lax.switch(i, [lambda v: hcb.id_tap(rec.labelled("b0"), v + 100),
                          lambda v: hcb.id_tap(rec.labelled("b1"), v - 100)],
                      x)
  r = jax.vmap(f)(jnp.array([0, 1, 1]), jnp.array([1, 2, 3]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_while_pred_pytree_tap(hcb, jax, jnp, np, lax):
  """A batched while whose predicate taps a pytree, part of it unbatched."""
  rec = Rec()
  def f(x, limit):
    def cond(c):
      i, v = c
      i, v, l = hcb.id_tap(rec.labelled("cond"), (i, v, limit))
      return v < l
    def body(c):
      i, v = c
      return i + 1, hcb.id_tap(rec.labelled("body"), v * 2)
    return lax.while_loop(cond, body, (0, x))
  r = jax.jit(jax.vmap(f, in_axes=(0, None)))(jnp.array([1, 3, 9]), 8)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_while_unbatched_pred_tap_in_cond(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    def cond(c):
      return hcb.id_tap(rec.labelled("cond"), c[0]) < 2
    def body(c):
      return c[0] + 1, hcb.id_tap(rec.labelled("body"), c[1] + c[0])
    return lax.while_loop(cond, body, (0, x))[1]
  r = jax.vmap(f)(jnp.array([10, 20]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_while_tap_cond_eager_with_body(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.vmap(lambda x: lax.while_loop(
      lambda v: hcb.id_tap(rec.labelled("c"), v < 3),
      lambda v: hcb.id_tap(rec.labelled("b"), v + 1), x))(np.array([0, 4, 1]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_vmap_grad_scan_cond(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    def step(c, i):
      c = lax.cond(i % 2 == 0, lambda v: hcb.id_tap(rec.labelled("even"), v),
                   lambda v: hcb.id_tap(rec.labelled("odd"), v * 2.), c * x)
      return c, None
    return lax.scan(step, 1., jnp.arange(3))[0]
  r = jax.jit(jax.vmap(jax.grad(f)))(jnp.array([1., 2.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_grad_cond(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    return lax.cond(x > 0, lambda v: hcb.id_tap(rec.labelled("pos"), v * v),
                    lambda v: hcb.id_tap(rec.labelled("neg"), -v), x)
  r = [jax.grad(f)(3.), jax.grad(f)(-2.)]
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_jvp_while_tap_in_cond(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.jvp(lambda x: lax.while_loop(
      lambda c: hcb.id_tap(rec.labelled("c"), c) < 5.,
      lambda c: c * 2., x), (1.,), (1.,))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_scan_reverse_and_map(hcb, jax, jnp, np, lax):
  rec = Rec()
  r1 = jax.jit(lambda xs: lax.scan(
      lambda c, x: (c + hcb.id_tap(rec.labelled("rev"), x), c), 0, xs,
      reverse=True))(jnp.arange(3))
  r2 = jax.jit(lambda xs: lax.map(
      lambda x: hcb.id_tap(rec.labelled("map"), x * 2), xs))(jnp.arange(3))
  hcb.barrier_wait()
  return {"result": out((r1, r2)), "calls": rec.calls}


def prog_grad_nested_jit_scan(hcb, jax, jnp, np, lax):
  """jit(scan(jit)) under grad, as odeint builds it."""
  rec = Rec()
  inner = jax.jit(lambda c: hcb.id_tap(rec.tap, c) * 0.5)
  f = jax.jit(lambda c: lax.scan(lambda c, _: (inner(c) + c, None), c,
                                 None, length=2)[0])
  r = jax.grad(f)(1.)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_remat_vmap(hcb, jax, jnp, np, lax):
  rec = Rec()
  g = jax.checkpoint(lambda x: jnp.sin(hcb.id_tap(rec.tap, x * 2.)))
  r = jax.vmap(jax.grad(g))(jnp.array([0., 1.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_tap_exception_under_vmap_grad(hcb, jax, jnp, np, lax):
  def bad(a, transforms):
    raise ZeroDivisionError(f"bad {len(transforms)}")
  r = catch(jax, lambda: jax.vmap(jax.grad(
      lambda x: hcb.id_tap(bad, x * x)))(jnp.arange(2.)))
  return {"result": r, "barrier1": barrier(hcb, "ZeroDivisionError", "bad 1"),
          "barrier2": barrier(hcb)}


def prog_call_result_list_and_python_values(hcb, jax, jnp, np, lax):
  f32 = jax.ShapeDtypeStruct((), np.float32)
  r1 = catch(jax, lambda: jax.jit(lambda x: hcb.call(
      lambda v: [v, v * 2], x, result_shape=[f32, f32]))(1.))
  r2 = catch(jax, lambda: jax.jit(lambda x: hcb.call(
      lambda v: 3.0, x, result_shape=f32))(1.))
  r3 = catch(jax, lambda: jax.jit(lambda x: hcb.call(
      lambda v: np.int64(5), x, result_shape=jax.ShapeDtypeStruct(
          (), np.int32)))(1.))
  r4 = catch(jax, lambda: jax.jit(lambda x: hcb.call(
      lambda v: v, x, result_shape=jnp.zeros((), jnp.float32)))(1.))
  return {"list": r1, "python_float": r2, "int64": r3, "array_shape": r4,
          "barrier": barrier(hcb)}


@isolated
def prog_call_result_list_for_tuple(hcb, jax, jnp, np, lax):
  f32 = jax.ShapeDtypeStruct((), np.float32)
  r = catch(jax, lambda: jax.jit(lambda x: hcb.call(
      lambda v: [v, v], x, result_shape=(f32, f32)))(1.), "pytree")
  return {"result": r, "barrier": barrier(hcb, "pytree")}


@isolated
def prog_call_weak_python_result_for_int(hcb, jax, jnp, np, lax):
  r = catch(jax, lambda: jax.jit(lambda x: hcb.call(
      lambda v: 2.5, x, result_shape=jax.ShapeDtypeStruct((), np.int32)))(1),
      "int32", "float32")
  return {"result": r, "barrier": barrier(hcb, "int32", "float32")}


def prog_call_vmap_in_jit(hcb, jax, jnp, np, lax):
  f = lambda x: hcb.call(lambda v: v, x, result_shape=x)
  return {"result": catch(jax, lambda: jax.jit(jax.vmap(f))(
      np.ones((2,), np.float32)), "batching", "call")}


def prog_call_custom_vjp_grad(hcb, jax, jnp, np, lax):
  """A call made differentiable by custom_vjp, the backward pass a call."""
  seen = []
  def host_sin(x):
    seen.append(("sin", x.tolist()))
    return np.sin(x)
  def host_cos_ct(args):
    x, ct = args
    seen.append(("cos_ct", x.tolist()))
    return np.cos(x) * ct
  @jax.custom_vjp
  def hsin(x):
    return hcb.call(host_sin, x, result_shape=x)
  def fwd(x):
    return hsin(x), x
  def bwd(x, ct):
    return (hcb.call(host_cos_ct, (x, ct), result_shape=x),)
  hsin.defvjp(fwd, bwd)
  v = jax.jit(hsin)(np.float32(1.))
  g = jax.jit(jax.grad(lambda x: 2. * hsin(x)))(np.float32(1.))
  gv = jax.vmap(jax.grad(lambda x: hsin(x)))
  gv_res = catch(jax, lambda: gv(np.array([0., 1.], np.float32)),
                 "batching", "call")
  hcb.barrier_wait()
  return {"value": out(v), "grad": out(g), "vmap_grad": gv_res,
          "host": seen}


def prog_linearize_primal_tap(hcb, jax, jnp, np, lax):
  rec = Rec()
  p, f_jvp = jax.linearize(lambda x: hcb.id_tap(rec.tap, x * x) * 2., 3.)
  n_after_linearize = len(rec.calls)
  t1, t2 = f_jvp(1.), f_jvp(2.)
  hcb.barrier_wait()
  return {"result": out((p, t1, t2)), "after_linearize": n_after_linearize,
          "calls": rec.calls}


def prog_custom_jvp_tangent_tap_linearize(hcb, jax, jnp, np, lax):
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  p, f_jvp = jax.linearize(lambda x: ident(x * x), 3.)
  hcb.barrier_wait()
  n_after_linearize = len(rec.calls)
  t1, t2 = f_jvp(1.), f_jvp(2.)
  hcb.barrier_wait()
  return {"result": out((p, t1, t2)), "after_linearize": n_after_linearize,
          "calls": rec.calls}


def prog_custom_jvp_tangent_tap_grad_of_grad(hcb, jax, jnp, np, lax):
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  r = jax.grad(jax.grad(lambda x: ident(x * x * x)))(2.)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_custom_jvp_tangent_tap_pullback_jit(hcb, jax, jnp, np, lax):
  rec = Rec()
  ident = _tap_tangent(hcb, jax, rec.tap)
  def grad_via_vjp(x, ct):
    _, pull = jax.vjp(lambda v: ident(jnp.sin(v)), x)
    return pull(ct)[0]
  r = jax.jit(grad_via_vjp)(jnp.array([0., 1.]), jnp.array([1., 2.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_custom_vjp_bwd_tap_jit_vmap(hcb, jax, jnp, np, lax):
  rec = Rec()
  @jax.custom_vjp
  def f(x):
    return jnp.sin(x)
  def fwd(x):
    hcb.id_tap(rec.labelled("fwd"), x)
    return jnp.sin(x), jnp.cos(x)
  def bwd(c, ct):
    return (hcb.id_tap(rec.labelled("bwd"), (c, ct))[1] * c,)
  f.defvjp(fwd, bwd)
  r = jax.jit(jax.vmap(jax.grad(f)))(jnp.array([0., 1.]))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_tap_namedtuple_and_int_keys(hcb, jax, jnp, np, lax):
  import collections
  Point = collections.namedtuple("Point", ["x", "y"])
  rec = Rec()
  s = io.StringIO()
  def f(v):
    p = hcb.id_tap(rec.tap, Point(v, v * 2))
    d = _pr(hcb, s, {2: v, 1: p.y}, what="int keys")
    return p.x + d[1]
  r = jax.jit(f)(1.)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls, "printed": s.getvalue()}


def prog_tap_many_leaves(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.jit(lambda x: sum(hcb.id_tap(rec.tap, [x + i for i in range(40)])))(
      jnp.float32(1.))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_tap_eager_list_arg(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = hcb.id_tap(rec.tap, [1, 2.5, np.arange(2)])
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_tap_bad_arguments(hcb, jax, jnp, np, lax):
  return {
      "not_callable": catch(jax, lambda: hcb.id_tap(42, 1.), "callable"),
      "string_arg": catch(jax, lambda: hcb.id_tap(lambda a, t: None, "s"),
                          "str"),
      "call_not_callable": catch(jax, lambda: hcb.call(
          "f", 1., result_shape=1.), "callable"),
      "barrier": barrier(hcb)}


def prog_print_stream_without_write(hcb, jax, jnp, np, lax):
  r = catch(jax, lambda: jax.jit(lambda x: hcb.id_print(
      x, output_stream=object()))(1.))
  return {"result": r, "barrier1": barrier(hcb, "write"),
          "barrier2": barrier(hcb)}


def prog_print_vmap_with_device(hcb, jax, jnp, np, lax):
  s = io.StringIO()
  jax.vmap(lambda x: _pr(hcb, s, x, tap_with_device=True, what="w",
                         extra=(1, 2)))(jnp.arange(2))
  hcb.barrier_wait()
  return {"printed": s.getvalue()}


def prog_device_index_single_device(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.jit(lambda x: hcb.id_tap(rec.tap, x, device_index=0,
                                   tap_with_device=True))(1.)
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


def prog_jit_donated_arg(hcb, jax, jnp, np, lax):
  rec = Rec()
  f = jax.jit(lambda x: hcb.id_tap(rec.tap, x * 2) + 1, donate_argnums=0)
  r = f(jnp.arange(3.))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


# ---------------------------------------------------------------------------
# Four CPU devices (run in a separate process)
# ---------------------------------------------------------------------------


def _by_device(calls):
  return sorted(calls, key=lambda c: (str(c["device"]), str(c["arg"])))


def prog_pmap_tap_with_device(hcb, jax, jnp, np, lax):
  rec = Rec()
  s = io.StringIO()
  def f(x):
    y = hcb.id_tap(rec.tap, x * 2, tap_with_device=True)
    return _pr(hcb, s, y + 1, tap_with_device=True, what="pm")
  r = jax.pmap(f)(np.arange(8.).reshape((4, 2)))
  hcb.barrier_wait()
  lines = s.getvalue().splitlines()
  pairs = sorted(zip(lines[0::2], lines[1::2]))
  return {"result": out(r), "calls": _by_device(rec.calls),
          "printed_sorted": pairs}


prog_pmap_tap_with_device.DEVICES = 4


def prog_pmap_tap_values(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.pmap(lambda x: hcb.id_tap(rec.tap, {"v": x, "s": x.sum()}))(
      np.arange(12, dtype=np.int32).reshape((4, 3)))
  hcb.barrier_wait()
  return {"result": out(r), "calls": sorted(rec.calls,
                                            key=lambda c: str(c["arg"]))}


prog_pmap_tap_values.DEVICES = 4


def prog_pmap_vmap_tap(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.pmap(jax.vmap(lambda x: hcb.id_tap(rec.tap, x, tap_with_device=True)
                        + 1))(np.arange(8).reshape((4, 2)))
  hcb.barrier_wait()
  return {"result": out(r), "calls": _by_device(rec.calls)}


prog_pmap_vmap_tap.DEVICES = 4


def prog_pmap_while_tap(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    return lax.while_loop(
        lambda c: c < 3,
        lambda c: hcb.id_tap(rec.tap, c + 1, tap_with_device=True), x)
  r = jax.pmap(f)(np.arange(4, dtype=np.int32))
  hcb.barrier_wait()
  return {"result": out(r), "calls": _by_device(rec.calls)}


prog_pmap_while_tap.DEVICES = 4


def prog_pmap_call_with_device(hcb, jax, jnp, np, lax):
  seen = []
  def host(x, device=None):
    seen.append((str(device), x.tolist()))
    return x * 10
  r = jax.pmap(lambda x: hcb.call(host, x, result_shape=x,
                                  call_with_device=True))(
      np.arange(4, dtype=np.int32))
  hcb.barrier_wait()
  return {"result": out(r), "calls": sorted(seen)}


prog_pmap_call_with_device.DEVICES = 4


def prog_pmap_tap_exception(hcb, jax, jnp, np, lax):
  def bad(a, transforms):
    if int(a) == 2:
      raise ValueError("device two")
  r = catch(jax, lambda: jax.pmap(lambda x: hcb.id_tap(bad, x))(
      np.arange(4, dtype=np.int32)))
  return {"result": r, "barrier1": barrier(hcb, "device two"),
          "barrier2": barrier(hcb)}


prog_pmap_tap_exception.DEVICES = 4


def _sharded(jax, np, x):
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
  return jax.device_put(x, jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec("d")))


def prog_jit_sharded_device_index(hcb, jax, jnp, np, lax):
  rec = Rec()
  x = _sharded(jax, np, np.arange(8, dtype=np.float32))
  res = []
  for idx in (0, 2):
    f = jax.jit(lambda v, idx=idx: hcb.id_tap(
        rec.labelled(f"index {idx}"), v * 2, tap_with_device=True,
        device_index=idx) + 1)
    res.append(out(f(x)))
  hcb.barrier_wait()
  return {"results": res, "calls": rec.calls}


prog_jit_sharded_device_index.DEVICES = 4


def prog_jit_replicated_tap_with_device(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.jit(lambda v: hcb.id_tap(rec.tap, v.sum(), tap_with_device=True))(
      np.arange(4.))
  hcb.barrier_wait()
  return {"result": out(r), "calls": rec.calls}


prog_jit_replicated_tap_with_device.DEVICES = 4


def prog_call_jit_on_other_device(hcb, jax, jnp, np, lax):
  """A host function that runs a JAX computation on another device."""
  other = jax.devices()[1]
  def host(x):
    return np.asarray(jax.jit(jnp.sin)(jax.device_put(x, other)))
  f = lambda x: hcb.call(host, x, result_shape=x)
  r = jax.jit(f)(np.float32(3.))
  hcb.barrier_wait()
  return {"result": out(r)}


prog_call_jit_on_other_device.DEVICES = 4


def _call_on(hcb, jax, fun, arg, device):
  """Calls the JAX function ``fun`` on ``device`` through ``call``, with
  reverse-mode differentiation by way of custom_vjp."""
  def run(a):
    return jax.jit(fun)(jax.device_put(a, device))
  @jax.custom_vjp
  def make_call(a):
    return hcb.call(run, a, result_shape=jax.eval_shape(fun, a))
  def fwd(a):
    return make_call(a), a
  def bwd(a, ct):
    def fun_vjp(a_and_ct):
      a, ct = a_and_ct
      _, pull = jax.vjp(fun, a)
      return pull(ct)[0]
    return (_call_on(hcb, jax, fun_vjp, (a, ct), device),)
  make_call.defvjp(fwd, bwd)
  return make_call(arg)


def prog_call_jax_other_device_grad(hcb, jax, jnp, np, lax):
  dev = jax.devices()[1]
  f = lambda x: 2. * _call_on(hcb, jax, jnp.sin, x, dev)
  g = lambda x: 2. * _call_on(hcb, jax, lambda v: v * v * v, x, dev)
  pytree = lambda d: _call_on(
      hcb, jax, lambda d: 3. * jnp.sin(d["a"]) + jnp.sin(d["b"]), d, dev)
  res = {"value": out(f(3.)), "jit_value": out(jax.jit(f)(3.)),
         "grad": out(jax.grad(f)(3.)),
         "grad_of_grad": out(jax.grad(jax.grad(g))(5.)),
         "grad_pytree": out(jax.grad(pytree)({"a": 3., "b": 4.}))}
  hcb.barrier_wait()
  return res


prog_call_jax_other_device_grad.DEVICES = 4


def prog_pmap_grad_tap(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.pmap(jax.grad(lambda x: hcb.id_tap(rec.tap, x * x,
                                             tap_with_device=True) * x))(
      np.arange(4.))
  hcb.barrier_wait()
  return {"result": out(r), "calls": _by_device(rec.calls)}


prog_pmap_grad_tap.DEVICES = 4


def prog_pmap_in_axes_none_tap(hcb, jax, jnp, np, lax):
  rec = Rec()
  r = jax.pmap(lambda x, y: hcb.id_tap(rec.tap, (x, y),
                                       tap_with_device=True)[0] + y,
               in_axes=(0, None))(np.arange(4.), 10.)
  hcb.barrier_wait()
  return {"result": out(r), "calls": _by_device(rec.calls)}


prog_pmap_in_axes_none_tap.DEVICES = 4


def prog_pmap_scan_order_per_device(hcb, jax, jnp, np, lax):
  rec = Rec()
  def f(x):
    return lax.scan(lambda c, i: (hcb.id_tap(rec.tap, c + i,
                                             tap_with_device=True), None),
                    x, jnp.arange(3.))[0]
  r = jax.pmap(f)(np.arange(4.) * 10)
  hcb.barrier_wait()
  per_device = {}
  for c in rec.calls:
    per_device.setdefault(c["device"], []).append(c["arg"])
  return {"result": out(r),
          "per_device_in_order": sorted(per_device.items())}


prog_pmap_scan_order_per_device.DEVICES = 4


def programs(devices: int):
  """The programs for a process with ``devices`` CPU devices, by name."""
  found = {}
  for name, fn in sorted(globals().items()):
    if name.startswith("prog_") and callable(fn):
      if getattr(fn, "DEVICES", 1) == devices:
        found[name[len("prog_"):]] = fn
  return found

"""Probes that fill docs/compatibility.md's table by running each callback.

``python -m tests.compatibility_probes`` prints the table; the test
``tests/test_compatibility_table.py`` fails when docs/compatibility.md
differs from what the probes find, so the table cannot drift from the code.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback as jax_io_callback

import hostcall
from hostcall import host_callback as hcb

CALLS: list = []


def _double(v):
  CALLS.append(1)
  return (np.asarray(v) * 2).astype(np.asarray(v).dtype)


def _effect(*args):
  CALLS.append(1)


_SHAPE = jax.ShapeDtypeStruct((), jnp.float32)


def _double_vjp(primals, ct):
  return (2 * ct,)


# Each row: name -> (returns_value, call). call(x) returns the callback's
# value (for value-returning rows) or None.
ROWS = {
    "jax.pure_callback": (True, lambda x: jax.pure_callback(_double, _SHAPE, x)),
    "hostcall.pure_callback": (
        True, lambda x: hostcall.pure_callback(_double, _SHAPE, x)),
    "hostcall.pure_callback + vmap_method, vjp": (
        True, lambda x: hostcall.pure_callback(
            _double, _SHAPE, x, vmap_method="sequential", vjp=_double_vjp)),
    "jax io_callback": (True, lambda x: jax_io_callback(_double, _SHAPE, x)),
    "jax io_callback ordered": (
        True, lambda x: jax_io_callback(_double, _SHAPE, x, ordered=True)),
    "hostcall.io_callback": (
        True, lambda x: hostcall.io_callback(_double, _SHAPE, x)),
    "hostcall.io_callback ordered": (
        True, lambda x: hostcall.io_callback(_double, _SHAPE, x, ordered=True)),
    "hostcall.io_callback ordered + vmap_method, vjp": (
        True, lambda x: hostcall.io_callback(
            _double, _SHAPE, x, ordered=True, vmap_method="sequential",
            vjp=_double_vjp)),
    "jax.debug.callback": (False, lambda x: jax.debug.callback(_effect, x)),
    "hostcall.debug_callback": (
        False, lambda x: hostcall.debug_callback(_effect, x)),
    "hostcall.host_callback.id_tap": (
        False, lambda x: (hcb.id_tap(_effect, x), None)[1]),
}


def _use(value, x):
  return x * 3.0 if value is None else value * x


def _finish():
  jax.effects_barrier()
  hostcall.barrier()


def _probe_jit(call):
  out = jax.jit(lambda x: _use(call(x), x))(2.0)
  _finish()
  return float(out) in (6.0, 8.0)


def _probe_vmap(call):
  out = jax.vmap(lambda x: _use(call(x), x))(jnp.arange(3.0))
  _finish()
  return np.asarray(out).shape == (3,)


def _probe_grad(call):
  out = jax.grad(lambda x: _use(call(x), x))(2.0)
  _finish()
  return float(out) in (3.0, 8.0)  # 3 (no result) or d(2x * x)/dx = 4x


def _probe_scan(call):
  def step(c, _):
    return c + _use(call(c), 1.0), None
  out = jax.jit(lambda x: lax.scan(step, x, None, length=2)[0])(1.0)
  _finish()
  return np.isfinite(float(out))


def _probe_while(call):
  def body(c):
    return c + _use(call(c), 1.0)
  out = jax.jit(lambda x: lax.while_loop(lambda c: c < 10.0, body, x))(1.0)
  _finish()
  return float(out) >= 10.0


def _probe_vmap_while(call):
  def f(limit):
    def body(c):
      return c + _use(call(c), 1.0)
    return lax.while_loop(lambda c: c < limit, body, 1.0)
  out = jax.vmap(f)(jnp.array([5.0, 20.0]))
  _finish()
  return bool(np.all(np.asarray(out) >= np.array([5.0, 20.0])))


def _probe_vmap_cond(call):
  def f(p, x):
    return lax.cond(p, lambda x: _use(call(x), x), lambda x: x, x)
  out = jax.vmap(f)(jnp.array([True, False]), jnp.array([2.0, 2.0]))
  _finish()
  return float(np.asarray(out)[1]) == 2.0


def _probe_checkpoint_grad(call):
  out = jax.grad(jax.checkpoint(lambda x: _use(call(x), x)))(2.0)
  _finish()
  return float(out) in (3.0, 8.0)


def _probe_unused(call):
  CALLS.clear()
  jax.jit(lambda x: (call(x), x + 1)[1])(2.0)
  _finish()
  return len(CALLS) == 1


COLUMNS = {
    "jit": _probe_jit,
    "vmap": _probe_vmap,
    "grad": _probe_grad,
    "scan": _probe_scan,
    "while_loop": _probe_while,
    "vmap of while (batched predicate)": _probe_vmap_while,
    "vmap of cond (batched predicate)": _probe_vmap_cond,
    "grad of checkpoint": _probe_checkpoint_grad,
    "runs when unused": _probe_unused,
}


def _cell(probe, call) -> str:
  try:
    return "yes" if probe(call) else "no"
  except Exception as exc:  # noqa: BLE001 - the error is the cell's content
    _finish_quietly()
    return f"no: `{type(exc).__name__}`"


def _finish_quietly():
  try:
    _finish()
  except Exception:  # noqa: BLE001
    pass


def table() -> str:
  header = ["callback", "returns a value", *COLUMNS]
  lines = ["| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)]
  for name, (returns, call) in ROWS.items():
    cells = [f"`{name}`", "yes" if returns else "no"]
    cells += [_cell(probe, call) for probe in COLUMNS.values()]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  print(table(), end="")

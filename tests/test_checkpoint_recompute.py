"""A call in a ``custom_vjp`` forward rule under ``grad`` of
``jax.checkpoint`` (issue 52, JAX #21303): docs/compatibility.md's table
says, for each flavour, how often it runs; this test runs each row and
asserts the table's cells, so that the page and the code cannot disagree.

The program is #21303's: ``jax.jit(jax.grad(lambda x: g(x) ** 2))`` where
``g`` is ``f`` (a ``custom_vjp`` whose forward rule makes the call), or
``jax.checkpoint(f)``.
"""

from __future__ import annotations

import contextlib
import io
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import host_callback as hcb

PAGE = pathlib.Path(__file__).parent.parent / "docs" / "compatibility.md"
HEADING = "## A call in a `custom_vjp` forward rule under `checkpoint`"
X = 3.2


def _like(x):
  return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


# The table's first cell: the call the forward rule makes on x, given the
# list the host appends to (printing flavours are counted from stdout), and
# giving back the value the rule goes on with.
SITES = {
    "`jax.debug.print`": lambda seen, run: lambda x: (
        jax.debug.print("fwd {}", x), x)[1],
    "`jax.debug.callback`": lambda seen, run: lambda x: (
        jax.debug.callback(lambda v: seen.append(v), x), x)[1],
    "`hostcall.debug_print`": lambda seen, run: lambda x: (
        hostcall.debug_print("fwd {}", x), x)[1],
    "`hostcall.debug_callback`": lambda seen, run: lambda x: (
        hostcall.debug_callback(lambda v: seen.append(v), x), x)[1],
    "`hostcall.debug_callback(..., ordered=True)`": lambda seen, run: (
        lambda x: (hostcall.debug_callback(lambda v: seen.append(v), x,
                                           ordered=True), x)[1]),
    "`hostcall.host_callback.id_tap`": lambda seen, run: lambda x: hcb.id_tap(
        lambda v, _: seen.append(v), x),
    "`hostcall.host_callback.id_print`": lambda seen, run: lambda x: (
        hcb.id_print(x, what="fwd")),
    "`hostcall.pure_callback`": lambda seen, run: lambda x: (
        hostcall.pure_callback(lambda v: (seen.append(v), v)[1], _like(x), x)),
    "`hostcall.io_callback`": lambda seen, run: lambda x: (
        hostcall.io_callback(lambda v: seen.append(v), None, x), x)[1],
    "`hostcall.io_callback(..., ordered=True)`": lambda seen, run: lambda x: (
        hostcall.io_callback(lambda v: seen.append(v), None, x,
                             ordered=True), x)[1],
    "`hostcall.grad_callback`": lambda seen, run: lambda x: (
        hostcall.grad_callback(lambda *v: seen.append(v), x)),
    "`hostcall.metrics.Run.log`": lambda seen, run: lambda x: (
        run.log(fwd=x), x)[1],
}
COUNTS = {"never": 0, "once": 1, "twice": 2}


def documented_rows() -> dict[str, tuple[str, str]]:
  """The table under ``HEADING``: flavour -> (under grad, under grad of
  checkpoint)."""
  text = PAGE.read_text()
  assert HEADING in text, f"{PAGE} has no section {HEADING!r}"
  section = text[text.index(HEADING):]
  rows = {}
  for line in section.splitlines()[1:]:
    if line.startswith("## "):
      break
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 4 and cells[0] in SITES:
      rows[cells[0]] = (cells[1], cells[2])
  return rows


def observe(flavour: str, checkpointed: bool, tmp_path) -> str:
  """How often the forward rule's call ran: "never", "once", "twice", or
  the refusal "refused: `Error`"."""
  seen, printed = [], io.StringIO()
  run = hostcall.metrics.Run("fwd", root=tmp_path, writers=["memory"],
                             exists="overwrite")
  site = SITES[flavour](seen, run)

  @jax.custom_vjp
  def f(x):
    return jnp.sin(x)

  def f_fwd(x):
    x = site(x)
    return jnp.sin(x), (x,)

  def f_bwd(res, g):
    (x,) = res
    return (jnp.cos(x) * g,)

  f.defvjp(f_fwd, f_bwd)
  g = jax.checkpoint(f) if checkpointed else f
  try:
    with contextlib.redirect_stdout(printed):
      grad = jax.jit(jax.grad(lambda x: g(x) ** 2))(X)
      jax.effects_barrier()
      hostcall.barrier()
  except Exception as exc:  # noqa: BLE001 - the refusal is the observation
    run.close()
    return f"refused: `{type(exc).__name__}`"
  # The gradient is right whatever the calls: d/dx sin(x)^2 = sin(2x).
  np.testing.assert_allclose(grad, np.sin(2 * X), rtol=1e-5)
  rows = [r for r in run.records() if "fwd" in r]
  run.close()
  prints = [line for line in printed.getvalue().splitlines() if "fwd" in line]
  calls = len(seen) + len(rows) + len(prints)
  return {n: word for word, n in COUNTS.items()}[calls]


def test_the_table_has_a_row_for_every_flavour():
  assert sorted(documented_rows()) == sorted(SITES)


@pytest.mark.parametrize("flavour", list(SITES))
def test_each_flavour_runs_as_the_table_says(flavour, tmp_path):
  under_grad, under_checkpoint = documented_rows()[flavour]
  assert observe(flavour, False, tmp_path) == under_grad
  assert observe(flavour, True, tmp_path) == under_checkpoint


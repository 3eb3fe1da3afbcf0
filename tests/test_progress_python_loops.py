"""hostcall.progress.tqdm and trange: bars of Python loops whose postfix takes
JAX arrays still being computed, and the compiled loops' bars under them."""

import io
import re
import threading

import jax
import jax.numpy as jnp
import pytest
import tqdm as tqdm_module

import hostcall
from hostcall import progress
from hostcall._apps.loops import invocations as loops_module
from hostcall._apps.progress import bars as bars_module, tqdm_guard
from tests.helpers import tqdm_postfix


def _screen(text: str) -> list[str]:
  """What a terminal shows after ``text``, tqdm's bars drawn on it (its
  ``\\r``, ``\\n`` and cursor-up moves), as its non-blank lines."""
  lines, row, col = [[]], 0, 0
  for piece in re.split(r"(\r|\n|\x1b\[A)", text):
    if piece == "\r":
      col = 0
    elif piece == "\n":
      row, col = row + 1, 0
    elif piece == "\x1b[A":
      row = max(row - 1, 0)
    else:
      while len(lines) <= row:
        lines.append([])
      line = lines[row]
      line.extend(" " * (col + len(piece) - len(line)))
      line[col:col + len(piece)] = piece
      col += len(piece)
  return [s for s in ("".join(line).rstrip() for line in lines) if s]


@jax.jit
def _step(w):
  """One step of gradient descent on sum(w**2): the new w, and the loss."""
  loss, grad = jax.value_and_grad(lambda w: jnp.sum(w * w))(w)
  return w - 0.1 * grad, loss


def test_a_python_loops_bar_shows_the_last_loss_of_a_jitted_step():
  out = io.StringIO()
  w, losses = jnp.arange(1.0, 4.0), []
  for _ in (bar := progress.trange(10, desc="fit", file=out)):
    w, loss = _step(w)
    bar.set_postfix(loss=loss)
    losses.append(loss)
  last = tqdm_module.tqdm.format_num(float(losses[-1]))
  assert float(losses[-1]) == pytest.approx(14.0 * 0.8 ** 18, rel=1e-5)
  assert _screen(out.getvalue()) == [
      s for s in _screen(out.getvalue()) if s.startswith("fit: 100%")]
  (final,) = _screen(out.getvalue())
  assert "10/10" in final and final.endswith(f"loss={last}]"), final


@jax.jit
def _slow(x, steps):
  """Seconds of computing (thousands of small matmuls) before a number: on
  CPU a computation with a host callback blocks its dispatch, this one
  does not."""
  m = jax.lax.fori_loop(0, steps, lambda i, m: jnp.tanh(m @ m),
                        jnp.full((300, 300), x / 300))
  return jnp.round(m[0, 0] * 0 + x * 2, 2)


def _dispatches_asynchronously() -> bool:
  """Whether a computation returns before it is done here. JAX 0.8
  dispatches every later computation of a process synchronously once a
  host callback in it has raised (JAX's own pure_callback too); 0.9 on
  does not."""
  _slow(1.0, 1).block_until_ready()  # compiled
  probe = _slow(1.0, 3000)
  running = not probe.is_ready()
  probe.block_until_ready()
  return running


def _needs_asynchronous_dispatch():
  if not _dispatches_asynchronously():
    pytest.skip("this process dispatches synchronously (JAX 0.8 after an "
                "earlier test's host callback raised): nothing to wait for")


def test_set_postfix_with_an_array_still_computed_does_not_wait():
  _needs_asynchronous_dispatch()
  out = io.StringIO()
  with progress.tqdm(total=1, desc="slow", file=out, mininterval=0) as bar:
    loss = _slow(1.25, 3000)  # seconds
    assert not loss.is_ready()
    bar.set_postfix({"loss": loss})
    bar.set_description(loss)
    bar.update()
    # Had any of them read the array, it would be ready now.
    assert not loss.is_ready()
  # Drawn before it was ready: "..."; closing waited for it.
  renders = out.getvalue()
  assert "loss=..." in renders
  (final,) = _screen(renders)
  assert final.startswith("2.5: 100%") and final.endswith("loss=2.5]"), final


def test_older_arrays_show_while_the_newest_is_computed():
  _needs_asynchronous_dispatch()
  out = io.StringIO()
  bar = progress.tqdm(total=3, file=out, mininterval=0, desc="lag")
  try:
    ready = jnp.float32(0.5)
    ready.block_until_ready()
    bar.set_postfix(loss=ready)
    newest = _slow(7.0, 3000)
    bar.set_postfix(loss=newest)
    bar.update()
    shown = _screen(out.getvalue())[-1]
    assert not newest.is_ready()
  finally:
    bar.close()  # an open bar would nest every later test's bars
  assert shown.endswith("loss=0.5]"), shown
  assert _screen(out.getvalue())[-1].endswith("loss=14]")


def test_tqdms_api_and_options_pass_through():
  out = io.StringIO()
  with progress.tqdm(total=5, desc="api", unit="batch", file=out,
                     postfix={"lr": 0.01}, mininterval=0) as bar:
    assert isinstance(bar, progress.tqdm)
    assert isinstance(bar, tqdm_module.tqdm)
    bar.update(2)
    bar.set_postfix_str("plain")
    bar.set_description_str("api!")
    bar.update(3)
    progress.tqdm.write("between", file=out)
  (final,) = [s for s in _screen(out.getvalue()) if "5/5" in s]
  assert final.startswith("api!: 100%") and "batch/s, plain]" in final
  assert "between" in out.getvalue()
  assert "lr=0.01" in out.getvalue()
  # disable: nothing drawn, nothing kept; leave=False: erased when done.
  quiet = io.StringIO()
  assert list(progress.tqdm("abc", file=quiet, disable=True)) == list("abc")
  assert quiet.getvalue() == ""
  gone = io.StringIO()
  assert sum(progress.trange(2, 8, 2, file=gone, leave=False)) == 12
  assert _screen(gone.getvalue()) == []
  assert tqdm_guard.loop_rows.rows() == 0


def test_set_postfix_formats_every_type_as_tqdm_does():
  # tqdm's rule: a numbers.Number through format_num (a bool too: 1), a
  # str as it is, anything else through str(); a JAX array shows the
  # number it holds (docs/compatibility.md).
  import decimal
  import numpy as np
  values = dict(flag=True, off=False, n=12345678, x=0.000123456,
                c=1 + 2j, d=decimal.Decimal("2.50"), f32=np.float32(0.5),
                nb=np.bool_(True), none=None, s=" text ", arr=np.arange(3))
  out = io.StringIO()
  with progress.tqdm(total=1, file=out) as bar:
    bar.set_postfix({"first": 1.5}, **values)
    shown = bar.postfix
  assert shown == tqdm_postfix({"first": 1.5}, **values)
  assert shown == ("first=1.5, arr=[0 1 2], c=1+2j, d=2.50, f32=0.5, flag=1, "
                   "n=1.23e+7, nb=True, none=None, off=0, s=text, x=0.000123")
  with progress.tqdm(total=1, file=io.StringIO()) as bar:
    bar.set_postfix(done=jnp.bool_(True), loss=jnp.float32(0.123456))
    bar.refresh()
    assert bar.postfix == tqdm_postfix(done=True, loss=float(
        jnp.float32(0.123456))) == "done=1, loss=0.123"


def test_a_bar_without_file_is_tqdm_autos_a_notebooks_widget_where_it_draws_one(
    monkeypatch):
  # In a notebook tqdm.auto's class draws a widget: the bar is made from
  # the class tqdm_guard.tqdm_class(None) gives, as a compiled loop's is.
  asked = []

  class Auto(tqdm_module.tqdm):
    pass

  def tqdm_class(file):
    asked.append(file)
    return Auto if file is None else tqdm_module.tqdm
  monkeypatch.setattr(tqdm_guard, "tqdm_class", tqdm_class)
  bar = progress.tqdm(range(3), file=None, disable=True)
  assert isinstance(bar, Auto) and isinstance(bar, progress.tqdm)
  assert list(bar) == [0, 1, 2]
  assert asked == [None]


def test_a_compiled_loop_called_from_a_python_loop_nests_under_its_bar():
  # Twenty calls of a jitted function whose progress.scan drew a bar each:
  # twenty finished bars stayed on screen. Under a Python loop's bar they
  # are drawn below it and erased when done; the Python bar stays.
  out = io.StringIO()
  run = jax.jit(lambda x: progress.scan(lambda c, _: (c + 1.0, None), x,
                                        length=30, file=out, desc="inner"))
  x = jnp.float32(0.0)
  for _ in progress.trange(20, desc="outer", file=out):
    x, _ = run(x)
  assert float(x) == 600.0
  screen = _screen(out.getvalue())
  assert len(screen) == 1 and screen[0].startswith("outer: 100%"), screen
  assert "20/20" in screen[0]
  assert "inner:" in out.getvalue()  # drawn live meanwhile
  inner = [s for s in loops_module.invocations._by_site
           if isinstance(s, bars_module.BarSpec) and s.desc == "inner"]
  assert inner and all(s.leave is None for s in inner)
  # Without the Python bar, the top row's bars stay, as tqdm's do.
  alone = io.StringIO()
  run2 = jax.jit(lambda x: progress.scan(lambda c, _: (c + 1.0, None), x,
                                         length=30, file=alone, desc="solo"))
  run2(0.0)
  hostcall.barrier()
  assert [s.split("|")[0] for s in _screen(alone.getvalue())] == [
      "solo: 100%"]


def test_an_explicit_leave_of_a_compiled_loop_is_kept_under_a_python_bar():
  out = io.StringIO()
  with progress.tqdm(total=1, desc="outer", file=out) as bar:
    spec = bars_module.BarSpec(desc="kept", total=3, unit="it", position=0,
                               leave=True, file=out, all_processes=False,
                               options=())
    made = spec.make(3, out)
    assert (abs(made.pos), made.leave) == (1, True)
    made.close()
    default = bars_module.BarSpec(desc="kept", total=3, unit="it",
                                  position=0, leave=None, file=out,
                                  all_processes=False, options=())
    made = default.make(3, out)
    assert (abs(made.pos), made.leave) == (1, False)
    made.close()
    bar.update()
  assert tqdm_guard.loop_rows.rows() == 0

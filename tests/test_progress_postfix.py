"""hostcall.progress.set_postfix: values from a compiled loop's body on its
bar, compared with what real tqdm shows for the same values; and the bar of
a loop of no step, compared with real tqdm's."""

import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import progress
from hostcall._apps.progress import bars as bars_module
from tests.helpers import tqdm_lines, tqdm_postfix


def _renders(out: io.StringIO, desc: str) -> list[str]:
  """Every render of the bar called ``desc``, in order."""
  return [r.strip() for r in re.split(r"[\r\n]", out.getvalue())
          if r.strip().startswith(desc + ":")]


def _postfix(render: str) -> str:
  """A render's postfix: what follows the rate."""
  match = re.search(r"(?:step/s|\?step/s), (.*)\]$", render)
  return match.group(1) if match else ""


def _final(out, desc) -> str:
  return _postfix(_renders(out, desc)[-1])


def _open_bars():
  return [key for key, bar in bars_module.bars._bars.items() if bar.is_open]


def test_a_scans_bar_shows_the_latest_values_at_each_tick_as_tqdm_does():
  out = io.StringIO()

  def step(w, x):
    loss = jnp.sum(w * w)
    progress.set_postfix(loss=loss, phase=" fit ", lr=0.001)
    return w * 0.5 + x, None

  run = jax.jit(lambda xs: progress.scan(step, jnp.ones(3), xs, every=10,
                                         desc="fit", file=out,
                                         mininterval=0)[0])
  run(jnp.zeros(40))
  hostcall.barrier()
  shown = {}
  for render in _renders(out, "fit"):
    count = int(re.search(r"(\d+)/40", render).group(1))
    shown.setdefault(count, _postfix(render))
  # Each tick (after steps 10, 20, 30, 40) shows its chunk's last step.
  assert shown == {0: "", **{
      n: tqdm_postfix(loss=3 * 0.25 ** (n - 1), phase=" fit ", lr=0.001)
      for n in (10, 20, 30, 40)}}
  assert shown[40] == "loss=9.93e-24, lr=0.001, phase=fit"
  assert _open_bars() == []


@pytest.mark.parametrize("loop", ["while_loop", "fori_loop",
                                  "fori_loop traced"])
def test_while_and_fori_loops_bars_show_their_bodys_values(loop):
  out = io.StringIO()

  def body(i, c):
    progress.set_postfix(i=i, last=i >= 24, half=c / 2)
    return c + 1.0

  if loop == "while_loop":
    run = jax.jit(lambda: progress.while_loop(
        lambda s: s[0] < 25, lambda s: (s[0] + 1, body(*s)), (0, 0.0),
        file=out, desc="loop")[1])
  elif loop == "fori_loop":
    run = jax.jit(lambda: progress.fori_loop(0, 25, body, 0.0, file=out,
                                             desc="loop"))
  else:
    run = jax.jit(lambda n: progress.fori_loop(0, n, body, 0.0, file=out,
                                               desc="loop")).__get__(25)
  assert float(run()) == 25.0
  hostcall.barrier()
  assert _final(out, "loop") == tqdm_postfix(i=24, last=True, half=12.0)
  assert _final(out, "loop") == "half=12, i=24, last=1"


def test_values_of_every_type_are_formatted_as_tqdm_formats_them():
  out = io.StringIO()

  def step(c, _):
    progress.set_postfix(
        {"z": c + 123456788, "y": "first"},
        a=jnp.float32(0.000123456) + 0 * c, b=c < 0,
        d=jnp.complex64(1 + 2j) + 0 * c, e=jnp.bfloat16(3.14159),
        f=jnp.uint8(7), g=1.5, h="text  ", i=None, j=np.bool_(True),
        k=True, m=jnp.float16(65504.0))
    return c + 1, None

  progress.scan(step, 0, length=2, file=out, desc="types")
  hostcall.barrier()
  want = tqdm_postfix(
      {"z": 123456789, "y": "first"}, a=float(np.float32(0.000123456)),
      b=False, d=complex(np.complex64(1 + 2j)),
      e=float(jnp.bfloat16(3.14159)), f=7, g=1.5, h="text  ", i=None,
      j=np.bool_(True), k=True, m=65504.0)
  assert _final(out, "types") == want
  assert want.startswith("z=1.23e+8, y=first, a=0.000123, b=0, d=1+2j, "
                         "e=3.14, f=7, g=1.5, h=text, i=None, j=True, k=1")


def test_each_call_replaces_the_postfix_as_in_tqdm():
  out = io.StringIO()

  def step(c, _):
    progress.set_postfix(gone=c)
    progress.set_postfix(kept=c * 2)
    return c + 1, None

  progress.scan(step, 0, length=5, file=out, desc="last")
  hostcall.barrier()
  assert _final(out, "last") == "kept=8"


def test_under_vmap_a_value_shows_its_lanes_range():
  out = io.StringIO()

  def one(x):
    def step(c, _):
      progress.set_postfix(same=c * 0 + 2.5, spread=c * 1000.0,
                           bad=jnp.where(c > 2, jnp.nan, c))
      return c, None
    return progress.scan(step, x, length=5, file=out, desc="lanes")[0]

  jax.jit(jax.vmap(one))(jnp.array([1.0, 2.0, 3.0]))
  hostcall.barrier()
  assert _final(out, "lanes") == (
      f"bad=nan, same={tqdm_postfix(s=2.5)[2:]}, "
      f"spread={tqdm_postfix(s=1000.0)[2:]}..{tqdm_postfix(s=3000.0)[2:]}, "
      "lanes 3")
  assert _final(out, "lanes") == "bad=nan, same=2.5, spread=1e+3..3e+3, lanes 3"


def test_a_vmap_of_no_lane_shows_no_value():
  out = io.StringIO()
  body = lambda x: progress.scan(
      lambda c, _: (progress.set_postfix(c=c), (c + 1, None))[1], x,
      length=5, file=out, desc="none")[0]
  assert jax.jit(jax.vmap(body))(jnp.zeros((0,))).shape == (0,)
  hostcall.barrier()
  assert "c=" not in out.getvalue() and _open_bars() == []


@pytest.mark.parametrize("loop", ["lax.scan", "hostcall.scan"])
def test_a_tracked_bodys_values_ride_on_its_steps(loop):
  out = io.StringIO()
  body = progress.track(
      lambda c, x: (progress.set_postfix(c=c), (c + x, None))[1], total=10,
      file=out, desc="track")
  if loop == "lax.scan":
    jax.jit(lambda: jax.lax.scan(body, 0.0, jnp.ones(10)))()
  else:  # its steps buffered, five at a time
    jax.jit(lambda: hostcall.scan(body, 0.0, jnp.ones(10), every=5))()
  hostcall.barrier()
  assert _final(out, "track") == tqdm_postfix(c=9.0) == "c=9"


def test_values_under_hostcall_jit_and_grad():
  out = io.StringIO()
  body = lambda c, x: (progress.set_postfix(c=c), (c * x, None))[1]
  run = hostcall.jit(lambda: progress.scan(body, 1.0, jnp.full(10, 2.0),
                                           file=out, desc="jit")[0])
  assert float(run()) == 1024.0
  grad = jax.grad(lambda a: progress.scan(body, a, jnp.full(10, 2.0),
                                          file=out, desc="grad")[0])(1.0)
  assert float(grad) == 1024.0
  hostcall.barrier()
  assert _final(out, "jit") == _final(out, "grad") == "c=512"


def _host_calls(fun) -> int:
  return str(jax.make_jaxpr(fun)()).count("hostcall[")


@pytest.mark.parametrize("loop", ["scan", "while_loop"])
def test_values_make_no_host_call_of_their_own(loop):
  def make(postfix):
    def body(c):
      if postfix:
        progress.set_postfix(c=c)
      return c + 1
    if loop == "scan":
      return lambda: progress.scan(lambda c, _: (body(c), None), 0,
                                   length=100, file=io.StringIO())[0]
    return lambda: progress.while_loop(lambda c: c < 100, body, 0,
                                       file=io.StringIO())
  assert _host_calls(make(True)) == _host_calls(make(False)) >= 3


@pytest.mark.parametrize("loop", ["scan", "while_loop"])
def test_a_body_is_traced_once_more_only_where_it_sets_values(loop):
  def traces(postfix):
    seen = []

    def body(c):
      seen.append(1)
      if postfix:
        progress.set_postfix(c=c)
      return c + 1
    if loop == "scan":
      jax.make_jaxpr(lambda: progress.scan(
          lambda c, _: (body(c), None), 0, length=100,
          file=io.StringIO()))()
    else:
      jax.make_jaxpr(lambda: progress.while_loop(
          lambda c: c < 100, body, 0, file=io.StringIO()))()
    return len(seen)
  assert traces(True) == traces(False) + 1


def test_a_stopped_bar_keeps_its_last_values():
  out = io.StringIO()
  result = jax.jit(lambda: progress.scan(
      lambda c, _: (progress.set_postfix(c=c), (c + 1, None))[1], 0,
      length=10**5, every=50, stop_when=lambda status: status.steps >= 100,
      file=out, desc="halt"))()
  hostcall.barrier()
  steps = int(result.steps)
  assert bool(result.stopped) and 100 <= steps < 10**5
  assert _final(out, "halt") == f"c={steps - 1}, stopped"


def test_a_disabled_bar_drops_its_values():
  out = io.StringIO()
  run = lambda: progress.scan(
      lambda c, _: (progress.set_postfix(c=c), (c + 1, None))[1], 0,
      length=50, file=out, disable=True)[0]
  assert int(jax.jit(run)()) == 50
  assert _host_calls(run) == 2  # its open and close: no tick
  hostcall.barrier()
  assert out.getvalue() == ""


def test_set_postfix_outside_a_progress_loops_body_is_refused():
  with pytest.raises(RuntimeError, match=r"called outside any\. For a "
                     r"Python loop's bar, call the bar's own"):
    progress.set_postfix(loss=1.0)
  with pytest.raises(RuntimeError, match="called outside any"):
    jax.jit(lambda c: jax.lax.scan(
        lambda c, _: (progress.set_postfix(c=c), (c, None))[1], c,
        length=3))(0.0)
  with pytest.raises(RuntimeError, match="has no bar to show values on"):
    jax.jit(lambda: hostcall.control.while_loop(
        lambda c: c < 3, lambda c: (progress.set_postfix(c=c), c + 1)[1], 0,
        time_limit=60.0))()


@pytest.mark.parametrize("inner", ["cond", "scan", "vmap", "jit"])
def test_set_postfix_inside_a_transformation_within_the_body_is_refused(
    inner):
  def nested(c):
    def set_it(v):
      progress.set_postfix(v=v)
      return v
    if inner == "cond":
      return jax.lax.cond(c > 0, set_it, lambda v: v, c)
    if inner == "scan":
      return jax.lax.scan(lambda v, _: (set_it(v), None), c, length=2)[0]
    if inner == "vmap":
      return jax.vmap(set_it)(jnp.stack([c, c]))[0]
    return jax.jit(set_it)(c)

  with pytest.raises(RuntimeError, match=r"not inside a transformation or "
                     r"loop within it \(lax\.cond"):
    jax.jit(lambda: progress.scan(lambda c, _: (nested(c), None), 1.0,
                                  length=3, file=io.StringIO()))()


def test_a_value_that_is_no_number_or_text_is_refused():
  def run(**values):
    return jax.jit(lambda: progress.scan(
        lambda c, _: (progress.set_postfix(**values), (c, None))[1], 0.0,
        length=3, file=io.StringIO()))()

  with pytest.raises(TypeError, match=r"x= takes one number .* got an array "
                     r"of shape \[3\]\. Reduce it first, e\.g\. "
                     r"x=jnp\.mean\(x\)"):
    run(x=jnp.ones(3))
  with pytest.raises(TypeError, match="key= takes a number or text, got an "
                     "array of key"):
    run(key=jax.random.key(0))
  with pytest.raises(TypeError, match=r"a key is a str .* got 1 of type int"):
    jax.jit(lambda: progress.scan(
        lambda c, _: (progress.set_postfix({1: c}), (c, None))[1], 0.0,
        length=3, file=io.StringIO()))()


def test_values_that_change_between_traces_are_refused():
  traced = []

  def step(c, _):
    traced.append(1)
    progress.set_postfix(**{f"v{len(traced)}": c})
    return c, None

  with pytest.raises(ValueError, match=r"set \{v1: float32\[\]\} the first "
                     r"time and \{v\d: float32\[\]\} the next"):
    jax.jit(lambda: progress.scan(step, 0.0, length=3,
                                  file=io.StringIO()))()


# A loop of no step: the bar real tqdm draws for a total of 0 ------------


@pytest.mark.parametrize("bar_format", [None, "{l_bar}{bar}{r_bar}"])
def test_a_loop_of_no_step_draws_tqdms_bar_of_a_total_of_0(bar_format):
  # tqdm draws a total of 0 as a counter ("0step"); with a bar_format (a
  # notebook's widget formats with one) as "0/0".
  want = tqdm_lines(total=0, desc="none", unit="step", bar_format=bar_format)
  loops = {
      "scan": lambda out: progress.scan(
          lambda c, _: (c, None), 0, length=0, **options(out)),
      "fori_loop": lambda out: progress.fori_loop(
          3, 3, lambda i, c: c, 0, **options(out)),
      "fori_loop traced": lambda out: jax.jit(lambda n: progress.fori_loop(
          n, n, lambda i, c: c, 0, **options(out)))(3),
      "while_loop": lambda out: progress.while_loop(
          lambda c: c < 0, lambda c: c, 0, total=0, **options(out)),
  }

  def options(out):
    return dict(file=out, desc="none", bar_format=bar_format)

  for name, loop in loops.items():
    out = io.StringIO()
    loop(out)
    hostcall.barrier()
    # (The rate's time is the bar's own: "00:00" in both.)
    assert out.getvalue() == want, name
  assert ("0/0" in want) == (bar_format is not None)

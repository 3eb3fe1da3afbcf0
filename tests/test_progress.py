"""hostcall.progress: bars driven from compiled loops, read back from a stream."""

import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import progress
from hostcall._apps.loops import invocations as loops_module
from hostcall._apps.progress import (bars as bars_module,
                                     options as options_module)


def _renders(stream: io.StringIO, desc: str) -> list[str]:
  """Every render of the bar called ``desc``, in order."""
  return [r.strip() for r in re.split(r"[\r\n]", stream.getvalue())
          if r.strip().startswith(desc + ":") or
          r.strip().startswith(desc + " ")]


def _final_counts(stream, desc) -> list[str]:
  """The ``n/total`` of each finished bar (the render before its newline)."""
  finals = []
  for line in stream.getvalue().split("\n"):
    renders = [r for r in line.split("\r") if r.strip().startswith(desc)]
    if renders:
      match = re.search(r"(\d+)/(\d+)|(\d+)\S* \[", renders[-1])
      finals.append(match.group(0).split(" ")[0] if match else renders[-1])
  return finals


def _open_bars():
  return [key for key, bar in bars_module.bars._bars.items() if bar.is_open]


@pytest.fixture
def calls(monkeypatch):
  """``calls(method, position)``: records that argument of every call of the
  host loop registry's ``method`` (the calls still go through)."""
  def spy(method, position):
    seen = []
    original = getattr(loops_module.invocations, method)

    def record(*args, **kwargs):
      seen.append(args[position])
      return original(*args, **kwargs)
    monkeypatch.setattr(loops_module.invocations, method, record)
    return seen
  return spy


@pytest.fixture
def received_ticks(monkeypatch):
  """The count of every tick the host receives, in order: a run of ticks
  the queue hands over at once (``_Tick.deliver_steps``) is drawn at its
  last, but each is recorded here."""
  from hostcall._apps.loops import events as loop_events
  seen = []
  deliver, deliver_steps = (loop_events._Tick.deliver,
                            loop_events._Tick.deliver_steps)

  def one(target, flat_args, context):
    seen.append(loops_module.last_count(flat_args[1]))
    return deliver(target, flat_args, context)

  def run(target, stacked, steps, context):
    seen.extend(loops_module.last_count(c) for c in
                loop_events._per_call(stacked[1], steps, context))
    return deliver_steps(target, stacked, steps, context)
  monkeypatch.setattr(loop_events._Tick, "deliver", one)
  monkeypatch.setattr(loop_events._Tick, "deliver_steps", run)
  return seen


def _step(carry, x):
  carry = carry * 0.5 + x
  return carry, carry * 2


def test_scan_matches_lax_scan_and_draws_one_bar_per_call():
  out = io.StringIO()
  xs = jnp.arange(300.0)
  run = jax.jit(lambda xs: progress.scan(_step, 1.0, xs, desc="fit", file=out))
  expected = jax.lax.scan(_step, 1.0, xs)
  for _ in range(3):
    carry, ys = run(xs)
    np.testing.assert_allclose(carry, expected[0], rtol=1e-6)
    np.testing.assert_allclose(ys, expected[1], rtol=1e-6)
  hostcall.barrier()
  assert _final_counts(out, "fit") == ["300/300"] * 3
  assert _open_bars() == []


def test_reverse_length_and_unroll_as_lax_scan():
  out = io.StringIO()
  xs = jnp.arange(10.0)
  got = progress.scan(_step, 0.0, xs, reverse=True, unroll=2, file=out,
                      desc="rev")
  want = jax.lax.scan(_step, 0.0, xs, reverse=True)
  np.testing.assert_allclose(got[1], want[1])
  got = progress.scan(lambda c, _: (c + 1, c), 0, length=7, file=out,
                      desc="len")
  assert int(got[0]) == 7 and got[1].tolist() == list(range(7))
  hostcall.barrier()
  assert _final_counts(out, "rev") == ["10/10"]
  assert _final_counts(out, "len") == ["7/7"]


def test_empty_loops_draw_empty_bars():
  out = io.StringIO()
  carry, ys = progress.scan(_step, 1.0, jnp.zeros(0), file=out, desc="none")
  assert float(carry) == 1.0 and ys.shape == (0,)
  assert int(progress.fori_loop(5, 2, lambda i, c: c + i, 7, file=out,
                                desc="backwards")) == 7
  assert int(progress.while_loop(lambda c: c < 0, lambda c: c + 1, 3,
                                 file=out, desc="never")) == 3
  hostcall.barrier()
  # tqdm draws a total of 0 as a counter.
  for desc in ("none", "backwards", "never"):
    assert re.match(desc + r": 0step \[", _renders(out, desc)[-1])
  assert _open_bars() == []


def test_ticks_are_few_and_redraws_throttled(received_ticks):
  ticks = received_ticks
  out = io.StringIO()
  jax.jit(lambda: progress.scan(lambda c, _: (c + 1, None), 0, length=1000,
                                file=out, desc="fast"))()
  hostcall.barrier()
  # One tick per 1% of the loop, not one per step.
  assert ticks == list(range(10, 1001, 10))
  # The loop takes milliseconds: the bar is drawn when it opens and when it
  # closes, not at every tick (at most one redraw per 0.1 s).
  assert len(_renders(out, "fast")) <= 3
  assert _final_counts(out, "fast") == ["1000/1000"]


@pytest.mark.parametrize("mininterval", [None, 0])
def test_a_short_loops_ticks_under_jax_jit_are_drawn_as_one_run(
    received_ticks, calls, mininterval):
  # The queue hands a run of a bar's ticks over at once under jax.jit too
  # (a 100-step loop in a Python loop paid a delivery a tick, 18 us each):
  # every tick reaches the host, the bar draws the run's last, and a bar
  # that redraws at every tick (mininterval=0) draws each. The delivery
  # thread gathers for up to a second: the loop's ticks (microseconds
  # apart) join one run, which the barrier takes.
  hostcall.barrier()
  hostcall.set_gather_window(1.0)
  drawn = calls("tick", 2)
  options = {} if mininterval is None else {"mininterval": mininterval}
  out = io.StringIO()
  run = jax.jit(lambda: progress.scan(lambda c, _: (c + 1, None), 0,
                                      length=100, file=out, desc="short",
                                      **options)[0])
  try:
    assert int(run()) == 100
    hostcall.barrier()
  finally:
    hostcall.set_gather_window(None)
  assert received_ticks == list(range(1, 101))
  assert drawn == (list(range(1, 101)) if mininterval == 0 else [100])
  assert _final_counts(out, "short") == ["100/100"]


def test_every_sets_the_ticks(received_ticks):
  seen = received_ticks
  progress.scan(lambda c, _: (c, None), 0, length=10, every=4,
                file=io.StringIO())
  hostcall.barrier()
  assert seen == [4, 8, 10]


def test_fori_loop_static_and_traced_bounds():
  out = io.StringIO()
  body = lambda i, c: c + i
  assert int(progress.fori_loop(2, 9, body, 0, file=out, desc="static")) == \
      sum(range(2, 9))
  traced = jax.jit(lambda n: progress.fori_loop(0, n, body, 0, file=out,
                                                desc="traced"))
  assert int(traced(6)) == 15
  assert int(traced(4)) == 6
  hostcall.barrier()
  assert _final_counts(out, "static") == ["7/7"]
  assert _final_counts(out, "traced") == ["6/6", "4/4"]


def test_fori_loop_is_reverse_differentiable_with_static_bounds():
  out = io.StringIO()
  f = lambda x: progress.fori_loop(0, 5, lambda i, c: c * x, 1.0, file=out)
  assert float(jax.grad(f)(2.0)) == pytest.approx(5 * 2.0 ** 4)


def test_while_loop_counts_without_a_total():
  out = io.StringIO()
  run = jax.jit(lambda n: progress.while_loop(lambda c: c[0] < n,
                                              lambda c: (c[0] + 1, c[1] * 2),
                                              (0, 1), file=out, desc="wl"))
  count, value = run(12)
  assert (int(count), int(value)) == (12, 4096)
  hostcall.barrier()
  final = _renders(out, "wl")[-1]
  assert re.match(r"wl: 12step \[", final), final


def test_while_loop_pace_doubles_until_a_tenth_of_a_second(monkeypatch):
  clock = [0.0]
  monkeypatch.setattr(loops_module.time, "monotonic", lambda: clock[0])
  bars = loops_module.Invocations()
  spec = options_module.spec("p", None, "step", None, io.StringIO(), False, {},
                          position=0)
  site = bars.site(spec)
  bars.open(site, "dev", None)
  paces = []
  for _ in range(12):
    clock[0] += 1e-3  # each chunk takes 1 ms, whatever its size
    paces.append(bars.pace(site, "dev"))
  # Start at one step; at most double each tick; settle near 0.1 s of steps.
  assert paces[:4] == [1, 2, 4, 8]
  assert all(b <= 2 * a for a, b in zip(paces, paces[1:]))
  clock[0] += 1.0
  slow = bars.pace(site, "dev")  # the last chunk took 1000x longer
  assert slow < paces[-1]
  bars.close_all()


def test_while_loop_every_fixes_the_chunk(received_ticks):
  seen = received_ticks
  progress.while_loop(lambda c: c < 10, lambda c: c + 1, 0, every=3,
                      file=io.StringIO())
  hostcall.barrier()
  assert seen == [3, 6, 9, 10]


def test_vmap_draws_one_bar_with_the_lanes():
  out = io.StringIO()
  f = lambda x: progress.scan(_step, x, jnp.arange(50.0), file=out,
                              desc="batch")
  carry, ys = jax.jit(jax.vmap(f))(jnp.arange(3.0))
  np.testing.assert_allclose(ys, jax.vmap(
      lambda x: jax.lax.scan(_step, x, jnp.arange(50.0))[1])(jnp.arange(3.0)),
      rtol=1e-6)
  hostcall.barrier()
  assert _final_counts(out, "batch") == ["50/50"]
  assert "lanes 3" in _renders(out, "batch")[-1]


def test_vmap_of_while_with_batched_predicate_shows_running_lanes():
  out = io.StringIO()
  f = lambda n: progress.while_loop(lambda c: c < n, lambda c: c + 1, 0,
                                    every=4, file=out, desc="lanes",
                                    mininterval=0)
  assert jax.vmap(f)(jnp.array([4, 8, 12])).tolist() == [4, 8, 12]
  hostcall.barrier()
  renders = " ".join(_renders(out, "lanes"))
  # After 4 steps the first lane is done, after 8 the second, after 12 all.
  assert "4step" in renders and "lanes 2/3" in renders
  assert "8step" in renders and "lanes 1/3" in renders
  assert re.search(r"lanes: 12step \[.*lanes 3\]$", _renders(out, "lanes")[-1])


def test_nested_loops_draw_nested_bars():
  out = io.StringIO()
  opened = []
  original = loops_module.Invocations.open

  def spy(self, site, device, total, context=None, **kwargs):
    opened.append(self.spec(site).desc)
    return original(self, site, device, total, context, **kwargs)

  loops_module.Invocations.open = spy
  try:
    def outer(c, _):
      c, _ = progress.scan(lambda d, _: (d + 1.0, None), c, length=4,
                           file=out, desc="inner")
      return c, None
    carry, _ = jax.jit(lambda: progress.scan(outer, 0.0, length=3, file=out,
                                             desc="outer"))()
    hostcall.barrier()
  finally:
    loops_module.Invocations.open = original
  assert float(carry) == 12.0
  assert opened == ["outer", "inner", "inner", "inner"]
  specs = {s.desc: s for s in loops_module.invocations._by_site
           if isinstance(s, bars_module.BarSpec)}
  # The default leave: tqdm's, only a bar drawn on the top row stays.
  assert (specs["outer"].position, specs["outer"].leave) == (0, None)
  assert (specs["inner"].position, specs["inner"].leave) == (1, None)
  assert specs["outer"].leave_at(0) and not specs["inner"].leave_at(1)
  assert _final_counts(out, "outer")[-1] == "3/3"
  assert _open_bars() == []


def test_bar_closes_stopped_when_the_loop_raises():
  out = io.StringIO()

  def fails_at_5(i):
    if int(i) == 5:
      raise ValueError("step 5 failed")
    return i

  def step(c, _):
    c = hostcall.pure_callback(fails_at_5, jax.ShapeDtypeStruct((), jnp.int32),
                               c)
    return c + 1, None

  with pytest.raises(Exception, match="step 5 failed"):
    jax.jit(lambda: progress.scan(step, 0, length=10, every=1, file=out,
                                  desc="boom"))()[0].block_until_ready()
  assert _open_bars() == []
  assert "stopped" in _renders(out, "boom")[-1]
  assert "10/10" not in out.getvalue()
  # The next run draws a fresh bar.
  jax.jit(lambda: progress.scan(lambda c, _: (c, None), 0, length=3,
                                file=out, desc="after"))()
  hostcall.barrier()
  assert _final_counts(out, "after") == ["3/3"]


def test_track_decorates_a_body():
  out = io.StringIO()

  @progress.track(total=20, file=out, desc="tracked")
  def step(c, x):
    return c + x, None

  run = jax.jit(lambda xs: jax.lax.scan(step, 0.0, xs)[0])
  assert float(run(jnp.ones(20))) == 20.0
  assert float(run(jnp.ones(20))) == 20.0
  hostcall.barrier()
  assert _final_counts(out, "tracked") == ["20/20", "20/20"]


def test_track_inside_hostcall_scan_is_buffered(calls):
  seen = calls("step", 2)
  out = io.StringIO()
  hostcall.scan(progress.track(lambda c, _: (c, None), total=100, file=out,
                               desc="buffered"), 0, length=100, every=25)
  hostcall.barrier()
  assert seen == [25, 25, 25, 25]
  assert _final_counts(out, "buffered") == ["100/100"]


def test_track_without_total_counts_until_the_barrier():
  out = io.StringIO()
  body = progress.track(lambda c: c + 1, file=out, desc="count")
  jax.lax.while_loop(lambda c: c < 9, body, 0)
  hostcall.barrier()
  assert re.match(r"count: 9step \[", _renders(out, "count")[-1])
  assert _open_bars() == []


def test_other_processes_draw_nothing_by_default():
  bars = loops_module.Invocations()
  bars.listen(bars_module.Bars())
  out = io.StringIO()
  site = bars.site(options_module.spec("p1", 5, "step", None, out, False, {},
                                    position=0))

  class Remote:
    process_index = 1
  bars.open(site, "dev", 5, Remote())
  bars.tick(site, "dev", 5)
  bars.close(site, "dev", 5)
  assert out.getvalue() == ""


def test_bad_arguments_are_explained():
  with pytest.raises(ValueError, match="every must be a positive int"):
    progress.scan(_step, 0.0, jnp.ones(3), every=0)
  with pytest.raises(ValueError, match="needs xs or length"):
    progress.scan(_step, 0.0)
  with pytest.raises(TypeError, match="must be callable"):
    progress.track(3)
  with pytest.raises(TypeError, match="must be hashable"):
    progress.scan(_step, 0.0, jnp.ones(3), lock_args=(["not", "hashable"],))


# The loops that draw a bar, each as a function of its bar options.
_BAR_LOOPS = {
    "scan": lambda **o: progress.scan(_step, 0.0, jnp.ones(3), **o),
    "fori_loop": lambda **o: progress.fori_loop(0, 3, lambda i, c: c, 0, **o),
    "while_loop": lambda **o: progress.while_loop(lambda c: c < 3,
                                                  lambda c: c + 1, 0, **o),
    "track": lambda **o: jax.lax.scan(progress.track(_step, **o), 0.0,
                                      jnp.ones(3)),
}


@pytest.mark.parametrize("loop", sorted(_BAR_LOOPS))
@pytest.mark.parametrize("option, value, takes", [
    ("desc", 5, "a str or None"),
    ("unit", None, "a str"),
    ("file", 5, r"None \(the terminal or notebook\) or an object with a "
     r"write\(\) method, e\.g\. sys\.stdout or io\.StringIO\(\)"),
    ("leave", "yes", r"True, False or None \(default: only outermost bars\)"),
    ("all_processes", 1, "True or False"),
    ("ncols", "wide", "an int >= 0 or None"),
    ("mininterval", -1, "a number of seconds >= 0"),
    ("smoothing", 2, "a number from 0 to 1"),
    ("colour", 3, r"a colour name or hex code \(str\), or None"),
    ("ascii", 1.5, "True, False, None or a str of at least 2 characters"),
    ("disable", "no", "True, False or None"),
])
def test_bar_options_are_checked_when_traced(loop, option, value, takes):
  # Each went to tqdm, which failed on the delivery thread as the loop ran.
  with pytest.raises(TypeError, match=rf"hostcall.progress: {option}= takes "
                     rf"{takes}, got {re.escape(repr(value))} of type "
                     rf"{type(value).__name__}\."):
    jax.jit(lambda: _BAR_LOOPS[loop](**{option: value}))()
  hostcall.barrier()  # nothing failed at run time: nothing ran
  assert _open_bars() == []


@pytest.mark.parametrize("loop", ["scan", "fori_loop", "while_loop"])
def test_an_interruptible_loops_desc_is_checked_as_any_bars(loop):
  class Unprintable:
    def __str__(self):
      raise RuntimeError("no str")

  # (Its label gets " (Ctrl-C stops)" only once it is known to be a str.)
  with pytest.raises(TypeError, match=r"hostcall.progress: desc= takes a str "
                     r"or None, got <.*Unprintable object .*> of type "
                     r"Unprintable\."):
    jax.jit(lambda: _BAR_LOOPS[loop](desc=Unprintable(),
                                     interruptible=True))()
  hostcall.barrier()
  assert _open_bars() == []


def test_a_bar_option_given_a_traced_value_says_to_pass_a_python_value():
  with pytest.raises(TypeError, match=r"ncols= takes an int >= 0 or None, got "
                     r"a traced value \(JitTracer.*pass a Python value"):
    jax.jit(lambda n: progress.scan(_step, 0.0, jnp.ones(3), ncols=n))(80)
  with pytest.raises(TypeError, match=r"sets a bar's position itself .* got "
                     r"position=2; leave it out"):
    progress.scan(_step, 0.0, jnp.ones(3), position=2)


@pytest.mark.parametrize("loop", ["hostcall.scan", "progress.scan",
                                  "progress.while_loop",
                                  "control.while_loop"])
def test_a_traced_every_says_to_pass_a_python_int(loop):
  run = {
      "hostcall.scan": lambda e: hostcall.scan(_step, 0.0, jnp.ones(3),
                                               every=e),
      "progress.scan": lambda e: progress.scan(_step, 0.0, jnp.ones(3),
                                               every=e),
      "progress.while_loop": lambda e: progress.while_loop(
          lambda c: c < 3, lambda c: c + 1, 0, every=e),
      "control.while_loop": lambda e: hostcall.control.while_loop(
          lambda c: c < 3, lambda c: c + 1, 0, every=e, time_limit=60.0),
  }[loop]
  with pytest.raises(ValueError, match=r"every must be a positive int \(a "
                     r"Python int >= 1.*\), known when the loop is traced: it "
                     r"sets the chunk size.*got a traced value \(JitTracer"
                     r".*Pass a Python int, e\.g\. every=100"):
    jax.jit(run)(2)
  with pytest.raises(ValueError, match=r"got 2.5 of type float; pass a Python "
                     "int"):
    run(2.5)


@pytest.mark.parametrize("loop, length", [
    (lambda body: jax.lax.scan(body, 0.0, jnp.ones(10)), 10),
    (lambda body: jax.lax.scan(body, 0.0, None, length=10), 10),
    (lambda body: hostcall.scan(body, 0.0, jnp.ones(10), every=4), 10),
    (lambda body: progress.scan(body, 0.0, jnp.ones(12), every=5,
                                file=io.StringIO()), 12),
    (lambda body: jax.lax.fori_loop(0, 10, lambda i, c: body(c, 1.0)[0],
                                    0.0), 10),
    # The innermost loop is the one that runs the body.
    (lambda body: jax.lax.scan(lambda c, _: jax.lax.scan(body, c,
                                                         jnp.ones(7)),
                               0.0, None, length=3), 7),
], ids=["lax.scan", "lax.scan length", "hostcall.scan", "progress.scan",
        "lax.fori_loop", "nested"])
def test_track_refuses_a_total_that_is_not_its_loops_length(loop, length):
  def count(c, _):
    return c + 1.0, None

  out = io.StringIO()
  with pytest.raises(ValueError, match=rf"track\(total=5\) decorates the body "
                     rf"of a loop of {length} steps: its bar would close after "
                     rf"5 steps and start again\. Pass total={length}"):
    jax.jit(lambda: loop(progress.track(count, total=5, file=out)))()
  # With the loop's length: one bar, whole.
  jax.jit(lambda: loop(progress.track(count, total=length, file=out,
                                      desc="whole", leave=True)))()
  hostcall.barrier()
  assert _final_counts(out, "whole")[-1] == f"{length}/{length}"


def test_track_takes_any_total_where_the_loop_has_no_length():
  out = io.StringIO()
  body = progress.track(lambda c: c + 1, total=5, file=out, desc="while")
  assert int(jax.jit(lambda: jax.lax.while_loop(lambda c: c < 5, body,
                                                0))()) == 5
  hostcall.barrier()
  assert _final_counts(out, "while") == ["5/5"]
  for bad in (0, -3, 2.5, True, "10"):
    with pytest.raises(ValueError, match=r"total is the number of steps of one "
                       r"invocation of the loop \(a Python int > 0\) or None "
                       rf"\(a counter\), got {re.escape(repr(bad))}"):
      progress.track(_step, total=bad)


@pytest.mark.parametrize("every", [2**31 - 1, 2**31, 2**40, 10**18])
def test_an_every_beyond_int32_is_one_chunk_of_a_while_loop(every):
  stream = io.StringIO()
  out = jax.jit(lambda: hostcall.progress.while_loop(
      lambda c: c < 5, lambda c: c + 1, 0, every=every, file=stream))()
  steered = jax.jit(lambda: hostcall.control.while_loop(
      lambda c: c < 5, lambda c: c + 1, 0, every=every, time_limit=3600.0))()
  hostcall.barrier()
  assert int(out) == 5 and int(steered.value) == 5 and int(steered.steps) == 5
  assert "5step" in stream.getvalue().replace(" ", "")


def test_every_device_of_an_invocation_gets_the_same_paces(monkeypatch):
  # A paced while_loop's chunk sizes come from the host's clock: device A
  # measures slow steps, device B fast ones. Both get A's answers (the
  # first to ask decides), so a communicating body runs the same steps
  # between two checks everywhere.
  now = [0.0]
  monkeypatch.setattr(loops_module.time, "monotonic", lambda: now[0])
  bars = loops_module.Invocations()
  site = bars.site(options_module.spec("p", None, "step", None, io.StringIO(),
                                    False, {"disable": True}, position=0))
  a, b = bars.open(site, "A", None), bars.open(site, "B", None)
  paces_a, paces_b = [], []
  for step in (1.0, 1.0, 1.0):  # a step a second on A: a tick a step
    paces_a.append(bars.pace(a, "A"))
    now[0] += step
  for step in (0.001, 0.001, 0.001):  # fast on B: it would double
    paces_b.append(bars.pace(b, "B"))
    now[0] += step
  assert paces_a == paces_b == [1, 1, 1]
  bars.close(a, "A", 3)
  bars.close(b, "B", 3)
  assert not bars._group_paces  # forgotten with the invocation's last device


def test_a_barrier_does_not_release_an_invocation_another_device_runs(
    monkeypatch):
  # A barrier ends the handles opened before it (their computations have
  # ended); one device's handle opened later, in a computation another
  # thread dispatched, still runs the invocation: it keeps its paces, and
  # the invocation is released only with it.
  now = [0.0]
  monkeypatch.setattr(loops_module.time, "monotonic", lambda: now[0])
  bars = loops_module.Invocations()
  released = []

  class Releases(loops_module.Listener):
    def on_release(self, group):
      released.append(group)
  bars.listen(Releases())
  site = bars.site(options_module.spec("p", None, "step", None, io.StringIO(),
                                    False, {"disable": True}, position=0))
  a = bars.open(site, "A", None)
  first = bars.pace(a, "A")
  now[0] = 1.0
  b = bars.open(site, "B", None)
  bars.close_all(opened_before=0.5)   # the barrier, begun between the opens
  assert released == [] and bars.pace(b, "B") == first
  bars.close(b, "B", 1)
  assert released == [(site, 0)] and not bars._group_paces


@pytest.mark.parametrize("loop", ["while_loop", "scan"])
def test_a_steered_loop_that_stops_closes_its_bar_marked_stopped(loop):
  out = io.StringIO()
  stop_when = lambda status: status.steps >= 100
  if loop == "while_loop":
    run = lambda: progress.while_loop(lambda c: c < 10**7, lambda c: c + 1, 0,
                                      every=50, stop_when=stop_when, file=out,
                                      desc="halt")
  else:
    run = lambda: progress.scan(lambda c, _: (c + 1, None), 0, length=10**5,
                                every=50, stop_when=stop_when, file=out,
                                desc="halt")
  result = jax.jit(run)()
  hostcall.barrier()
  assert bool(result.stopped) and 100 <= int(result.steps) < 10**5
  assert "stopped" in _renders(out, "halt")[-1]
  # Not stopped: not marked.
  out2 = io.StringIO()
  jax.jit(lambda: progress.while_loop(lambda c: c < 200, lambda c: c + 1, 0,
                                      every=50, stop_when=lambda s: False,
                                      file=out2, desc="ends"))()
  hostcall.barrier()
  assert _renders(out2, "ends")[-1].startswith("ends: 200step")
  assert "stopped" not in _renders(out2, "ends")[-1]


def test_a_stopped_counter_in_a_notebook_is_not_painted_a_success():
  # tqdm.notebook paints a bar that closes short of its total "danger", any
  # other (a counter without a total) "success".
  from hostcall._apps.progress import bars as bars_module
  painted = []

  from tqdm.notebook import tqdm as notebook_tqdm

  # What tqdm.notebook.tqdm does on close; a subclass of it, as tqdm.auto's
  # class is in a notebook (defined in tqdm.auto).
  class NotebookBar(notebook_tqdm):
    total, n = None, 0
    def set_postfix_str(self, s, refresh=True):
      painted.append(("postfix", s))
    def close(self):
      painted.append(("style", "success"))
    def disp(self, bar_style=None, check_delay=True):
      painted.append(("style", bar_style))
    def __del__(self):
      pass
  NotebookBar.__module__ = "tqdm.auto"

  bar = bars_module._Bar.__new__(bars_module._Bar)
  # A widget: no stream. (Not constructed: no widget library here.)
  bar.tqdm, bar.stream = object.__new__(NotebookBar), None
  bar.finish(stopped=True)
  assert painted == [("postfix", "stopped"), ("style", "success"),
                     ("style", "danger")]


def _flushed_rows(monkeypatch):
  """The rows each delivery of ``Run.log``'s chunks carried, in order."""
  from hostcall._apps.metrics import log_target
  sizes = []
  real = log_target.LogTarget.deliver_steps

  def deliver_steps(self, stacked, steps, context):
    sizes.append(steps)
    return real(self, stacked, steps, context)

  monkeypatch.setattr(log_target.LogTarget, "deliver_steps", deliver_steps)
  return sizes


@pytest.mark.parametrize("jit", [jax.jit, hostcall.jit])
@pytest.mark.parametrize("length, reverse, flushes", [
    (1000, False, [250] * 4),
    (1075, False, [250] * 4 + [70, 5]),  # chunks left over, then steps
    (1075, True, [250] * 4 + [70, 5]),
    (240, False, [240]),
])
def test_a_bar_flushes_the_taps_of_many_ticks_at_once(
    monkeypatch, tmp_path, jit, length, reverse, flushes):
  sizes = _flushed_rows(monkeypatch)
  run = hostcall.metrics.Run("grouped", root=tmp_path)
  xs = jnp.arange(length, dtype=jnp.float32) * 0.5
  out = io.StringIO()

  def step(c, x):
    run.log(c, x=x)
    return c + 1, x * 2

  carry, ys = jit(lambda xs: progress.scan(
      step, 0, xs, every=10, reverse=reverse, file=out, desc="g"))(xs)
  run.close()
  assert sizes == flushes
  expected_x = np.asarray(xs)[::-1] if reverse else np.asarray(xs)
  rows = hostcall.metrics.read(run.dir)
  assert rows["step"].tolist() == list(range(length))
  np.testing.assert_array_equal(rows["x"].to_numpy(np.float32), expected_x)
  assert int(carry) == length
  np.testing.assert_array_equal(ys, np.asarray(xs) * 2)
  assert _final_counts(out, "g") == [f"{length}/{length}"]


def test_a_bar_flushes_each_tick_where_the_taps_are_large_or_steered(
    monkeypatch, tmp_path):
  sizes = _flushed_rows(monkeypatch)
  run = hostcall.metrics.Run("large", root=tmp_path)

  def large(c, _):  # 64 KiB of values a step: 10 steps hold 640 KiB
    run.log(c, v=jnp.full(16384, c, jnp.float32))
    return c + 1, None

  def small(c, _):
    run.log(c, v=c * 1.0)
    return c + 1, None

  jax.jit(lambda: progress.scan(large, 0, length=30, every=10,
                                file=io.StringIO()))()
  hostcall.barrier()
  assert sizes == [10, 10, 10]
  sizes.clear()

  def lane(c, _):  # 16 KiB and a step number a step and lane: 3 steps fit
    run.log(c, v=jnp.full(4096, c, jnp.float32))
    return c + 1, None

  jax.jit(jax.vmap(lambda c: progress.scan(
      lane, c, length=16, every=1, file=io.StringIO())[0]))(
      jnp.zeros(64, jnp.int32))
  hostcall.barrier()
  assert sizes == [3, 3, 3, 3, 3, 1]  # the 64 KiB bound is a lane's
  sizes.clear()
  seen = []

  def stop_when(status):  # a predicate sees the rows of the chunk before
    seen.append(run.latest("v"))
    return False

  jax.jit(lambda: progress.scan(small, 0, length=30, every=10,
                                file=io.StringIO(), stop_when=stop_when))()
  hostcall.barrier()
  run.close()
  assert sizes == [10, 10, 10]
  assert [step for step, _ in seen] == [9, 19, 29]


def test_a_body_that_fails_to_trace_fails_as_under_lax_scan():
  def body(c, _):
    raise ValueError("the body's own error")

  for loop in (jax.lax.scan, progress.scan):
    with pytest.raises(ValueError, match="the body's own error"):
      jax.jit(lambda: loop(body, 0, length=300))()


def _tick_context(lanes=None):
  import types
  return types.SimpleNamespace(
      device="cpu:0", batch_levels=[] if lanes is None else [(0, lanes)])


def test_a_run_of_queued_ticks_draws_each_invocations_last(calls,
                                                          monkeypatch):
  # hostcall.jit's queue hands consecutive ticks of one site over at once:
  # one draw for each stretch of one invocation's ticks, at its furthest
  # count (the ticks of steered loops, whose opens are not queued, carry
  # their invocation's handle, and two threads running the same program
  # interleave them); an invocation whose predicate reads ticks sees each.
  from hostcall._apps.loops import events as loop_events
  from hostcall._apps import control as control_module
  ticks = calls("tick", 2)
  handles = calls("tick", 0)
  monkeypatch.setattr(control_module.controls, "watches",
                      lambda handle: handle == 9)
  after = []
  monkeypatch.setattr(control_module.controls, "after_tick",
                      lambda handle, steps, device: after.append(
                          (handle, steps)))
  tick = loop_events._Tick(site=loops_module.invocations.site(
      loops_module.NoBarSpec(position=0, interruptible=False)))
  stacked = [np.array([5, 5, 7, 5, 5, 9, 9], np.int32),  # handles
             np.array([10, 20, 10, 30, 40, 1, 2], np.int32),  # counts
             np.zeros((7, 0), np.float32)]  # witnesses
  tick.deliver_steps(stacked, 7, _tick_context())
  assert list(zip(handles, ticks)) == [(5, 20), (7, 10), (5, 40), (9, 1),
                                       (9, 2)]
  assert after == [(5, 20), (7, 10), (5, 40), (9, 1), (9, 2)]


def test_a_run_of_vmapped_ticks_reports_the_furthest_lane_and_running(
    monkeypatch):
  from hostcall._apps.loops import events as loop_events
  seen = []
  monkeypatch.setattr(loops_module.invocations, "tick",
                      lambda *args: seen.append(args))
  tick = loop_events._Tick(site=loops_module.invocations.site(
      loops_module.NoBarSpec(position=0, interruptible=False)))
  # Three lanes (the batch axis first), two ticks, a while loop's running
  # lanes.
  stacked = [np.full((3, 2), 4, np.int32),
             np.array([[5, 9], [7, 8], [6, 9]], np.int32),
             np.zeros((3, 2, 0), np.float32),
             np.array([[1, 0], [1, 1], [1, 0]], np.bool_)]
  tick.deliver_steps(stacked, 2, _tick_context(lanes=3))
  assert seen == [(4, "cpu:0", 9, 3, 1)]


def test_under_hostcall_jit_a_bar_ends_as_under_jax_jit_and_predicates_see_every_tick(
    calls):
  ticks = calls("tick", 2)
  results = {}
  for name, jit in (("jax", jax.jit), ("hostcall", hostcall.jit)):
    out, seen = io.StringIO(), []
    ticks.clear()
    bar = jit(lambda: progress.scan(lambda c, _: (c + 1, None), 0,
                                    length=1000, file=out, desc="fast"))
    steered = jit(lambda: progress.scan(
        lambda c, _: (c + 1, None), 0, length=1000, file=out, desc="steered",
        stop_when=lambda status: seen.append(status.steps) or False))
    values = [int(bar()[0])]
    hostcall.barrier()
    # The device ticks every 1% of the loop; queued, a run of them that
    # reaches the host together is drawn once, at its last; under
    # hostcall.jit the device drops most of them (within a fraction of the
    # bar's mininterval of the last one queued), the close carrying 1000.
    assert ticks and ticks == sorted(set(ticks))
    assert set(ticks) <= set(range(10, 1001, 10))
    assert name == "hostcall" or ticks[-1] == 1000
    ticks.clear()
    values.append(int(steered().value[0]))
    hostcall.barrier()
    assert ticks == list(range(10, 1001, 10))
    results[name] = (values, seen, _final_counts(out, "fast"),
                     _final_counts(out, "steered"))
  assert results["hostcall"] == results["jax"]
  assert results["jax"] == ([1000, 1000], list(range(10, 1001, 10)),
                            ["1000/1000"], ["1000/1000"])


@pytest.mark.parametrize("loop", ["scan", "fori_loop", "while_loop",
                                  "steered", "track"])
@pytest.mark.parametrize("jit", [jax.jit, hostcall.jit],
                         ids=["jax.jit", "hostcall.jit"])
def test_a_vmap_of_no_lane_draws_a_bar_of_no_step(loop, jit):
  # Events of no lane carry no handle: they find the device's latest
  # invocation of their bar, as a queued open's do.
  out = io.StringIO()
  step = lambda c, _: (c + 1, None)
  body = {
      "scan": lambda x: progress.scan(step, x, length=50, file=out,
                                      desc="d")[0],
      "fori_loop": lambda x: progress.fori_loop(
          0, 50, lambda i, c: c + 1, x, file=out, desc="d"),
      "while_loop": lambda x: progress.while_loop(
          lambda c: c < 50, lambda c: c + 1, x, file=out, desc="d"),
      "steered": lambda x: progress.scan(
          step, x, length=50, file=out, desc="d",
          stop_when=lambda status: False).value[0],
      "track": lambda x: jax.lax.scan(
          progress.track(step, total=50, file=out, desc="d"), x, None,
          length=50)[0],
  }[loop]
  assert jit(jax.vmap(body))(jnp.zeros((0,))).shape == (0,)
  hostcall.barrier()  # raises what a host function raised
  assert _open_bars() == []


_FAILING_STREAMS = r'''
import io, sys
import jax, hostcall
from hostcall import progress

class Flaky(io.StringIO):
  """Takes two writes, then every one raises."""
  def __init__(self):
    super().__init__()
    self.writes = 0
  def write(self, text):
    self.writes += 1
    if self.writes > 2:
      raise OSError(28, "No space left on device")
    return super().write(text)

def loop(**options):
  return lambda x: progress.scan(lambda c, _: (c + 1, None), x, length=50,
                                 every=5, mininterval=0, **options)

class HungUp(io.StringIO):
  """A terminal that hung up after the bar opened: tqdm's own wrapper
  stops drawing on EIO, as on a closed file."""
  def __init__(self, failure):
    super().__init__()
    self.failure, self.writes = failure, 0
  def write(self, text):
    self.writes += 1
    if self.writes > 1:
      raise self.failure
    return super().write(text)

def report(name, run):
  import re
  try:
    value = run()
    hostcall.barrier()
    print(name, "ok", value, flush=True)
  except Exception as exc:
    # How many failures the barrier counted, where it says.
    count = re.search(r"(\d+) tap function call", str(exc))
    print(name, "raised", type(exc).__name__,
          *([count.group(1)] if count else []), flush=True)

from hostcall._jit import routes
hostcall.barrier()  # the queue started
print("queued", routes.queues(), flush=True)

for jit in (jax.jit, hostcall.jit):
  # A steered loop's checks wait for each tick's predicate.
  seen = []
  report("steered", lambda: float(jit(loop(
      file=Flaky(), stop_when=lambda s: seen.append(s.steps) or False))(
          0.).value[0]))
  print("predicate saw", seen, flush=True)
  report("bar", lambda: float(jit(loop(file=Flaky()))(0.)[0]))
  for failure in (OSError(5, "Input/output error"),
                  ValueError("I/O operation on closed file.")):
    report("hung up", lambda: float(jit(loop(file=HungUp(failure)))(0.)[0]))
    report("hung up, steered", lambda: float(jit(loop(
        file=HungUp(failure), stop_when=lambda s: False))(0.).value[0]))
  # tqdm raises while drawing (inside its lock), from the thread that opens
  report("bad format", lambda: float(jit(loop(
      file=io.StringIO(), bar_format="{nonexistent}"))(0.)[0]))
  out = io.StringIO()
  report("good", lambda: float(jit(loop(file=out))(0.)[0]))
  print("drawn", out.getvalue().split("\r")[-1].strip(), flush=True)

class Closed:
  def write(self, text):
    raise BrokenPipeError(32, "Broken pipe")
  def flush(self):
    raise BrokenPipeError(32, "Broken pipe")
  def isatty(self):
    return False
sys.stderr = Closed()
report("stderr", lambda: float(jax.jit(loop())(0.)[0]))
sys.stderr = sys.__stderr__
out = io.StringIO()
report("after", lambda: float(jax.jit(loop(file=out))(0.)[0]))
print("drawn", out.getvalue().split("\r")[-1].strip(), flush=True)
'''


def test_a_stream_or_format_that_raises_fails_its_bar_and_hangs_nothing():
  # tqdm holds a process-wide lock while it draws and lets go only when
  # drawing returns: a write or a format that raised kept it held, and the
  # next bar drawn from another thread (or a steered loop's check waiting
  # for its tick) waited forever.
  import subprocess
  import sys
  proc = subprocess.run([sys.executable, "-c", _FAILING_STREAMS],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  # Whether the program's hostcall.jit queues its calls (the FFI handler)
  # or keeps them live (JAX's callbacks).
  queued, *lines = proc.stdout.splitlines()
  queued = queued == "queued True"
  drawn = "50/50 "
  def each_jit(open_failure):
    return [
        # The predicate saw every tick; the failure reached the barrier,
        # once: after it the bar draws nothing more.
        "steered raised CallbackException 1",
        "predicate saw [5, 10, 15, 20, 25, 30, 35, 40, 45, 50]",
        "bar raised CallbackException 1",
        # tqdm stops drawing a bar on EIO and a closed file, quietly.
        "hung up ok 50.0", "hung up, steered ok 50.0",
        "hung up ok 50.0", "hung up, steered ok 50.0",
        # An open that cannot draw fails its computation (hostcall.jit:
        # queued, reported by the barrier).
        f"bad format raised {open_failure}",
        "good ok 50.0"]
  assert [line for line in lines if not line.startswith("drawn")] == (
      each_jit("JaxRuntimeError")
      + each_jit("CallbackException 1" if queued else "JaxRuntimeError")
      + ["stderr raised JaxRuntimeError", "after ok 50.0"])
  assert [line.startswith("drawn 100%") and drawn in line
          for line in lines if line.startswith("drawn")] == [True] * 3


def test_the_guard_flushes_as_tqdm_does_where_a_stream_has_no_flush():
  # A stream without flush: nothing to flush. One whose flush is not
  # callable, or raises: the failure kept for hostcall to raise (tqdm's
  # own bar raises TypeError there), and nothing drawn after it.
  from hostcall._apps.progress import tqdm_guard

  class NoFlush:
    def __init__(self):
      self.text = []

    def write(self, text):
      self.text.append(text)

  bare = tqdm_guard.Guarded(NoFlush())
  assert bare.flush() is None and bare.failure is None
  bare.write("a")
  assert bare._stream.text == ["a"]
  for flush in (None, _raising(ValueError("flush failed"))):
    stream = io.StringIO()
    stream.flush = flush
    guarded = tqdm_guard.Guarded(stream)
    guarded.flush()
    assert isinstance(guarded.failure, (TypeError, ValueError))
    guarded.write("after")
    assert stream.getvalue() == ""
    with pytest.raises(type(guarded.failure)):
      guarded.raise_failure()


def _raising(failure):
  def raise_():
    raise failure
  return raise_


def test_the_guard_can_tell_whether_this_thread_holds_tqdms_locks():
  # tqdm_guard reads the standard library's private lock state: this fails
  # loudly where Python renames it (the guard would then release nothing).
  import multiprocessing
  import threading

  import tqdm

  from hostcall._apps.progress import tqdm_guard
  locks = tqdm.tqdm.get_lock().locks
  assert {type(lock) for lock in locks} >= {type(threading.RLock())}
  for lock in [*locks, threading.RLock(), multiprocessing.RLock()]:
    assert tqdm_guard._held(lock) is False
    with lock:
      assert tqdm_guard._held(lock) is True
    assert tqdm_guard._held(lock) is False
  # A call that raised while holding them lets go; one already held stays.
  with pytest.raises(KeyError):
    with tqdm_guard.unlocked_on_failure():
      tqdm.tqdm.get_lock().acquire()
      raise KeyError("drawing failed")
  assert [tqdm_guard._held(lock) for lock in locks] == [False] * len(locks)
  with tqdm.tqdm.get_lock():
    with pytest.raises(KeyError):
      with tqdm_guard.unlocked_on_failure():
        raise KeyError("drawing failed")
    assert [tqdm_guard._held(lock) for lock in locks] == [True] * len(locks)


@pytest.mark.parametrize("jit", [jax.jit, hostcall.jit])
def test_a_disabled_bar_is_never_made_and_its_loop_still_runs_and_stops(
    jit, monkeypatch):
  # tqdm(disable=True) draws nothing and takes no row: making one only cost
  # a steered loop's open, which the device waits for.
  made = []
  original = bars_module.BarSpec.make
  monkeypatch.setattr(bars_module.BarSpec, "make",
                      lambda self, *a: made.append(self.desc)
                      or original(self, *a))
  seen = []

  def loop(**options):
    return jit(lambda x: progress.scan(lambda c, _: (c + 1, None), x,
                                       length=50, every=5, **options))

  steered = loop(disable=True, desc="off",
                 stop_when=lambda s: seen.append(s.steps) or s.steps >= 20)
  result = steered(0)
  timed = loop(disable=True, desc="off", time_limit=3600.0)(0)
  plain = loop(disable=True, desc="off")(0)
  drawn = loop(disable=False, desc="on", file=io.StringIO())(0)
  hostcall.barrier()
  # Within one check of the predicate's answer (a check waits for it to
  # have seen the chunk before its own); it saw every tick.
  stopped_at = int(result.value[0])
  assert stopped_at in (20, 25) and bool(result.stopped)
  assert seen == list(range(5, stopped_at + 1, 5))
  assert int(timed.value[0]) == 50 and not bool(timed.stopped)
  assert int(plain[0]) == 50 and int(drawn[0]) == 50
  assert made == ["on"]
  assert _open_bars() == []


def test_a_bar_that_fails_to_open_leaves_no_row_behind():
  # tqdm registers a bar (for the rows bars take) before it draws it.
  import gc

  import tqdm
  before = len(tqdm.tqdm._instances)
  for _ in range(3):
    # (Under hostcall.jit the open is queued: the barrier reports it.)
    with pytest.raises(Exception, match="nonexistent"):
      jax.jit(lambda: progress.scan(lambda c, _: (c + 1, None), 0,
                                    length=10, file=io.StringIO(),
                                    bar_format="{nonexistent}"))()
      hostcall.barrier()
  hostcall.barrier()
  gc.collect()
  assert len(tqdm.tqdm._instances) == before
  assert _open_bars() == []


def test_a_notebooks_bar_class_is_told_by_its_base():
  # In a notebook, tqdm.auto's class is a subclass of tqdm.notebook's
  # defined in tqdm.auto: it draws a widget, on no stream of hostcall's.
  import tqdm
  from tqdm.notebook import tqdm as notebook_tqdm

  from hostcall._apps.progress import tqdm_guard

  class AutoNotebook(notebook_tqdm):
    pass
  AutoNotebook.__module__ = "tqdm.auto"
  assert tqdm_guard.is_notebook_bar(AutoNotebook)
  assert not tqdm_guard.is_notebook_bar(tqdm.tqdm)
  spec = bars_module.BarSpec(desc=None, total=3, unit="it", position=0,
                             leave=True, file=None, all_processes=False,
                             options=())
  original = tqdm_guard.tqdm_class
  try:
    tqdm_guard.tqdm_class = lambda file: AutoNotebook
    assert spec.guard() is None
    tqdm_guard.tqdm_class = lambda file: tqdm.tqdm
    assert isinstance(spec.guard(), tqdm_guard.Guarded)
  finally:
    tqdm_guard.tqdm_class = original


def test_closing_every_bar_goes_on_past_one_that_fails():
  # The barrier closes the bars whose loops never closed them: one that
  # fails to close must not leave the others open.
  import time

  class Failing(io.StringIO):
    closing = False

    def write(self, text):
      if self.closing:
        raise OSError(28, "No space left on device")
      return super().write(text)

  streams = [Failing(), io.StringIO(), Failing()]
  for k, stream in enumerate(streams):
    site = loops_module.invocations.site(bars_module.BarSpec(
        desc=f"left open {k}", total=10, unit="it", position=0, leave=True,
        file=stream, all_processes=False, options=()))
    loops_module.invocations.open(site, "cpu:0", 10)
  streams[0].closing = streams[2].closing = True
  with pytest.raises(OSError, match="No space left on device"):
    loops_module.invocations.close_all(opened_before=time.monotonic() + 60)
  assert _open_bars() == []
  assert _final_counts(streams[1], "left open 1") == ["0/10"]


@pytest.mark.parametrize("every", [10, None])
def test_a_vmapped_while_loop_under_hostcall_jit_runs_each_lane_to_its_end(
    every):
  # Its predicate is batched: under hostcall.jit the loop, rebuilt to queue
  # its calls, runs while any lane's holds and keeps each finished lane's
  # carry, as jax.jit's does.
  results = {}
  for name, jit in (("jax", jax.jit), ("hostcall", hostcall.jit)):
    out = io.StringIO()
    run = jit(jax.vmap(lambda n: progress.while_loop(
        lambda c: c < n, lambda c: c + 1, 0, every=every, file=out,
        desc="lanes")))
    values = run(jnp.array([3, 25])).tolist()
    hostcall.barrier()
    results[name] = (values, _final_counts(out, "lanes"),
                     "lanes 2" in out.getvalue())
  assert results["hostcall"] == results["jax"]
  assert results["jax"][0] == [3, 25] and results["jax"][2]


@pytest.mark.parametrize("traced", [False, True], ids=["int", "traced"])
def test_a_while_loops_bar_takes_tqdms_total(traced):
  # (NumPy's integers count too: np.int64(40) below, where not traced.)
  # tqdm's total= where the user knows how many steps the loop takes: the
  # bar shows n/total (it raised "got multiple values for argument").
  out = io.StringIO()

  def run(limit):
    return hostcall.progress.while_loop(
        lambda c: c < limit, lambda c: c + 1, 0,
        total=limit if traced else np.int64(40), file=out, mininterval=0)

  value = jax.jit(run)(40) if traced else run(40)
  hostcall.barrier()
  assert int(value) == 40
  assert "40/40" in out.getvalue()


@pytest.mark.parametrize("total", [-1, 2.5, True, "10", 2**40,
                                   np.float32(3), np.arange(3)])
def test_a_while_loops_total_must_be_a_count(total):
  with pytest.raises(TypeError, match=r"total= is the number of steps the "
                     r"bar expects, an int from 0 to 2147483647 .* got "
                     + re.escape(repr(total))):
    hostcall.progress.while_loop(lambda c: c < 3, lambda c: c + 1, 0,
                                 total=total)


@pytest.mark.parametrize("loop", ["scan", "fori_loop"])
def test_a_total_for_a_loop_that_knows_its_length_is_refused_clearly(loop):
  run = {"scan": lambda: hostcall.progress.scan(
      lambda c, x: (c + x, None), 0, jnp.arange(5), total=5),
         "fori_loop": lambda: hostcall.progress.fori_loop(
             0, 5, lambda i, c: c + i, 0, total=5)}[loop]
  with pytest.raises(TypeError, match=r"the loop's length is the bar's total"
                     r".* got total=5; leave it out"):
    run()

"""hostcall's constructs in place of JAX's, side by side.

The same step runs in JAX's construct and in hostcall's, in one process, on
the same inputs: ``lax.scan`` against ``hostcall.scan`` (``every``,
``unroll``, ``reverse``) and ``progress.scan``; ``lax.while_loop`` and
``lax.fori_loop`` against ``progress.while_loop``, ``progress.fori_loop``
and the steered ``control.while_loop``; ``jax.jit`` against
``hostcall.jit`` over a Python loop of steps. Each step makes a mixture of
host calls (``CALLS``). The check: what the host saw after JAX's sync point
(``SYNC_POINTS``) is what it saw under JAX's construct: the same calls with
the same values, ordered calls in the same order, each call site's calls in
step order, the same printed lines, the same result and the same error.
Where hostcall deliberately differs, the table says so (and
docs/compatibility.md, "hostcall's constructs in place of JAX's").

The bigger products of the tables, and the longer random programs, are
``heavy`` (``make test-compositions`` in CI).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import itertools
import os
import pathlib
import subprocess
import sys
import tempfile
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from jax import lax
from jax.experimental import io_callback as jax_io_callback

import hostcall
from hostcall import control, progress
from hostcall import host_callback as hcb

F32 = jax.ShapeDtypeStruct((), jnp.float32)


class Log:
  """What the host saw: ``(site, value)`` events in the order host functions
  ran (prints are read from the captured stdout)."""

  def __init__(self):
    self.events = []
    self._lock = threading.Lock()
    self.fail_at = None  # (site, value) whose host function raises
    self.run = None  # the metrics run "run_log" logs to (made when used)

  def metrics_run(self):
    if self.run is None:
      self.run = hostcall.metrics.Run("drop-in", root=tempfile.mkdtemp(),
                                      writers=["memory"])
    return self.run

  def rows(self) -> list:
    """The rows logged so far, as events."""
    return ([] if self.run is None else
            [("run_log", int(r["v"])) for r in self.run.records()])

  def record(self, site, v):
    event = (site, int(np.asarray(v)))
    if event == self.fail_at:
      raise ValueError(f"{site} fails at {event[1]}")
    with self._lock:
      self.events.append(event)


def _tap(log, site):
  return lambda v: log.record(site, v)


def _live(log, site):
  def host(v):
    log.record(site, v)
    return np.float32(v)
  return host


#: Each host call a step may make: ``(make, ordered)``, ``make(log, i)``
#: staging it for step ``i`` and returning what it adds to the carry.
#: ``ordered``: its calls keep program order with the other ordered calls
#: of their token (hostcall's io calls and JAX's share JAX's io token).
CALLS = {
    "io_live_ordered": (lambda log, i: hostcall.io_callback(
        _live(log, "io_live_ordered"), F32, i, ordered=True), "io"),
    "io_live": (lambda log, i: hostcall.io_callback(
        _live(log, "io_live"), F32, i), None),
    "pure": (lambda log, i: hostcall.pure_callback(
        lambda v: np.float32(2 * v), F32, i), None),
    "io_tap_ordered": (lambda log, i: hostcall.io_callback(
        _tap(log, "io_tap_ordered"), None, i, ordered=True), "io"),
    "io_tap": (lambda log, i: hostcall.io_callback(
        _tap(log, "io_tap"), None, i), None),
    "debug": (lambda log, i: hostcall.debug_callback(
        _tap(log, "debug"), i), None),
    "debug_ordered": (lambda log, i: hostcall.debug_callback(
        _tap(log, "debug_ordered"), i, ordered=True), "debug"),
    "print": (lambda log, i: hostcall.debug_print("print {}", i), None),
    "id_tap": (lambda log, i: hcb.id_tap(
        lambda v, _: log.record("id_tap", v), i) * 0, "hostcall"),
    "jax_debug": (lambda log, i: jax.debug.callback(
        _tap(log, "jax_debug"), i), None),
    "jax_io_ordered": (lambda log, i: jax_io_callback(
        _tap(log, "jax_io_ordered"), None, i, ordered=True), "io"),
    "jax_print": (lambda log, i: jax.debug.print("jax_print {}", i), None),
    "run_log": (lambda log, i: log.metrics_run().log({"v": i}), None),
}
PRINTED = ("print", "jax_print")


def _step_calls(log, names, i):
  """The host calls ``names`` for step ``i`` (a traced int32); their
  results summed as a float32 for the carry."""
  total = jnp.float32(0)
  for name in names:
    out = CALLS[name][0](log, i)
    if out is not None:
      total = total + jnp.asarray(out, jnp.float32)
  return total


# (The carry changes each step, as a real loop's does: where nothing the
# loop computes changes, XLA may run the unordered calls of a chunk of
# hostcall's loops before the chunks it follows; docs/compatibility.md.)
def _scan_step(log, names):
  def step(c, i):
    return c + i.astype(jnp.float32) + _step_calls(log, names, i), i * 2
  return step


def _while_body(log, names):
  def body(state):
    i, c = state
    return i + 1, c + i.astype(jnp.float32) + _step_calls(log, names, i)
  return body


def _quiet(**kw):
  return dict(file=io.StringIO(), **kw)


#: What hostcall offers in place of ``lax.scan``: ``(f, init, xs)``, and
#: the options of the ``lax.scan`` it is compared with (JAX's own unrolled
#: scan runs unordered calls of unrolled steps in any order).
SCANS = {
    "hostcall.scan": (lambda f, c, xs: hostcall.scan(f, c, xs), {}),
    "hostcall.scan every=1": (lambda f, c, xs: hostcall.scan(
        f, c, xs, every=1), {}),
    "hostcall.scan every=2": (lambda f, c, xs: hostcall.scan(
        f, c, xs, every=2), {}),
    "hostcall.scan unroll=2": (lambda f, c, xs: hostcall.scan(
        f, c, xs, unroll=2, every=3), {"unroll": 2}),
    "hostcall.scan reverse": (lambda f, c, xs: hostcall.scan(
        f, c, xs, reverse=True, every=2), {"reverse": True}),
    "progress.scan": (lambda f, c, xs: progress.scan(f, c, xs, **_quiet()),
                      {}),
    "progress.scan every=2": (lambda f, c, xs: progress.scan(
        f, c, xs, **_quiet(every=2)), {}),
    "progress.scan reverse": (lambda f, c, xs: progress.scan(
        f, c, xs, reverse=True, **_quiet(every=2)), {"reverse": True}),
}

#: ``lax.while_loop`` and what hostcall offers in its place.
WHILES = {
    "progress.while_loop": lambda c, b, s: progress.while_loop(
        c, b, s, **_quiet()),
    "progress.while_loop every=2": lambda c, b, s: progress.while_loop(
        c, b, s, **_quiet(every=2)),
    "control.while_loop time_limit": lambda c, b, s: control.while_loop(
        c, b, s, time_limit=1e6).value,
    "control.while_loop stop_when": lambda c, b, s: control.while_loop(
        c, b, s, every=2, stop_when=lambda status: False).value,
    "control.while_loop interruptible": lambda c, b, s: control.while_loop(
        c, b, s, interruptible=True).value,
}

#: The mixtures of calls a step makes.
MIXTURES = [
    ("io_live_ordered", "io_tap_ordered"),  # issue 52's first finding
    ("io_tap_ordered", "io_live_ordered", "debug"),
    ("io_live", "io_tap", "debug", "print"),
    ("id_tap", "debug", "print"),
    ("pure", "io_tap_ordered", "jax_io_ordered"),
    ("jax_debug", "jax_print", "io_tap"),
    ("debug_ordered", "print"),
    ("io_tap_ordered", "id_tap", "debug"),
    ("run_log", "print", "io_tap_ordered"),
    ("run_log", "io_live", "jax_debug"),
    ("run_log", "run_log", "print"),  # two rows a step share the run's steps
]
STEPS = 5


def _compare(reference, subject, names, sites_in_order=True):
  """The host saw the same under ``subject`` as under ``reference``: each
  ``(events, printed lines, result or error)``; with ``sites_in_order``,
  each call site's calls in step order (not so in an unrolled loop, where
  JAX's own scan runs the unordered calls of unrolled steps in any order)."""
  (events, lines, out), (s_events, s_lines, s_out) = reference, subject
  assert collections.Counter(s_events) == collections.Counter(events)
  for site in {s for s, _ in events} if sites_in_order else ():
    assert ([e for e in s_events if e[0] == site]
            == [e for e in events if e[0] == site]), site
  # The ordered calls of each token in program order.
  tokens = {n: CALLS[n][1] if n in CALLS else "hostcall" for n in names}
  for token in set(tokens.values()) - {None}:
    sites = {n for n in names if tokens[n] == token}
    assert ([e for e in s_events if e[0] in sites]
            == [e for e in events if e[0] in sites]), token
  assert sorted(s_lines) == sorted(lines)
  for prefix in PRINTED if sites_in_order else ():
    assert ([x for x in s_lines if x.startswith(prefix + " ")]
            == [x for x in lines if x.startswith(prefix + " ")])
  if isinstance(out, BaseException):
    # The error's last line: the host function's exception. (Before it,
    # the runtime's text holds a traceback, through the construct's own
    # frames.)
    words = lambda e: str(e).strip().splitlines()[-1]  # noqa: E731
    assert type(s_out) is type(out) and words(s_out) == words(out)
  else:
    jax.tree_util.tree_map(np.testing.assert_array_equal, s_out, out)


def _observe(run, log, sync=None):
  """``run()`` with stdout captured, then JAX's sync point ``sync(out)``:
  ``(events, printed lines, result or the exception raised)``."""
  log.events.clear()
  rows = len(log.rows())
  buffer = io.StringIO()
  with contextlib.redirect_stdout(buffer):
    try:
      out = run()
      (sync or _effects_barrier)(out)
    except Exception as exc:  # noqa: BLE001 - compared with JAX's
      out = exc
    jax.effects_barrier()
  return (list(log.events) + log.rows()[rows:],
          buffer.getvalue().splitlines(),
          out if isinstance(out, BaseException) else jax.device_get(out))


def _effects_barrier(out):
  del out
  jax.effects_barrier()


def _in_jit(loop):
  return lambda: jax.jit(loop)()


def _scan_case(log, names, construct):
  """JAX's ``lax.scan`` and ``construct`` on the same step: both views."""
  xs = jnp.arange(STEPS, dtype=jnp.int32)
  step = _scan_step(log, names)
  loop, options = SCANS[construct]
  reference = _observe(_in_jit(lambda: lax.scan(step, jnp.float32(0), xs,
                                                **options)), log)
  subject = _observe(_in_jit(lambda: loop(step, jnp.float32(0), xs)), log)
  return reference, subject


@pytest.mark.parametrize("names", MIXTURES, ids="+".join)
@pytest.mark.parametrize("construct", list(SCANS))
def test_scan_constructs_see_what_lax_scan_sees(construct, names):
  log = Log()
  _compare(*_scan_case(log, names, construct), names,
           sites_in_order="unroll" not in construct)


def _while_case(log, names, construct):
  """JAX's ``lax.while_loop`` and ``construct`` on the same body: both
  views."""
  body = _while_body(log, names)
  cond = lambda s: s[0] < STEPS  # noqa: E731
  init = (jnp.int32(0), jnp.float32(0))
  reference = _observe(_in_jit(lambda: lax.while_loop(cond, body, init)),
                       log)
  subject = _observe(_in_jit(lambda: WHILES[construct](cond, body, init)),
                     log)
  return reference, subject


@pytest.mark.parametrize("names", MIXTURES, ids="+".join)
@pytest.mark.parametrize("construct", list(WHILES))
def test_while_constructs_see_what_lax_while_loop_sees(construct, names):
  log = Log()
  _compare(*_while_case(log, names, construct), names)


@pytest.mark.parametrize("names", MIXTURES[:4], ids="+".join)
def test_progress_fori_loop_sees_what_lax_fori_loop_sees(names):
  log = Log()
  body = lambda i, c: c + i + _step_calls(log, names, i)  # noqa: E731
  reference = _observe(_in_jit(lambda: lax.fori_loop(
      0, STEPS, body, jnp.float32(0))), log)
  subject = _observe(_in_jit(lambda: progress.fori_loop(
      0, STEPS, body, jnp.float32(0), **_quiet())), log)
  _compare(reference, subject, names)


# A host function failing at a step: JAX's construct stops there, and
# raises the failing call's error; hostcall's must too. (An unordered call
# fails alone in its step: its order against another call is JAX's to
# choose, so which of them ran before the failure is too; JAX 0.12 and
# 0.10 choose differently.)
FAILING = [
    (("io_live_ordered", "io_tap_ordered"), ("io_live_ordered", 2)),
    (("io_live_ordered", "io_tap_ordered"), ("io_tap_ordered", 3)),
    (("io_live",), ("io_live", 2)),
    (("io_tap_ordered", "io_live_ordered"), ("io_live_ordered", 3)),
    # Buffered: the chunk's calls are replayed up to the failing one.
    (("io_tap_ordered",), ("io_tap_ordered", 2)),
    (("debug",), ("debug", 3)),
    (("io_tap",), ("io_tap", 1)),
]


@pytest.mark.parametrize("names,fail_at", FAILING,
                         ids=lambda v: "+".join(map(str, v)))
@pytest.mark.parametrize("construct", ["hostcall.scan", "hostcall.scan "
                                       "every=2", "progress.scan"])
def test_a_failing_call_stops_the_scan_where_lax_scan_stops(construct, names,
                                                             fail_at):
  log = Log()
  log.fail_at = fail_at
  reference, subject = _scan_case(log, names, construct)
  assert isinstance(reference[2], Exception)
  _compare(reference, subject, names)


@pytest.mark.parametrize("construct", ["hostcall.scan", "hostcall.scan "
                                       "every=2", "progress.scan"])
def test_backward_pass_calls_match_lax_scans(construct):
  # grad_callback's calls (the backward pass, last step first) and the
  # forward pass's calls of a differentiated loop, as under lax.scan.
  log = Log()

  def step(c, i):
    c = hostcall.grad_callback(lambda ct, k: log.record(
        "grad", 1000 * int(k) + int(np.asarray(ct) * 10)), c, i)
    hostcall.debug_callback(_tap(log, "debug"), i)
    return jnp.sin(c) * 1.5, None

  loop, options = SCANS[construct]
  xs = jnp.arange(STEPS, dtype=jnp.int32)
  grad = lambda scan: jax.jit(jax.grad(  # noqa: E731
      lambda c: scan(step, c, xs)[0]))(jnp.float32(0.5))
  reference = _observe(lambda: grad(functools.partial(lax.scan, **options)),
                       log)
  subject = _observe(lambda: grad(loop), log)
  assert [e[1] // 1000 for e in reference[0] if e[0] == "grad"] == [
      4, 3, 2, 1, 0]
  _compare(reference, subject, ("grad", "debug"))  # (grad: ordered)


# ---------------------------------------------------------------------------
# jax.jit against hostcall.jit: a Python loop over a jitted step, then one
# of JAX's sync points.

#: JAX's sync points after a loop of steps, and what hostcall.jit keeps of
#: them: "all" (every call has run, as under jax.jit), or "live" (the calls
#: whose results the program uses have run; a call hostcall.jit takes out of
#: the program is delivered after it, by the next jax.effects_barrier() or
#: hostcall.barrier(): docs/compatibility.md).
SYNC_POINTS = {
    "jax.effects_barrier": (lambda out: jax.effects_barrier(), "all"),
    "hostcall.barrier": (lambda out: hostcall.barrier(), "all"),
    "block_until_ready": (lambda out: jax.block_until_ready(out), "live"),
    "jax.device_get": (lambda out: jax.device_get(out), "live"),
    "np.asarray": (lambda out: np.asarray(out), "live"),
}

JIT_MIXTURES = [
    ("debug", "print", "run_log"),
    ("jax_debug", "jax_print"),
    ("io_tap_ordered", "jax_io_ordered", "io_tap"),
    ("io_live_ordered", "io_tap_ordered"),
    ("id_tap", "debug_ordered"),
]


def _python_loop(jit, log, names, steps=STEPS):
  @jit
  def step(c, i):
    return c + _step_calls(log, names, i), i + 1

  def run():
    c, i = jnp.float32(0), jnp.int32(0)
    for _ in range(steps):
      c, i = step(c, i)
    return c
  return run


def _observe_sync(run, log, sync):
  """``_observe`` where the events are read right after the sync point
  (and the rest after an effects barrier)."""
  log.events.clear()
  rows = len(log.rows())
  buffer = io.StringIO()
  with contextlib.redirect_stdout(buffer):
    out = run()
    sync(out)
    at_sync = (list(log.events) + log.rows()[rows:],
               buffer.getvalue().splitlines())
  jax.effects_barrier()
  return at_sync, (list(log.events) + log.rows()[rows:],
                   buffer.getvalue().splitlines(), jax.device_get(out))


@pytest.mark.parametrize("names", JIT_MIXTURES, ids="+".join)
@pytest.mark.parametrize("sync", list(SYNC_POINTS))
def test_hostcall_jit_keeps_jaxs_sync_points(jit_route, sync, names):
  log = Log()
  wait, keeps = SYNC_POINTS[sync]
  (ref_events, ref_lines), reference = _observe_sync(
      _python_loop(jax.jit, log, names), log, wait)
  (events, lines), subject = _observe_sync(
      _python_loop(hostcall.jit, log, names), log, wait)
  _compare(reference, subject, names)
  assert collections.Counter(ref_events) == collections.Counter(reference[0])
  if keeps == "all":
    assert collections.Counter(events) == collections.Counter(ref_events)
    assert sorted(lines) == sorted(ref_lines)
  else:  # what had run by then is a part of it, each site in order
    assert not collections.Counter(events) - collections.Counter(ref_events)
    live = [e for e in ref_events if e[0].startswith("io_live")]
    assert [e for e in events if e[0].startswith("io_live")] == live


def test_prints_under_hostcall_jit_go_where_stdout_was_at_the_call(jit_route):
  # Also a jax.debug.print whose format reads JAX's arrays themselves
  # (their repr), which JAX's own formatting writes.
  def program(jit):
    @jit
    def step(w):
      jax.debug.print("jax {}", w.sum())
      hostcall.debug_print("hostcall {}", w.sum())
      jax.debug.print("repr {!r}", w.sum())
      return w + 1
    return step

  captured = {}
  for name, jit in (("jax.jit", jax.jit), ("hostcall.jit", hostcall.jit)):
    step, inside, w = program(jit), io.StringIO(), jnp.ones(4)
    with contextlib.redirect_stdout(inside):
      for _ in range(50):
        w = step(w)
    outside = io.StringIO()
    with contextlib.redirect_stdout(outside):
      w = step(w)  # printed after the block: not in it
      jax.effects_barrier()
    captured[name] = (inside.getvalue(), outside.getvalue())
  assert captured["hostcall.jit"] == captured["jax.jit"]
  inside, outside = captured["jax.jit"]
  assert len(inside.splitlines()) == 150 and len(outside.splitlines()) == 3
  assert "repr Array(204., dtype=float32)" in outside


def test_jax_effects_barrier_waits_for_every_deferred_call(jit_route):
  seen = []

  def program(jit):
    @jit
    def step(w):
      jax.debug.callback(lambda total: seen.append(float(total)), w.sum())
      return w * 1.0001
    return step

  counts = {}
  for name, jit in (("jax.jit", jax.jit), ("hostcall.jit", hostcall.jit)):
    seen.clear()
    step, w = program(jit), jnp.ones(16)
    for _ in range(500):
      w = step(w)
    w.block_until_ready()
    jax.effects_barrier()
    counts[name] = (len(seen), seen[-1])
  assert counts["hostcall.jit"] == counts["jax.jit"]
  assert counts["jax.jit"][0] == 500


def test_an_effects_barrier_in_a_host_function_does_not_wait_for_itself(
    jit_route):
  seen = []

  def host(v):
    jax.effects_barrier()  # JAX allows it; here it must not deadlock
    seen.append(int(v))

  step = hostcall.jit(lambda i: (hostcall.debug_callback(host, i), i + 1)[1])
  i = jnp.int32(0)
  for _ in range(3):
    i = step(i)
  jax.effects_barrier()
  assert seen == [0, 1, 2]


# ---------------------------------------------------------------------------
# Random programs: a construct, a mixture of calls and a sync point drawn
# at random; the same rule.

_NAMES = sorted(CALLS)


def _random_case(draw_names, construct_kind, construct):
  log = Log()
  names = tuple(draw_names)
  case = _scan_case if construct_kind == "scan" else _while_case
  _compare(*case(log, names, construct), names,
           sites_in_order="unroll" not in construct)


_CONSTRUCTS = ([("scan", c) for c in SCANS]
               + [("while", c) for c in WHILES])


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(_NAMES), min_size=1, max_size=4),
       construct=st.sampled_from(_CONSTRUCTS))
def test_random_programs_see_what_jaxs_constructs_see(names, construct):
  _random_case(names, *construct)


@pytest.mark.heavy
@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.sampled_from(_NAMES), min_size=1, max_size=6),
       construct=st.sampled_from(_CONSTRUCTS))
def test_longer_random_programs_see_what_jaxs_constructs_see(names,
                                                              construct):
  _random_case(names, *construct)


@pytest.mark.heavy
@pytest.mark.parametrize("names", [p for p in itertools.combinations(
    [n for n in _NAMES if n not in ("pure",)], 2)], ids="+".join)
@pytest.mark.parametrize("construct", ["hostcall.scan every=2",
                                       "progress.scan",
                                       "control.while_loop time_limit"])
def test_every_pair_of_calls(construct, names):
  _random_case(names, "scan" if construct in SCANS else "while", construct)


# ---------------------------------------------------------------------------
# The same harness where every call takes JAX's callback path into the
# native queue (HOSTCALL_NATIVE=0, read at import: a fresh process).


@pytest.mark.heavy
def test_the_harness_holds_with_hostcall_native_0():
  here = pathlib.Path(__file__).parent
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       "-m", "not heavy", f"{here / 'test_drop_in.py'}"],
      capture_output=True, text=True, timeout=900, cwd=here.parent,
      env=dict(os.environ, HOSTCALL_NATIVE="0"))
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
  assert " passed" in proc.stdout


# A program's calls at exit: the process ends without a barrier, right
# after the loop; every call JAX's construct would have made is made, its
# lines printed, under hostcall's construct too.
_EXIT_PROGRAM = """
import sys, jax, jax.numpy as jnp, hostcall
from jax import lax
construct = sys.argv[1]
jit = hostcall.jit if construct == "hostcall.jit" else jax.jit
loop = {"lax.scan": lax.scan, "hostcall.scan": hostcall.scan,
        "progress.scan": lambda f, c, xs: hostcall.progress.scan(
            f, c, xs, file=open("/dev/null", "w"))}.get(construct, lax.scan)

@jit
def step(c, xs):
  def body(c, i):
    jax.debug.print("jax_print {}", i)
    hostcall.debug_print("print {}", i)
    hostcall.io_callback(lambda v: print("io", int(v)), None, i,
                         ordered=True)
    return c + i, None
  return loop(body, c, xs)[0]

c = 0
for k in range(3):
  c = step(c, jnp.arange(4) + 4 * k)
"""


@pytest.mark.parametrize("construct", ["hostcall.jit", "hostcall.scan",
                                       "progress.scan"])
def test_every_call_is_made_by_program_exit(construct):
  def run(name):
    proc = subprocess.run([sys.executable, "-c", _EXIT_PROGRAM, name],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()

  reference, subject = run("jax.jit"), run(construct)
  assert len(reference) == 36
  assert sorted(subject) == sorted(reference)
  for prefix in ("jax_print ", "print ", "io "):
    assert ([x for x in subject if x.startswith(prefix)]
            == [x for x in reference if x.startswith(prefix)])

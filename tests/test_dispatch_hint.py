"""The one-time hint that a ``jax.jit`` program with host calls is called
from a Python loop (``hostcall.SlowDispatchWarning``): given where
``hostcall.jit`` would make the loop fast, at the user's line, once; never
where the program is fast already or ``hostcall.jit`` could not help."""

import logging
import sys
import types
import warnings

import jax
import jax.numpy as jnp
import pytest

import hostcall
from hostcall import host_callback as hcb
from hostcall._runtime import dispatch_hint

CALLS = 3 * dispatch_hint.CHECK


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
  """Each test starts as a process that gave no hint, hints on, and any
  loop of this box's speed counting as one over a small step (the hint's
  own spacing is tested on a clock of its own, below)."""
  monkeypatch.setattr(dispatch_hint, "_given", False)
  monkeypatch.delenv("HOSTCALL_HINTS", raising=False)
  monkeypatch.setattr(dispatch_hint, "SPACING", 1.0)


def _noop(*args):
  del args


def _loop(f, calls=CALLS, ignored=False):
  """Calls ``f`` from a Python loop; returns its line and the hints
  (``ignored``: the hints filtered out)."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if ignored:
      warnings.filterwarnings("ignore",
                              category=hostcall.SlowDispatchWarning)
    x = jnp.float32(1)
    line = sys._getframe().f_lineno + 2
    for _ in range(calls):
      x = f(x)
    hostcall.barrier()
  return line, [w for w in caught
                if issubclass(w.category, hostcall.SlowDispatchWarning)]


def _printing():
  """A new step each time: JAX keeps a function's compiled program (and
  the tally its lowering made) across its jax.jit wrappers."""
  def step(x):
    hostcall.debug_callback(_noop, x)
    return x + 1
  return step


def test_a_python_loop_over_a_jax_jit_step_with_a_host_call_is_told_once():
  line, hints = _loop(jax.jit(_printing()))
  assert len(hints) == 1
  hint = hints[0]
  assert (hint.filename, hint.lineno) == (__file__, line)  # the user's call
  text = str(hint.message)
  assert text.startswith(f"the jax.jit program called here ran "
                         f"{dispatch_hint.CHECK} times in ")
  assert "(hostcall.debug_callback)" in text
  assert "from a Python loop" in text
  assert "write @hostcall.jit where this function is jitted" in text
  assert "HOSTCALL_HINTS=0" in text and "SlowDispatchWarning" in text
  # Once a process: another program, another loop, no second hint.
  assert _loop(jax.jit(_printing()))[1] == []


def test_queued_calls_count_too_a_metrics_row_a_step():
  run = hostcall.metrics.Run("hint", writers=["memory"])

  def step(x):
    run.log({"x": x})      # queued (asynchronous): counted as delivered
    hcb.id_tap(_noop, x, delivery="async")
    return x + 1

  _, hints = _loop(jax.jit(step))
  run.close()
  assert len(hints) == 1 and "metrics.Run('hint').log" in str(
      hints[0].message)
  assert len(run.records()) == CALLS


@pytest.mark.parametrize("why", [
    "hostcall.jit", "a few calls", "calls inside one program's loop",
    "a result the program reads", "called outside jit", "HOSTCALL_HINTS=0",
    "a slow step"])
def test_no_hint_where_the_program_is_fast_or_hostcall_jit_cannot_help(
    why, monkeypatch):
  step = _printing()
  f, calls = jax.jit(step), CALLS
  if why == "hostcall.jit":
    f = hostcall.jit(_printing())
  elif why == "a few calls":
    calls = dispatch_hint.CHECK
  elif why == "calls inside one program's loop":
    f = jax.jit(lambda x: jax.lax.fori_loop(
        0, CALLS, lambda i, c: step(c), x))
    calls = 1
  elif why == "a result the program reads":
    # hostcall.jit would keep this program as it is: no faster there.
    f = jax.jit(lambda x: step(hostcall.pure_callback(
        lambda v: v, jax.ShapeDtypeStruct((), jnp.float32), x)))
  elif why == "called outside jit":
    f = lambda x: hcb.id_tap(_noop, x)  # noqa: E731 - a one-call program each
  elif why == "HOSTCALL_HINTS=0":
    monkeypatch.setenv("HOSTCALL_HINTS", "0")
  else:  # a step that takes longer than the spacing the hint looks for
    monkeypatch.setattr(dispatch_hint, "SPACING", 1e-9)
  assert _loop(f, calls)[1] == []
  assert not dispatch_hint._given


def test_a_warnings_filter_silences_it_and_an_error_filter_fails_nothing(
    caplog):
  assert _loop(jax.jit(_printing()), ignored=True)[1] == []
  assert dispatch_hint._given  # given, and filtered out
  dispatch_hint._given = False
  with warnings.catch_warnings():
    warnings.simplefilter("error", hostcall.SlowDispatchWarning)
    with caplog.at_level(logging.WARNING, logger="hostcall"):
      f = jax.jit(_printing())
      x = jnp.float32(1)
      for _ in range(CALLS):
        x = f(x)         # the delivery that gives the hint does not fail
      hostcall.barrier()
  assert float(x) == 1 + CALLS
  said = [r.getMessage() for r in caplog.records]
  assert len(said) == 1 and "SlowDispatchWarning: the jax.jit program" in (
      said[0])


class _Module:
  """Stands for a lowered program's module."""


def _clocked_tally(monkeypatch, times):
  """A tally whose clock reads ``times`` in turn; its hints, recorded."""
  clock = iter(times)
  monkeypatch.setattr(dispatch_hint, "time",
                      types.SimpleNamespace(monotonic=lambda: next(clock)))
  given = []
  monkeypatch.setattr(dispatch_hint, "_give",
                      lambda tally, runs, seconds: given.append(
                          (runs, round(seconds, 6))))
  program = dispatch_hint.Program(_Module(), ("f.py", 1))
  return dispatch_hint.Tally(program, "a call"), given


@pytest.mark.parametrize("seconds,hinted", [(0.099, True), (0.101, False)])
def test_the_hint_needs_check_runs_closer_than_the_spacing(
    monkeypatch, seconds, hinted):
  monkeypatch.setattr(dispatch_hint, "SPACING", 1e-3)
  # The first run starts the clock (compiling is not a step); the check
  # comes CHECK runs later.
  tally, given = _clocked_tally(monkeypatch, [5.0, 5.0 + seconds, 99.0])
  for _ in range(dispatch_hint.CHECK):
    tally.add()
  assert given == []
  tally.add()
  assert given == ([(dispatch_hint.CHECK, seconds)] if hinted else [])
  for _ in range(dispatch_hint.CHECK):  # once given, no clock is read
    tally.add()
  assert tally.check_at == (float("inf") if hinted else
                            3 * dispatch_hint.CHECK + 1)


def test_a_program_hostcall_jit_would_keep_never_hints():
  program = dispatch_hint.Program(_Module(), ("f.py", 1))
  tally = dispatch_hint.Tally(program, "a call")
  program.kept = True     # a program hostcall.jit would keep: never hints
  tally.add(5 * dispatch_hint.CHECK)
  assert tally.check_at == float("inf") and not dispatch_hint._given

"""Drop-in fidelity: the same program with JAX's callback and with hostcall's,
in one test, with the same results, host calls, errors and words."""

import contextlib
import functools
import io
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import io_callback as jax_io_callback

import hostcall
from hostcall import host_callback as hcb

F32 = jax.ShapeDtypeStruct((), jnp.float32)
PAIR = (jax.ShapeDtypeStruct((2,), jnp.float32),
        jax.ShapeDtypeStruct((), jnp.int32))

PURE = {"jax": jax.pure_callback, "hostcall": hostcall.pure_callback}
IO = {"jax": jax_io_callback, "hostcall": hostcall.io_callback}
DEBUG = {"jax": jax.debug.callback, "hostcall": hostcall.debug_callback}
PRINT = {"jax": jax.debug.print, "hostcall": hostcall.debug_print}


def _both(impls, program):
  """``program(impl)`` for JAX's and hostcall's; returns both outcomes."""
  outcomes = {}
  for name, impl in impls.items():
    try:
      outcomes[name] = ("ok", program(impl))
    except Exception as exc:  # noqa: BLE001 - the outcome is compared
      outcomes[name] = ("error", type(exc), str(exc))
    jax.effects_barrier()
    hostcall.barrier()
  return outcomes["jax"], outcomes["hostcall"]


def _printed(fn):
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    fn()
    jax.effects_barrier()
    hostcall.barrier()
  return out.getvalue()


# --- results: leaves, not pytree structure -----------------------------------

@pytest.mark.parametrize("returned", [
    lambda x: [x * 2, np.int32(3)],             # a list where a tuple is declared
    lambda x: [[x * 2], [np.int32(3)]],         # nested lists
    lambda x: {"a": x * 2, "b": np.int32(3)},   # a dict: leaves in key order
])
@pytest.mark.parametrize("flavour", ["pure", "io"])
def test_results_are_matched_leaf_by_leaf_like_jax(returned, flavour):
  impls = PURE if flavour == "pure" else IO
  program = lambda impl: jax.tree_util.tree_map(
      np.asarray, jax.jit(lambda x: impl(returned, PAIR, x))(jnp.ones(2)))
  ours, theirs = _both(impls, program)
  assert ours[0] == theirs[0] == "ok"
  np.testing.assert_array_equal(ours[1][0], theirs[1][0])
  assert int(ours[1][1]) == int(theirs[1][1]) == 3


@pytest.mark.parametrize("flavour", ["pure", "io"])
def test_wrong_number_of_results_has_jax_words(flavour):
  impls = PURE if flavour == "pure" else IO
  jax_out, ours = _both(impls, lambda impl: jax.jit(
      lambda x: impl(lambda v: (v, v, v), PAIR, x))(jnp.ones(2)))
  for outcome in (jax_out, ours):
    assert outcome[0] == "error"
    assert ("Mismatched number of outputs from callback. Expected: 2, "
            "Actual: 3") in outcome[2]


@pytest.mark.parametrize("flavour", ["pure", "io"])
def test_wrong_dtype_has_jax_words_and_the_fix(flavour):
  impls = PURE if flavour == "pure" else IO
  program = lambda impl: jax.jit(lambda x: impl(
      lambda v: v.astype(np.int32), jax.ShapeDtypeStruct((2,), jnp.float32),
      x))(jnp.ones(2))
  jax_out, ours = _both(impls, program)
  words = ("Incorrect output dtype for return value #0: Expected: float32, "
           "Actual: int32")
  assert words in jax_out[2] and words in ours[2]
  assert "np.asarray(r, np.float32)" in ours[2]


@pytest.mark.parametrize("flavour", ["pure", "io"])
def test_wrong_shape_has_jax_words(flavour):
  impls = PURE if flavour == "pure" else IO
  program = lambda impl: jax.jit(lambda x: impl(
      lambda v: v[:1], jax.ShapeDtypeStruct((2,), jnp.float32),
      x))(jnp.ones(2))
  jax_out, ours = _both(impls, program)
  words = ("Incorrect output shape for return value #0: Expected: (2,), "
           "Actual: (1,)")
  assert words in jax_out[2] and words in ours[2]


@pytest.mark.parametrize("declared", [
    jax.ShapeDtypeStruct((), np.float64),
    jax.ShapeDtypeStruct((3,), np.int64),
    (F32, jax.ShapeDtypeStruct((), np.uint64)),
    np.zeros((), np.float64),
])
@pytest.mark.parametrize("flavour", ["pure", "io"])
def test_64_bit_declarations_are_refused_without_x64_like_jax(declared,
                                                              flavour):
  assert not jax.config.jax_enable_x64
  impls = PURE if flavour == "pure" else IO
  calls = []
  jax_out, ours = _both(impls, lambda impl: jax.jit(
      lambda x: impl(lambda v: calls.append(v), declared, x))(1.0))
  for outcome in (jax_out, ours):
    assert outcome[:2] == ("error", ValueError)
    assert ("cannot specify 64-bit types when `jax_enable_x64` is disabled"
            in outcome[2])
  assert calls == []


def test_64_bit_results_are_narrowed_without_x64_like_jax():
  for impl in PURE.values():
    out = jax.jit(lambda x: impl(lambda v: np.float64(2.5), F32, x))(1.0)
    assert out.dtype == jnp.float32 and float(out) == 2.5


def test_shape_description_that_is_not_one_is_refused_like_jax():
  for name, impl in PURE.items():
    with pytest.raises(Exception) as info:
      jax.jit(lambda x: impl(lambda v: v, (3,), x))(jnp.ones(3))
    if name == "hostcall":
      assert info.type is ValueError
      assert "jax.ShapeDtypeStruct((3,), dtype)" in str(info.value)


def test_python_numbers_are_converted_where_no_value_changes():
  # hostcall's extra: JAX refuses a Python int for a float32 result.
  f = lambda ret, decl: jax.jit(lambda x: hostcall.pure_callback(
      lambda v: ret, decl, x))(1.0)
  assert float(f(3, F32)) == 3.0
  np.testing.assert_array_equal(
      f([1, 2], jax.ShapeDtypeStruct((2,), jnp.float32)), [1.0, 2.0])
  with pytest.raises(Exception, match="would change their value"):
    f(2.5, jax.ShapeDtypeStruct((), jnp.int32))
  with pytest.raises(Exception, match="does not fit in int8"):
    f(300, jax.ShapeDtypeStruct((), jnp.int8))
  with pytest.raises(Exception, match="ragged"):
    f([[1, 2], [3]], jax.ShapeDtypeStruct((2, 2), jnp.float32))


def test_big_endian_result_is_accepted():
  out = jax.jit(lambda x: hostcall.pure_callback(
      lambda v: np.asarray(v, ">f4") * 2, jax.ShapeDtypeStruct((2,), jnp.float32),
      x))(jnp.ones(2))
  np.testing.assert_array_equal(out, [2.0, 2.0])


# --- failures: logged with the flavour's name and the traceback --------------

@pytest.mark.parametrize("flavour,impls,label", [
    ("pure", PURE, "pure_callback failed"),
    ("io", IO, "io_callback failed"),
])
def test_failing_host_function_is_logged_with_its_traceback(flavour, impls,
                                                            label, caplog):
  def broken(v):
    raise KeyError("missing-key")

  for name, impl in impls.items():
    caplog.clear()
    with caplog.at_level(logging.ERROR):
      with pytest.raises(Exception, match="missing-key"):
        jax.jit(lambda x: impl(broken, F32, x))(1.0)
    records = [r for r in caplog.records if r.levelno == logging.ERROR]
    text = "\n".join(r.getMessage() + (
        "\n" + logging.Formatter().formatException(r.exc_info)
        if r.exc_info else "") for r in records)
    assert label in text, name
    assert "Traceback" in text and "in broken" in text, name


def test_debug_callback_failure_is_logged_like_jax(caplog):
  def broken(v):
    raise KeyError("debug-key")

  with caplog.at_level(logging.ERROR):
    with pytest.raises(Exception, match="debug-key"):
      jax.jit(lambda x: hostcall.debug_callback(broken, x))(1.0)
  assert "jax.debug.callback failed" in caplog.text
  assert "in broken" in caplog.text


class _Records(logging.Handler):
  """Every record of every logger, as (logger, level, message, exception)."""

  def __init__(self):
    super().__init__(level=logging.DEBUG)
    self.records = []

  def emit(self, record):
    exc = record.exc_info[1] if record.exc_info else None
    self.records.append((record.name, record.levelname, record.getMessage(),
                         type(exc).__name__ if exc else None))


@pytest.mark.parametrize("impls,call,logger,message", [
    (PURE, lambda impl, f, x: impl(f, F32, x), "jax._src.callback",
     "jax.pure_callback failed"),
    (IO, lambda impl, f, x: impl(f, F32, x), "jax._src.callback",
     "jax.io_callback failed"),
    (IO, lambda impl, f, x: (impl(f, None, x), x)[1], "jax._src.callback",
     "jax.io_callback failed"),
    (DEBUG, lambda impl, f, x: (impl(f, x), x)[1], "jax._src.debugging",
     "jax.debug.callback failed"),
], ids=["pure", "io", "io-result-less", "debug"])
def test_a_failure_is_logged_with_jaxs_own_record(impls, call, logger,
                                                  message):
  # The same logger, level, message and exception type as JAX's record, so a
  # filter written for JAX's (equinox's filter_jit) also takes hostcall's;
  # once, with the logger and words docs/reliability.md names.
  def broken(v):
    raise KeyError("missing-key")

  seen = {}
  for name, impl in impls.items():
    handler = _Records()
    logging.getLogger().addHandler(handler)
    try:
      with pytest.raises(Exception, match="missing-key"):
        jax.jit(lambda x: call(impl, broken, x))(1.0)
    finally:
      logging.getLogger().removeHandler(handler)
    jax.effects_barrier()
    seen[name] = [r for r in handler.records if r[1] == "ERROR"]
  assert seen["hostcall"] == seen["jax"] == [
      (logger, "ERROR", message, "KeyError")]


def test_a_filter_written_for_jaxs_record_quiets_hostcalls():
  class QuietExpected(logging.Filter):  # as equinox's filter_jit installs
    def filter(self, record):
      return record.getMessage() != "jax.pure_callback failed"

  def broken(v):
    raise ValueError("expected failure")

  quiet, handler = QuietExpected(), _Records()
  logger = logging.getLogger("jax._src.callback")
  logger.addFilter(quiet)
  logging.getLogger().addHandler(handler)
  try:
    for impl in PURE.values():
      with pytest.raises(Exception, match="expected failure"):
        jax.jit(lambda x: impl(broken, F32, x))(1.0)
  finally:
    logger.removeFilter(quiet)
    logging.getLogger().removeHandler(handler)
  assert [r for r in handler.records if r[1] == "ERROR"] == []


def test_the_logged_traceback_starts_at_the_host_function_and_names_the_way_back(
    caplog):
  def broken(v):
    raise KeyError("missing-key")

  with caplog.at_level(logging.ERROR):
    with pytest.raises(Exception, match="missing-key"):
      jax.jit(lambda x: hostcall.pure_callback(broken, F32, x))(1.0)
  record, = [r for r in caplog.records if r.levelno == logging.ERROR]
  text = logging.Formatter().formatException(record.exc_info)
  frames = [line for line in text.splitlines() if line.startswith("  File")]
  assert len(frames) == 1 and "in broken" in frames[0]
  assert ("the host function of hostcall.pure_callback raised KeyError: "
          "'missing-key'; `with hostcall.original_errors():`") in text


# --- io callbacks: never on a branch no element takes, never twice -----------

def test_io_callback_under_vmap_of_cond_runs_for_the_lanes_that_took_it():
  # JAX refuses; hostcall calls the host for the lanes that took the
  # branch, and for no other (docs/compatibility.md, differences).
  calls = []
  program = lambda impl: jax.vmap(lambda p, x: lax.cond(
      p, lambda x: (impl(lambda v: calls.append(float(v)), None, x), x)[1],
      lambda x: x, x))(jnp.array([True, False, True]), jnp.arange(3.0))
  jax_out, ours = _both(IO, program)
  assert jax_out[:2] == ("error", NotImplementedError)
  assert "IO effect not supported in vmap-of-cond" in jax_out[2]
  assert ours[0] == "ok"
  np.testing.assert_array_equal(ours[1], [0.0, 1.0, 2.0])
  assert calls == [0.0, 2.0]


def test_io_callback_with_results_under_vmap_of_cond_is_refused_like_jax():
  # Its branch would go on with its results for every lane (made-up ones
  # for lanes that did not take it, which could steer a loop there
  # forever): refused with JAX's words, as JAX refuses it.
  calls = []

  def walk(impl, x):
    step = impl(lambda v: (calls.append(1), np.float32(0.5))[1], F32, x)
    return lax.while_loop(lambda s: s < 10.0, lambda s: s + step, x)

  program = lambda impl: jax.jit(jax.vmap(lambda x: lax.cond(
      x > 0, lambda x: walk(impl, x), lambda x: x, x)))(jnp.array([1., -1.]))
  jax_out, ours = _both(IO, program)
  assert jax_out[:2] == ours[:2] == ("error", NotImplementedError)
  assert "IO effect not supported in vmap-of-cond" in ours[2]
  assert calls == []


def test_io_callback_under_vmap_of_cond_with_unbatched_predicate_too():
  calls = []
  program = lambda impl, p: jax.vmap(lambda p, x: lax.cond(
      p, lambda x: impl(lambda v: (calls.append(float(v)), v * 10)[1], F32,
                        x),
      lambda x: x, x), in_axes=(None, 0))(p, jnp.arange(2.0))
  jax_out, ours = _both(IO, lambda impl: program(impl, True))
  assert jax_out[:2] == ("error", NotImplementedError)
  assert ours[0] == "ok"
  np.testing.assert_array_equal(ours[1], [0.0, 10.0])
  assert calls == [0.0, 1.0]
  calls.clear()
  np.testing.assert_array_equal(program(hostcall.io_callback, False),
                                [0.0, 1.0])
  assert calls == []


def test_debug_callbacks_under_vmap_of_cond_see_only_the_lanes_that_took_it():
  # JAX's run for every lane (#19314); hostcall's for the lanes that took
  # the branch, each call site with its own lanes, under jit and nested
  # vmaps, in a switch, and in a jit inside a branch.
  seen = []
  record = lambda tag: lambda v: seen.append((tag, float(v)))

  def f(x):
    inner = jax.jit(lambda x: (hostcall.debug_callback(record("jit"), x),
                               x)[1])
    return lax.switch(jnp.int32(x) % 3, [
        lambda x: (hostcall.debug_callback(record("0"), x), x + 1)[1],
        lambda x: (hostcall.debug_print("one {}", x), x * 2)[1],
        lambda x: inner(x) - 1], x)

  xs = jnp.arange(6.0)
  out = jax.jit(jax.vmap(f))(xs)
  hostcall.barrier()
  np.testing.assert_array_equal(out, [1, 2, 1, 4, 8, 4])
  assert sorted(seen) == [("0", 0.0), ("0", 3.0), ("jit", 2.0), ("jit", 5.0)]
  seen.clear()
  out = jax.vmap(jax.vmap(f))(xs.reshape(2, 3))
  hostcall.barrier()
  np.testing.assert_array_equal(out.ravel(), [1, 2, 1, 4, 8, 4])
  assert sorted(seen) == [("0", 0.0), ("0", 3.0), ("jit", 2.0), ("jit", 5.0)]
  # The same program with JAX's own callback calls for every lane.
  jax_seen = []
  jax.vmap(lambda x: lax.cond(x > 1, lambda x: (jax.debug.callback(
      lambda v: jax_seen.append(float(v)), x), x)[1], lambda x: x, x))(xs)
  jax.effects_barrier()
  assert len(jax_seen) == 6


def test_a_vectorised_callback_under_vmap_of_cond_gets_the_batch_once():
  seen = []
  f = lambda x: lax.cond(x > 1, lambda x: hostcall.io_callback(
      lambda v: seen.append(v.tolist()), None, x,
      vmap_method="expand_dims"), lambda x: None, x)
  jax.vmap(f)(jnp.arange(4.0))
  jax.vmap(f)(jnp.arange(2.0))  # no lane takes it: no call
  hostcall.barrier()
  assert seen == [[0.0, 1.0, 2.0, 3.0]]


def _jax_refusal_in_checkpoint() -> str:
  """JAX's words refusing its io callback in ``checkpoint`` under grad, for
  a callback on a value not differentiated (whose JVP JAX does not refuse
  first); they change between JAX releases."""
  @jax.checkpoint
  def f(x, y):
    jax_io_callback(lambda v: v, F32, y)
    return x

  with pytest.raises(NotImplementedError) as refusal:
    jax.grad(f)(1.0, 2.0)
  return str(refusal.value)


@pytest.mark.parametrize("returns", [False, True])
def test_io_callback_in_checkpoint_under_grad_is_refused_like_jax(returns):
  calls = []

  def program(impl):
    @jax.checkpoint
    def f(x):
      y = impl(lambda v: (calls.append(1), v if returns else None)[1],
               F32 if returns else None, x)
      return jnp.sin(y if returns else x)
    return jax.grad(f)(1.0)

  jax_out, ours = _both(IO, program)
  assert jax_out[0] == ours[0] == "error"
  if returns:
    assert jax_out[1] is ours[1] is ValueError
    assert "IO callbacks do not support JVP." in ours[2]
  else:
    # hostcall runs a result-less io callback under grad (on primal values,
    # once) where JAX refuses any; under checkpoint it would run twice.
    assert ours[1] is NotImplementedError
    assert ours[2] == _jax_refusal_in_checkpoint()
  assert calls == []


@pytest.mark.parametrize("transform", ["jvp", "linearize"])
def test_io_callback_under_jvp_is_refused_before_it_runs(transform):
  calls = []

  def program(impl):
    f = lambda x: impl(lambda v: (calls.append(1), v)[1], F32, x)
    if transform == "jvp":
      return jax.jvp(f, (1.0,), (1.0,))
    return jax.linearize(f, 1.0)

  jax_out, ours = _both(IO, program)
  assert jax_out[:2] == ours[:2] == ("error", ValueError)
  assert "IO callbacks do not support JVP." in ours[2]
  assert calls == []


def test_io_callback_under_transposition_raises_value_error_like_jax():
  program = lambda impl: jax.linear_transpose(
      lambda x: impl(lambda v: v, F32, x), 1.0)(1.0)
  jax_out, ours = _both(IO, program)
  assert jax_out[0] == ours[0] == "error"
  assert jax_out[1] is ours[1] is ValueError


def test_pure_callback_under_transposition_raises_value_error_like_jax():
  program = lambda impl: jax.linear_transpose(
      lambda x: impl(lambda v: v, F32, x), 1.0)(1.0)
  jax_out, ours = _both(PURE, program)
  assert jax_out[0] == ours[0] == "error"
  assert jax_out[1] is ours[1]


def test_ordered_io_callbacks_of_jax_and_hostcall_share_one_order():
  log = []

  def f(x):
    jax_io_callback(lambda v: log.append(("jax", float(v))), None, x,
                    ordered=True)
    hostcall.io_callback(lambda v: log.append(("hostcall", float(v))), None,
                         x + 1, ordered=True)
    jax_io_callback(lambda v: log.append(("jax", float(v))), None, x + 2,
                    ordered=True)
    return x

  jax.jit(f)(0.0)
  jax.effects_barrier()
  assert log == [("jax", 0.0), ("hostcall", 1.0), ("jax", 2.0)]


# --- debug callbacks under checkpoint policies -------------------------------

@pytest.mark.parametrize("policy", [
    None,
    jax.checkpoint_policies.everything_saveable,
    jax.checkpoint_policies.nothing_saveable,
    jax.checkpoint_policies.save_anything_except_these_names("a", "b"),
    jax.checkpoint_policies.save_only_these_names("a"),
])
def test_debug_print_under_checkpoint_prints_as_often_as_jax(policy):
  def program(impl):
    @functools.partial(jax.checkpoint, policy=policy)
    def f(x):
      a = checkpoint_name(jnp.sin(x), "a")
      impl("a={}", a)
      return jnp.cos(a)
    return _printed(lambda: jax.grad(f)(1.0))

  jax_out, ours = _both(PRINT, program)
  assert jax_out == ours
  assert jax_out[1].count("a=") >= 1


def test_debug_callback_under_checkpoint_calls_as_often_as_jax():
  for policy in (jax.checkpoint_policies.everything_saveable,
                 jax.checkpoint_policies.save_anything_except_these_names(
                     "a", "b")):
    counts = {}
    for name, impl in DEBUG.items():
      calls = []

      @functools.partial(jax.checkpoint, policy=policy)
      def f(x):
        impl(lambda v: calls.append(float(v)), x)
        return jnp.sin(x)

      jax.grad(f)(1.0)
      jax.effects_barrier()
      counts[name] = calls
    assert counts["jax"] == counts["hostcall"]


# --- debug_print's text ------------------------------------------------------

@pytest.mark.parametrize("fmt,make", [
    ("{}", lambda x: ((x,), {})),
    ("{!r}", lambda x: ((x,), {})),
    ("{}", lambda x: (([x, x * 2],), {})),
    ("{x} and {y!r}", lambda x: ((), {"x": x, "y": (x, jnp.ones(2))})),
    ("{:.3f}", lambda x: ((x.astype(jnp.float32) / 3,), {})),
    ("{!r}", lambda x: ((jnp.arange(30.0).reshape(3, 10) * x,), {})),
    ("{!r}", lambda x: ((jnp.zeros((0, 3)),), {})),
    ("{}", lambda x: (({"a": x, "b": jnp.ones(2, jnp.bfloat16)},), {})),
    ("no placeholders", lambda x: ((x, x + 1), {})),
])
def test_debug_print_text_is_jaxs(fmt, make):
  def program(impl):
    def f(x):
      args, kwargs = make(x)
      impl(fmt, *args, **kwargs)
    return _printed(lambda: jax.jit(f)(jnp.int32(2)))
  jax_out, ours = _both(PRINT, program)
  assert jax_out == ours


def test_debug_print_accepts_skip_format_check():
  for impl in PRINT.values():
    out = _printed(lambda: jax.jit(lambda x: impl(
        "x:", x, skip_format_check=True))(jnp.int32(1)))
    assert out == "x: 1\n"


# --- the legacy module -------------------------------------------------------

def test_callback_flavor_is_accepted_everywhere_the_legacy_module_took_it():
  flavour = hcb.CallbackFlavor.PURE
  assert [f.name for f in hcb.CallbackFlavor] == ["IO_CALLBACK", "PURE",
                                                   "DEBUG"]
  out = jax.jit(lambda x: hcb.call(lambda v: v * 2, x, result_shape=x,
                                   callback_flavor=flavour))(2.0)
  assert float(out) == 4.0
  seen = []
  jax.jit(lambda x: hcb.id_tap(lambda v, t: seen.append(float(v)), x,
                               callback_flavor=flavour))(3.0)
  text = io.StringIO()
  jax.jit(lambda x: hcb.id_print(x, output_stream=text,
                                 callback_flavor=flavour))(4.0)
  hcb.barrier_wait()
  assert seen == [3.0] and text.getvalue() == "4.\n"


def test_call_under_vmap_has_the_legacy_words():
  with pytest.raises(NotImplementedError, match="batching rules are "
                     "implemented only for id_tap, not for call"):
    jax.vmap(lambda x: hcb.call(lambda v: v, x, result_shape=x))(jnp.ones(2))


def test_callback_exception_has_the_legacy_words():
  jax.jit(lambda x: hcb.id_tap(lambda v, t: 1 / 0, x))(1.0)
  with pytest.raises(hcb.CallbackException, match=r"^There were exceptions "
                     r"during callback processing\. Last one was: "
                     r"Traceback") as info:
    hcb.barrier_wait()
  assert "ZeroDivisionError" in str(info.value)
  assert "1 tap function call(s) raised since the last barrier" in str(
      info.value)


def test_debug_callback_of_a_linear_value_under_transposition_like_jax():
  # JAX's debug callback contributes no cotangent and is not called in the
  # transposed program.
  for name, impl in DEBUG.items():
    calls = []

    def f(x):
      impl(lambda v: calls.append(float(v)), x)
      return 2 * x

    ct = jax.linear_transpose(f, 1.0)(1.0)
    jax.effects_barrier()
    assert float(ct[0]) == 2.0 and calls == [], name


def test_gated_calls_under_nested_vmaps_see_their_own_lanes():
  # The predicate from the outer vmap, the operand from the inner one (the
  # gate comes after the inner level was recorded); and nested conds, the
  # lane having to take both branches, with a vectorised io callback.
  seen = []

  def f(a, b):
    return lax.cond(a > 0, lambda: (hostcall.debug_callback(
        lambda a, b: seen.append((float(a), float(b))), a, b), a + b)[1],
        lambda: a)

  out = jax.vmap(jax.vmap(f, in_axes=(None, 0)), in_axes=(0, None))(
      jnp.array([1.0, -1.0]), jnp.array([10.0, 20.0, 30.0]))
  hostcall.barrier()
  np.testing.assert_array_equal(out, [[11, 21, 31], [-1, -1, -1]])
  assert seen == [(1.0, 10.0), (1.0, 20.0), (1.0, 30.0)]
  seen.clear()

  def g(a, b):
    return lax.cond(a > 0, lambda: lax.cond(b > 0, lambda: (
        hostcall.io_callback(lambda v: seen.append(v.tolist()), None, a + b,
                             vmap_method="expand_dims"), a)[1],
        lambda: a), lambda: b)

  for b_rows, expected in (([[-1., -1., 1.], [1., 1., 1.]], 1),
                           ([[-1., -1., -1.], [1., 1., 1.]], 0)):
    seen.clear()
    jax.vmap(jax.vmap(g, in_axes=(None, 0)))(jnp.array([1.0, -1.0]),
                                             jnp.array(b_rows))
    hostcall.barrier()
    assert len(seen) == expected  # the whole batch once, if a lane took both

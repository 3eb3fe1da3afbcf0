"""Errors and warnings said once, in words that name the user's function
and line (issue 52): a host function's wrong result beside JAX's own
error for it; JAX's callbacks that hostcall.jit rewrites, named after the
user's function; a PRNG key print taken out; call_context()'s key for the
axis of a pmap without axis_name."""

import functools
import inspect
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback as jax_io_callback

import hostcall
from hostcall._core import hostcall_p
from hostcall._jit import jax_callbacks
from hostcall._jit import jitted as jit_module
from hostcall._runtime import errors

S2 = jax.ShapeDtypeStruct((2,), jnp.float32)
PURE = {"jax": jax.pure_callback, "hostcall": hostcall.pure_callback}
IO = {"jax": jax_io_callback, "hostcall": hostcall.io_callback}
SHAPE_WORDS = ("Incorrect output shape for return value #0: Expected: (2,), "
               "Actual: (3,)")


def returns_three(x):
  return np.zeros((3,), np.float32)


def _raised(program):
  with pytest.raises(Exception) as info:
    jax.block_until_ready(program())
  return info.value


def _logged_texts(caplog) -> str:
  formatter = logging.Formatter()
  return "\n".join(formatter.format(r) for r in caplog.records)


# --- 1. a wrong result: one error, said once --------------------------------

# How the call is run: (impl, host function, declared) -> (program, args).
WAYS = {
    "jit": lambda impl: (jax.jit(lambda x: impl(returns_three, S2, x)),
                         jnp.ones(2)),
    "eager": lambda impl: (lambda x: impl(returns_three, S2, x), jnp.ones(2)),
    "hostcall.jit": lambda impl: (
        hostcall.jit(lambda x: impl(returns_three, S2, x)), jnp.ones(2)),
    "vmap sequential": lambda impl: (jax.jit(jax.vmap(
        lambda x: impl(returns_three, S2, x, vmap_method="sequential"))),
        jnp.ones((4, 2))),
}


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("impls", [PURE, IO], ids=["pure", "io"])
def test_a_wrong_shape_is_one_error_naming_the_function_and_both_shapes_once(
    impls, way, caplog):
  if way == "vmap sequential" and impls is IO:
    pytest.skip("io_callback takes no vmap_method")
  raised = {}
  with caplog.at_level(logging.ERROR):
    for name, impl in impls.items():
      program, x = WAYS[way](impl)
      raised[name] = _raised(lambda: program(x))
  theirs, ours = raised["jax"], raised["hostcall"]
  # JAX's exception type, and JAX's words (once) in a message that names
  # the function and where it is defined, and each shape once.
  assert type(theirs) is type(ours) is jax.errors.JaxRuntimeError
  assert SHAPE_WORDS in str(theirs)
  text = str(ours)
  assert text.count(SHAPE_WORDS) == 1
  assert text.count("(2,)") == text.count("(3,)") == 1
  assert text.count("returns_three") == 1
  assert (f"the callback 'returns_three' (defined at {__file__}:"
          f"{returns_three.__code__.co_firstlineno}) returned a wrong result"
          in text)
  assert "float32[" not in text and ".;" not in text
  # hostcall's own frames that checked the result are not shown (JAX's
  # text ends at its check too), nor is the message logged: JAX logs none
  # for its own check.
  for frame in ("in check_results", "in deliver", "in _call_once", "in fail"):
    assert frame not in text
  assert text.rstrip().endswith(
      "Return arrays of the declared shape, or change the declared result.")
  assert "Incorrect output shape" not in _logged_texts(caplog)
  # hostcall.original_error still finds it; the uncaught error's summary
  # line would repeat it, so there is none.
  assert "returns_three" in str(hostcall.original_error(ours))
  assert errors.summary(ours) is None


@pytest.mark.parametrize("impls", [PURE, IO], ids=["pure", "io"])
def test_a_wrong_dtype_is_said_once_with_jax_words(impls, caplog):
  program = lambda impl: jax.jit(lambda x: impl(   # noqa: E731
      lambda v: v.astype(np.int32), S2, x))(jnp.ones(2))
  with caplog.at_level(logging.ERROR):
    theirs = _raised(lambda: program(impls["jax"]))
    ours = _raised(lambda: program(impls["hostcall"]))
  words = ("Incorrect output dtype for return value #0: Expected: float32, "
           "Actual: int32")
  assert type(theirs) is type(ours) is jax.errors.JaxRuntimeError
  assert words in str(theirs) and str(ours).count(words) == 1
  assert str(ours).count("int32") == 1
  assert "'<lambda>' (defined at " in str(ours)
  assert "Incorrect output dtype" not in _logged_texts(caplog)


def test_a_wrong_number_of_results_shows_both_structures_once(caplog):
  f = jax.jit(lambda x: hostcall.pure_callback(
      lambda v: (v, v, v), (S2, jax.ShapeDtypeStruct((), jnp.int32)), x))
  with caplog.at_level(logging.ERROR):
    text = str(_raised(lambda: f(jnp.ones(2))))
  assert text.count("Mismatched number of outputs from callback. Expected: "
                    "2, Actual: 3") == 1
  assert text.count("returned (float32[2], float32[2], float32[2]), but the "
                    "declared result is (float32[2], int32[])") == 1
  assert "in check_results" not in text
  assert "Mismatched number" not in _logged_texts(caplog)


def test_under_disable_jit_the_error_is_still_a_jax_runtime_error():
  with jax.disable_jit():
    error = _raised(lambda: hostcall.pure_callback(returns_three, S2,
                                                   jnp.ones(2)))
  assert isinstance(error, jax.errors.JaxRuntimeError)
  assert isinstance(error, TypeError)  # as hostcall raised before
  assert str(error).count(SHAPE_WORDS) == 1


def test_original_errors_raises_the_failed_check_itself():
  f = jax.jit(lambda x: hostcall.pure_callback(returns_three, S2, x))
  with pytest.raises(TypeError, match="'returns_three'") as info:
    with hostcall.original_errors():
      f(jnp.ones(2))
  assert isinstance(info.value.__context__, jax.errors.JaxRuntimeError)


def test_a_deferred_calls_wrong_result_is_said_without_hostcalls_frames(
    caplog):
  # A result-less io_callback that returns a value, taken out by
  # hostcall.jit: the barrier raises it (a tap's failure), logged once when
  # it happened, neither with the frames of hostcall's check.
  f = hostcall.jit(lambda x: hostcall.io_callback(returns_three, None, x))
  with caplog.at_level(logging.ERROR):
    f(jnp.ones(2))
    with pytest.raises(hostcall.CallbackException) as info:
      hostcall.barrier()
  text = str(info.value)
  words = "Mismatched number of outputs from callback. Expected: 0, Actual: 1"
  assert text.count(words) == 1 and text.count("'returns_three'") == 1
  assert "in check_results" not in text
  logged = _logged_texts(caplog)
  assert logged.count(words) == 1 and "in check_results" not in logged


def test_a_host_functions_own_error_keeps_its_note_without_a_stray_period(
    caplog):
  def broken(v):
    raise ValueError("bad value.")

  with caplog.at_level(logging.ERROR):
    with pytest.raises(jax.errors.JaxRuntimeError, match="bad value"):
      jax.jit(lambda x: hostcall.pure_callback(broken, S2, x))(jnp.ones(2))
  logged = _logged_texts(caplog)
  assert "raised ValueError: bad value; `with hostcall.original_errors()" in (
      logged)
  assert ".;" not in logged


# --- 2. JAX's callbacks under hostcall.jit, named as the user wrote them ----

@pytest.fixture
def mode(jit_route):
  """Both ways hostcall.jit takes a program's calls out (conftest's)."""
  return jit_route


def my_cb(x):
  raise ValueError("boom")


def _closing_over(callback):
  def users(x):  # a user's closure over a `callback`: named itself
    callback(x)
  return users


#: Whether this JAX's jax.debug.callback takes its options first, the
#: function in a second call.
_TWO_CALL_FORM = "callback" not in [
    p for p, v in inspect.signature(jax.debug.callback).parameters.items()
    if v.default is inspect.Parameter.empty]

CALLS = {
    "jax.debug.callback": lambda x: jax.debug.callback(my_cb, x),
    "hostcall.debug_callback": lambda x: hostcall.debug_callback(my_cb, x),
    # (The two-call form is JAX's since 0.9: a plain call before.)
    "two-call form": lambda x: (
        jax.debug.callback(ordered=True)(my_cb, x) if _TWO_CALL_FORM
        else jax.debug.callback(my_cb, x, ordered=True)),
    "partial": lambda x: jax.debug.callback(functools.partial(my_cb), x),
    "vmapped": lambda x: jax.vmap(
        lambda v: jax.debug.callback(my_cb, v))(jnp.stack([x, x])),
    "jax io_callback": lambda x: jax_io_callback(my_cb, None, x),
    "hostcall.io_callback": lambda x: hostcall.io_callback(my_cb, None, x),
    "closure": lambda x: jax.debug.callback(_closing_over(my_cb), x),
}
NAMED = {"jax io_callback": "io_callback('my_cb')",
         "hostcall.io_callback": "io_callback('my_cb')",
         "closure": "debug_callback('users')"}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_failing_callback_under_hostcall_jit_is_named_after_its_function(
    mode, call, caplog):
  with caplog.at_level(logging.ERROR, logger="hostcall"):
    hostcall.jit(lambda x: (CALLS[call](x), x + 1)[1])(jnp.float32(1))
    with pytest.raises(hostcall.CallbackException, match="boom"):
      hostcall.barrier()
  lines = {r.getMessage().splitlines()[0] for r in caplog.records
           if r.name == "hostcall" and "tap function" in r.getMessage()}
  named = NAMED.get(call, "debug_callback('my_cb')")
  assert lines == {f"hostcall: tap function {named} raised; the next "
                   "barrier will raise CallbackException."}


def test_jaxs_rewritten_calls_keep_the_users_file_and_line():
  def program(x):
    jax.debug.print("x {}", x)
    jax.debug.callback(my_cb, x)
    jax_io_callback(my_cb, None, x)
    return x

  line = program.__code__.co_firstlineno
  rewritten = jax_callbacks.as_hostcalls(jax.make_jaxpr(program)(1.0))
  described = [jax_callbacks.first_kept(
      rewritten, lambda e, eqn=eqn: e is eqn)
               for eqn in rewritten.jaxpr.eqns if eqn.primitive is hostcall_p]
  assert described == [
      f"debug_print('debug_print') at {__file__}:{line + 1}",
      f"debug_callback('my_cb') at {__file__}:{line + 2}",
      f"io_callback('my_cb') at {__file__}:{line + 3}"]


def _warnings_of(recwarn) -> list[str]:
  return [str(w.message) for w in recwarn
          if issubclass(w.category, jit_module.HostcallJitWarning)]


def test_the_warning_names_the_users_line_and_the_true_reason(mode, recwarn):
  def program(x):
    return hostcall.io_callback(lambda v: v, jax.ShapeDtypeStruct(
        (), jnp.float32), x) + 1

  def checkpointed(x):
    return jax.checkpoint(lambda v: (jax.debug.print("{}", v), v * 2)[1])(x)

  assert float(hostcall.jit(program)(jnp.float32(1))) == 2.0
  assert float(hostcall.jit(checkpointed)(jnp.float32(1))) == 2.0
  hostcall.barrier()
  results, inside = _warnings_of(recwarn)
  line = program.__code__.co_firstlineno + 1
  assert (f"because of io_callback('<lambda>') at {__file__}:{line}: a call "
          "whose results the program uses, which must run in place.") in (
              results)
  line = checkpointed.__code__.co_firstlineno + 1
  assert (f"at {__file__}:{line}: the host calls (or other effects) inside "
          "a jax.checkpoint, where hostcall.jit takes none out.") in inside
  for message in (results, inside):
    assert "a call whose results the program uses, or" not in message


KEY_PROGRAMS = {
    "jax.debug.print": lambda key: jax.debug.print(
        "key {} {k}", key, k=jax.random.split(key)),
    "jax.debug.callback": lambda key: jax.debug.callback(
        lambda k: print("callback", type(k).__name__, np.asarray(k).tolist()),
        key),
    "hostcall.debug_print": lambda key: hostcall.debug_print("hc {}", key),
    "hostcall.debug_callback": lambda key: hostcall.debug_callback(
        lambda k: print("hc callback", np.asarray(k).tolist()), key),
    "vmapped print": lambda key: jax.vmap(
        lambda k: jax.debug.print("lane {}", k))(jax.random.split(key, 3)),
    "scan of prints": lambda key: jax.lax.scan(
        lambda k, _: (jax.random.split(k)[0],
                      jax.debug.print("step {}", k)), key, length=3),
}


@pytest.mark.parametrize("name", sorted(KEY_PROGRAMS))
def test_a_prng_key_print_is_taken_out_and_writes_what_jax_jit_writes(
    mode, name, capfd, recwarn):
  # Under jax.jit the host sees a key's key data; hostcall.jit takes the
  # call out with that data (it used to keep the program as jax.jit has
  # it, warning about "a call whose results the program uses").
  def program(key):
    KEY_PROGRAMS[name](key)
    return jax.random.key_data(key)

  key = jax.random.key(0)
  texts = []
  for jit in (jax.jit, hostcall.jit):
    np.testing.assert_array_equal(jit(program)(key), [0, 0])
    jax.effects_barrier()
    hostcall.barrier()
    texts.append(capfd.readouterr().out)
  assert texts[0].strip()
  # (jax.jit lets XLA reorder unordered calls; hostcall.jit keeps the order.)
  assert sorted(texts[1].splitlines()) == sorted(texts[0].splitlines())
  assert _warnings_of(recwarn) == []
  active = hostcall.jit(program)._hostcall_jitted._active
  assert not jax.make_jaxpr(active)(key).effects


def test_a_key_print_as_written_by_jax_jit():
  # What the test above compares against: the key data, as jax.jit's
  # callback gets it.
  key = jax.random.key(0)
  seen = []
  jax.jit(lambda k: jax.debug.callback(
      lambda v: seen.append(np.asarray(v).tolist()), k))(key)
  jax.effects_barrier()
  assert seen == [[0, 0]]


# --- 3. call_context().axis_indices of a pmap without axis_name ---------------

@pytest.mark.parametrize("axis_name, key", [(None, None), ("i", "i")])
@pytest.mark.parametrize("flavour", ["debug_callback", "pure_callback"])
def test_an_unnamed_pmap_axis_is_keyed_none(flavour, axis_name, key):
  seen = []

  def host(v):
    seen.append(dict(hostcall.call_context().axis_indices))
    return v

  def body(v):
    if flavour == "debug_callback":
      hostcall.debug_callback(host, v)
      return v
    return hostcall.pure_callback(host, jax.ShapeDtypeStruct((), v.dtype), v)

  n = jax.local_device_count()
  out = jax.pmap(body, axis_name=axis_name)(jnp.arange(float(n)))
  hostcall.barrier()
  np.testing.assert_array_equal(out, np.arange(n))
  assert sorted(seen, key=lambda s: s[key]) == [{key: i} for i in range(n)]

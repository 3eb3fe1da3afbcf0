"""Mistakes are reported where they are made, when the program is traced, in
the user's terms: what was expected, what came, how to fix it."""

import pathlib
import re
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import host_callback as hcb

X = jnp.ones(3)


def _traced_error(fn, *args):
  """The exception raised while tracing ``fn`` (nothing is compiled)."""
  with pytest.raises(Exception) as info:
    jax.make_jaxpr(fn)(*args)
  return info


def test_a_tap_function_of_one_parameter():
  info = _traced_error(lambda x: hcb.id_tap(lambda v: print(v), x), X)
  assert info.type is TypeError
  assert str(info.value) == (
      "id_tap will call tests.test_errors.test_a_tap_function_of_one_parameter"
      ".<locals>.<lambda>"
      ".<locals>.<lambda>(v) with (arg, transforms), which it cannot take: "
      "too many positional arguments. A tap function takes the tapped value "
      "and the transformations applied to it: def tap(arg, transforms), or "
      "wrap yours, e.g. id_tap(lambda arg, transforms: f(arg), x).")


def test_a_tap_with_device_that_takes_no_device():
  info = _traced_error(lambda x: hcb.id_tap(lambda v, t: None, x,
                                            tap_with_device=True), X)
  assert "with (arg, transforms, device=...)" in str(info.value)
  assert "got an unexpected keyword argument 'device'" in str(info.value)
  assert "def tap(arg, transforms, *, device)" in str(info.value)


def test_a_forgotten_result_shape_dtypes():
  info = _traced_error(lambda x: hostcall.pure_callback(np.sin, x), X)
  # A TypeError, and what JAX raises for it when the computation runs.
  assert isinstance(info.value, TypeError)
  assert isinstance(info.value, jax.errors.JaxRuntimeError)
  text = str(info.value)
  assert text.startswith("hostcall.pure_callback will call numpy.sin(x, /, ")
  assert "with (nothing), which it cannot take: missing a required argument: "\
      "'x'." in text
  assert text.endswith(
      "Did you forget result_shape_dtypes? hostcall.pure_callback(callback, "
      "result_shape_dtypes, *args), e.g. hostcall.pure_callback(np.sin, "
      "jax.ShapeDtypeStruct(x.shape, x.dtype), x).")


def test_a_callback_that_takes_fewer_arguments_than_given():
  info = _traced_error(lambda x: hostcall.io_callback(
      lambda a: a, None, x, x), X)
  assert "with (arg0, arg1), which it cannot take: too many positional " \
      "arguments." in str(info.value)


def test_a_debug_callback_that_takes_no_keyword():
  info = _traced_error(lambda x: hostcall.debug_callback(
      lambda a: None, x, label=x), X)
  assert "with (arg0, label=...), which it cannot take: got an unexpected " \
      "keyword argument 'label'." in str(info.value)


def test_a_derivative_rule_of_the_wrong_shape():
  info = _traced_error(lambda x: hostcall.pure_callback(
      np.sin, jax.ShapeDtypeStruct(X.shape, X.dtype), x,
      vjp=lambda ct: ct), X)
  assert "a derivative rule of hostcall.pure_callback will call" in str(
      info.value)
  assert "rule(primals, cotangent, **kwargs)" in str(info.value)


def test_a_call_host_function_of_two_parameters_and_no_tuple():
  info = _traced_error(lambda x: hcb.call(lambda a, b: a, x, result_shape=x),
                       X)
  assert "host_callback.call will call" in str(info.value)
  assert "missing a required argument: 'b'" in str(info.value)


@pytest.mark.parametrize("shape", [(3,), (3, 4), 3])
def test_numbers_are_not_a_shape_description(shape):
  info = _traced_error(lambda x: hostcall.pure_callback(
      lambda v: v, shape, x), X)
  assert info.type is ValueError
  flat = jax.tree_util.tree_leaves(shape)
  assert (f"Numbers are not shapes: for an array of shape {tuple(flat)} "
          f"write jax.ShapeDtypeStruct({tuple(flat)}, dtype).") in str(
              info.value)


def test_a_misspelled_progress_option():
  info = _traced_error(lambda x: hostcall.progress.scan(
      lambda c, v: (c + v, None), 0.0, x, dsec="fit"), X)
  assert info.type is TypeError
  assert str(info.value).startswith(
      "hostcall.progress got unknown option(s) 'dsec' (did you mean "
      "'desc'?). It takes desc, every, unit, leave, file, all_processes and "
      "tqdm's options: ")


@pytest.mark.parametrize("scan", [hostcall.scan, hostcall.progress.scan,
                                  jax.lax.scan])
def test_a_scan_body_that_returns_only_the_carry(scan):
  info = _traced_error(lambda x: scan(lambda c, v: c + v, 0.0, x), X)
  assert info.type is TypeError
  assert str(info.value).startswith(
      "scan body output must be a pair, got float32[]")


def test_errors_while_tracing_a_body_point_at_the_users_code():
  def users_body(c, v):
    return c + undefined_name, None  # noqa: F821 - the mistake under test

  with pytest.raises(NameError) as info:
    jax.jit(lambda x: hostcall.progress.scan(users_body, 0.0, x))(X)
  frames = traceback.extract_tb(info.value.__traceback__)
  files = [f.filename for f in frames]
  assert frames[-1].name == "users_body"
  assert not any("/hostcall/" in f and "/tests/" not in f for f in files), (
      files)


@pytest.mark.parametrize("given", [5, "error", ValueError])
def test_original_error_of_what_is_no_exception(given):
  with pytest.raises(TypeError, match=r"original_error takes the exception a "
                     r"JAX call raised .*got " + re.escape(repr(given)) +
                     f" of type {type(given).__name__}"):
    hostcall.original_error(given)
  assert hostcall.original_error(None) is None  # (no exception: none behind)


def test_hostcall_scan_of_a_body_that_is_not_callable():
  for scan in (hostcall.scan, hostcall.progress.scan):
    with pytest.raises(TypeError, match=r"scan's body f must be callable, got "
                       r"3 of type int"):
      scan(3, 0.0, None, length=2)
  with pytest.raises(TypeError, match="while loop's cond_fun must be callable"):
    hostcall.progress.while_loop(None, lambda c: c, 0)


def test_an_uncaught_host_failure_ends_with_the_users_exception_and_the_way_back(
    tmp_path):
  # The runtime's text lists JAX's frames first and the host function's
  # exception on its last line; hostcall's log record and the last line of
  # an uncaught error name the exception and hostcall.original_errors().
  import os
  import subprocess
  import sys
  script = tmp_path / "fails.py"
  script.write_text(
      "import jax, hostcall\n"
      "def lookup(k):\n"
      "  raise KeyError(int(k))\n"
      "jax.jit(lambda k: hostcall.pure_callback(\n"
      "    lookup, jax.ShapeDtypeStruct((), k.dtype), k))(3)\n")
  src = str(pathlib.Path(hostcall.__file__).parent.parent)
  env = dict(os.environ, PYTHONPATH=src, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, str(script)], capture_output=True,
                        text=True, env=env, timeout=120)
  assert proc.returncode == 1
  lines = proc.stderr.strip().splitlines()
  # JAX's record first (JAX before 0.9 formats it with its own handler:
  # "ERROR:<time>:jax._src.callback:<line>: jax.pure_callback failed").
  assert lines[0].endswith("jax.pure_callback failed")
  note = lines.index("KeyError: 3") + 1  # the host function's frames only
  assert "raised KeyError: 3; `with hostcall.original_errors():`" in lines[note]
  assert note < 8
  assert lines[-1] == (
      "hostcall: the JAX call failed because a host function raised "
      "KeyError: 3; `with hostcall.original_errors():` around the call "
      "raises that KeyError itself.")
  assert "JaxRuntimeError" in proc.stderr

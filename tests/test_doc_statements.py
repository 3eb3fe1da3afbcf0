"""What the docs say a failing host function does, run.

Each test quotes the sentences it checks (whitespace aside), in every page
that makes them, and fails if a page no longer says so; then it runs what
they say, with JAX's callback beside hostcall's where JAX has one.
"""

import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback as jax_io_callback

import hostcall
from hostcall import host_callback as hcb
from tests.helpers import stated

def _fail(*args, **kwargs):
  raise ValueError("host function failed on purpose")


F32 = jax.ShapeDtypeStruct((), jnp.float32)
SYNC_FAILURES = {
    "pure_callback": (lambda x: jax.pure_callback(_fail, F32, x),
                      lambda x: hostcall.pure_callback(_fail, F32, x)),
    "io_callback": (lambda x: jax_io_callback(_fail, F32, x),
                    lambda x: hostcall.io_callback(_fail, F32, x)),
    "result-less io_callback": (
        lambda x: (jax_io_callback(_fail, None, x), x)[1],
        lambda x: (hostcall.io_callback(_fail, None, x), x)[1]),
    "debug_callback": (lambda x: (jax.debug.callback(_fail, x), x)[1],
                       lambda x: (hostcall.debug_callback(_fail, x), x)[1]),
    # A format JAX cannot apply to the value: the host side raises.
    "debug_print": (lambda x: (jax.debug.print("{:d}", x), x)[1],
                    lambda x: (hostcall.debug_print("{:d}", x), x)[1]),
}


@pytest.mark.parametrize("flavour", SYNC_FAILURES)
def test_jaxs_callbacks_fail_the_jax_call_at_once_as_in_jax(flavour):
  stated("docs/getting-started.md",
         "JAX's callbacks fail as in JAX: when the host function of a "
         "`pure_callback`, an `io_callback` (with or without results), a "
         "`debug_callback` or a `debug_print` raises, the JAX call that ran "
         "it fails at once.")
  stated("docs/api/index.md",
         "Any other call whose host function raises (`pure_callback`, "
         "`io_callback` with or without results, `debug_callback`, "
         "`debug_print`, `call`) fails the JAX call that ran it, as in JAX;")
  stated("README.md", "JAX's callbacks fail their JAX call with the "
         "original traceback (as in JAX)")
  for impl in SYNC_FAILURES[flavour]:  # JAX's, then hostcall's
    with pytest.raises(jax.errors.JaxRuntimeError):
      jax.block_until_ready(jax.jit(impl)(jnp.float32(1.0)))
    jax.effects_barrier()
    hostcall.barrier()  # nothing left for the barrier: it was raised


def test_a_call_with_a_result_and_a_result_less_call_fail_the_jax_call():
  stated("docs/getting-started.md",
         "A call with a result (`pure_callback`, `io_callback`, `call`) fails "
         "the JAX call that ran it, with the host traceback, and so does a "
         "`debug_callback` or a result-less `io_callback` (as in JAX)")
  stated("README.md", "An exception in a `call` host function, or a result "
         "of the wrong structure, shape or dtype, fails the JAX call with an "
         "error naming what was expected and what came.")
  with pytest.raises(jax.errors.JaxRuntimeError, match="on purpose") as info:
    jax.jit(lambda x: hcb.call(_fail, x, result_shape=x))(1.0)
  assert "in _fail" in str(info.value)  # the host traceback
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match=r"float32\[2\].*float32\[3\]|\(2,\).*\(3,\)"):
    jax.jit(lambda x: hcb.call(lambda v: np.ones(3, np.float32), x,
                               result_shape=x))(jnp.ones(2))
  hostcall.barrier()


@pytest.mark.parametrize("flavour", ["debug_callback",
                                     "result-less io_callback"])
def test_asynchronous_result_less_calls_report_at_the_next_barrier(flavour):
  stated("docs/getting-started.md",
         "Only with asynchronous delivery (below), where the device does not "
         "wait for the host, does a result-less call's exception wait for "
         "the next barrier.")
  stated("docs/api/index.md", "with asynchronous delivery a result-less "
         "call's exception is reported by the next barrier instead.")
  stated("README.md", "`host_callback` taps report at the next barrier, "
         "asynchronous calls too")
  assert ("or the host function of a result-less call delivered "
          "asynchronously") in re.sub(r"\s+", " ", hostcall.barrier.__doc__)
  impl = SYNC_FAILURES[flavour][1]
  with hostcall.delivery("async"):  # in force while traced
    out = jax.jit(lambda x: impl(x))(jnp.float32(2.0))  # returns at once
  assert float(out) == 2.0
  with pytest.raises(hostcall.CallbackException, match="on purpose"):
    hostcall.barrier()
  hostcall.barrier()  # raised once


def test_a_tap_that_raises_is_logged_later_taps_run_the_barrier_raises(caplog):
  stated("docs/getting-started.md",
         "A tap function that raises is logged, later taps still run, and "
         "the next [`hostcall.barrier()`][hostcall.barrier] (which waits "
         "until every host call started so far has run) raises "
         "`hostcall.CallbackException`.",
         "A tap's exception is logged, later taps still run, and the next "
         "barrier raises it")
  stated("docs/api/index.md", "\"Tap\" means a call made for its effect "
         "(`id_tap`, `id_print`, `Run.log`, a bar's update): its exceptions "
         "are logged and reported by the next [`hostcall.barrier`]")
  stated("README.md", "An exception in a tap function is logged, later taps "
         "still run, and the next `barrier_wait()` (or `hostcall.barrier()`) "
         "raises `CallbackException` with the original text and traceback.")
  stated("docs/migration.md", "An exception in a tap function is logged, "
         "later taps still run, and the next `barrier_wait()` raises "
         "`CallbackException`")
  seen = []

  def tap(x, transforms):
    seen.append(float(x))
    if float(x) == 1.0:
      raise ValueError(f"cannot handle {float(x)}")

  def body(c, _):
    hcb.id_tap(tap, c)
    return c + 1.0, None

  with caplog.at_level(logging.ERROR):
    out = jax.jit(lambda: jax.lax.scan(body, 0.0, None, length=3)[0])()
    assert float(out) == 3.0  # the program goes on
  assert "cannot handle 1.0" in caplog.text  # logged when it happened
  with pytest.raises(hostcall.CallbackException,
                     match="cannot handle 1.0") as info:
    hcb.barrier_wait()
  assert seen == [0.0, 1.0, 2.0]  # the later tap ran
  assert isinstance(info.value.__cause__, ValueError)
  assert "in tap" in str(info.value)  # with its traceback

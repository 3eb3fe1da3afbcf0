"""What a failing host function does, as docs/getting-started.md,
docs/api/index.md, docs/migration.md, README.md and ``hostcall.barrier``'s
docstring state it, run: with JAX's callback beside hostcall's where JAX
has one. The tests check the facts, not the pages' words, so that the
prose may be reworded; each names the statements it checks.
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

def _fail(*args, **kwargs):
  raise ValueError("host function failed on purpose")


F32 = jax.ShapeDtypeStruct((), jnp.float32)
#: flavour -> (JAX's call, hostcall's call, the frame of the host function
#: that raised, as its traceback shows it).
SYNC_FAILURES = {
    "pure_callback": (lambda x: jax.pure_callback(_fail, F32, x),
                      lambda x: hostcall.pure_callback(_fail, F32, x),
                      "in _fail"),
    "io_callback": (lambda x: jax_io_callback(_fail, F32, x),
                    lambda x: hostcall.io_callback(_fail, F32, x),
                    "in _fail"),
    "result-less io_callback": (
        lambda x: (jax_io_callback(_fail, None, x), x)[1],
        lambda x: (hostcall.io_callback(_fail, None, x), x)[1],
        "in _fail"),
    "debug_callback": (lambda x: (jax.debug.callback(_fail, x), x)[1],
                       lambda x: (hostcall.debug_callback(_fail, x), x)[1],
                       "in _fail"),
    # A format JAX cannot apply to the value: the host side raises.
    "debug_print": (lambda x: (jax.debug.print("{:d}", x), x)[1],
                    lambda x: (hostcall.debug_print("{:d}", x), x)[1],
                    "in __format__"),
}


@pytest.mark.parametrize("flavour", SYNC_FAILURES)
def test_jaxs_callbacks_fail_the_jax_call_at_once_as_in_jax(flavour):
  # Stated by getting-started, the API index and the README: the JAX call
  # itself raises, with the host function's traceback, JAX's callback as
  # hostcall's; nothing is left for the barrier.
  *impls, frame = SYNC_FAILURES[flavour]
  for impl in impls:  # JAX's, then hostcall's
    with pytest.raises(jax.errors.JaxRuntimeError) as info:
      jax.block_until_ready(jax.jit(impl)(jnp.float32(1.0)))
    assert "Traceback" in str(info.value) and frame in str(info.value)
    jax.effects_barrier()
    hostcall.barrier()  # nothing left for the barrier: it was raised


def test_a_call_with_a_result_and_a_result_less_call_fail_the_jax_call():
  # getting-started and the README: a `call` whose host function raises,
  # or whose result has the wrong structure, shape or dtype, fails the JAX
  # call with the host traceback, or an error naming what was expected and
  # what came (the other flavours: the test above).
  def call(f, x):
    return jax.jit(lambda x: hcb.call(f, x, result_shape=x))(x)

  with pytest.raises(jax.errors.JaxRuntimeError, match="on purpose") as info:
    call(_fail, 1.0)
  assert "in _fail" in str(info.value)  # the host traceback
  for result, expected_and_came in (
      (lambda v: np.ones(3, np.float32),  # shape
       r"float32\[2\].*float32\[3\]|\(2,\).*\(3,\)"),
      (lambda v: np.ones(2, np.int32), r"float32\[2\].*int32\[2\]"),  # dtype
      (lambda v: (np.ones(2, np.float32),),  # structure
       r"PyTreeDef\(\*\).*PyTreeDef\(\(\*,\)\)")):
    with pytest.raises(jax.errors.JaxRuntimeError, match=expected_and_came):
      call(result, jnp.ones(2))
  hostcall.barrier()


ASYNC_FAILURES = {
    "debug_callback": SYNC_FAILURES["debug_callback"][1],
    "result-less io_callback": SYNC_FAILURES["result-less io_callback"][1],
    "id_tap": lambda x: hcb.id_tap(_fail, x),
}


@pytest.mark.parametrize("flavour", ASYNC_FAILURES)
def test_asynchronous_result_less_calls_report_at_the_next_barrier(flavour):
  # Stated by getting-started, the API index, the README (taps too) and
  # hostcall.barrier's docstring: delivered asynchronously, a result-less
  # call that raises lets its JAX call return its value, and the next
  # barrier raises, once. (Delivered synchronously the JAX call itself
  # fails: the tests above.)
  impl = ASYNC_FAILURES[flavour]
  with hostcall.delivery("async"):  # in force while traced
    out = jax.jit(lambda x: impl(x))(jnp.float32(2.0))  # returns at once
  assert float(out) == 2.0
  with pytest.raises(hostcall.CallbackException, match="on purpose"):
    hostcall.barrier()
  hostcall.barrier()  # raised once


def test_a_tap_that_raises_is_logged_later_taps_run_the_barrier_raises(caplog):
  # Stated by getting-started, the API index, the README and the migration
  # guide: a tap's exception is logged, later taps still run, and the next
  # barrier raises CallbackException with the original text and traceback.
  # The API index's other taps: Run.log's failures, test_metrics.py::
  # test_a_failing_writer_does_not_lose_the_others_rows; a bar's update:
  # test_progress.py::
  # test_a_stream_or_format_that_raises_fails_its_bar_and_hangs_nothing;
  # id_print: the test below.
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


def test_an_id_print_that_raises_is_reported_by_the_barrier(caplog):
  # id_print is a tap too (the API index): its failure (here its stream's)
  # is logged, the program goes on, and the next barrier raises, once.
  class Gone:
    def write(self, text):
      raise OSError("stream gone")

    def flush(self):
      pass

  with caplog.at_level(logging.ERROR):
    out = jax.jit(lambda x: hcb.id_print(x, output_stream=Gone()) + 1.0)(1.0)
    assert float(out) == 2.0
  with pytest.raises(hostcall.CallbackException) as info:
    hcb.barrier_wait()
  assert isinstance(info.value.__cause__, OSError)
  assert "stream gone" in caplog.text
  hcb.barrier_wait()  # reported once

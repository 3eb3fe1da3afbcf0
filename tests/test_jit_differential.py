"""Every tap test program, run again with ``jax.jit`` replaced by
``hostcall.jit`` (tests/jit_differential/plugin.py), must see the same host
calls, values, order and transforms, and return the same results; JAX's own
callback test programs (``jax_suite``) too, whose programs run JAX's
callbacks beside hostcall's, which hostcall.jit then rewrites.

Deselected: what hostcall.jit documents as different (docs/performance.md,
"A Python loop over a jitted step"): a failing host function is reported by
the next barrier instead of failing the call, and rows logged by several
calls reach a metrics writer as one block; queued, a bar's ticks are
thinned on the device. Both ways hostcall.jit takes
calls out are run: queued from the device and deferred to outputs.
"""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent

FILES = ["test_id_tap.py", "test_id_print.py", "test_debug.py",
         "test_io_callback.py", "test_buffered.py", "test_metrics.py",
         "test_call.py", "test_pure_callback.py", "test_contracts.py",
         "test_roundtrip.py", "test_progress.py", "test_grad_callback.py",
         "test_compositions.py", "test_fidelity.py",
         # JAX's own callback test programs, JAX's callbacks beside
         # hostcall's: under hostcall.jit JAX's are rewritten too.
         "jax_suite/test_differential.py"]

DIFFERENT = {
    # A failure is reported by the barrier, not by the call (and logged
    # by hostcall's words, where JAX's call would log its own).
    "test_debug.py::test_exception_in_debug_callback_fails_the_call",
    "test_contracts.py::"
    "test_a_tap_failure_waits_for_the_barrier_a_debug_failure_does_not",
    "test_grad_callback.py::test_a_failing_callback_fails_the_backward_pass",
    "test_fidelity.py::test_debug_callback_failure_is_logged_like_jax",
    "test_fidelity.py::test_a_failure_is_logged_with_jaxs_own_record",
    "jax_suite/test_differential.py::"
    "test_exception_in_debug_callback_under_jit",
    "jax_suite/test_differential.py::"
    "test_failure_log_names_the_api_like_jax",
    "jax_suite/test_differential.py::"
    "test_print_format_starting_with_escaped_brace_documented_difference",
    # Rows logged by several calls reach the writer as one block.
    "test_metrics.py::"
    "test_the_writer_joins_waiting_blocks_with_the_same_columns",
    # Ticks of a bar that reach the host together are drawn once.
    "test_progress.py::test_ticks_are_few_and_redraws_throttled",
}


#: Different where the calls become outputs: they are not queue items.
DIFFERENT_AS_OUTPUTS = {
    "test_grad_callback.py::test_asynchronous_delivery_goes_through_the_queue",
    "test_grad_callback.py::"
    "test_the_delivery_is_the_one_in_force_where_the_value_is_watched",
}


#: Different where the calls are queued from the device: a bar's ticks are
#: thinned there (within a quarter of its mininterval of the last one
#: queued; docs/compatibility.md), so that a listener sees fewer of them.
DIFFERENT_QUEUED = {
    "test_progress.py::"
    "test_a_short_loops_ticks_under_jax_jit_are_drawn_as_one_run[None]",
    "test_progress.py::"
    "test_under_hostcall_jit_a_bar_ends_as_under_jax_jit_and_predicates_see_"
    "every_tick",
}


# Heavy (4 minutes on 2 cores): `make test-jit-differential`, which CI runs.
@pytest.mark.heavy
@pytest.mark.parametrize("mode", ["auto", "outputs"])
def test_tap_programs_see_the_same_under_hostcall_jit(mode):
  # auto: queued from the device (CPU devices, the native queue);
  # outputs: deferred to the program's outputs, as on an accelerator.
  different = DIFFERENT | (DIFFERENT_AS_OUTPUTS if mode == "outputs"
                           else DIFFERENT_QUEUED)
  deselect = [arg for name in sorted(different)
              for arg in ("--deselect", f"tests/{name}")]
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       "-p", "tests.jit_differential.plugin", *deselect,
       *[f"tests/{f}" for f in FILES]],
      capture_output=True, text=True, timeout=900, cwd=HERE.parent,
      env=dict(os.environ, HOSTCALL_JIT_MODE=mode))
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
  assert " passed" in proc.stdout

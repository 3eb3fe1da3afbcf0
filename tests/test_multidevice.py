"""Runs tests/multidevice in a subprocess with 4 forced CPU devices; the fault
matrix once with each asynchronous queue (the queue is chosen when hostcall
is imported), and hostcall.jit's cross-program order with JAX's callbacks
pushing into the queue (HOSTCALL_NATIVE=0) on one device and on four."""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent
FAULT_MATRIX = "multidevice/test_fault_matrix.py"


def _run(paths, **env):
  env = {**os.environ,
         "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
         "JAX_PLATFORMS": "cpu", **env}
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       *paths], env=env, capture_output=True, text=True, timeout=600,
      cwd=HERE.parent)
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
  assert " passed" in proc.stdout and "skipped" not in proc.stdout


def test_multidevice_suite_passes_on_four_cpu_devices():
  _run([str(HERE / "multidevice"), f"--ignore={HERE / FAULT_MATRIX}"])


@pytest.mark.parametrize("route", ["ffi", "callbacks"])
def test_the_fault_matrix_holds_on_either_route_into_the_queue(route):
  _run([str(HERE / FAULT_MATRIX)],
       HOSTCALL_NATIVE="1" if route == "ffi" else "0")


@pytest.mark.parametrize("devices", [1, 4])
def test_cross_program_order_holds_with_jax_callbacks_into_the_queue(devices):
  # HOSTCALL_NATIVE=0: hostcall.jit's queued calls, as jax.jit's
  # asynchronous taps, are JAX Python callbacks pushing into the native
  # queue, in the order the devices run them (issue 42).
  if devices == 1:
    _run([str(HERE / "test_jit.py"), "-k",
          "asynchronous_taps_keep_their_place and queued"],
         HOSTCALL_NATIVE="0", XLA_FLAGS="")
  else:
    _run([str(HERE / "multidevice" / "test_jit.py"), "-k",
          "asynchronous_taps or long_computation or dropped"],
         HOSTCALL_NATIVE="0")

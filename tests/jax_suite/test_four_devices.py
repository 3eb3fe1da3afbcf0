"""Runs tests/jax_suite/four_devices in a subprocess with 4 CPU devices."""

import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent


def test_four_device_programs_match_jax():
  env = dict(os.environ,
             XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       str(HERE / "four_devices")],
      env=env, capture_output=True, text=True, timeout=300,
      cwd=HERE.parent.parent)
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
  assert " passed" in proc.stdout and "skipped" not in proc.stdout

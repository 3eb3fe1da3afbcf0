"""The hostcall command: demo and info."""

import pathlib
import subprocess
import sys


def _hostcall(*args):
  return subprocess.run([sys.executable, "-m", "hostcall", *args],
                        capture_output=True, text=True, timeout=300)


def test_demo_runs_taps_under_jit_vmap_and_grad():
  proc = _hostcall("demo")
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert "what: carry\n1.\nwhat: carry\n2.5\nwhat: carry\n4.25\n" in out
  assert ("transforms: [('batch', {'batch_dims': (0, 0)})] what: x,x^2\n"
          "( [2. 3.] [4. 9.] )\n") in out
  assert "what: x,x^2\n( 3. 9. )\nd/dx x^3 at 3 = 27.0\n" in out
  assert "grads = [ 3. 12.]" in out
  assert "eigenvalues = [1. 3.]" in out
  assert ("barrier_wait raised CallbackException: ValueError: cannot handle "
          "41.0") in out


def test_info_names_versions_and_devices():
  proc = _hostcall("info")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.startswith("hostcall 0.1.0\njax 0.10.")
  assert "backend cpu" in proc.stdout
  assert "async taps: native (XLA FFI handler" in proc.stdout


def test_unknown_command_fails():
  assert _hostcall("nope").returncode == 2


def test_benchmark_smoke_run():
  script = pathlib.Path(__file__).parent.parent / "benchmarks" / "run.py"
  proc = subprocess.run([sys.executable, str(script), "--smoke"],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "1. default tap, scalar" in proc.stdout
  assert "6. async taps with a busy Python thread" in proc.stdout

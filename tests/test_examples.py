"""The examples in examples/ run as written and print what they document."""

import pathlib
import subprocess
import sys

import jax
import numpy as np

EXAMPLES = pathlib.Path(__file__).parent.parent / "examples"


def _run(name: str) -> str:
  proc = subprocess.run([sys.executable, str(EXAMPLES / name)],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc.stdout


def test_legacy_host_callback_tour():
  out = _run("legacy_host_callback_tour.py")
  y = np.sin(np.asarray(jax.random.uniform(jax.random.PRNGKey(42),
                                            (8, 8)))) * 2.0
  assert "received data type: <class 'numpy.ndarray'>" in out
  assert "data shape: (8, 8)" in out
  assert "JAX transform context: ()" in out
  sample = out.split("data content (sample): [")[1].split("]")[0].split()
  np.testing.assert_allclose(np.array(sample, np.float32), y.flatten()[:5],
                             rtol=1e-5)
  # id_tap output appears before the result line: the host ran in order.
  assert out.index("--- end of host callback ---") < out.index("final result")
  assert "what: intermediate y\n[5. 6. 7.]\n" in out
  assert "received data shape: (5,)" in out
  assert "received parameter: 0.5" in out
  x = np.linspace(-2.0, 2.0, 5, dtype=np.float32)
  inter = np.log1p(np.abs(x))
  expected = (np.tanh(inter) + 0.5) / (1.0 + inter.mean())
  printed = out.split("final JAX result: ")[1].strip()
  np.testing.assert_allclose(
      np.array(printed.strip("[]").split(), dtype=np.float32), expected,
      rtol=1e-5)


def test_io_callback_in_jit_vmap_grad():
  out = _run("io_callback_in_jit_vmap_grad.py")
  lines = out.splitlines()
  assert lines[0].startswith("intermediate value: ") and "Tracer" in lines[0]
  assert lines[1] == "intermediate value: 3"
  assert lines[2:4] == ["generating float32[5]"] * 2
  assert "state advanced: True" in lines
  # Unordered vmap: one host call per element.
  assert lines[lines.index("state advanced: True") + 1:][:5] == [
      "generating float32[]"] * 5
  assert "ValueError: Cannot `vmap` ordered IO callback." in lines
  assert "ordered vmap: [[" in out
  assert out.count("generating float32[3]") == 3
  assert "scan: [" in out
  assert "hello" in lines
  assert "ValueError: IO callbacks do not support JVP." in lines
  grads = out.split("grad with differentiable=False: [")[1].split("]")[0]
  assert len(grads.split()) == 3


def test_pure_callback_with_scipy_and_gradients():
  out = _run("pure_callback_with_scipy_and_gradients.py")
  assert "batched output shape: (10, 3, 3)" in out
  error = float(out.split("max abs error against the analytic gradient: ")[1]
                .split()[0])
  assert error < 1e-4  # the tolerance docs/flavours.md states
  assert "multiple outputs: res1=Array(20., dtype=float32), " \
         "res2=Array(6., dtype=float32)" in out

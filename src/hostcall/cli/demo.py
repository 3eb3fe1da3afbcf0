"""Fit a model whose loss calls SciPy, inside one jitted scan (make demo).

The model is the radial profile of a drum's fundamental mode,
``y = amplitude * J0(wavenumber * r) + offset``, with the Bessel function J0
computed on the host by ``scipy.special.j0`` through a differentiable
``hostcall.pure_callback`` (its derivative, ``-J1``, is a host rule too).
An ensemble of fits from different starting wavenumbers runs under ``vmap``
in one jitted ``hostcall.progress.scan``: one live bar for the ensemble,
every step's metrics logged to ``runs/demo/metrics.jsonl`` from inside the
loop, a summary and ``runs/demo/metrics.png`` at the end.
"""

from __future__ import annotations

import importlib.util
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import hostcall
from hostcall import control, metrics, progress
from hostcall.cli.arguments import positive_float, positive_int

TRUE = {"amplitude": 2.0, "wavenumber": 3.0, "offset": 0.5}
START_WAVENUMBERS = (0.8, 2.2, 5.5, 8.5)


# The SciPy routine and its derivative rules, on the host -----------------------

def _host_j0(z):
  import scipy.special
  return scipy.special.j0(z).astype(z.dtype)


def _j0_jvp(primals, tangents):
  import scipy.special
  (z,), (dz,) = primals, tangents
  return (-scipy.special.j1(z) * dz).astype(z.dtype)


def _j0_vjp(primals, cotangent):
  import scipy.special
  (z,) = primals
  return ((-scipy.special.j1(z) * cotangent).astype(z.dtype),)


def bessel_j0(z: jax.Array) -> jax.Array:
  """J0(z) by SciPy on the host; differentiable, batched under vmap."""
  return hostcall.pure_callback(_host_j0, jax.ShapeDtypeStruct(z.shape, z.dtype),
                                z, vmap_method="broadcast_all",
                                jvp=_j0_jvp, vjp=_j0_vjp)


# The model and its fit, on the device --------------------------------------------

def model(params, r):
  return params["amplitude"] * bessel_j0(params["wavenumber"] * r) \
      + params["offset"]


def loss_fn(params, r, y):
  return jnp.mean((model(params, r) - y) ** 2)


def make_data(points: int = 2048, noise: float = 0.05, seed: int = 0):
  import scipy.special
  rng = np.random.default_rng(seed)
  r = np.linspace(0.0, 6.0, points, dtype=np.float32)
  y = (TRUE["amplitude"] * scipy.special.j0(TRUE["wavenumber"] * r)
       + TRUE["offset"] + noise * rng.standard_normal(points))
  return r, y.astype(np.float32)


def fit(start_wavenumber, r, y, batches, run: metrics.Run, *,
        learning_rate: float = 0.02, time_limit: float | None = None):
  """Adam on minibatches, one jitted scan; logs every step. Ctrl-C or the
  time limit stops it early: returns the parameters reached, the loss and
  the steps done."""
  params = {"amplitude": jnp.float32(1.0), "offset": jnp.float32(0.0),
            "wavenumber": start_wavenumber}
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  steps = batches.shape[0]

  def step(state, batch):
    i, params, m, v = state
    loss, grads = jax.value_and_grad(loss_fn)(params, r[batch], y[batch])
    rate = learning_rate * 0.5 * (1 + jnp.cos(jnp.pi * i / steps))
    m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
    v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g * g, v,
                               grads)
    t = i + 1
    params = jax.tree_util.tree_map(
        lambda p, m, v: p - rate * (m / (1 - 0.9 ** t))
        / (jnp.sqrt(v / (1 - 0.999 ** t)) + 1e-8), params, m, v)
    grad_norm = jnp.sqrt(sum(jnp.sum(g * g)
                             for g in jax.tree_util.tree_leaves(grads)))
    run.log(i, loss=loss, grad_norm=grad_norm, learning_rate=rate, **params)
    return (t, params, m, v), loss

  out = progress.scan(
      step, (jnp.int32(0), params, zeros, zeros), batches, desc="fit",
      unit="step", interruptible=True, time_limit=time_limit)
  (_, params, _, _), _ = out.value
  return params, loss_fn(params, r, y), out.steps, out.reason


HELP = ("fit a model that calls SciPy inside one jitted scan, with a "
        "progress bar, metrics in runs/demo and their plot")


def add_arguments(parser) -> None:
  parser.add_argument("--steps", type=positive_int, default=3000,
                      help="Adam steps of each fit (default: 3000)")
  parser.add_argument("--batch", type=positive_int, default=128,
                      help="points in each step's minibatch (default: 128)")
  parser.add_argument("--time-limit", type=positive_float, default=600.0,
                      metavar="SECONDS",
                      help="stop the fit early after this long, keeping what "
                      "it reached; Ctrl-C stops it too (default: 600)")
  parser.add_argument("--root", default="runs",
                      help="directory of runs; metrics go to <root>/demo "
                      "(default: runs)")


def _missing(module: str) -> bool:
  return importlib.util.find_spec(module) is None


def run(args) -> int:
  if _missing("scipy"):
    print("hostcall demo: the demo's model calls scipy.special on the host, "
          "and SciPy is not installed: pip install 'hostcall[demo]'",
          file=sys.stderr)
    return 1
  draw = not _missing("matplotlib")
  r, y = (jnp.asarray(a) for a in make_data())
  rng = np.random.default_rng(1)
  batches = rng.integers(0, len(r), size=(args.steps, args.batch),
                         dtype=np.int32)
  starts = jnp.asarray(START_WAVENUMBERS, jnp.float32)
  print(f"hostcall {hostcall.__version__} demo: fitting "
        f"y = a*J0(k*r) + c (J0 from scipy.special, on the host) to "
        f"{len(r)} points")
  print(f"  {len(starts)} fits under vmap, {args.steps} Adam steps each, in "
        f"one jitted hostcall.progress.scan on {jax.devices()[0]}")
  print(f"  Ctrl-C stops the fit at its next check and keeps what it "
        f"reached (so does a budget of {args.time_limit:g} s)")

  run_ = metrics.Run("demo", root=args.root, writers=["jsonl"])
  fit_all = jax.jit(jax.vmap(
      lambda k: fit(k, r, y, batches, run_, time_limit=args.time_limit)))
  began = time.perf_counter()
  params, final_loss, steps, reason = fit_all(starts)
  final_loss.block_until_ready()
  # vmap's lanes stop together: every member ran the same steps.
  steps = int(np.asarray(steps).reshape(-1)[0])
  stopped = control.reason_name(reason)
  elapsed = time.perf_counter() - began
  run_.close()  # waits for the last rows and writes them
  rows = run_.records()
  if stopped:
    print(f"\nstopped early ({stopped.replace('_', ' ')}) after {steps} of "
          f"{args.steps} steps: the results below are those of the steps "
          f"done")
  _summary(args, starts, params, final_loss, elapsed, steps, rows, run_)
  # The summary is printed first: a plot that cannot be drawn never costs it.
  if not draw:
    print("plot:    skipped: matplotlib is not installed "
          "(pip install 'hostcall[demo]')")
    return 0
  try:
    print(f"plot:    {metrics.plot(run_.dir)}")
  except Exception as exc:  # noqa: BLE001 - the fit itself succeeded
    print(f"plot:    failed ({type(exc).__name__}: {exc})")
  return 0


def _summary(args, starts, params, final_loss, elapsed, steps, rows,
             run_) -> None:
  print(f"\nfinished in {elapsed:.1f} s (compile included): "
        f"{steps * len(starts) / elapsed:,.0f} member-steps/s")
  print("\n  member  start k  final k  amplitude  offset  full-data loss")
  for member in range(len(starts)):
    print(f"  {member:>6}  {float(starts[member]):7.2f}  "
          f"{float(params['wavenumber'][member]):7.3f}  "
          f"{float(params['amplitude'][member]):9.3f}  "
          f"{float(params['offset'][member]):6.3f}  "
          f"{float(final_loss[member]):14.5f}")
  print(f"  {'truth':>6}  {'':7}  {TRUE['wavenumber']:7.3f}  "
        f"{TRUE['amplitude']:9.3f}  {TRUE['offset']:6.3f}  "
        f"{'(noise 0.05)':>14}")
  best = int(jnp.argmin(final_loss))
  # The noise alone leaves a mean squared error of about 0.05**2.
  found = [m for m in range(len(starts)) if float(final_loss[m]) < 0.01]
  print(f"\n{len(found)} of {len(starts)} starts reach the true minimum; "
        f"best fit: member {best}, k = "
        f"{float(params['wavenumber'][best]):.3f} (true {TRUE['wavenumber']})")
  for m in sorted(set(range(len(starts))) - set(found)):
    print(f"member {m} stopped in a local minimum at k = "
          f"{float(params['wavenumber'][m]):.3f}")
  print(f"metrics: {len(rows)} rows ({steps} steps x {len(starts)} "
        f"members) in {run_.dir / 'metrics.jsonl'}")

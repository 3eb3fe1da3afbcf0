"""A tour of the legacy host_callback taps under jit, scan, vmap and grad."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hostcall import host_callback as hcb


def _section(title: str) -> None:
  print(f"\n== {title}")


HELP = "legacy host_callback taps under jit, scan, vmap and grad"


def add_arguments(parser) -> None:
  del parser  # no options


def run(args=None) -> int:
  _section("jit + scan: one tap per step, delivered in program order")

  def step(carry, x):
    carry = 0.5 * carry + x
    hcb.id_print(carry, what="carry")
    return carry, carry

  jax.jit(lambda xs: jax.lax.scan(step, 0.0, xs))(jnp.arange(1.0, 4.0))
  hcb.barrier_wait()

  _section("vmap: the tap receives the whole batch and the transforms")

  def power3(x):
    y = x * x
    hcb.id_print((x, y), what="x,x^2")
    return y * x

  jax.jit(jax.vmap(power3))(jnp.array([2.0, 3.0]))
  hcb.barrier_wait()

  _section("grad: taps see primal values only, once per evaluation")
  print("d/dx x^3 at 3 =", jax.grad(power3)(3.0))
  hcb.barrier_wait()

  _section("vmap of grad of jit")
  print("grads =", jax.vmap(jax.grad(jax.jit(power3)))(jnp.array([1.0, 2.0])))
  hcb.barrier_wait()

  _section("call: a NumPy routine returns its result into the computation")

  def host_eig(m):
    return np.linalg.eigvalsh(m).astype(m.dtype)

  @jax.jit
  def spectrum(m):
    return hcb.call(host_eig, m,
                    result_shape=jax.ShapeDtypeStruct(m.shape[:-1], m.dtype))

  print("eigenvalues =", spectrum(jnp.array([[2.0, 1.0], [1.0, 2.0]])))

  _section("a failing tap is logged, never hangs, and the barrier raises it")

  def fragile(value, transforms):
    raise ValueError(f"cannot handle {value}")

  jax.jit(lambda x: hcb.id_tap(fragile, x) + 1)(41.0).block_until_ready()
  try:
    hcb.barrier_wait()
  except hcb.CallbackException as exc:
    cause = exc.__cause__
    print("barrier_wait raised CallbackException:",
          f"{type(cause).__name__}: {cause}")
  return 0

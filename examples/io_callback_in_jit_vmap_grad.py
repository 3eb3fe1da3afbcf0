"""io_callback inside jit, vmap and grad: an impure host function, step by step.

``from jax.experimental import io_callback`` became
``from hostcall import io_callback``; where an example shows a JAX wall, the
hostcall option that removes it is shown next to it.
"""

import jax
import jax.numpy as jnp
import numpy as np

import hostcall
from hostcall import io_callback

# --- print inside jit shows tracers; debug_print shows runtime values --------


@jax.jit
def f(x):
  y = x + 1
  print("intermediate value: {}".format(y))
  return y * 2


result = f(2)


@jax.jit
def f(x):
  y = x + 1
  hostcall.debug_print("intermediate value: {}", y)
  return y * 2


result = f(2)
jax.effects_barrier()

# --- io_callback inside jit: a global NumPy RNG -------------------------------

global_rng = np.random.default_rng(0)


def host_side_random_like(x):
  """Generate a random array like x using the global_rng state"""
  # We have two side-effects here:
  # - printing the shape and dtype
  # - calling global_rng, thus updating its state
  print(f'generating {x.dtype}{list(x.shape)}')
  return global_rng.uniform(size=x.shape).astype(x.dtype)


@jax.jit
def numpy_random_like(x):
  return io_callback(host_side_random_like, x, x)


x = jnp.zeros(5)
first = numpy_random_like(x)
second = numpy_random_like(x)  # the state advanced: different numbers
print("first:", first)
print("second:", second)
print("state advanced:", not np.array_equal(first, second))

# --- vmap: unordered is allowed (per-element calls) ----------------------------

print("vmap:", jax.vmap(numpy_random_like)(x))


# --- vmap of an ordered callback: JAX's error, and hostcall's option ----------

@jax.jit
def numpy_random_like_ordered(x):
  return io_callback(host_side_random_like, x, x, ordered=True)


try:
  jax.vmap(numpy_random_like_ordered)(x)
except ValueError as e:
  print("ValueError:", str(e).split(".")[0] + ".")


@jax.jit
def numpy_random_like_ordered_vmappable(x):
  return io_callback(host_side_random_like, x, x, ordered=True,
                     vmap_method="sequential")


print("ordered vmap:", jax.vmap(numpy_random_like_ordered_vmappable)(
    jnp.zeros((2, 3))))


# --- scan: ordered or not ----------------------------------------------------

def body_fun(_, x):
  return _, numpy_random_like_ordered(x)


print("scan:", jax.lax.scan(body_fun, None, jnp.arange(5.0))[1])


# --- grad: a callback independent of the differentiated value runs -------------

@jax.jit
def f(x):
  io_callback(lambda: print('hello'), None)
  return x


jax.grad(f)(1.0)
jax.effects_barrier()

# A callback that depends on it fails in JAX; hostcall raises JAX's error too,
# and with differentiable=False its result is a constant for differentiation.
try:
  jax.grad(lambda x: numpy_random_like(x).sum())(jnp.ones(3))
except ValueError as e:
  print("ValueError:", str(e).split(".")[0] + ".")

g = jax.grad(lambda x: (x * io_callback(host_side_random_like, x, x,
                                        differentiable=False)).sum())
print("grad with differentiable=False:", g(jnp.ones(3)))

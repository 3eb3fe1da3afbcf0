"""pure_callback: a pure host function under jit, vmap and grad.

``jax.pure_callback`` became ``hostcall.pure_callback``. Two calls gained the
one argument modern JAX needs: ``vmap_method="sequential"`` for ``vmap``
(JAX refuses to guess since 0.4.35) and ``finite_differences=True`` for
``grad`` of the black-box host function (JAX has no derivative for it).
"""

import jax
import jax.numpy as jnp
import numpy as np

import hostcall


# Suppose this function stands for some complex pure computation,
# perhaps from an external library or custom Python code.
def external_pure_python_computation(x: np.ndarray, y: float) -> np.ndarray:
  """A placeholder for a pure Python function."""
  # Make sure the inputs of this function are NumPy arrays
  if isinstance(x, jax.Array):
    x = np.array(x)
  # Example of a pure computation:
  return np.sin(x) * y + 1.0


def jax_function_using_callback(a, b, **options):
  """A JAX function containing a pure callback."""
  # The expected output structure: like 'a'.
  output_shape_dtype = jax.ShapeDtypeStruct(a.shape, a.dtype)
  result = hostcall.pure_callback(
      external_pure_python_computation,  # the pure Python function
      output_shape_dtype,                # expected output shape/dtype
      a,                                 # actual argument 'a'
      b,                                 # actual argument 'b'
      **options,
  )
  return result + a  # continue with standard JAX operations


key = jax.random.PRNGKey(0)
input_array = jax.random.normal(key, (3, 3))
input_scalar = 2.0

jitted_function = jax.jit(jax_function_using_callback)
output = jitted_function(input_array, input_scalar)
print("input array:\n", input_array)
print("\noutput array:\n", output)

expected_output = (np.sin(np.array(input_array)) * input_scalar + 1.0
                   + np.array(input_array))
print("\nexpected output (approx):\n", expected_output)
assert np.allclose(output, expected_output)

# vmap: one added argument, the vmap_method JAX requires.
vmapped_function = jax.vmap(
    lambda a, b: jax_function_using_callback(a, b, vmap_method="sequential"),
    in_axes=(0, None))
batched_input_array = jax.random.normal(key, (10, 3, 3))
batched_output = vmapped_function(batched_input_array, input_scalar)
print("\nbatched output shape:", batched_output.shape)

# grad: one added argument, finite differences of the black box.
grad_function = jax.grad(lambda x: jnp.sum(jax_function_using_callback(
    x, input_scalar, finite_differences=True)))
gradients = grad_function(input_array)
print("\ngradient with respect to input_array:\n", gradients)
analytic = np.cos(np.array(input_array)) * input_scalar + 1.0
print("max abs error against the analytic gradient:",
      float(np.max(np.abs(np.asarray(gradients) - analytic))))


# Multiple outputs
def multi_output_pure_function(x):
  return np.sum(x), np.mean(x)


def jax_multi_output_callback(arr):
  # Output structure: two float32 scalars
  output_structure = (
      jax.ShapeDtypeStruct((), arr.dtype),  # a scalar has shape ()
      jax.ShapeDtypeStruct((), arr.dtype),
  )
  sum_val, mean_val = hostcall.pure_callback(
      multi_output_pure_function, output_structure, arr)
  return sum_val * 2, mean_val * 3


input_arr = jnp.arange(5.0)
res1, res2 = jax.jit(jax_multi_output_callback)(input_arr)
print(f"\nmultiple outputs: {res1=}, {res2=}")  # res1=20.0, res2=6.0

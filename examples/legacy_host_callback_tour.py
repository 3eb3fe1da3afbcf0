"""The removed jax.experimental.host_callback, on today's JAX: a tour.

Only the import changed: ``from jax.experimental import host_callback`` became
``from hostcall import host_callback``.
"""

import jax
import jax.numpy as jnp
import numpy as np

from hostcall import host_callback


# --- id_tap: an identity with a host-side side effect -------------------------

# This function runs on the Python host.
def log_intermediate_data(arg, transform_info):
  # arg is a NumPy array here
  print("\n--- host callback ---")
  print(f"received data type: {type(arg)}")
  print(f"data shape: {arg.shape}")
  print(f"data content (sample): {arg.flatten()[:5]}")
  print(f"JAX transform context: {transform_info}")
  print("--- end of host callback ---\n")
  # id_tap uses no explicit return value


@jax.jit
def process_data(x):
  y = jnp.sin(x) * 2.0
  # Inserted into the computation after y is computed.
  # tap_with_transform=True gives information about jit/vmap etc.
  host_callback.id_tap(log_intermediate_data, y, tap_with_transform=True)
  # The y used below is still jnp.sin(x) * 2.0
  z = jnp.mean(jnp.cos(y))
  return z


key = jax.random.PRNGKey(42)
input_data = jax.random.uniform(key, (8, 8))

print("Running the jit-compiled function with host_callback...")
result = process_data(input_data)
# Callbacks are asynchronous: block until the computation is done.
result.block_until_ready()
print(f"final result: {result}")


# --- id_print: print from the host ------------------------------------------

@jax.jit
def simple_print_example(x):
  y = x + 5.0
  # Print y directly (from the host)
  host_callback.id_print(y, what="intermediate y")
  return y * 2.0


data = jnp.arange(3.0)
output = simple_print_example(data)
output.block_until_ready()  # needed to see the printed output


# --- call: return values into the computation -------------------------------

# Simulates an external library function not available in JAX.
def external_cpu_calculation(data_np, parameter):
  # This function runs on the Python host
  print("\n--- host callback (call) ---")
  print(f"received data shape: {data_np.shape}")
  print(f"received parameter: {parameter}")
  # Some computation, possibly with SciPy/OpenCV etc.
  result_np = (np.tanh(data_np) + parameter).astype(data_np.dtype)
  print(f"returned result shape: {result_np.shape}")
  print("--- end of host callback (call) ---\n")
  return result_np


@jax.jit
def jax_workflow(x, ext_param):
  intermediate = jnp.log1p(jnp.abs(x))

  # Call the external function
  external_result = host_callback.call(
      external_cpu_calculation,   # Python function to call on the host
      (intermediate, ext_param),  # arguments (JAX arrays converted automatically)
      # Important: the expected shape and dtype of the *returned value*
      result_shape_dtypes=intermediate  # same shape/dtype as 'intermediate'
      # otherwise: result_shape_dtypes=jax.ShapeDtypeStruct(shape=(...), dtype=jnp.float32)
  )

  # Use the host callback's result in later JAX operations
  final_output = external_result / (1.0 + jnp.mean(intermediate))
  return final_output


input_array = jnp.linspace(-2.0, 2.0, 5, dtype=jnp.float32)
parameter_value = 0.5  # a static Python value passed as an argument

print("Running the jit-compiled function with host_callback.call...")
final_result = jax_workflow(input_array, parameter_value)
final_result.block_until_ready()  # make sure the host work has finished

print(f"final JAX result: {final_result}")

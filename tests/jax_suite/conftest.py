import jax

# four_devices/ needs 4 CPU devices, configured before JAX starts:
# test_four_devices.py runs it in its own pytest process.
collect_ignore_glob = []
if jax.device_count() < 4:
  collect_ignore_glob.append("four_devices/*")

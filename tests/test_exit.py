"""Host calls made while the interpreter exits are delivered (issue 42).

hostcall waits for every host call at exit from a hook registered when it
is imported: exit handlers registered after ``import hostcall`` (atexit
runs the last registered first) run before it, and what they call on the
host reaches it. Each program runs in a child process that exits while
its handler's calls may still be queued.
"""

import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import atexit, os, sys
    route, jit_name, out = sys.argv[1], sys.argv[2], sys.argv[3]
    sink = open(out, "w")
    # Registered before hostcall is imported: runs after hostcall's wait,
    # writing out what the host functions received.
    atexit.register(sink.flush)

    import jax, jax.numpy as jnp
    import hostcall
    from hostcall._jit import routes
    from hostcall import host_callback as hcb

    if route == "outputs":
      routes.set_outputs_only(True)
    record = lambda v: sink.write(f"{int(v)}\\n")
    jit = hostcall.jit if jit_name == "hostcall.jit" else jax.jit
    tap = jit(lambda x: hostcall.debug_callback(record, x))
    async_tap = jax.jit(lambda x: hcb.id_tap(lambda v, t: record(v), x,
                                             result=x))

    def at_exit():  # registered after import hostcall, before any call
      for i in range(200):
        (tap if jit_name != "id_tap" else async_tap)(jnp.int32(i))
      sink.flush()
    atexit.register(at_exit)
""")


@pytest.mark.parametrize("route", ["queued", "outputs"])
@pytest.mark.parametrize("jit_name", ["hostcall.jit", "jax.jit", "id_tap"])
def test_host_calls_from_an_exit_handler_are_delivered(tmp_path, route,
                                                       jit_name):
  out = tmp_path / "calls.txt"
  proc = subprocess.run(
      [sys.executable, "-c", CHILD, route, jit_name, str(out)],
      capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = out.read_text().split()
  assert sorted(map(int, lines)) == list(range(200)), (
      len(lines), proc.stderr[-2000:])

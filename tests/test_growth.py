"""Growth without bound: what a call site, a run or a loop invocation leaves
behind once it is gone.

A host function (and all it closes over) lives as long as the executables
compiled from its call sites; every registry of the package stays the same
size over any number of invocations; so do the process's threads and open
file descriptors. The tests of the queue run in a fresh interpreter, once
with each route into the queue (its FFI handler; JAX's callbacks with
``HOSTCALL_NATIVE=0``): the queue, and the route, belong to the process.
"""

import gc
import textwrap
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import host_callback as hcb
from tests.helpers import run_python

# HOSTCALL_NATIVE=0: the same native queue, reached through JAX's callbacks.
QUEUES = pytest.mark.parametrize("native", ["1", "0"], ids=["ffi",
                                                            "jax_callbacks"])

# Prepended to each child's code: ``sizes()``, the length of every container
# the package holds (module globals, and the attributes of its objects, three
# levels deep) and the entries of its functools caches; ``resources()``, the
# process's threads and open file descriptors.
_PRELUDE = """
import collections, functools, gc, os, sys, threading, weakref
import jax, jax.numpy as jnp, numpy as np
import hostcall
from hostcall import host_callback as hcb

def sizes():
  found, seen = {}, set()
  def visit(label, value, depth):
    if id(value) in seen:
      return
    seen.add(id(value))
    if isinstance(value, (dict, list, set, collections.deque)):
      found[label] = len(value)
      if depth:  # what the package keeps in its containers
        for i, item in enumerate(list(value)[:4]):
          if type(item).__module__.startswith("hostcall"):
            visit(f"{label}[{i}]", item, depth - 1)
    elif hasattr(value, "cache_info"):
      found[label] = value.cache_info().currsize
    elif (depth and type(value).__module__.startswith("hostcall")
          and not isinstance(value, type)):
      attributes = getattr(value, "__dict__", None) or {
          name: getattr(value, name) for name in getattr(
              type(value), "__slots__", ()) if hasattr(value, name)}
      for name, attribute in attributes.items():
        visit(f"{label}.{name}", attribute, depth - 1)
  for name, module in sorted(sys.modules.items()):
    if name.startswith("hostcall"):
      for attr, value in list(vars(module).items()):
        if not isinstance(value, type(sys)):
          visit(f"{name}.{attr}", value, 3)
  return found

def resources():
  return threading.active_count(), len(os.listdir("/proc/self/fd"))

def settled():
  hostcall.barrier()
  gc.collect()
  hostcall.barrier()  # releases the call sites the collection retired
  return sizes(), resources()

def changed(before, after):
  return {k: (before.get(k), v) for k, v in after.items()
          if before.get(k) != v}
"""


def _child(code: str, native: str, timeout: float = 300):
  proc = run_python(_PRELUDE + textwrap.dedent(code), timeout=timeout,
                 env={"HOSTCALL_NATIVE": native})
  return proc.stdout.strip().splitlines()[-1]


@QUEUES
def test_an_asynchronous_call_site_is_released_with_its_executable(native):
  # 40 jitted functions tap asynchronously through closures over 8 MiB each.
  # The first tap holds the delivery thread until the functions are deleted,
  # so that the others are still queued then: they must be delivered, and
  # only then released.
  out = _child("""
      from hostcall._runtime import call_sites
      sites_before = len(call_sites.sites)
      release, got, refs = threading.Event(), [], []

      class Big:
        def __init__(self):
          self.data = np.ones(1 << 20)

      def make(i):
        big = Big()
        refs.append(weakref.ref(big))
        def tap(x, transforms):
          if i == 0:
            release.wait(60)
          got.append((i, int(x), big.data.size))
        return jax.jit(lambda x: hcb.id_tap(tap, x + 1, delivery="async"))

      functions = [make(i) for i in range(40)]
      for i, f in enumerate(functions):
        f(i)
      del functions, f
      jax.clear_caches()
      gc.collect()
      alive_while_queued = sum(r() is not None for r in refs)
      release.set()
      hostcall.barrier()
      gc.collect()
      hostcall.barrier()
      print(alive_while_queued, sum(r() is not None for r in refs),
            len(call_sites.sites) - sites_before,
            sorted(got) == [(i, i + 1, 1 << 20) for i in range(40)])
      """, native)
  assert out.split() == ["40", "0", "0", "True"]


@QUEUES
def test_the_delivery_thread_keeps_no_tapped_values(native):
  # Between two batches the delivery thread holds nothing of the last: an
  # 8 MiB tap is released once its host function has let go of it.
  out = _child("""
      received = []
      def tap(x, transforms):
        received.append((weakref.ref(x), float(x[-1])))
      jax.jit(lambda x: hcb.id_tap(tap, x, delivery="async"))(
          jnp.full(1 << 21, 7.0, jnp.float32))
      hostcall.barrier()
      gc.collect()
      (ref, last), = received
      print(ref() is None, last)
      """, native)
  assert out.split() == ["True", "7.0"]


@pytest.mark.parametrize("jit", ["jax.jit", "hostcall.jit"])
def test_a_call_site_released_while_its_program_runs_delivers_every_tap(jit):
  # The call returns at once (asynchronous dispatch); the function, its
  # executable and the site's owner go while the program still runs: its
  # taps, queued after that, are still delivered, and the site released.
  from hostcall._runtime import call_sites
  got, ref = [], None

  def start(x):
    nonlocal ref
    big = np.ones(1 << 20)
    ref = weakref.ref(big)

    def step(c, i):
      c = jnp.tanh(c @ c)
      hostcall.debug_callback(lambda k, v: got.append(int(k) + big[0] - 1),
                              i, c[0, 0])
      return c, None

    wrap = {"jax.jit": jax.jit, "hostcall.jit": hostcall.jit}[jit]
    return wrap(lambda x: jax.lax.scan(step, x, jnp.arange(3000))[0])(x)

  sites_before = len(call_sites.sites)
  # A long program first, whose result the tapped one takes: that one
  # starts after its owner has gone.
  slow = jax.jit(lambda x: jax.lax.scan(
      lambda c, _: (jnp.tanh(c @ c), None), x, None, length=40_000)[0])
  out = start(slow(jnp.full((64, 64), 0.01)))
  jax.clear_caches()
  gc.collect()  # the executable's owner is gone, maybe before the taps
  hostcall.barrier()
  gc.collect()
  hostcall.barrier()
  assert got == list(range(3000))
  assert np.isfinite(np.asarray(out)).all()
  del out
  gc.collect()
  hostcall.barrier()
  assert ref() is None and len(call_sites.sites) <= sites_before


@pytest.mark.parametrize("flavour", [
    "id_tap sync", "id_tap async", "pure_callback", "io_callback",
    "debug_callback"])
def test_a_host_function_goes_with_its_function_without_clearing_caches(
    flavour):
  # As JAX's own callbacks: deleting the jitted function is enough; JAX's
  # caches of primitive parameters hold call sites weakly.
  got = []

  def site():
    """The call site, closing over 8 MiB, and a weak reference to those."""
    big = np.ones(1 << 20)

    def host(x, *transforms):
      got.append(float(x) + big[0])
      return np.asarray(x)

    like = jax.ShapeDtypeStruct((), jnp.float32)
    call = {
        "id_tap sync": lambda x: hcb.id_tap(host, x, delivery="sync"),
        "id_tap async": lambda x: hcb.id_tap(host, x, delivery="async"),
        "pure_callback": lambda x: hostcall.pure_callback(host, like, x),
        "io_callback": lambda x: hostcall.io_callback(host, like, x),
        "debug_callback": lambda x: hostcall.debug_callback(host, x) or x,
    }[flavour]
    return call, weakref.ref(big)

  call, ref = site()
  f = jax.jit(call)
  f(jnp.float32(2.0))
  del f, call
  gc.collect()  # the executable goes: its call site is retired
  hostcall.barrier()  # its taps delivered, the site is released
  gc.collect()
  assert got == [3.0]
  assert ref() is None


@QUEUES
def test_a_closed_memory_run_is_released_with_its_executables(native):
  out = _child("""
      import tempfile
      root, refs, rows = tempfile.mkdtemp(), [], []
      for i in range(40):
        run = hostcall.metrics.Run(f"r{i}", root=root, writers=["memory"])
        f = jax.jit(lambda x: run.log(0, big=x))
        f(jnp.full(1 << 18, i, jnp.float32))
        run.close()
        rows.append(float(run.dataframe()["big"][0][0]))
        refs.append(weakref.ref(run))
      del run, f
      jax.clear_caches()
      gc.collect()
      hostcall.barrier()
      gc.collect()
      print(sum(r() is not None for r in refs), rows == list(range(40)))
      """, native)
  assert out.split() == ["0", "True"]


_STEERED_LOOPS = """
      hostcall._apps.progress.bars.Bars.KEPT_BARS = 16  # reached within the warm-up
      checks = []
      loops = [
          jax.jit(lambda x: hostcall.control.while_loop(
              lambda c: c < 40, lambda c: c + 1, x, every=10,
              time_limit=3600.0)),
          jax.jit(lambda x: hostcall.progress.scan(
              lambda c, _: (c + 1, c), x, length=40, every=10,
              interruptible=True, disable=True)),
          jax.jit(lambda x: hostcall.control.while_loop(
              lambda c: c < 40, lambda c: c + 1, x, every=10,
              stop_when=lambda status: checks.append(status.steps) and False)),
      ]
      def invoke(n):
        for i in range(n):
          for loop in loops:
            loop(i % 10)
"""


@QUEUES
def test_steered_loop_registries_stay_flat(native):
  out = _child(_STEERED_LOOPS + """
      invoke(100)
      before = settled()
      invoke(2000)
      after = settled()
      groups = "hostcall._apps.control.controls._groups"
      print(len(checks) >= 2100 * 3, changed(before[0], after[0]),
            before[1] == after[1], after[0][groups])
      """, native)
  assert out == "True {} True 0"


_TAPS = """
      sink = []
      taps = [jax.jit(lambda x: hcb.id_tap(lambda a, t: sink.append(int(a)),
                                           x, delivery=delivery))
              for delivery in ("async", "sync")]
      def invoke(n):
        for i in range(n):
          for tap in taps:
            tap(i)
          if i % 25 == 0:  # and a call site compiled, run and let go of
            jax.jit(lambda x: hcb.id_tap(lambda a, t: sink.append(int(a)),
                                         x, delivery="async"))(i)
"""


@QUEUES
def test_taps_leave_registries_threads_and_descriptors_flat(native):
  out = _child(_TAPS + """
      invoke(100)
      before = settled()
      invoke(5000)
      after = settled()
      print(len(sink) == 5100 * 2 + 4 + 200, changed(before[0], after[0]),
            before[1] == after[1])
      """, native)
  assert out == "True {} True"


@pytest.mark.heavy
@QUEUES
def test_100000_invocations_leave_everything_flat(native):
  out = _child(_TAPS + """
      taps_invoke = invoke
  """ + _STEERED_LOOPS + """
      loops_invoke = invoke
      taps_invoke(1000)
      loops_invoke(100)
      before = settled()
      taps_invoke(100000)
      loops_invoke(100000)
      after = settled()
      print(changed(before[0], after[0]), before[1] == after[1])
      """, native, timeout=3600)
  assert out == "{} True"


_JIT_STEPS = """
      import resource
      seen = []
      run = hostcall.metrics.Run("growth", root=os.environ["RUN_ROOT"],
                                 writers=["memory"])
      @hostcall.jit
      def step(x, i):
        hostcall.debug_callback(lambda v: seen.append(1), x[0])
        run.log(i, loss=x[1])
        return jnp.tanh(x)
      def invoke(n):
        x = jnp.ones(16)
        for i in range(n):
          x = step(x, i)
      def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""


def test_hostcall_jit_leaves_registries_threads_and_descriptors_flat(
    tmp_path, monkeypatch):
  monkeypatch.setenv("RUN_ROOT", str(tmp_path))
  out = _child(_JIT_STEPS + """
      invoke(200)
      before = settled()
      invoke(5000)
      after = settled()
      print(len(seen) == 5200, changed(before[0], after[0]),
            before[1] == after[1])
      """, "1")
  assert out == "True {} True"


@pytest.mark.heavy
def test_100000_hostcall_jit_calls_leave_memory_flat(tmp_path, monkeypatch):
  monkeypatch.setenv("RUN_ROOT", str(tmp_path))
  out = _child(_JIT_STEPS + """
      invoke(20000)
      settled()
      peak = rss()
      invoke(100000)
      after = settled()
      grown_mib = (rss() - peak) / 1024
      print(len(seen) == 120000, grown_mib < 64)
      """, "1", timeout=3600)
  assert out == "True True"


def test_a_barrier_interrupted_before_settling_leaves_released_sites_to_the_next(
    monkeypatch):
  from hostcall import _jax_private
  from hostcall._runtime import call_sites
  got = []
  f = jax.jit(lambda x: hcb.id_tap(lambda a, t: got.append(int(a)), x,
                                   delivery="async"))
  f(5)
  hostcall.barrier()
  registered = len(call_sites.sites)
  del f
  jax.clear_caches()
  gc.collect()  # its site retired, not yet settled by a barrier
  real = _jax_private.wait_for_effects

  def interrupted():
    monkeypatch.setattr(_jax_private, "wait_for_effects", real)
    raise KeyboardInterrupt

  monkeypatch.setattr(_jax_private, "wait_for_effects", interrupted)
  with pytest.raises(KeyboardInterrupt):
    hostcall.barrier()
  assert len(call_sites.sites) == registered  # kept for the next barrier
  hostcall.barrier()
  assert got == [5] and len(call_sites.sites) == registered - 1

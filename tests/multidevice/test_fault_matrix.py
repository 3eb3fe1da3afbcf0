"""The fault matrix on 4 devices: a host function raising on device 1 only.

For each capability (asynchronous taps, large ones handed over without a
copy, ``hostcall.scan``, progress bars, metrics) a host function raises on
device 1 at one step of a loop under ``shard_map`` (and ``pmap``); what
every device's host functions received, in order, how the call ended, what
the next barrier raised, and that the next run works are asserted.
(Steered loops: ``test_steering_faults.py``; two processes:
``tests/test_multiprocess.py``.)

``tests/test_multidevice.py`` runs this file once with each route into
the queue (the FFI handler, and JAX's callbacks with ``HOSTCALL_NATIVE=0``,
which must be set before hostcall is imported); the fixture below checks
which one runs.
"""

import ctypes
import io
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcall
from hostcall import host_callback as hcb, metrics, progress
from hostcall._apps.progress import bars as bars_module
from hostcall._runtime.native_queue import ZERO_COPY_BYTES

assert jax.device_count() == 4, "run with --xla_force_host_platform_device_count=4"

STEPS, FAILING_STEP, FAILING_DEVICE = 12, 5, 1
NATIVE = os.environ.get("HOSTCALL_NATIVE", "1") != "0"


@pytest.fixture(autouse=True, scope="module")
def _the_queue_asked_for():
  # The route this run was asked for is the one in use: the FFI handler,
  # or JAX's callbacks pushing into the same queue (HOSTCALL_NATIVE=0).
  assert hostcall.queue_stats()["native"] is NATIVE


def _device() -> int:
  return hostcall.call_context().device.id


def _mesh():
  return Mesh(np.array(jax.devices()), ("d",))


def _per_device(f):
  """``f`` on each device's block of a (4 * n,) array, under shard_map."""
  return jax.jit(jax.shard_map(f, mesh=_mesh(), in_specs=P("d"),
                               out_specs=P("d")))


def _raised_once(match):
  """The next barrier raises CallbackException naming one failure; the one
  after it raises nothing."""
  with pytest.raises(hcb.CallbackException) as info:
    hostcall.barrier()
  text = str(info.value)
  assert re.search(match, text), text
  assert "1 tap function call(s) raised since the last barrier" in text
  assert isinstance(info.value.__cause__, ValueError)
  hostcall.barrier()


def _root(array):
  """The object an array's memory belongs to."""
  while isinstance(array, np.ndarray) and array.base is not None:
    array = array.base
  return array


# --- asynchronous taps, small and large (handed over without a copy) --------

_SIZES = {"small": 4, "zero-copy": ZERO_COPY_BYTES // 4}  # float32s a device


class TapHost:
  """An id_tap function recording, per device, ``(step, first, last)`` of
  each tap; it raises on one device at one step."""

  def __init__(self, failing_device=FAILING_DEVICE):
    self.failing_device = failing_device
    self.seen = {}
    self.zero_copy = set()

  def __call__(self, arg, transforms):
    step, block = arg
    device = _device()
    self.seen.setdefault(device, []).append(
        (int(step), float(block[0]), float(block[-1])))
    self.zero_copy.add(isinstance(_root(block), ctypes.Array))
    if device == self.failing_device and int(step) == FAILING_STEP:
      raise ValueError(f"tap boom on device {device} at step {int(step)}")

  @staticmethod
  def expected(n):
    return {d: [(s, 1000.0 * d + s, 1000.0 * d + n - 1 + s)
                for s in range(STEPS)] for d in range(4)}


def _tapping_loop(host, api):
  def loop(block):
    def step(c, s):
      if api == "delivery=":
        hcb.id_tap(host, (s, block + s), delivery="async")
      else:
        hcb.id_tap(host, (s, block + s))
      return c + 1, None
    if api == "delivery=":
      return lax.scan(step, block, jnp.arange(STEPS))[0]
    with hostcall.delivery("async"):  # fixed when traced
      return lax.scan(step, block, jnp.arange(STEPS))[0]
  return loop


@pytest.mark.parametrize("size", list(_SIZES))
@pytest.mark.parametrize("api", ["delivery=", "with delivery"])
@pytest.mark.parametrize("mapping", ["shard_map", "pmap"])
def test_an_asynchronous_tap_raising_on_one_device_loses_no_tap(
    mapping, api, size):
  n = _SIZES[size]
  host = TapHost()
  loop = _tapping_loop(host, api)
  blocks = (1000.0 * jnp.arange(4.0)[:, None] + jnp.arange(float(n)))
  if mapping == "shard_map":
    f, x = _per_device(loop), blocks.reshape(-1)
  else:
    f, x = jax.pmap(loop), blocks
  jax.block_until_ready(f(x))  # taps postpone failures: the call returns
  _raised_once(r"ValueError: tap boom on device 1 at step 5")
  # Every device's taps arrived, each once, in order: the failing device's
  # later ones too.
  assert host.seen == TapHost.expected(n)
  # Large taps reach the host function as views on the native queue's
  # blocks; small ones, and every tap pushed by a Python callback, as copies.
  assert host.zero_copy == {NATIVE and size == "zero-copy"}
  # Later calls work, with nothing left over.
  host.failing_device = None
  host.seen.clear()
  jax.block_until_ready(f(x))
  hostcall.barrier()
  assert host.seen == TapHost.expected(n)


# --- hostcall.scan: buffered taps fail as lax.scan's -------------------------

class StepHost:
  """A host function recording ``(device, step)``; raises on one device at
  one step."""

  def __init__(self, failing_device=FAILING_DEVICE):
    self.failing_device = failing_device
    self.seen = []

  def __call__(self, step):
    device = _device()
    self.seen.append((device, int(step)))
    if device == self.failing_device and int(step) == FAILING_STEP:
      raise ValueError(f"boom on device {device} at step {int(step)}")

  def steps_of(self, device):
    return [s for d, s in self.seen if d == device]


_TAPS = {
    "id_tap": lambda host, s: hcb.id_tap(lambda v, _: host(v), s),
    "debug_callback": lambda host, s: hostcall.debug_callback(host, s),
}

_SCANS = {
    "lax.scan": lambda step, init, xs: lax.scan(step, init, xs),
    "hostcall.scan every=4": lambda step, init, xs: hostcall.scan(
        step, init, xs, every=4),
    "hostcall.scan every=64": lambda step, init, xs: hostcall.scan(
        step, init, xs, every=64),
}


def _scan_outcome(scan, flavour, delivery):
  """The steps each device's host function saw, how the call ended and
  what the next barrier raised."""
  host = StepHost()

  def loop(x):
    def step(c, s):
      _TAPS[flavour](host, s)
      return c + x, None
    with hostcall.delivery(delivery):  # fixed when traced
      return _SCANS[scan](step, x * 0, jnp.arange(STEPS))[0]

  f = _per_device(loop)
  try:
    jax.block_until_ready(f(jnp.arange(4.0)))
    call = "returned"
  except jax.errors.JaxRuntimeError as exc:
    assert "boom on device 1 at step 5" in str(exc)
    call = "failed"
  try:
    hostcall.barrier()
    barrier = "nothing"
  except hcb.CallbackException as exc:
    assert "boom on device 1 at step 5" in str(exc)
    assert "1 tap function call(s) raised" in str(exc)
    barrier = "CallbackException"
  hostcall.barrier()  # reported once
  seen = {d: host.steps_of(d) for d in range(4)}
  # The same program runs right after, on every device.
  host.failing_device = None
  host.seen.clear()
  jax.block_until_ready(f(jnp.arange(4.0)))
  hostcall.barrier()
  assert all(host.steps_of(d) == list(range(STEPS)) for d in range(4))
  return seen, call, barrier


@pytest.mark.parametrize("delivery", ["sync", "async"])
@pytest.mark.parametrize("flavour", list(_TAPS))
@pytest.mark.parametrize("scan", [s for s in _SCANS if s != "lax.scan"])
def test_hostcall_scan_fails_on_one_device_as_lax_scan(scan, flavour,
                                                       delivery):
  expected = _scan_outcome("lax.scan", flavour, delivery)
  assert _scan_outcome(scan, flavour, delivery) == expected
  # Spelled out: a synchronous debug_callback fails the call, and no later
  # step reaches the failing device's host function (the other devices run
  # on to their end: they do not wait for each other); a tap, or anything
  # asynchronous, lets every device run every step, and the barrier
  # reports it.
  every_step = list(range(STEPS))
  if delivery == "sync" and flavour == "debug_callback":
    assert expected == ({0: every_step, 1: list(range(FAILING_STEP + 1)),
                         2: every_step, 3: every_step}, "failed", "nothing")
  else:
    assert expected == ({d: every_step for d in range(4)}, "returned",
                        "CallbackException")


# --- progress bars ------------------------------------------------------------

BAR_STEPS = 40


def _bars(out: io.StringIO, desc: str) -> list[str]:
  """The last render of each bar called ``desc``, in order (a bar ends with
  a newline once closed; an open one is last and has none)."""
  finals = []
  for line in out.getvalue().split("\n"):
    renders = [r for r in line.split("\r") if r.startswith(desc + ":")]
    if renders:
      finals.append(renders[-1])
  return finals


def _open_bars():
  return [key for key, bar in bars_module.bars._bars.items() if bar.is_open]


def _progress_loop(loop, flavour, host, out, desc):
  tap = {"debug_callback": lambda s: hostcall.debug_callback(host, s),
         "async id_tap": lambda s: hcb.id_tap(lambda v, _: host(v), s,
                                              delivery="async")}[flavour]

  def f(x):
    if loop == "progress.scan":
      def step(c, s):
        tap(s)
        return c + x, None
      return progress.scan(step, x * 0, jnp.arange(BAR_STEPS), every=4,
                           file=out, desc=desc)[0]
    def body(state):
      tap(state[0])
      return state[0] + 1, state[1] + x
    return progress.while_loop(lambda s: s[0] < BAR_STEPS, body, (0, x * 0),
                               every=4, file=out, desc=desc)[1]
  return _per_device(f)


@pytest.mark.parametrize("flavour", ["debug_callback", "async id_tap"])
@pytest.mark.parametrize("loop", ["progress.scan", "progress.while_loop"])
def test_a_bar_whose_loop_fails_on_one_device_closes_stopped(loop, flavour):
  out = io.StringIO()
  host = StepHost()
  f = _progress_loop(loop, flavour, host, out, "faulty")
  count = f"{BAR_STEPS}/{BAR_STEPS}" if loop == "progress.scan" else (
      f" {BAR_STEPS}step")
  if flavour == "debug_callback":
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match="boom on device 1 at step 5"):
      jax.block_until_ready(f(jnp.arange(4.0)))
    hostcall.barrier()  # nothing postponed
    # One bar, closed when the computation failed, marked so, short of the
    # failing step: it follows the slowest device, the failed one, whose
    # last tick came after step 3 (the bar counts every 4 steps).
    assert _open_bars() == []
    (bar,) = _bars(out, "faulty")
    assert bar.rstrip().endswith(", stopped]"), bar
    shown = re.search(r"\| (\d+)/40 \[" if loop == "progress.scan"
                      else r"^faulty: (\d+)step \[", bar)
    assert shown and int(shown.group(1)) in (0, 4), bar
    assert out.getvalue().endswith("\n")
    assert host.steps_of(1) == list(range(FAILING_STEP + 1))
  else:
    jax.block_until_ready(f(jnp.arange(4.0)))
    _raised_once(r"ValueError: boom on device 1 at step 5")
    # A failing tap stops nothing: the bar ran to its end.
    (bar,) = _bars(out, "faulty")
    assert count in bar and "stopped" not in bar, bar
    assert _open_bars() == []
    assert host.steps_of(1) == list(range(BAR_STEPS))
  for device in (0, 2, 3):
    assert host.steps_of(device) == list(range(BAR_STEPS))
  # The next run draws a fresh, complete bar.
  host.failing_device = None
  jax.block_until_ready(f(jnp.arange(4.0)))
  hostcall.barrier()
  first, second = _bars(out, "faulty")
  assert count in second and "stopped" not in second, second
  assert _open_bars() == []


# --- metrics ------------------------------------------------------------------

def _logging_loop(run, tap):
  def f(x):
    def step(c, s):
      run.log(s, value=x[0] * 100 + s)
      tap(s)
      return c + x, None
    return lax.scan(step, x * 0, jnp.arange(STEPS))[0]
  return _per_device(f)


def _rows(records):
  """``(device, step, value)`` of each row, in the order written."""
  return [(r["device"], r["step"], r["value"]) for r in records]


def _by_device(rows):
  return {d: [(s, v) for dd, s, v in rows if dd == d]
          for d in sorted({r[0] for r in rows})}


def _logged(steps):
  return {d: [(s, 100.0 * d + s) for s in steps[d]] for d in range(4)}


@pytest.mark.parametrize("flavour", ["debug_callback", "async id_tap"])
def test_rows_logged_before_a_failure_on_one_device_are_kept_once(
    flavour, tmp_path):
  host = StepHost()
  tap = {"debug_callback": lambda s: hostcall.debug_callback(host, s),
         "async id_tap": lambda s: hcb.id_tap(lambda v, _: host(v), s,
                                              delivery="async")}[flavour]
  run = metrics.Run("faulty", root=tmp_path, writers=["memory", "jsonl"])
  f = _logging_loop(run, tap)
  every = list(range(STEPS))
  pushed = hostcall.queue_stats()["pushed"]
  if flavour == "debug_callback":
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match="boom on device 1 at step 5"):
      jax.block_until_ready(f(jnp.arange(4.0)))
    hostcall.barrier()
    # Device 1 logged every step before the failing one, and nothing after
    # it; the row of the failing step itself is there when the device ran
    # its log before the failing host function (the two are not ordered
    # with each other, as two unordered callbacks in JAX are not). The
    # others logged every step.
    rows = _by_device(_rows(run.records()))
    last = rows[1][-1][0]
    assert last in (FAILING_STEP - 1, FAILING_STEP), rows[1]
    expected = _logged({0: every, 1: every[:last + 1], 2: every, 3: every})
    # Nothing queued was lost: every row the devices sent is there.
    assert hostcall.queue_stats()["pushed"] - pushed == 3 * STEPS + last + 1
  else:
    jax.block_until_ready(f(jnp.arange(4.0)))
    _raised_once(r"ValueError: boom on device 1 at step 5")
    expected = _logged({d: every for d in range(4)})
  # Every row once, in each device's order, in memory and on disk alike.
  assert _by_device(_rows(run.records())) == expected
  run.flush()
  on_disk = metrics.read(run.dir).to_dict("records")
  assert _by_device(_rows(on_disk)) == expected
  # The run logs on: the next call's rows follow, each once.
  host.failing_device = None
  jax.block_until_ready(f(jnp.arange(4.0)))
  hostcall.barrier()
  rows = _by_device(_rows(run.records()))
  run.close()
  assert {d: rows[d][len(expected[d]):] for d in rows} == _logged(
      {d: every for d in range(4)})


class RaisingForDevice(metrics.Writer):
  """A writer that raises on any block holding a row of one device, and
  keeps the blocks it wrote."""

  def __init__(self, device):
    self.device = device
    self.rows = []

  def write(self, block):
    if self.device in block.device.tolist():
      raise OSError(28, f"No space left for device {self.device}")
    self.rows += [(int(d), int(s), float(v)) for d, s, v in
                  zip(block.device, block.step, block.metrics["value"])]


def test_a_writer_raising_on_one_devices_rows_costs_the_others_nothing(
    tmp_path):
  raising = RaisingForDevice(FAILING_DEVICE)
  run = metrics.Run("writer", root=tmp_path,
                    writers=[raising, "memory", "jsonl"])
  f = _logging_loop(run, lambda s: None)
  jax.block_until_ready(f(jnp.arange(4.0)))
  with pytest.raises(hcb.CallbackException,
                     match="No space left for device 1") as info:
    hostcall.barrier()
  assert isinstance(info.value.__cause__, OSError)
  hostcall.barrier()  # reported once
  every = _logged({d: list(range(STEPS)) for d in range(4)})
  # The other writers kept every row of every device, once.
  assert _by_device(_rows(run.records())) == every
  run.close()
  assert _by_device(_rows(metrics.read(run.dir).to_dict("records"))) == every
  # The raising writer wrote no row of device 1, and no row twice (it may
  # have been handed other devices' rows with device 1's, in one block).
  written = _by_device(raising.rows)
  assert 1 not in written
  assert all(rows == every[d][:len(rows)] or set(rows) <= set(every[d])
             for d, rows in written.items())
  assert len(raising.rows) == len(set(raising.rows))
  # A later run, with writers that work, logs every row.
  again = metrics.Run("writer-again", root=tmp_path,
                      writers=["memory", "jsonl"])
  jax.block_until_ready(_logging_loop(again, lambda s: None)(
      jnp.arange(4.0)))
  hostcall.barrier()
  assert _by_device(_rows(again.records())) == every
  again.close()


# --- one failed ordered call fails its own computation only (JAX #37587) --

@pytest.mark.parametrize("ordered", [True, False])
def test_after_one_failed_ordered_call_the_next_computations_run(ordered):
  mesh = _mesh()
  seen = []

  def host(v):
    if float(v[0]) == 2.0:
      raise ValueError("bad block")
    seen.append(float(v[0]))

  def body(x):
    hostcall.io_callback(host, None, x, ordered=ordered)
    return x + 1

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"),
                            out_specs=P("d")),
              in_shardings=NamedSharding(mesh, P("d")))
  with pytest.raises(Exception, match="bad block"):
    f(jnp.arange(4.0)).block_until_ready()
  hostcall.barrier()
  assert sorted(seen) == [0.0, 1.0, 3.0]  # the other devices' calls ran
  seen.clear()
  # The same program on good inputs, twice; another program; a barrier.
  for start in (10.0, 20.0):
    out = f(jnp.arange(4.0) + start)
    np.testing.assert_array_equal(out, np.arange(4.0) + start + 1)
    hostcall.barrier()
    assert sorted(seen) == [start + i for i in range(4)]
    seen.clear()
  other = jax.jit(lambda x: hostcall.io_callback(
      lambda v: seen.append(("other", float(v))), None, x, ordered=True))
  other(5.0)
  hostcall.barrier()
  jax.effects_barrier()  # JAX's own waits no longer re-raise the old error
  assert seen == [("other", 5.0)]


def test_jaxs_effects_barrier_raises_a_failure_once():
  mesh = _mesh()

  def host(v):
    raise KeyError("once")

  f = jax.jit(jax.shard_map(
      lambda x: (hostcall.io_callback(host, None, x, ordered=True), x)[1],
      mesh=mesh, in_specs=P("d"), out_specs=P("d")),
      in_shardings=NamedSharding(mesh, P("d")))
  f(jnp.arange(4.0))  # dropped: its failure reaches the token only
  with pytest.raises(Exception, match="once"):
    jax.effects_barrier()
  jax.effects_barrier()  # raised once, not at every later wait
  hostcall.barrier()

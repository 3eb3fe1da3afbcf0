"""Progress bars and metrics on 4 CPU devices: one bar, rows per device."""

import io
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcall
from hostcall import metrics, progress
from hostcall._apps.progress import bars as bars_module

assert jax.device_count() == 4, "run with --xla_force_host_platform_device_count=4"


def _bars_drawn(out: io.StringIO, desc: str) -> list[str]:
  """The final render of each bar called ``desc`` (one per closed bar)."""
  finals = []
  for line in out.getvalue().split("\n"):
    renders = [r for r in line.split("\r") if r.startswith(desc + ":")]
    if renders:
      finals.append(renders[-1])
  return finals


def _loop(out, desc):
  def f(x):
    return progress.scan(lambda c, _: (c + x, None), x * 0, length=40,
                         file=out, desc=desc)[0]
  return f


def test_shard_map_draws_one_bar_for_four_devices():
  out = io.StringIO()
  mesh = Mesh(np.array(jax.devices()), ("d",))
  f = jax.jit(jax.shard_map(_loop(out, "sharded"), mesh=mesh, in_specs=P("d"),
                            out_specs=P("d")))
  result = f(jnp.arange(4.0))
  hostcall.barrier()
  np.testing.assert_array_equal(result, 40 * np.arange(4.0))
  assert "sharded" in out.getvalue()
  (final,) = _bars_drawn(out, "sharded")
  assert "40/40" in final
  assert not [k for k, b in bars_module.bars._bars.items() if b.is_open]


def test_set_postfix_under_shard_map_shows_the_devices_range():
  out = io.StringIO()
  mesh = Mesh(np.array(jax.devices()), ("d",))

  def loop(x):
    def step(c, _):
      progress.set_postfix(c=c[0])  # each device's own value
      return c + x, None
    return progress.scan(step, x * 0, length=40, file=out, desc="ranged")[0]

  f = jax.jit(jax.shard_map(loop, mesh=mesh, in_specs=P("d"),
                            out_specs=P("d")))
  f(jnp.arange(4.0) + 1)
  hostcall.barrier()
  (final,) = _bars_drawn(out, "ranged")
  # The last step's values: 39 * x on the device holding x, 1 to 4.
  assert "40/40" in final and final.endswith("step/s, c=39..156]"), final


def test_pmap_draws_one_bar_per_call():
  out = io.StringIO()
  f = jax.pmap(_loop(out, "pmapped"))
  for _ in range(2):
    f(jnp.arange(4.0)[:, None])
  hostcall.barrier()
  finals = _bars_drawn(out, "pmapped")
  assert len(finals) == 2 and all("40/40" in f for f in finals)


def test_global_view_jit_draws_one_bar():
  out = io.StringIO()
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("d")))
  jax.jit(_loop(out, "global"))(x)
  hostcall.barrier()
  (final,) = _bars_drawn(out, "global")
  assert "40/40" in final


def test_metrics_rows_carry_the_device_under_shard_map():
  run = metrics.Run("devices", writers=["memory"])
  mesh = Mesh(np.array(jax.devices()), ("d",))

  def f(x):
    def step(c, i):
      run.log(i, value=c[0])
      return c + 1.0, None
    return jax.lax.scan(step, x, jnp.arange(3))[0]

  jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P("d")))(
      jnp.arange(4.0) * 10)
  records = run.records()
  run.close()
  by_device = {}
  for r in records:
    by_device.setdefault(r["device"], []).append((r["step"], r["value"]))
  assert by_device == {d: [(s, 10.0 * d + s) for s in range(3)]
                       for d in range(4)}


def _steered_loop(**options):
  def f(x):
    return progress.scan(lambda c, _: (c + x + 1, None), x * 0,
                         length=100_000, every=100, file=io.StringIO(),
                         **options)
  return f


def test_devices_of_one_loop_stop_after_the_same_check():
  # A loop whose body communicates (psum) would hang if one device stopped
  # a check before another: the devices of one invocation stop together.
  mesh = Mesh(np.array(jax.devices()), ("d",))

  def f(x):
    def step(c, _):
      return c + jax.lax.psum(x, "d"), None
    out = progress.scan(step, x * 0, length=100_000, every=100,
                        file=io.StringIO(),
                        stop_when=lambda status: status.steps >= 1000)
    return out.value[0], out.steps[None]  # per device

  carry, steps = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"),
                                       out_specs=P("d")))(jnp.arange(4.0))
  hostcall.barrier()
  steps = np.asarray(steps)
  assert len(set(steps.tolist())) == 1 and 1000 <= steps[0] < 100_000
  np.testing.assert_array_equal(carry, [6.0 * steps[0]] * 4)


def test_a_device_opening_after_its_peers_closed_stops_with_them(
    monkeypatch):
  # Without a body that communicates, one device may open an invocation
  # after every other one closed it (a busy machine): it still stops after
  # their check. Here the last device opens only once the others closed,
  # and only the others' predicate ever asks to stop.
  from hostcall._apps.control import host as control_host
  controls, late = control_host.controls, jax.devices()[3]
  closed, waited, early, closes = threading.Event(), [], set(), []
  real_open, real_close = controls.open, controls.close

  def open_(handle, stop, device=None, waiter=None):
    if device == late:
      waited.append(closed.wait(60))
    else:
      early.add(handle)
    real_open(handle, stop, device, waiter)

  def close(handle):
    real_close(handle)
    if handle in early:
      closes.append(handle)
      if len(closes) == 3:
        closed.set()

  monkeypatch.setattr(controls, "open", open_)
  monkeypatch.setattr(controls, "close", close)
  out = jax.pmap(_steered_loop(
      stop_when=lambda status: status.device != late and status.steps >= 500))(
          jnp.arange(4.0)[:, None])
  hostcall.barrier()
  steps = np.asarray(out.steps).reshape(-1).tolist()
  assert waited == [True]
  assert len(set(steps)) == 1 and 500 <= steps[0] < 100_000, steps
  assert not controls._groups


def test_pmap_and_global_view_loops_stop_too():
  stop = dict(stop_when=lambda status: status.steps >= 500)
  out = jax.pmap(_steered_loop(**stop))(jnp.arange(4.0)[:, None])
  hostcall.barrier()
  assert len(set(np.asarray(out.steps).reshape(-1).tolist())) == 1
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("d")))
  out = jax.jit(_steered_loop(**stop))(x)
  hostcall.barrier()
  assert bool(out.stopped) and 500 <= int(out.steps) < 100_000
  np.testing.assert_array_equal(out.value[0], (np.arange(8.0) + 1) *
                                int(out.steps))

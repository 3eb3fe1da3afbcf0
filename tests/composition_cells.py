"""A cell of the composition matrix (``test_composition_matrix.py``; which
cells there are, and what each receives: ``composition_table.py``): how
one is built, and what its host receives.

A cell is a flavour of host call written once in a tiny body ``f(x) = 2 *
x`` (the call sees ``x``), wrapped in a composition of transformations
(``("jit", "grad", "scan")``: ``jit`` outermost). ``observe`` runs it and
returns the host calls in order, each as text: the value received (``1``,
``[1,2]``), for taps ``@`` the transforms they are told (``b0`` a batch
entry with ``batch_dims=(0,)``, ``jvp``, ``transpose``), ``!Error`` the
exception the cell raised; with ``jax_flavour`` it runs JAX's own flavour
instead (``jax.debug.callback``, ``jax.debug.print``,
``jax.experimental.io_callback``).

"""

from __future__ import annotations

import io
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback as jax_io_callback

import hostcall
from hostcall import host_callback as hcb
from hostcall._apps.loops import (events as loop_events,
                                  invocations as loops_module)

N = 3  # steps of every loop
CKPT_POLICIES = {
    "ckpt": None,
    "ckpt_nothing": jax.checkpoint_policies.nothing_saveable,
    "ckpt_everything": jax.checkpoint_policies.everything_saveable,
    "ckpt_dots": jax.checkpoint_policies.dots_saveable,
}

# --- what the host receives, as text ------------------------------------------


def fmt(value) -> str:
  a = np.asarray(value)
  if a.ndim == 0:
    return f"{float(a):g}"
  return "[" + ",".join(f"{float(e):g}" for e in a.ravel()) + "]"


def fmt_transforms(transforms) -> str:
  parts = []
  for name, *params in transforms:
    if name == "batch":
      dims = params[0]["batch_dims"]
      parts.append("b" + "".join("_" if d is None else str(d) for d in dims))
    else:
      parts.append(name)
  return "@" + ".".join(parts) if parts else ""


# --- flavours: f(x) = 2 * x with one host call seeing x -----------------------


class Log:
  def __init__(self):
    self.events = []

  def value(self, v, *unused):
    self.events.append(fmt(v))

  def tap(self, v, transforms):
    self.events.append(fmt(v) + fmt_transforms(transforms))

  def mark(self, *unused):
    self.events.append("*")


def _like(x):
  return jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))


def _pure(log):
  def host(v):
    log.value(v)
    return np.asarray(v) * 2

  def vjp(primals, ct):
    log.events.append("vjp:" + fmt(ct))
    return (np.asarray(ct) * 2,)

  return lambda x: hostcall.pure_callback(host, _like(x), x,
                                          vmap_method="sequential", vjp=vjp)


def _call(log):
  def host(v):
    log.value(v)
    return np.asarray(v) * 2
  return lambda x: hcb.call(host, x, result_shape=_like(x))


def _returning(log):
  def host(v):
    log.value(v)
    return np.asarray(v)
  return host


def _then_double(call):
  def site(x):
    call(x)
    return x * 2.0
  return site


SITES = {
    "debug_callback": lambda log, x: hostcall.debug_callback(log.value, x),
    "debug_callback noargs": lambda log, x: hostcall.debug_callback(log.mark),
    "debug_print": lambda log, x: hostcall.debug_print("v={}", x),
    "io_callback": lambda log, x: hostcall.io_callback(log.value, None, x),
    "io_callback ordered": lambda log, x: hostcall.io_callback(
        log.value, None, x, ordered=True),
    "io_callback result unused": lambda log, x: hostcall.io_callback(
        _returning(log), _like(x), x),
    "id_tap": None,
    "call": None,
    "pure_callback": None,
    "grad_callback": None,
    "metrics": None,
    "progress": None,
}
JAX_SITES = {
    "debug_callback": lambda log, x: jax.debug.callback(log.value, x),
    "debug_callback noargs": lambda log, x: jax.debug.callback(log.mark),
    "debug_print": lambda log, x: jax.debug.print("v={}", x),
    "io_callback": lambda log, x: jax_io_callback(log.value, None, x),
    "io_callback ordered": lambda log, x: jax_io_callback(
        log.value, None, x, ordered=True),
    "io_callback result unused": lambda log, x: jax_io_callback(
        _returning(log), _like(x), x),
}
FLAVOURS = list(SITES)


def make_site(flavour, log, run=None, jax_flavour=False):
  """``f(x) = 2 * x`` making the flavour's host call on ``x``."""
  if jax_flavour:
    return _then_double(lambda x: JAX_SITES[flavour](log, x))
  if flavour == "id_tap":
    return lambda x: hcb.id_tap(log.tap, x) * 2.0
  if flavour == "call":
    return _call(log)
  if flavour == "pure_callback":
    return _pure(log)
  if flavour == "grad_callback":
    return lambda x: hostcall.grad_callback(log.value, x) * 2.0
  if flavour == "metrics":
    return _then_double(lambda x: run.log(v=x))
  if flavour == "progress":
    return lambda x: x * 2.0  # the loop is the host call
  return _then_double(lambda x: SITES[flavour](log, x))


# --- transformations: each maps f: x -> (array of x's shape) to another -------


def _sum(f):
  return lambda x: jnp.sum(f(x))


def _scan(f, flavour):
  body = lambda c, _: (f(c), None)
  if flavour == "progress":
    return lambda x: hostcall.progress.scan(body, x, None, length=N, every=1,
                                            file=io.StringIO(), desc="m")[0]
  return lambda x: lax.scan(body, x, None, length=N)[0]


def _custom_vjp_fwd(f):
  # the call in the forward rule (and in the primal function)
  g = jax.custom_vjp(f)
  g.defvjp(lambda x: (f(x), None), lambda _, ct: (2.0 * ct,))
  return g


def _custom_vjp_bwd(f):
  # the call in the backward rule, on the cotangent: f(ct) = 2 * ct
  g = jax.custom_vjp(lambda x: 2.0 * x)
  g.defvjp(lambda x: (2.0 * x, None), lambda _, ct: (f(ct),))
  return g


def _custom_jvp(f):
  g = jax.custom_jvp(f)
  g.defjvp(lambda p, t: (f(p[0]), 2.0 * t[0]))
  return g


def _custom_jvp_tangent(f):
  # the call in the JVP rule, on the tangent: f(t) = 2 * t (under grad, the
  # rule is transposed, and a tap of the tangent with it)
  g = jax.custom_jvp(lambda x: 2.0 * x)
  g.defjvp(lambda p, t: (2.0 * p[0], f(t[0])))
  return g


def _mesh():
  from jax.sharding import Mesh
  return Mesh(np.array(jax.devices()[:4]), ("i",))


def _shard_map(f):
  from jax.sharding import PartitionSpec as P
  return jax.shard_map(f, mesh=_mesh(), in_specs=P("i"), out_specs=P("i"))


def wrap(name, f, flavour):
  if name == "jit":
    return jax.jit(f)
  if name == "hjit":
    return hostcall.jit(f)
  if name == "vmap":
    return jax.vmap(f)
  if name == "grad":
    return jax.grad(_sum(f))
  if name == "vag":
    return lambda x: (lambda v, g: v + g)(*jax.value_and_grad(_sum(f))(x))
  if name == "vjp":
    return lambda x: (lambda y, pb: y + pb(jnp.ones_like(y))[0])(
        *jax.vjp(f, x))
  if name == "jvp":
    return lambda x: sum(jax.jvp(f, (x,), (jnp.ones_like(x),)))
  if name == "linearize":
    return lambda x: (lambda y, lin: y + lin(jnp.ones_like(x)))(
        *jax.linearize(f, x))
  if name == "scan":
    return _scan(f, flavour)
  if name == "fori":
    return lambda x: lax.fori_loop(0, N, lambda i, c: f(c), x)
  if name == "while":
    return lambda x: lax.while_loop(lambda s: s[0] < N,
                                    lambda s: (s[0] + 1, f(s[1])), (0, x))[1]
  if name == "cond":       # unbatched predicate, the call's branch taken
    return lambda x: lax.cond(jnp.bool_(True), f, lambda x: x * 2.0, x)
  if name == "cond_else":  # unbatched predicate, the call's branch not taken
    return lambda x: lax.cond(jnp.bool_(False), f, lambda x: x * 2.0, x)
  if name == "cond_batched":  # under vmap: lane 0 (x = 1) takes the call
    return lambda x: lax.cond(jnp.sum(x) < 1.5, f, lambda x: x * 2.0, x)
  if name in CKPT_POLICIES:
    return jax.checkpoint(f, policy=CKPT_POLICIES[name])
  if name == "cvjp_fwd":
    return _custom_vjp_fwd(f)
  if name == "cvjp_bwd":
    return _custom_vjp_bwd(f)
  if name == "cjvp":
    return _custom_jvp(f)
  if name == "cjvp_tan":
    return _custom_jvp_tangent(f)
  if name == "shard_map":
    return _shard_map(f)
  if name == "pmap":
    return jax.pmap(f)
  raise AssertionError(name)


def build(flavour, composition, log, run=None, jax_flavour=False):
  f = make_site(flavour, log, run, jax_flavour)
  for name in reversed(composition):
    f = wrap(name, f, flavour)
  return f


def argument(composition):
  if "shard_map" in composition or "pmap" in composition:
    return jnp.arange(1.0, 5.0)
  shape = (2,) * composition.count("vmap")
  return jnp.arange(1.0, 1.0 + np.prod(shape, dtype=int)).reshape(shape)


# --- observing a cell ---------------------------------------------------------


class _BarSpy:
  """Records the bar registry's open/close calls (still made) and every
  tick the host receives, in order: a run of ticks the queue hands over at
  once is drawn at its last (``loops/events.py``:
  ``_Tick.deliver_steps``), but each tick the program made is recorded."""

  def __init__(self, log):
    self.log, self.saved = log, {}

  def __enter__(self):
    registry = loops_module.invocations
    for method, event in (("open", "o"), ("close", "c")):
      original = getattr(registry, method)
      self.saved[method] = original

      def record(*args, _original=original, _event=event, **kwargs):
        count = args[2] if len(args) > 2 else kwargs.get(
            "total" if _event == "o" else "count")
        self.log.events.append(f"{_event}{count}")
        return _original(*args, **kwargs)
      setattr(registry, method, record)
    tick = loop_events._Tick
    self.tick_methods = (tick.deliver, tick.deliver_steps)
    events = self.log.events

    def deliver(target, flat_args, context):
      events.append(f"t{loops_module.last_count(flat_args[1])}")
      return self.tick_methods[0](target, flat_args, context)

    def deliver_steps(target, stacked, steps, context):
      counts = loop_events._per_call(stacked[1], steps, context)
      events.extend(f"t{loops_module.last_count(c)}" for c in counts)
      return self.tick_methods[1](target, stacked, steps, context)
    tick.deliver, tick.deliver_steps = deliver, deliver_steps
    return self

  def __exit__(self, *exc):
    # The registry's own methods come from its class: the spies are
    # deleted, not replaced by bound methods (which would hide the class's
    # from a later spy set on the class).
    for method in self.saved:
      delattr(loops_module.invocations, method)
    loop_events._Tick.deliver, loop_events._Tick.deliver_steps = (
        self.tick_methods)


_NUMBER = re.compile(r"-?\d+(?:\.\d*)?(?:e[-+]?\d+)?")


def _printed(text):
  events = []
  for line in text.splitlines():
    if line.startswith("v="):
      numbers = [float(n) for n in _NUMBER.findall(line[2:])]
      events.append(fmt(numbers[0]) if "[" not in line else fmt(numbers))
  return events


def _settle():
  for wait in (jax.effects_barrier, hostcall.barrier):
    try:
      wait()
    except Exception:  # noqa: BLE001 - the cell's error is reported already
      pass


def observe(flavour, composition, jax_flavour=False, metrics_root=None,
            read_stdout=None):
  """The cell's host calls, as the list of event texts."""
  log = Log()
  run = None
  if flavour == "metrics":
    run = hostcall.metrics.Run("matrix", root=metrics_root or "/tmp/hc-matrix",
                               writers=["memory"], exists="overwrite")
  spy = _BarSpy(log) if flavour == "progress" else None
  try:
    if spy:
      spy.__enter__()
    try:
      f = build(flavour, composition, log, run, jax_flavour)
      jax.block_until_ready(f(argument(composition)))
      jax.effects_barrier()
      hostcall.barrier()
    except Exception as exc:  # noqa: BLE001 - the error is the observation
      _settle()
      log.events.append("!" + type(exc).__name__)
  finally:
    if spy:
      spy.__exit__()
  if flavour == "debug_print" and read_stdout is not None:
    printed = _printed(read_stdout())
    log.events = printed + [e for e in log.events if e.startswith("!")]
  if run is not None:
    rows = run.records()
    run.close()
    log.events = [(f"m{r['member']}:" if "member" in r else "") + fmt(r["v"])
                  for r in rows] + log.events
  return log.events


def key(flavour, composition) -> str:
  """A cell's name: ``"debug_callback: jit>scan"``."""
  return f"{flavour}: {'>'.join(composition)}"

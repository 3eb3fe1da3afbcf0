"""The composition matrix (issue 39): "a call the user wrote once per step
runs once per step, whatever transformations wrap it".

Every flavour of host call is written once in a tiny body ``f(x) = 2 * x``
(the call sees ``x``), and the body is wrapped in two (and, for a
selection, three) transformations. ``EXPECTED`` below is the one table of
what the host receives in each cell: the host calls in order, each written
as the value received (``1``, ``[1,2]``) and, for taps, ``@`` the
transforms they are told (``b0`` a batch entry with ``batch_dims=(0,)``,
``jvp``, ``transpose``). ``!Error`` is the exception the cell raises.

The second column says how the cell compares with JAX's own flavour
(``jax.debug.callback``, ``jax.debug.print``,
``jax.experimental.io_callback``) running the same program in the same
process: ``=`` the same calls (asserted too), ``-`` no JAX flavour to
compare with, or a reason: the cell is a deliberate difference, and what
JAX does is asserted from the text after ``JAX:``.

Cells named ``shard_map``/``pmap`` run in one subprocess with 4 forced CPU
devices; their calls come from several devices, so they are compared
sorted. A Hypothesis generator at the end checks the rule itself on random
compositions.

Regenerate the observed side of the table (to review it, never to accept
it blindly) with ``python tests/test_composition_matrix.py --observe``.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
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

# --- what the host receives, as text -----------------------------------------


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


# --- transformations: each maps f: x -> (array of x's shape) to another ------


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
  once is drawn at its last (``loops/events.py``: ``_Tick.deliver_steps``), but each
  tick the program made is recorded."""

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


# --- the cells ------------------------------------------------------------------

OUTER = ["jit", "hjit", "vmap", "grad", "vag", "vjp", "jvp", "linearize"]
INNER = ["scan", "fori", "while", "cond", "cond_else", "ckpt", "ckpt_nothing",
         "ckpt_everything", "ckpt_dots", "cvjp_fwd", "cvjp_bwd", "cjvp",
         "cjvp_tan"]
SINGLE = OUTER + INNER
OUTER_PAIRS = [("jit", "grad"), ("grad", "jit"), ("jit", "vmap"),
               ("vmap", "jit"), ("vmap", "grad"), ("grad", "vmap"),
               ("hjit", "grad"), ("hjit", "vmap"), ("vmap", "jvp"),
               ("grad", "grad"), ("jit", "jvp"), ("vmap", "vjp")]
INNER_PAIRS = [("scan", "fori"), ("fori", "scan"), ("scan", "cond"),
               ("scan", "cond_else"), ("scan", "ckpt"), ("scan", "cvjp_fwd"),
               ("scan", "cvjp_bwd"), ("scan", "cjvp"), ("while", "scan")]
THREES = [("jit", "grad", "scan"), ("jit", "vmap", "scan"),
          ("vmap", "grad", "scan"), ("grad", "vmap", "scan"),
          ("jit", "grad", "fori"), ("hjit", "grad", "scan"),
          ("hjit", "vmap", "scan"), ("jit", "grad", "cjvp"),
          ("grad", "scan", "cond"), ("grad", "scan", "cvjp_fwd"),
          ("grad", "scan", "cvjp_bwd"), ("jvp", "scan", "ckpt_nothing"),
          ("linearize", "scan", "cond")] + [
              ("grad", "scan", p) for p in CKPT_POLICIES] + [
              ("jit", "grad", "scan", "cond_else")]
UNUSED_RESULT = [("grad", "scan", "cvjp_fwd"),
                 ("jit", "grad", "scan", "cvjp_fwd"),
                 ("jit", "grad", "fori", "cvjp_fwd")]
BATCHED_COND = [("vmap", "cond_batched"), ("jit", "vmap", "cond_batched"),
                ("vmap", "scan", "cond_batched"),
                ("vmap", "cond_batched", "scan"),
                ("jit", "vmap", "cond_batched", "fori")]
MULTIDEVICE = [("shard_map",), ("pmap",), ("jit", "shard_map"),
               ("shard_map", "scan"), ("pmap", "scan"), ("shard_map", "grad"),
               ("pmap", "grad"), ("shard_map", "vmap"), ("grad", "shard_map"),
               ("shard_map", "grad", "scan")]

# Flavours checked in every cell; the others in a selection that covers each
# transformation at least once next to a loop and next to autodiff.
FULL = {"debug_callback", "io_callback", "id_tap"}
SELECTION = ([(t,) for t in SINGLE]
             + [(o, i) for o in ("jit", "vmap", "grad", "jvp")
                for i in ("scan", "cond", "cond_else", "ckpt_nothing",
                          "cvjp_fwd", "cvjp_bwd")]
             + [("jit", "grad"), ("vmap", "grad"), ("hjit", "vmap"),
                ("scan", "cond"), ("jit", "grad", "scan"),
                ("jit", "vmap", "scan"), ("vmap", "grad", "scan"),
                ("hjit", "grad", "scan")])


def compositions(flavour):
  if flavour in FULL:
    comps = ([(t,) for t in SINGLE]
             + [(o, i) for o in OUTER if o not in ("vag", "vjp") for i in INNER]
             + [(o, i) for o in ("vag", "vjp")
                for i in ("scan", "cond", "ckpt", "cvjp_fwd", "cjvp_tan")]
             + OUTER_PAIRS + INNER_PAIRS + THREES)
  else:
    comps = list(SELECTION)
  if flavour in ("debug_callback noargs",):
    comps = [c for c in comps if any(t in c for t in ("scan", "fori"))
             or len(c) == 1]
  if flavour == "progress":
    comps = [c for c in comps + THREES + INNER_PAIRS if "scan" in c]
    comps = list(dict.fromkeys(comps))
  if flavour == "io_callback result unused":
    comps = comps + UNUSED_RESULT
  if flavour in ("debug_callback", "debug_print", "io_callback", "id_tap"):
    comps = comps + BATCHED_COND
  return comps


def key(flavour, composition):
  return f"{flavour}: {'>'.join(composition)}"


def cells():
  out = []
  for flavour in FLAVOURS:
    for c in compositions(flavour):
      out.append((flavour, c))
  return out


def multidevice_cells():
  return [(fl, c) for fl in ("debug_callback", "io_callback", "id_tap",
                             "pure_callback", "grad_callback", "metrics")
          for c in MULTIDEVICE]


# --- the table -------------------------------------------------------------------

EXPECTED = {
    'debug_callback: jit': ('1', '='),
    'debug_callback: hjit': ('1', '='),
    'debug_callback: vmap': ('1 2', '='),
    'debug_callback: grad': ('1', '='),
    'debug_callback: vag': ('1', '='),
    'debug_callback: vjp': ('1', '='),
    'debug_callback: jvp': ('1', '='),
    'debug_callback: linearize': ('1', '='),
    'debug_callback: scan': ('1 2 4', '='),
    'debug_callback: fori': ('1 2 4', '='),
    'debug_callback: while': ('1 2 4', '='),
    'debug_callback: cond': ('1', '='),
    'debug_callback: cond_else': ('', '='),
    'debug_callback: ckpt': ('1', '='),
    'debug_callback: ckpt_nothing': ('1', '='),
    'debug_callback: ckpt_everything': ('1', '='),
    'debug_callback: ckpt_dots': ('1', '='),
    'debug_callback: cvjp_fwd': ('1', '='),
    'debug_callback: cvjp_bwd': ('', '='),
    'debug_callback: cjvp': ('1', '='),
    'debug_callback: cjvp_tan': ('', '='),
    'debug_callback: jit>scan': ('1 2 4', '='),
    'debug_callback: jit>fori': ('1 2 4', '='),
    'debug_callback: jit>while': ('1 2 4', '='),
    'debug_callback: jit>cond': ('1', '='),
    'debug_callback: jit>cond_else': ('', '='),
    'debug_callback: jit>ckpt': ('1', '='),
    'debug_callback: jit>ckpt_nothing': ('1', '='),
    'debug_callback: jit>ckpt_everything': ('1', '='),
    'debug_callback: jit>ckpt_dots': ('1', '='),
    'debug_callback: jit>cvjp_fwd': ('1', '='),
    'debug_callback: jit>cvjp_bwd': ('', '='),
    'debug_callback: jit>cjvp': ('1', '='),
    'debug_callback: jit>cjvp_tan': ('', '='),
    'debug_callback: hjit>scan': ('1 2 4', '='),
    'debug_callback: hjit>fori': ('1 2 4', '='),
    'debug_callback: hjit>while': ('1 2 4', '='),
    'debug_callback: hjit>cond': ('1', '='),
    'debug_callback: hjit>cond_else': ('', '='),
    'debug_callback: hjit>ckpt': ('1', '='),
    'debug_callback: hjit>ckpt_nothing': ('1', '='),
    'debug_callback: hjit>ckpt_everything': ('1', '='),
    'debug_callback: hjit>ckpt_dots': ('1', '='),
    'debug_callback: hjit>cvjp_fwd': ('1', '='),
    'debug_callback: hjit>cvjp_bwd': ('', '='),
    'debug_callback: hjit>cjvp': ('1', '='),
    'debug_callback: hjit>cjvp_tan': ('', '='),
    'debug_callback: vmap>scan': ('1 2 2 4 4 8',
        "lanes in index order (JAX's vmap of scan calls the last lane first); JAX: 2 1 4 2 8 4"),
    'debug_callback: vmap>fori': ('1 2 2 4 4 8', '='),
    'debug_callback: vmap>while': ('1 2 2 4 4 8', '='),
    'debug_callback: vmap>cond': ('1 2', '='),
    'debug_callback: vmap>cond_else': ('', '='),
    'debug_callback: vmap>ckpt': ('1 2', '='),
    'debug_callback: vmap>ckpt_nothing': ('1 2', '='),
    'debug_callback: vmap>ckpt_everything': ('1 2', '='),
    'debug_callback: vmap>ckpt_dots': ('1 2', '='),
    'debug_callback: vmap>cvjp_fwd': ('1 2', '='),
    'debug_callback: vmap>cvjp_bwd': ('', '='),
    'debug_callback: vmap>cjvp': ('1 2', '='),
    'debug_callback: vmap>cjvp_tan': ('', '='),
    'debug_callback: grad>scan': ('1 2 4', '='),
    'debug_callback: grad>fori': ('1 2 4', '='),
    'debug_callback: grad>while': ('1 2 4 !ValueError', '='),
    'debug_callback: grad>cond': ('1', '='),
    'debug_callback: grad>cond_else': ('', '='),
    'debug_callback: grad>ckpt': ('1 1', '='),
    'debug_callback: grad>ckpt_nothing': ('1 1', '='),
    'debug_callback: grad>ckpt_everything': ('1 1', '='),
    'debug_callback: grad>ckpt_dots': ('1 1', '='),
    'debug_callback: grad>cvjp_fwd': ('1', '='),
    'debug_callback: grad>cvjp_bwd': ('1', '='),
    'debug_callback: grad>cjvp': ('1', '='),
    'debug_callback: grad>cjvp_tan': ('', '='),
    'debug_callback: jvp>scan': ('1 2 4', '='),
    'debug_callback: jvp>fori': ('1 2 4', '='),
    'debug_callback: jvp>while': ('1 2 4', '='),
    'debug_callback: jvp>cond': ('1', '='),
    'debug_callback: jvp>cond_else': ('', '='),
    'debug_callback: jvp>ckpt': ('1', '='),
    'debug_callback: jvp>ckpt_nothing': ('1', '='),
    'debug_callback: jvp>ckpt_everything': ('1', '='),
    'debug_callback: jvp>ckpt_dots': ('1', '='),
    'debug_callback: jvp>cvjp_fwd': ('1 !TypeError', '='),
    'debug_callback: jvp>cvjp_bwd': ('!TypeError', '='),
    'debug_callback: jvp>cjvp': ('1', '='),
    'debug_callback: jvp>cjvp_tan': ('1', '='),
    'debug_callback: linearize>scan': ('1 2 4', '='),
    'debug_callback: linearize>fori': ('1 2 4', '='),
    'debug_callback: linearize>while': ('1 2 4',
        'JAX stages the primal loop again for the tangents under linearize of a while_loop; the primal calls run in the known loop only; JAX: 1 2 4 1 2 4'),
    'debug_callback: linearize>cond': ('1', '='),
    'debug_callback: linearize>cond_else': ('', '='),
    'debug_callback: linearize>ckpt': ('1 1', '='),
    'debug_callback: linearize>ckpt_nothing': ('1 1', '='),
    'debug_callback: linearize>ckpt_everything': ('1 1', '='),
    'debug_callback: linearize>ckpt_dots': ('1 1', '='),
    'debug_callback: linearize>cvjp_fwd': ('1 !TypeError', '='),
    'debug_callback: linearize>cvjp_bwd': ('!TypeError', '='),
    'debug_callback: linearize>cjvp': ('1', '='),
    'debug_callback: linearize>cjvp_tan': ('1', '='),
    'debug_callback: vag>scan': ('1 2 4', '='),
    'debug_callback: vag>cond': ('1', '='),
    'debug_callback: vag>ckpt': ('1 1', '='),
    'debug_callback: vag>cvjp_fwd': ('1', '='),
    'debug_callback: vag>cjvp_tan': ('', '='),
    'debug_callback: vjp>scan': ('1 2 4', '='),
    'debug_callback: vjp>cond': ('1', '='),
    'debug_callback: vjp>ckpt': ('1 1', '='),
    'debug_callback: vjp>cvjp_fwd': ('1', '='),
    'debug_callback: vjp>cjvp_tan': ('', '='),
    'debug_callback: jit>grad': ('1', '='),
    'debug_callback: grad>jit': ('1', '='),
    'debug_callback: jit>vmap': ('1 2', '='),
    'debug_callback: vmap>jit': ('1 2', '='),
    'debug_callback: vmap>grad': ('1 2', '='),
    'debug_callback: grad>vmap': ('1 2', '='),
    'debug_callback: hjit>grad': ('1', '='),
    'debug_callback: hjit>vmap': ('1 2', '='),
    'debug_callback: vmap>jvp': ('1 2', '='),
    'debug_callback: grad>grad': ('1', '='),
    'debug_callback: jit>jvp': ('1', '='),
    'debug_callback: vmap>vjp': ('1 2', '='),
    'debug_callback: scan>fori': ('1 2 4 8 16 32 64 128 256', '='),
    'debug_callback: fori>scan': ('1 2 4 8 16 32 64 128 256', '='),
    'debug_callback: scan>cond': ('1 2 4', '='),
    'debug_callback: scan>cond_else': ('', '='),
    'debug_callback: scan>ckpt': ('1 2 4', '='),
    'debug_callback: scan>cvjp_fwd': ('1 2 4', '='),
    'debug_callback: scan>cvjp_bwd': ('', '='),
    'debug_callback: scan>cjvp': ('1 2 4', '='),
    'debug_callback: while>scan': ('1 2 4 8 16 32 64 128 256', '='),
    'debug_callback: jit>grad>scan': ('1 2 4', '='),
    'debug_callback: jit>vmap>scan': ('1 2 2 4 4 8',
        "lanes in index order (JAX's vmap of scan calls the last lane first); JAX: 2 1 4 2 8 4"),
    'debug_callback: vmap>grad>scan': ('1 2 2 4 4 8',
        "lanes in index order (JAX's vmap of scan calls the last lane first); JAX: 2 1 4 2 8 4"),
    'debug_callback: grad>vmap>scan': ('1 2 2 4 4 8',
        "lanes in index order (JAX's vmap of scan calls the last lane first); JAX: 2 1 4 2 8 4"),
    'debug_callback: jit>grad>fori': ('1 2 4', '='),
    'debug_callback: hjit>grad>scan': ('1 2 4', '='),
    'debug_callback: hjit>vmap>scan': ('1 2 2 4 4 8', '='),  # JAX's own
    # jax.debug.callback under hostcall.jit is taken out too: program order
    'debug_callback: jit>grad>cjvp': ('1', '='),
    'debug_callback: grad>scan>cond': ('1 2 4', '='),
    'debug_callback: grad>scan>cvjp_fwd': ('1 2 4', '='),
    'debug_callback: grad>scan>cvjp_bwd': ('1 2 4', '='),
    'debug_callback: jvp>scan>ckpt_nothing': ('1 2 4', '='),
    'debug_callback: linearize>scan>cond': ('1 2 4', '='),
    'debug_callback: grad>scan>ckpt': ('1 2 4 4 2 1', '='),
    'debug_callback: grad>scan>ckpt_nothing': ('1 2 4 4 2 1', '='),
    'debug_callback: grad>scan>ckpt_everything': ('1 2 4 4 2 1', '='),
    'debug_callback: grad>scan>ckpt_dots': ('1 2 4 4 2 1', '='),
    'debug_callback: jit>grad>scan>cond_else': ('', '='),
    'debug_callback: vmap>cond_batched': ('1',
        'calls for the lanes that took the branch only (JAX: every lane, or refuses an io callback); JAX: 1 2'),
    'debug_callback: jit>vmap>cond_batched': ('1',
        'calls for the lanes that took the branch only (JAX: every lane, or refuses an io callback); JAX: 1 2'),
    'debug_callback: vmap>scan>cond_batched': ('1',
        'calls for the lanes that took the branch only (JAX: every lane, or refuses an io callback); JAX: 2 1 4 2 8 4'),
    'debug_callback: vmap>cond_batched>scan': ('1 2 4', '-'),
    'debug_callback: jit>vmap>cond_batched>fori': ('1 2 4', '-'),
    'debug_callback noargs: jit': ('*', '='),
    'debug_callback noargs: hjit': ('*', '='),
    'debug_callback noargs: vmap': ('*', '='),
    'debug_callback noargs: grad': ('*', '='),
    'debug_callback noargs: vag': ('*', '='),
    'debug_callback noargs: vjp': ('*', '='),
    'debug_callback noargs: jvp': ('*', '='),
    'debug_callback noargs: linearize': ('*', '='),
    'debug_callback noargs: scan': ('* * *', '='),
    'debug_callback noargs: fori': ('* * *', '='),
    'debug_callback noargs: while': ('* * *', '='),
    'debug_callback noargs: cond': ('*', '='),
    'debug_callback noargs: cond_else': ('', '='),
    'debug_callback noargs: ckpt': ('*', '='),
    'debug_callback noargs: ckpt_nothing': ('*', '='),
    'debug_callback noargs: ckpt_everything': ('*', '='),
    'debug_callback noargs: ckpt_dots': ('*', '='),
    'debug_callback noargs: cvjp_fwd': ('*', '='),
    'debug_callback noargs: cvjp_bwd': ('', '='),
    'debug_callback noargs: cjvp': ('*', '='),
    'debug_callback noargs: cjvp_tan': ('', '='),
    'debug_callback noargs: jit>scan': ('* * *', '='),
    'debug_callback noargs: vmap>scan': ('* * *', '='),
    'debug_callback noargs: grad>scan': ('* * *',
        'JAX hoists a call with loop-invariant operands out of the loop under grad (#16637); JAX: *'),
    'debug_callback noargs: jvp>scan': ('* * *', '='),
    'debug_callback noargs: scan>cond': ('* * *', '='),
    'debug_callback noargs: jit>grad>scan': ('* * *',
        'JAX hoists a call with loop-invariant operands out of the loop under grad (#16637); JAX: *'),
    'debug_callback noargs: jit>vmap>scan': ('* * *', '='),
    'debug_callback noargs: vmap>grad>scan': ('* * *',
        'JAX hoists a call with loop-invariant operands out of the loop under grad (#16637); JAX: *'),
    'debug_callback noargs: hjit>grad>scan': ('* * *',
        'JAX hoists a call with loop-invariant operands out of the loop under grad (#16637); JAX: *'),
    'debug_print: jit': ('1', '='),
    'debug_print: hjit': ('1', '='),
    'debug_print: vmap': ('1 2', '='),
    'debug_print: grad': ('1', '='),
    'debug_print: vag': ('1', '='),
    'debug_print: vjp': ('1', '='),
    'debug_print: jvp': ('1', '='),
    'debug_print: linearize': ('1', '='),
    'debug_print: scan': ('1 2 4', '='),
    'debug_print: fori': ('1 2 4', '='),
    'debug_print: while': ('1 2 4', '='),
    'debug_print: cond': ('1', '='),
    'debug_print: cond_else': ('', '='),
    'debug_print: ckpt': ('1', '='),
    'debug_print: ckpt_nothing': ('1', '='),
    'debug_print: ckpt_everything': ('1', '='),
    'debug_print: ckpt_dots': ('1', '='),
    'debug_print: cvjp_fwd': ('1', '='),
    'debug_print: cvjp_bwd': ('', '='),
    'debug_print: cjvp': ('1', '='),
    'debug_print: cjvp_tan': ('', '='),
    'debug_print: jit>scan': ('1 2 4', '='),
    'debug_print: jit>cond': ('1', '='),
    'debug_print: jit>cond_else': ('', '='),
    'debug_print: jit>ckpt_nothing': ('1', '='),
    'debug_print: jit>cvjp_fwd': ('1', '='),
    'debug_print: jit>cvjp_bwd': ('', '='),
    'debug_print: vmap>scan': ('1 2 2 4 4 8',
        "lanes in index order (JAX's vmap of scan calls the last lane first); JAX: 2 1 4 2 8 4"),
    'debug_print: vmap>cond': ('1 2', '='),
    'debug_print: vmap>cond_else': ('', '='),
    'debug_print: vmap>ckpt_nothing': ('1 2', '='),
    'debug_print: vmap>cvjp_fwd': ('1 2', '='),
    'debug_print: vmap>cvjp_bwd': ('', '='),
    'debug_print: grad>scan': ('1 2 4', '='),
    'debug_print: grad>cond': ('1', '='),
    'debug_print: grad>cond_else': ('', '='),
    'debug_print: grad>ckpt_nothing': ('1 1', '='),
    'debug_print: grad>cvjp_fwd': ('1', '='),
    'debug_print: grad>cvjp_bwd': ('1', '='),
    'debug_print: jvp>scan': ('1 2 4', '='),
    'debug_print: jvp>cond': ('1', '='),
    'debug_print: jvp>cond_else': ('', '='),
    'debug_print: jvp>ckpt_nothing': ('1', '='),
    'debug_print: jvp>cvjp_fwd': ('1 !TypeError', '='),
    'debug_print: jvp>cvjp_bwd': ('!TypeError', '='),
    'debug_print: jit>grad': ('1', '='),
    'debug_print: vmap>grad': ('1 2', '='),
    'debug_print: hjit>vmap': ('1 2', '='),
    'debug_print: scan>cond': ('1 2 4', '='),
    'debug_print: jit>grad>scan': ('1 2 4', '='),
    'debug_print: jit>vmap>scan': ('1 2 2 4 4 8',
        "lanes in index order (JAX's vmap of scan calls the last lane first); JAX: 2 1 4 2 8 4"),
    'debug_print: vmap>grad>scan': ('1 2 2 4 4 8',
        "lanes in index order (JAX's vmap of scan calls the last lane first); JAX: 2 1 4 2 8 4"),
    'debug_print: hjit>grad>scan': ('1 2 4', '='),
    'debug_print: vmap>cond_batched': ('1',
        'calls for the lanes that took the branch only (JAX: every lane, or refuses an io callback); JAX: 1 2'),
    'debug_print: jit>vmap>cond_batched': ('1',
        'calls for the lanes that took the branch only (JAX: every lane, or refuses an io callback); JAX: 1 2'),
    'debug_print: vmap>scan>cond_batched': ('1',
        'calls for the lanes that took the branch only (JAX: every lane, or refuses an io callback); JAX: 2 1 4 2 8 4'),
    'debug_print: vmap>cond_batched>scan': ('1 2 4', '-'),
    'debug_print: jit>vmap>cond_batched>fori': ('1 2 4', '-'),
    'io_callback: jit': ('1', '='),
    'io_callback: hjit': ('1', '='),
    'io_callback: vmap': ('1 2', '='),
    'io_callback: grad': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: vag': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: vjp': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jvp': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: linearize': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: scan': ('1 2 4', '='),
    'io_callback: fori': ('1 2 4', '='),
    'io_callback: while': ('1 2 4', '='),
    'io_callback: cond': ('1', '='),
    'io_callback: cond_else': ('', '='),
    'io_callback: ckpt': ('1', '='),
    'io_callback: ckpt_nothing': ('1', '='),
    'io_callback: ckpt_everything': ('1', '='),
    'io_callback: ckpt_dots': ('1', '='),
    'io_callback: cvjp_fwd': ('1', '='),
    'io_callback: cvjp_bwd': ('', '='),
    'io_callback: cjvp': ('1', '='),
    'io_callback: cjvp_tan': ('', '='),
    'io_callback: jit>scan': ('1 2 4', '='),
    'io_callback: jit>fori': ('1 2 4', '='),
    'io_callback: jit>while': ('1 2 4', '='),
    'io_callback: jit>cond': ('1', '='),
    'io_callback: jit>cond_else': ('', '='),
    'io_callback: jit>ckpt': ('1', '='),
    'io_callback: jit>ckpt_nothing': ('1', '='),
    'io_callback: jit>ckpt_everything': ('1', '='),
    'io_callback: jit>ckpt_dots': ('1', '='),
    'io_callback: jit>cvjp_fwd': ('1', '='),
    'io_callback: jit>cvjp_bwd': ('', '='),
    'io_callback: jit>cjvp': ('1', '='),
    'io_callback: jit>cjvp_tan': ('', '='),
    'io_callback: hjit>scan': ('1 2 4', '='),
    'io_callback: hjit>fori': ('1 2 4', '='),
    'io_callback: hjit>while': ('1 2 4', '='),
    'io_callback: hjit>cond': ('1', '='),
    'io_callback: hjit>cond_else': ('', '='),
    'io_callback: hjit>ckpt': ('1', '='),
    'io_callback: hjit>ckpt_nothing': ('1', '='),
    'io_callback: hjit>ckpt_everything': ('1', '='),
    'io_callback: hjit>ckpt_dots': ('1', '='),
    'io_callback: hjit>cvjp_fwd': ('1', '='),
    'io_callback: hjit>cvjp_bwd': ('', '='),
    'io_callback: hjit>cjvp': ('1', '='),
    'io_callback: hjit>cjvp_tan': ('', '='),
    'io_callback: vmap>scan': ('1 2 2 4 4 8', '='),
    'io_callback: vmap>fori': ('1 2 2 4 4 8', '='),
    'io_callback: vmap>while': ('1 2 2 4 4 8', '='),
    'io_callback: vmap>cond': ('1 2',
        'JAX refuses an io callback in any vmap of cond; hostcall runs it for the lanes that took its branch; JAX: !NotImplementedError'),
    'io_callback: vmap>cond_else': ('',
        'JAX refuses an io callback in any vmap of cond; hostcall runs it for the lanes that took its branch; JAX: !NotImplementedError'),
    'io_callback: vmap>ckpt': ('1 2', '='),
    'io_callback: vmap>ckpt_nothing': ('1 2', '='),
    'io_callback: vmap>ckpt_everything': ('1 2', '='),
    'io_callback: vmap>ckpt_dots': ('1 2', '='),
    'io_callback: vmap>cvjp_fwd': ('1 2', '='),
    'io_callback: vmap>cvjp_bwd': ('', '='),
    'io_callback: vmap>cjvp': ('1 2', '='),
    'io_callback: vmap>cjvp_tan': ('', '='),
    'io_callback: grad>scan': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: grad>fori': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: grad>while': ('1 2 4 !ValueError',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: grad>cond': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: grad>cond_else': ('',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: grad>ckpt': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: grad>ckpt_nothing': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: grad>ckpt_everything': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: grad>ckpt_dots': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: grad>cvjp_fwd': ('1', '='),
    'io_callback: grad>cvjp_bwd': ('1', '='),
    'io_callback: grad>cjvp': ('1', '='),
    'io_callback: grad>cjvp_tan': ('!ValueError', '='),
    'io_callback: jvp>scan': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jvp>fori': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jvp>while': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jvp>cond': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jvp>cond_else': ('',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jvp>ckpt': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jvp>ckpt_nothing': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jvp>ckpt_everything': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jvp>ckpt_dots': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jvp>cvjp_fwd': ('1 !TypeError', '='),
    'io_callback: jvp>cvjp_bwd': ('!TypeError', '='),
    'io_callback: jvp>cjvp': ('1', '='),
    'io_callback: jvp>cjvp_tan': ('1', '='),
    'io_callback: linearize>scan': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: linearize>fori': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: linearize>while': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: linearize>cond': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: linearize>cond_else': ('',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: linearize>ckpt': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: linearize>ckpt_nothing': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: linearize>ckpt_everything': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: linearize>ckpt_dots': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: linearize>cvjp_fwd': ('1 !TypeError', '='),
    'io_callback: linearize>cvjp_bwd': ('!TypeError', '='),
    'io_callback: linearize>cjvp': ('1', '='),
    'io_callback: linearize>cjvp_tan': ('1', '='),
    'io_callback: vag>scan': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: vag>cond': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: vag>ckpt': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: vag>cvjp_fwd': ('1', '='),
    'io_callback: vag>cjvp_tan': ('!ValueError', '='),
    'io_callback: vjp>scan': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: vjp>cond': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: vjp>ckpt': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: vjp>cvjp_fwd': ('1', '='),
    'io_callback: vjp>cjvp_tan': ('!ValueError', '='),
    'io_callback: jit>grad': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: grad>jit': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jit>vmap': ('1 2', '='),
    'io_callback: vmap>jit': ('1 2', '='),
    'io_callback: vmap>grad': ('1 2',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: grad>vmap': ('1 2',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: hjit>grad': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: hjit>vmap': ('1 2', '='),
    'io_callback: vmap>jvp': ('1 2',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: grad>grad': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jit>jvp': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: vmap>vjp': ('1 2',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: scan>fori': ('1 2 4 8 16 32 64 128 256', '='),
    'io_callback: fori>scan': ('1 2 4 8 16 32 64 128 256', '='),
    'io_callback: scan>cond': ('1 2 4', '='),
    'io_callback: scan>cond_else': ('', '='),
    'io_callback: scan>ckpt': ('1 2 4', '='),
    'io_callback: scan>cvjp_fwd': ('1 2 4', '='),
    'io_callback: scan>cvjp_bwd': ('', '='),
    'io_callback: scan>cjvp': ('1 2 4', '='),
    'io_callback: while>scan': ('1 2 4 8 16 32 64 128 256', '='),
    'io_callback: jit>grad>scan': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jit>vmap>scan': ('1 2 2 4 4 8', '='),
    'io_callback: vmap>grad>scan': ('1 2 2 4 4 8',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: grad>vmap>scan': ('1 2 2 4 4 8',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: jit>grad>fori': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: hjit>grad>scan': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: hjit>vmap>scan': ('1 2 2 4 4 8', '='),
    'io_callback: jit>grad>cjvp': ('1', '='),
    'io_callback: grad>scan>cond': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: grad>scan>cvjp_fwd': ('1 2 4', '='),
    'io_callback: grad>scan>cvjp_bwd': ('1 2 4', '='),
    'io_callback: jvp>scan>ckpt_nothing': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: linearize>scan>cond': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: grad>scan>ckpt': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: grad>scan>ckpt_nothing': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: grad>scan>ckpt_everything': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: grad>scan>ckpt_dots': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback: jit>grad>scan>cond_else': ('',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback: vmap>cond_batched': ('1',
        'calls for the lanes that took the branch only (JAX: every lane, or refuses an io callback); JAX: !NotImplementedError'),
    'io_callback: jit>vmap>cond_batched': ('1',
        'calls for the lanes that took the branch only (JAX: every lane, or refuses an io callback); JAX: !NotImplementedError'),
    'io_callback: vmap>scan>cond_batched': ('1',
        'calls for the lanes that took the branch only (JAX: every lane, or refuses an io callback); JAX: !NotImplementedError'),
    'io_callback: vmap>cond_batched>scan': ('1 2 4', '-'),
    'io_callback: jit>vmap>cond_batched>fori': ('1 2 4', '-'),
    'io_callback ordered: jit': ('1', '='),
    'io_callback ordered: hjit': ('1', '='),
    'io_callback ordered: vmap': ('!ValueError', '='),
    'io_callback ordered: grad': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: vag': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: vjp': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: jvp': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: linearize': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: scan': ('1 2 4', '='),
    'io_callback ordered: fori': ('1 2 4', '='),
    'io_callback ordered: while': ('1 2 4', '='),
    'io_callback ordered: cond': ('1', '='),
    'io_callback ordered: cond_else': ('', '='),
    'io_callback ordered: ckpt': ('1', '='),
    'io_callback ordered: ckpt_nothing': ('1', '='),
    'io_callback ordered: ckpt_everything': ('1', '='),
    'io_callback ordered: ckpt_dots': ('1', '='),
    'io_callback ordered: cvjp_fwd': ('1', '='),
    'io_callback ordered: cvjp_bwd': ('', '='),
    'io_callback ordered: cjvp': ('1', '='),
    'io_callback ordered: cjvp_tan': ('', '='),
    'io_callback ordered: jit>scan': ('1 2 4', '='),
    'io_callback ordered: jit>cond': ('1', '='),
    'io_callback ordered: jit>cond_else': ('', '='),
    'io_callback ordered: jit>ckpt_nothing': ('1', '='),
    'io_callback ordered: jit>cvjp_fwd': ('1', '='),
    'io_callback ordered: jit>cvjp_bwd': ('', '='),
    'io_callback ordered: vmap>scan': ('!ValueError', '='),
    'io_callback ordered: vmap>cond': ('!ValueError',
        'both refuse, another check first; JAX: !NotImplementedError'),
    'io_callback ordered: vmap>cond_else': ('!ValueError',
        'both refuse, another check first; JAX: !NotImplementedError'),
    'io_callback ordered: vmap>ckpt_nothing': ('!ValueError', '='),
    'io_callback ordered: vmap>cvjp_fwd': ('!ValueError', '='),
    'io_callback ordered: vmap>cvjp_bwd': ('', '='),
    'io_callback ordered: grad>scan': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: grad>cond': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: grad>cond_else': ('',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: grad>ckpt_nothing': ('!NotImplementedError',
        'both refuse, another check first; JAX: !ValueError'),
    'io_callback ordered: grad>cvjp_fwd': ('1', '='),
    'io_callback ordered: grad>cvjp_bwd': ('1', '='),
    'io_callback ordered: jvp>scan': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: jvp>cond': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: jvp>cond_else': ('',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: jvp>ckpt_nothing': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: jvp>cvjp_fwd': ('1 !TypeError', '='),
    'io_callback ordered: jvp>cvjp_bwd': ('!TypeError', '='),
    'io_callback ordered: jit>grad': ('1',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: vmap>grad': ('!ValueError', '='),
    'io_callback ordered: hjit>vmap': ('!ValueError', '='),
    'io_callback ordered: scan>cond': ('1 2 4', '='),
    'io_callback ordered: jit>grad>scan': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback ordered: jit>vmap>scan': ('!ValueError', '='),
    'io_callback ordered: vmap>grad>scan': ('!ValueError', '='),
    'io_callback ordered: hjit>grad>scan': ('1 2 4',
        'a result-less io callback runs under autodiff on primal values (JAX: IO callbacks do not support JVP); JAX: !ValueError'),
    'io_callback result unused: jit': ('1', '='),
    'io_callback result unused: hjit': ('1', '='),
    'io_callback result unused: vmap': ('1 2', '='),
    'io_callback result unused: grad': ('!ValueError', '='),
    'io_callback result unused: vag': ('!ValueError', '='),
    'io_callback result unused: vjp': ('!ValueError', '='),
    'io_callback result unused: jvp': ('!ValueError', '='),
    'io_callback result unused: linearize': ('!ValueError', '='),
    'io_callback result unused: scan': ('1 2 4', '='),
    'io_callback result unused: fori': ('1 2 4', '='),
    'io_callback result unused: while': ('1 2 4', '='),
    'io_callback result unused: cond': ('1', '='),
    'io_callback result unused: cond_else': ('', '='),
    'io_callback result unused: ckpt': ('1', '='),
    'io_callback result unused: ckpt_nothing': ('1', '='),
    'io_callback result unused: ckpt_everything': ('1', '='),
    'io_callback result unused: ckpt_dots': ('1', '='),
    'io_callback result unused: cvjp_fwd': ('1', '='),
    'io_callback result unused: cvjp_bwd': ('', '='),
    'io_callback result unused: cjvp': ('1', '='),
    'io_callback result unused: cjvp_tan': ('', '='),
    'io_callback result unused: jit>scan': ('1 2 4', '='),
    'io_callback result unused: jit>cond': ('1', '='),
    'io_callback result unused: jit>cond_else': ('', '='),
    'io_callback result unused: jit>ckpt_nothing': ('1', '='),
    'io_callback result unused: jit>cvjp_fwd': ('1', '='),
    'io_callback result unused: jit>cvjp_bwd': ('', '='),
    'io_callback result unused: vmap>scan': ('1 2 2 4 4 8', '='),
    'io_callback result unused: vmap>cond': ('1 2',
        'JAX refuses an io callback in any vmap of cond; hostcall runs it for the lanes that took its branch; JAX: !NotImplementedError'),
    'io_callback result unused: vmap>cond_else': ('',
        'JAX refuses an io callback in any vmap of cond; hostcall runs it for the lanes that took its branch; JAX: !NotImplementedError'),
    'io_callback result unused: vmap>ckpt_nothing': ('1 2', '='),
    'io_callback result unused: vmap>cvjp_fwd': ('1 2', '='),
    'io_callback result unused: vmap>cvjp_bwd': ('', '='),
    'io_callback result unused: grad>scan': ('!ValueError', '='),
    'io_callback result unused: grad>cond': ('!ValueError', '='),
    'io_callback result unused: grad>cond_else': ('!ValueError', '='),
    'io_callback result unused: grad>ckpt_nothing': ('!ValueError', '='),
    'io_callback result unused: grad>cvjp_fwd': ('1', '='),
    'io_callback result unused: grad>cvjp_bwd': ('1', '='),
    'io_callback result unused: jvp>scan': ('!ValueError', '='),
    'io_callback result unused: jvp>cond': ('!ValueError', '='),
    'io_callback result unused: jvp>cond_else': ('!ValueError', '='),
    'io_callback result unused: jvp>ckpt_nothing': ('!ValueError', '='),
    'io_callback result unused: jvp>cvjp_fwd': ('1 !TypeError', '='),
    'io_callback result unused: jvp>cvjp_bwd': ('!TypeError', '='),
    'io_callback result unused: jit>grad': ('!ValueError', '='),
    'io_callback result unused: vmap>grad': ('!ValueError', '='),
    'io_callback result unused: hjit>vmap': ('1 2', '='),
    'io_callback result unused: scan>cond': ('1 2 4', '='),
    'io_callback result unused: jit>grad>scan': ('!ValueError', '='),
    'io_callback result unused: jit>vmap>scan': ('1 2 2 4 4 8', '='),
    'io_callback result unused: vmap>grad>scan': ('!ValueError', '='),
    'io_callback result unused: hjit>grad>scan': ('!ValueError', '='),
    'io_callback result unused: grad>scan>cvjp_fwd': ('1 2 4', '='),
    'io_callback result unused: jit>grad>scan>cvjp_fwd': ('1 2 4', '='),
    'io_callback result unused: jit>grad>fori>cvjp_fwd': ('1 2 4', '='),
    'id_tap: jit': ('1', '-'),
    'id_tap: hjit': ('1', '-'),
    'id_tap: vmap': ('[1,2]@b0', '-'),
    'id_tap: grad': ('1', '-'),
    'id_tap: vag': ('1', '-'),
    'id_tap: vjp': ('1', '-'),
    'id_tap: jvp': ('1', '-'),
    'id_tap: linearize': ('1', '-'),
    'id_tap: scan': ('1 2 4', '-'),
    'id_tap: fori': ('1 2 4', '-'),
    'id_tap: while': ('1 2 4', '-'),
    'id_tap: cond': ('1', '-'),
    'id_tap: cond_else': ('', '-'),
    'id_tap: ckpt': ('1', '-'),
    'id_tap: ckpt_nothing': ('1', '-'),
    'id_tap: ckpt_everything': ('1', '-'),
    'id_tap: ckpt_dots': ('1', '-'),
    'id_tap: cvjp_fwd': ('1', '-'),
    'id_tap: cvjp_bwd': ('', '-'),
    'id_tap: cjvp': ('1', '-'),
    'id_tap: cjvp_tan': ('', '-'),
    'id_tap: jit>scan': ('1 2 4', '-'),
    'id_tap: jit>fori': ('1 2 4', '-'),
    'id_tap: jit>while': ('1 2 4', '-'),
    'id_tap: jit>cond': ('1', '-'),
    'id_tap: jit>cond_else': ('', '-'),
    'id_tap: jit>ckpt': ('1', '-'),
    'id_tap: jit>ckpt_nothing': ('1', '-'),
    'id_tap: jit>ckpt_everything': ('1', '-'),
    'id_tap: jit>ckpt_dots': ('1', '-'),
    'id_tap: jit>cvjp_fwd': ('1', '-'),
    'id_tap: jit>cvjp_bwd': ('', '-'),
    'id_tap: jit>cjvp': ('1', '-'),
    'id_tap: jit>cjvp_tan': ('', '-'),
    'id_tap: hjit>scan': ('1 2 4', '-'),
    'id_tap: hjit>fori': ('1 2 4', '-'),
    'id_tap: hjit>while': ('1 2 4', '-'),
    'id_tap: hjit>cond': ('1', '-'),
    'id_tap: hjit>cond_else': ('', '-'),
    'id_tap: hjit>ckpt': ('1', '-'),
    'id_tap: hjit>ckpt_nothing': ('1', '-'),
    'id_tap: hjit>ckpt_everything': ('1', '-'),
    'id_tap: hjit>ckpt_dots': ('1', '-'),
    'id_tap: hjit>cvjp_fwd': ('1', '-'),
    'id_tap: hjit>cvjp_bwd': ('', '-'),
    'id_tap: hjit>cjvp': ('1', '-'),
    'id_tap: hjit>cjvp_tan': ('', '-'),
    'id_tap: vmap>scan': ('[1,2]@b0 [2,4]@b0 [4,8]@b0', '-'),
    'id_tap: vmap>fori': ('[1,2]@b0 [2,4]@b0 [4,8]@b0', '-'),
    'id_tap: vmap>while': ('[1,2]@b0 [2,4]@b0 [4,8]@b0', '-'),
    'id_tap: vmap>cond': ('[1,2]@b0', '-'),
    'id_tap: vmap>cond_else': ('', '-'),
    'id_tap: vmap>ckpt': ('[1,2]@b0', '-'),
    'id_tap: vmap>ckpt_nothing': ('[1,2]@b0', '-'),
    'id_tap: vmap>ckpt_everything': ('[1,2]@b0', '-'),
    'id_tap: vmap>ckpt_dots': ('[1,2]@b0', '-'),
    'id_tap: vmap>cvjp_fwd': ('[1,2]@b0', '-'),
    'id_tap: vmap>cvjp_bwd': ('', '-'),
    'id_tap: vmap>cjvp': ('[1,2]@b0', '-'),
    'id_tap: vmap>cjvp_tan': ('', '-'),
    'id_tap: grad>scan': ('1 2 4', '-'),
    'id_tap: grad>fori': ('1 2 4', '-'),
    'id_tap: grad>while': ('1 2 4 !ValueError', '-'),
    'id_tap: grad>cond': ('1', '-'),
    'id_tap: grad>cond_else': ('', '-'),
    'id_tap: grad>ckpt': ('1 1', '-'),
    'id_tap: grad>ckpt_nothing': ('1 1', '-'),
    'id_tap: grad>ckpt_everything': ('1', '-'),
    'id_tap: grad>ckpt_dots': ('1 1', '-'),
    'id_tap: grad>cvjp_fwd': ('1', '-'),
    'id_tap: grad>cvjp_bwd': ('1', '-'),
    'id_tap: grad>cjvp': ('1', '-'),
    'id_tap: grad>cjvp_tan': ('2@transpose', '-'),
    'id_tap: jvp>scan': ('1 2 4', '-'),
    'id_tap: jvp>fori': ('1 2 4', '-'),
    'id_tap: jvp>while': ('1 2 4', '-'),
    'id_tap: jvp>cond': ('1', '-'),
    'id_tap: jvp>cond_else': ('', '-'),
    'id_tap: jvp>ckpt': ('1', '-'),
    'id_tap: jvp>ckpt_nothing': ('1', '-'),
    'id_tap: jvp>ckpt_everything': ('1', '-'),
    'id_tap: jvp>ckpt_dots': ('1', '-'),
    'id_tap: jvp>cvjp_fwd': ('1 !TypeError', '-'),
    'id_tap: jvp>cvjp_bwd': ('!TypeError', '-'),
    'id_tap: jvp>cjvp': ('1', '-'),
    'id_tap: jvp>cjvp_tan': ('1', '-'),
    'id_tap: linearize>scan': ('1 2 4', '-'),
    'id_tap: linearize>fori': ('1 2 4', '-'),
    'id_tap: linearize>while': ('1 2 4', '-'),
    'id_tap: linearize>cond': ('1', '-'),
    'id_tap: linearize>cond_else': ('', '-'),
    'id_tap: linearize>ckpt': ('1 1', '-'),
    'id_tap: linearize>ckpt_nothing': ('1 1', '-'),
    'id_tap: linearize>ckpt_everything': ('1', '-'),
    'id_tap: linearize>ckpt_dots': ('1 1', '-'),
    'id_tap: linearize>cvjp_fwd': ('1 !TypeError', '-'),
    'id_tap: linearize>cvjp_bwd': ('!TypeError', '-'),
    'id_tap: linearize>cjvp': ('1', '-'),
    'id_tap: linearize>cjvp_tan': ('1', '-'),
    'id_tap: vag>scan': ('1 2 4', '-'),
    'id_tap: vag>cond': ('1', '-'),
    'id_tap: vag>ckpt': ('1 1', '-'),
    'id_tap: vag>cvjp_fwd': ('1', '-'),
    'id_tap: vag>cjvp_tan': ('2@transpose', '-'),
    'id_tap: vjp>scan': ('1 2 4', '-'),
    'id_tap: vjp>cond': ('1', '-'),
    'id_tap: vjp>ckpt': ('1 1', '-'),
    'id_tap: vjp>cvjp_fwd': ('1', '-'),
    'id_tap: vjp>cjvp_tan': ('2@transpose', '-'),
    'id_tap: jit>grad': ('1', '-'),
    'id_tap: grad>jit': ('1', '-'),
    'id_tap: jit>vmap': ('[1,2]@b0', '-'),
    'id_tap: vmap>jit': ('[1,2]@b0', '-'),
    'id_tap: vmap>grad': ('[1,2]@b0', '-'),
    'id_tap: grad>vmap': ('[1,2]@b0', '-'),
    'id_tap: hjit>grad': ('1', '-'),
    'id_tap: hjit>vmap': ('[1,2]@b0', '-'),
    'id_tap: vmap>jvp': ('[1,2]@b0', '-'),
    'id_tap: grad>grad': ('1', '-'),
    'id_tap: jit>jvp': ('1', '-'),
    'id_tap: vmap>vjp': ('[1,2]@b0', '-'),
    'id_tap: scan>fori': ('1 2 4 8 16 32 64 128 256', '-'),
    'id_tap: fori>scan': ('1 2 4 8 16 32 64 128 256', '-'),
    'id_tap: scan>cond': ('1 2 4', '-'),
    'id_tap: scan>cond_else': ('', '-'),
    'id_tap: scan>ckpt': ('1 2 4', '-'),
    'id_tap: scan>cvjp_fwd': ('1 2 4', '-'),
    'id_tap: scan>cvjp_bwd': ('', '-'),
    'id_tap: scan>cjvp': ('1 2 4', '-'),
    'id_tap: while>scan': ('1 2 4 8 16 32 64 128 256', '-'),
    'id_tap: jit>grad>scan': ('1 2 4', '-'),
    'id_tap: jit>vmap>scan': ('[1,2]@b0 [2,4]@b0 [4,8]@b0', '-'),
    'id_tap: vmap>grad>scan': ('[1,2]@b0 [2,4]@b0 [4,8]@b0', '-'),
    'id_tap: grad>vmap>scan': ('[1,2]@b0 [2,4]@b0 [4,8]@b0', '-'),
    'id_tap: jit>grad>fori': ('1 2 4', '-'),
    'id_tap: hjit>grad>scan': ('1 2 4', '-'),
    'id_tap: hjit>vmap>scan': ('[1,2]@b0 [2,4]@b0 [4,8]@b0', '-'),
    'id_tap: jit>grad>cjvp': ('1', '-'),
    'id_tap: grad>scan>cond': ('1 2 4', '-'),
    'id_tap: grad>scan>cvjp_fwd': ('1 2 4', '-'),
    'id_tap: grad>scan>cvjp_bwd': ('1 2 4', '-'),
    'id_tap: jvp>scan>ckpt_nothing': ('1 2 4', '-'),
    'id_tap: linearize>scan>cond': ('1 2 4', '-'),
    'id_tap: grad>scan>ckpt': ('1 2 4 4 2 1', '-'),
    'id_tap: grad>scan>ckpt_nothing': ('1 2 4 4 2 1', '-'),
    'id_tap: grad>scan>ckpt_everything': ('1 2 4', '-'),
    'id_tap: grad>scan>ckpt_dots': ('1 2 4 4 2 1', '-'),
    'id_tap: jit>grad>scan>cond_else': ('', '-'),
    'id_tap: vmap>cond_batched': ('[1,2]@b0', '-'),
    'id_tap: jit>vmap>cond_batched': ('[1,2]@b0', '-'),
    'id_tap: vmap>scan>cond_batched': ('[1,2]@b0 [2,4]@b0 [4,8]@b0', '-'),
    'id_tap: vmap>cond_batched>scan': ('[1,2]@b0 [2,4]@b0 [4,8]@b0', '-'),
    'id_tap: jit>vmap>cond_batched>fori': ('[1,2]@b0 [2,4]@b0 [4,8]@b0', '-'),
    'call: jit': ('1', '-'),
    'call: hjit': ('1', '-'),
    'call: vmap': ('!NotImplementedError', '-'),
    'call: grad': ('!NotImplementedError', '-'),
    'call: vag': ('!NotImplementedError', '-'),
    'call: vjp': ('!NotImplementedError', '-'),
    'call: jvp': ('!NotImplementedError', '-'),
    'call: linearize': ('!NotImplementedError', '-'),
    'call: scan': ('1 2 4', '-'),
    'call: fori': ('1 2 4', '-'),
    'call: while': ('1 2 4', '-'),
    'call: cond': ('1', '-'),
    'call: cond_else': ('', '-'),
    'call: ckpt': ('1', '-'),
    'call: ckpt_nothing': ('1', '-'),
    'call: ckpt_everything': ('1', '-'),
    'call: ckpt_dots': ('1', '-'),
    'call: cvjp_fwd': ('1', '-'),
    'call: cvjp_bwd': ('', '-'),
    'call: cjvp': ('1', '-'),
    'call: cjvp_tan': ('', '-'),
    'call: jit>scan': ('1 2 4', '-'),
    'call: jit>cond': ('1', '-'),
    'call: jit>cond_else': ('', '-'),
    'call: jit>ckpt_nothing': ('1', '-'),
    'call: jit>cvjp_fwd': ('1', '-'),
    'call: jit>cvjp_bwd': ('', '-'),
    'call: vmap>scan': ('!NotImplementedError', '-'),
    'call: vmap>cond': ('!NotImplementedError', '-'),
    'call: vmap>cond_else': ('!NotImplementedError', '-'),
    'call: vmap>ckpt_nothing': ('!NotImplementedError', '-'),
    'call: vmap>cvjp_fwd': ('!NotImplementedError', '-'),
    'call: vmap>cvjp_bwd': ('', '-'),
    'call: grad>scan': ('!NotImplementedError', '-'),
    'call: grad>cond': ('!NotImplementedError', '-'),
    'call: grad>cond_else': ('!NotImplementedError', '-'),
    'call: grad>ckpt_nothing': ('!NotImplementedError', '-'),
    'call: grad>cvjp_fwd': ('1', '-'),
    'call: grad>cvjp_bwd': ('1', '-'),
    'call: jvp>scan': ('!NotImplementedError', '-'),
    'call: jvp>cond': ('!NotImplementedError', '-'),
    'call: jvp>cond_else': ('!NotImplementedError', '-'),
    'call: jvp>ckpt_nothing': ('!NotImplementedError', '-'),
    'call: jvp>cvjp_fwd': ('1 !TypeError', '-'),
    'call: jvp>cvjp_bwd': ('!TypeError', '-'),
    'call: jit>grad': ('!NotImplementedError', '-'),
    'call: vmap>grad': ('!NotImplementedError', '-'),
    'call: hjit>vmap': ('!NotImplementedError', '-'),
    'call: scan>cond': ('1 2 4', '-'),
    'call: jit>grad>scan': ('!NotImplementedError', '-'),
    'call: jit>vmap>scan': ('!NotImplementedError', '-'),
    'call: vmap>grad>scan': ('!NotImplementedError', '-'),
    'call: hjit>grad>scan': ('!NotImplementedError', '-'),
    'pure_callback: jit': ('1', '-'),
    'pure_callback: hjit': ('1', '-'),
    'pure_callback: vmap': ('1 2', '-'),
    'pure_callback: grad': ('1 vjp:1', '-'),
    'pure_callback: vag': ('1 vjp:1', '-'),
    'pure_callback: vjp': ('1 vjp:1', '-'),
    'pure_callback: jvp': ('1 vjp:1', '-'),
    'pure_callback: linearize': ('1 vjp:1', '-'),
    'pure_callback: scan': ('1 2 4', '-'),
    'pure_callback: fori': ('1 2 4', '-'),
    'pure_callback: while': ('1 2 4', '-'),
    'pure_callback: cond': ('1', '-'),
    'pure_callback: cond_else': ('', '-'),
    'pure_callback: ckpt': ('1', '-'),
    'pure_callback: ckpt_nothing': ('1', '-'),
    'pure_callback: ckpt_everything': ('1', '-'),
    'pure_callback: ckpt_dots': ('1', '-'),
    'pure_callback: cvjp_fwd': ('1', '-'),
    'pure_callback: cvjp_bwd': ('', '-'),
    'pure_callback: cjvp': ('1', '-'),
    'pure_callback: cjvp_tan': ('', '-'),
    'pure_callback: jit>scan': ('1 2 4', '-'),
    'pure_callback: jit>cond': ('1', '-'),
    'pure_callback: jit>cond_else': ('', '-'),
    'pure_callback: jit>ckpt_nothing': ('1', '-'),
    'pure_callback: jit>cvjp_fwd': ('1', '-'),
    'pure_callback: jit>cvjp_bwd': ('', '-'),
    'pure_callback: vmap>scan': ('1 2 2 4 4 8', '-'),
    'pure_callback: vmap>cond': ('1 2', '-'),
    'pure_callback: vmap>cond_else': ('', '-'),
    'pure_callback: vmap>ckpt_nothing': ('1 2', '-'),
    'pure_callback: vmap>cvjp_fwd': ('1 2', '-'),
    'pure_callback: vmap>cvjp_bwd': ('', '-'),
    'pure_callback: grad>scan': ('1 2 4 vjp:1 vjp:2 vjp:4', '-'),
    'pure_callback: grad>cond': ('1 vjp:1', '-'),
    'pure_callback: grad>cond_else': ('', '-'),
    'pure_callback: grad>ckpt_nothing': ('1 vjp:1', '-'),
    'pure_callback: grad>cvjp_fwd': ('1', '-'),
    'pure_callback: grad>cvjp_bwd': ('1', '-'),
    'pure_callback: jvp>scan': ('1 vjp:1 2 vjp:1 4 vjp:1', '-'),
    'pure_callback: jvp>cond': ('1 vjp:1', '-'),
    'pure_callback: jvp>cond_else': ('', '-'),
    'pure_callback: jvp>ckpt_nothing': ('1 vjp:1', '-'),
    'pure_callback: jvp>cvjp_fwd': ('1 !TypeError', '-'),
    'pure_callback: jvp>cvjp_bwd': ('!TypeError', '-'),
    'pure_callback: jit>grad': ('vjp:1', '-'),
    'pure_callback: vmap>grad': ('1 2 vjp:1 vjp:1', '-'),
    'pure_callback: hjit>vmap': ('1 2', '-'),
    'pure_callback: scan>cond': ('1 2 4', '-'),
    'pure_callback: jit>grad>scan': ('1 2 4 vjp:1 vjp:2 vjp:4', '-'),
    'pure_callback: jit>vmap>scan': ('1 2 2 4 4 8', '-'),
    'pure_callback: vmap>grad>scan': ('1 2 2 4 4 8 vjp:1 vjp:1 vjp:2 vjp:2 vjp:4 vjp:4',
        '-'),
    'pure_callback: hjit>grad>scan': ('1 2 4 vjp:1 vjp:2 vjp:4', '-'),
    'grad_callback: jit': ('', '-'),
    'grad_callback: hjit': ('', '-'),
    'grad_callback: vmap': ('', '-'),
    'grad_callback: grad': ('2', '-'),
    'grad_callback: vag': ('2', '-'),
    'grad_callback: vjp': ('2', '-'),
    'grad_callback: jvp': ('!TypeError', '-'),
    'grad_callback: linearize': ('!TypeError', '-'),
    'grad_callback: scan': ('', '-'),
    'grad_callback: fori': ('', '-'),
    'grad_callback: while': ('', '-'),
    'grad_callback: cond': ('', '-'),
    'grad_callback: cond_else': ('', '-'),
    'grad_callback: ckpt': ('', '-'),
    'grad_callback: ckpt_nothing': ('', '-'),
    'grad_callback: ckpt_everything': ('', '-'),
    'grad_callback: ckpt_dots': ('', '-'),
    'grad_callback: cvjp_fwd': ('', '-'),
    'grad_callback: cvjp_bwd': ('', '-'),
    'grad_callback: cjvp': ('', '-'),
    'grad_callback: cjvp_tan': ('', '-'),
    'grad_callback: jit>scan': ('', '-'),
    'grad_callback: jit>cond': ('', '-'),
    'grad_callback: jit>cond_else': ('', '-'),
    'grad_callback: jit>ckpt_nothing': ('', '-'),
    'grad_callback: jit>cvjp_fwd': ('', '-'),
    'grad_callback: jit>cvjp_bwd': ('', '-'),
    'grad_callback: vmap>scan': ('', '-'),
    'grad_callback: vmap>cond': ('', '-'),
    'grad_callback: vmap>cond_else': ('', '-'),
    'grad_callback: vmap>ckpt_nothing': ('', '-'),
    'grad_callback: vmap>cvjp_fwd': ('', '-'),
    'grad_callback: vmap>cvjp_bwd': ('', '-'),
    'grad_callback: grad>scan': ('2 4 8', '-'),
    'grad_callback: grad>cond': ('2', '-'),
    'grad_callback: grad>cond_else': ('', '-'),
    'grad_callback: grad>ckpt_nothing': ('2', '-'),
    'grad_callback: grad>cvjp_fwd': ('', '-'),
    'grad_callback: grad>cvjp_bwd': ('', '-'),
    'grad_callback: jvp>scan': ('!TypeError', '-'),
    'grad_callback: jvp>cond': ('!TypeError', '-'),
    'grad_callback: jvp>cond_else': ('!TypeError', '-'),
    'grad_callback: jvp>ckpt_nothing': ('!TypeError', '-'),
    'grad_callback: jvp>cvjp_fwd': ('!TypeError', '-'),
    'grad_callback: jvp>cvjp_bwd': ('!TypeError', '-'),
    'grad_callback: jit>grad': ('2', '-'),
    'grad_callback: vmap>grad': ('2', '-'),
    'grad_callback: hjit>vmap': ('', '-'),
    'grad_callback: scan>cond': ('', '-'),
    'grad_callback: jit>grad>scan': ('2 4 8', '-'),
    'grad_callback: jit>vmap>scan': ('', '-'),
    'grad_callback: vmap>grad>scan': ('2 4 8', '-'),
    'grad_callback: hjit>grad>scan': ('2 4 8', '-'),
    'metrics: jit': ('1', '-'),
    'metrics: hjit': ('1', '-'),
    'metrics: vmap': ('m0:1 m1:2', '-'),
    'metrics: grad': ('1', '-'),
    'metrics: vag': ('1', '-'),
    'metrics: vjp': ('1', '-'),
    'metrics: jvp': ('1', '-'),
    'metrics: linearize': ('1', '-'),
    'metrics: scan': ('1 2 4', '-'),
    'metrics: fori': ('1 2 4', '-'),
    'metrics: while': ('1 2 4', '-'),
    'metrics: cond': ('1', '-'),
    'metrics: cond_else': ('', '-'),
    'metrics: ckpt': ('1', '-'),
    'metrics: ckpt_nothing': ('1', '-'),
    'metrics: ckpt_everything': ('1', '-'),
    'metrics: ckpt_dots': ('1', '-'),
    'metrics: cvjp_fwd': ('1', '-'),
    'metrics: cvjp_bwd': ('', '-'),
    'metrics: cjvp': ('1', '-'),
    'metrics: cjvp_tan': ('', '-'),
    'metrics: jit>scan': ('1 2 4', '-'),
    'metrics: jit>cond': ('1', '-'),
    'metrics: jit>cond_else': ('', '-'),
    'metrics: jit>ckpt_nothing': ('1', '-'),
    'metrics: jit>cvjp_fwd': ('1', '-'),
    'metrics: jit>cvjp_bwd': ('', '-'),
    'metrics: vmap>scan': ('m0:1 m1:2 m0:2 m1:4 m0:4 m1:8', '-'),
    'metrics: vmap>cond': ('m0:1 m1:2', '-'),
    'metrics: vmap>cond_else': ('', '-'),
    'metrics: vmap>ckpt_nothing': ('m0:1 m1:2', '-'),
    'metrics: vmap>cvjp_fwd': ('m0:1 m1:2', '-'),
    'metrics: vmap>cvjp_bwd': ('', '-'),
    'metrics: grad>scan': ('1 2 4', '-'),
    'metrics: grad>cond': ('1', '-'),
    'metrics: grad>cond_else': ('', '-'),
    'metrics: grad>ckpt_nothing': ('1', '-'),
    'metrics: grad>cvjp_fwd': ('1', '-'),
    'metrics: grad>cvjp_bwd': ('1', '-'),
    'metrics: jvp>scan': ('1 2 4', '-'),
    'metrics: jvp>cond': ('1', '-'),
    'metrics: jvp>cond_else': ('', '-'),
    'metrics: jvp>ckpt_nothing': ('1', '-'),
    'metrics: jvp>cvjp_fwd': ('1 !TypeError', '-'),
    'metrics: jvp>cvjp_bwd': ('!TypeError', '-'),
    'metrics: jit>grad': ('1', '-'),
    'metrics: vmap>grad': ('m0:1 m1:2', '-'),
    'metrics: hjit>vmap': ('m0:1 m1:2', '-'),
    'metrics: scan>cond': ('1 2 4', '-'),
    'metrics: jit>grad>scan': ('1 2 4', '-'),
    'metrics: jit>vmap>scan': ('m0:1 m1:2 m0:2 m1:4 m0:4 m1:8', '-'),
    'metrics: vmap>grad>scan': ('m0:1 m1:2 m0:2 m1:4 m0:4 m1:8', '-'),
    'metrics: hjit>grad>scan': ('1 2 4', '-'),
    'progress: scan': ('o3 t1 t2 t3 c3', '-'),
    'progress: jit>scan': ('o3 t1 t2 t3 c3', '-'),
    'progress: vmap>scan': ('o3 t1 t2 t3 c3', '-'),
    'progress: grad>scan': ('o3 t1 t2 t3 c3', '-'),
    'progress: jvp>scan': ('o3 t1 t2 t3 c3', '-'),
    'progress: scan>cond': ('o3 t1 t2 t3 c3', '-'),
    'progress: jit>grad>scan': ('o3 t1 t2 t3 c3', '-'),
    'progress: jit>vmap>scan': ('o3 t1 t2 t3 c3', '-'),
    'progress: vmap>grad>scan': ('o3 t1 t2 t3 c3', '-'),
    'progress: hjit>grad>scan': ('o3 t1 t2 t3 c3', '-'),
    'progress: grad>vmap>scan': ('o3 t1 t2 t3 c3', '-'),
    'progress: hjit>vmap>scan': ('o3 t1 t2 t3 c3', '-'),
    'progress: grad>scan>cond': ('o3 t1 t2 t3 c3', '-'),
    'progress: grad>scan>cvjp_fwd': ('o3 t1 t2 t3 c3', '-'),
    'progress: grad>scan>cvjp_bwd': ('o3 t1 t2 t3 c3', '-'),
    'progress: jvp>scan>ckpt_nothing': ('o3 t1 t2 t3 c3', '-'),
    'progress: linearize>scan>cond': ('o3 t1 t2 t3 c3', '-'),
    'progress: grad>scan>ckpt': ('o3 t1 t2 t3 c3', '-'),
    'progress: grad>scan>ckpt_nothing': ('o3 t1 t2 t3 c3', '-'),
    'progress: grad>scan>ckpt_everything': ('o3 t1 t2 t3 c3', '-'),
    'progress: grad>scan>ckpt_dots': ('o3 t1 t2 t3 c3', '-'),
    'progress: jit>grad>scan>cond_else': ('o3 t1 t2 t3 c3', '-'),
    'progress: scan>fori': ('o3 t1 t2 t3 c3', '-'),
    'progress: fori>scan': ('o3 o3 o3 t1 t2 t3 c3 t1 t2 t3 c3 t1 t2 t3 c3', '-'),
    'progress: scan>cond_else': ('o3 t1 t2 t3 c3', '-'),
    'progress: scan>ckpt': ('o3 t1 t2 t3 c3', '-'),
    'progress: scan>cvjp_fwd': ('o3 t1 t2 t3 c3', '-'),
    'progress: scan>cvjp_bwd': ('o3 t1 t2 t3 c3', '-'),
    'progress: scan>cjvp': ('o3 t1 t2 t3 c3', '-'),
    'progress: while>scan': ('o3 o3 o3 t1 t2 t3 c3 t1 t2 t3 c3 t1 t2 t3 c3', '-'),
    'debug_callback: shard_map': ('[1] [2] [3] [4]', '-'),
    'debug_callback: pmap': ('1 2 3 4', '-'),
    'debug_callback: jit>shard_map': ('[1] [2] [3] [4]', '-'),
    'debug_callback: shard_map>scan': ('[12] [16] [1] [2] [2] [3] [4] [4] [4] [6] [8] [8]',
        '-'),
    'debug_callback: pmap>scan': ('1 12 16 2 2 3 4 4 4 6 8 8', '-'),
    'debug_callback: shard_map>grad': ('[1] [2] [3] [4]', '-'),
    'debug_callback: pmap>grad': ('1 2 3 4', '-'),
    'debug_callback: shard_map>vmap': ('1 2 3 4', '-'),
    'debug_callback: grad>shard_map': ('[1] [2] [3] [4]', '-'),
    'debug_callback: shard_map>grad>scan': ('[12] [16] [1] [2] [2] [3] [4] [4] [4] [6] [8] [8]',
        '-'),
    'io_callback: shard_map': ('[1] [2] [3] [4]', '-'),
    'io_callback: pmap': ('1 2 3 4', '-'),
    'io_callback: jit>shard_map': ('[1] [2] [3] [4]', '-'),
    'io_callback: shard_map>scan': ('[12] [16] [1] [2] [2] [3] [4] [4] [4] [6] [8] [8]',
        '-'),
    'io_callback: pmap>scan': ('1 12 16 2 2 3 4 4 4 6 8 8', '-'),
    'io_callback: shard_map>grad': ('[1] [2] [3] [4]', '-'),
    'io_callback: pmap>grad': ('1 2 3 4', '-'),
    'io_callback: shard_map>vmap': ('1 2 3 4', '-'),
    'io_callback: grad>shard_map': ('[1] [2] [3] [4]', '-'),
    'io_callback: shard_map>grad>scan': ('[12] [16] [1] [2] [2] [3] [4] [4] [4] [6] [8] [8]',
        '-'),
    'id_tap: shard_map': ('[1] [2] [3] [4]', '-'),
    'id_tap: pmap': ('1 2 3 4', '-'),
    'id_tap: jit>shard_map': ('[1] [2] [3] [4]', '-'),
    'id_tap: shard_map>scan': ('[12] [16] [1] [2] [2] [3] [4] [4] [4] [6] [8] [8]',
        '-'),
    'id_tap: pmap>scan': ('1 12 16 2 2 3 4 4 4 6 8 8', '-'),
    'id_tap: shard_map>grad': ('[1] [2] [3] [4]', '-'),
    'id_tap: pmap>grad': ('1 2 3 4', '-'),
    'id_tap: shard_map>vmap': ('[1]@b0 [2]@b0 [3]@b0 [4]@b0', '-'),
    'id_tap: grad>shard_map': ('[1] [2] [3] [4]', '-'),
    'id_tap: shard_map>grad>scan': ('[12] [16] [1] [2] [2] [3] [4] [4] [4] [6] [8] [8]',
        '-'),
    'pure_callback: shard_map': ('[1] [2] [3] [4]', '-'),
    'pure_callback: pmap': ('1 2 3 4', '-'),
    'pure_callback: jit>shard_map': ('[1] [2] [3] [4]', '-'),
    'pure_callback: shard_map>scan': ('!TypeError', '-'),
    'pure_callback: pmap>scan': ('1 12 16 2 2 3 4 4 4 6 8 8', '-'),
    'pure_callback: shard_map>grad': ('[1] [2] [3] [4] vjp:[1] vjp:[1] vjp:[1] vjp:[1]',
        '-'),
    'pure_callback: pmap>grad': ('vjp:1 vjp:1 vjp:1 vjp:1', '-'),
    'pure_callback: shard_map>vmap': ('1 2 3 4', '-'),
    'pure_callback: grad>shard_map': ('[1] [2] [3] [4] vjp:[4] vjp:[4] vjp:[4] vjp:[4]',
        '-'),
    'pure_callback: shard_map>grad>scan': ('!TypeError', '-'),
    'grad_callback: shard_map': ('', '-'),
    'grad_callback: pmap': ('', '-'),
    'grad_callback: jit>shard_map': ('', '-'),
    'grad_callback: shard_map>scan': ('', '-'),
    'grad_callback: pmap>scan': ('', '-'),
    'grad_callback: shard_map>grad': ('[2] [2] [2] [2]', '-'),
    'grad_callback: pmap>grad': ('2 2 2 2', '-'),
    'grad_callback: shard_map>vmap': ('', '-'),
    'grad_callback: grad>shard_map': ('[2] [2] [2] [2]', '-'),
    'grad_callback: shard_map>grad>scan': ('[2] [2] [2] [2] [4] [4] [4] [4] [8] [8] [8] [8]',
        '-'),
    'metrics: shard_map': ('[1] [2] [3] [4]', '-'),
    'metrics: pmap': ('1 2 3 4', '-'),
    'metrics: jit>shard_map': ('[1] [2] [3] [4]', '-'),
    'metrics: shard_map>scan': ('[12] [16] [1] [2] [2] [3] [4] [4] [4] [6] [8] [8]',
        '-'),
    'metrics: pmap>scan': ('1 12 16 2 2 3 4 4 4 6 8 8', '-'),
    'metrics: shard_map>grad': ('[1] [2] [3] [4]', '-'),
    'metrics: pmap>grad': ('1 2 3 4', '-'),
    'metrics: shard_map>vmap': ('m0:1 m0:2 m0:3 m0:4', '-'),
    'metrics: grad>shard_map': ('[1] [2] [3] [4]', '-'),
    'metrics: shard_map>grad>scan': ('[12] [16] [1] [2] [2] [3] [4] [4] [4] [6] [8] [8]',
        '-'),
}

# Cells the project has not fixed yet, each marked xfail(strict=True) with
# the reason (so that a fix shows as an XPASS to remove from here). Empty:
# the last ones (a call in a loop inside a branch of a vmap of cond with a
# batched predicate ran for every lane) were fixed by hostcall._core.gating.
OPEN_CELLS: dict[str, str] = {}


# --- the tests -------------------------------------------------------------------


def _params(cell_list):
  params = []
  for flavour, c in cell_list:
    k = key(flavour, c)
    marks = []
    if _heavy(flavour, c):
      marks.append(pytest.mark.heavy)
    if k in OPEN_CELLS:
      marks.append(pytest.mark.xfail(strict=True, reason=OPEN_CELLS[k]))
    params.append(pytest.param(flavour, c, id=k.replace(" ", "_"),
                               marks=marks))
  return params


def _heavy(flavour, composition) -> bool:
  """The cells run by `make test-compositions` (CI) and `make test-heavy`
  only (`make test` keeps every single transformation for every flavour,
  and every pair for `debug_callback`, the flavour the others' calls are
  made like): pairs with a checkpoint policy other than the default, and
  the other flavours' pairs."""
  if len(composition) < 2:
    return False
  return (any(t.startswith("ckpt_") for t in composition)
          or flavour != "debug_callback")


def _jax_note(note):
  # "<why it differs>; JAX: <JAX's calls>"
  return note.rsplit("; JAX: ", 1)[1].split() if "; JAX: " in note else None


def test_the_table_covers_every_cell_once():
  wanted = {key(fl, c) for fl, c in cells() + multidevice_cells()}
  assert set(EXPECTED) == wanted
  assert set(OPEN_CELLS) <= wanted


@pytest.mark.parametrize("flavour, composition", _params(cells()))
def test_cell(flavour, composition, capfd, tmp_path):
  events, note = EXPECTED[key(flavour, composition)]
  read = (lambda: capfd.readouterr().out) if flavour == "debug_print" else None
  if read:
    read()
  ours = observe(flavour, composition, metrics_root=tmp_path,
                 read_stdout=read)
  if flavour == "pure_callback" and "jvp" in composition:
    # A pure call and its derivative rule's call under jvp are independent
    # (neither reads the other's result): XLA orders them as it likes
    # (0.10 the primal first in a scan step, 0.12 the rule): the same calls.
    assert sorted(ours) == sorted(events.split()), (
        key(flavour, composition), ours)
    ours = events.split()
  assert ours == events.split(), (key(flavour, composition), ours)
  if note == "=" or _jax_note(note) is not None:
    theirs = observe(flavour, composition, jax_flavour=True, read_stdout=read)
    wanted = ours if note == "=" else _jax_note(note)
    if _lanes_in_a_loop(composition):
      # JAX promises no order among the lanes of an unordered callback in
      # a vmapped loop, and its order changed between releases (0.10: the
      # last lane first in a scan; 0.12: in a fori_loop): the same calls.
      theirs, wanted = sorted(theirs), sorted(wanted)
    assert theirs == wanted, theirs


def _lanes_in_a_loop(composition) -> bool:
  if "vmap" not in composition:
    return False
  inner = composition[composition.index("vmap") + 1:]
  return any(t in ("scan", "fori", "while") for t in inner)


@pytest.fixture(scope="module")
def multidevice_observed():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, __file__, "--multidevice"], env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("flavour, composition", _params(multidevice_cells()))
def test_multidevice_cell(flavour, composition, multidevice_observed):
  events, _ = EXPECTED[key(flavour, composition)]
  assert multidevice_observed[key(flavour, composition)] == events.split()


# --- the rule, on random compositions ------------------------------------------

import hypothesis  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

GENERATED = ["jit", "vmap", "grad", "scan", "fori", "cond", "ckpt",
             "ckpt_nothing", "ckpt_dots"]
LOOPS = {"scan": N, "fori": N}


def calls_per_primal_step(composition) -> int | None:
  """How many times a ``debug_callback`` written once in the body runs:
  once per primal step (loops multiply, ``vmap`` calls once per element),
  whatever ``jit``, ``grad`` and ``cond`` (a taken branch) wrap it. None
  where a ``jax.checkpoint`` is differentiated: there the promise is "as
  ``jax.debug.callback``" (it may run again where rematerialised)."""
  count = 1
  for i, name in enumerate(composition):
    if name.startswith("ckpt") and "grad" in composition[:i]:
      return None
    count *= LOOPS.get(name, 2 if name == "vmap" else 1)
  return count


def the_rule_holds(composition):
  ours = observe("debug_callback", composition)
  assert not any(e.startswith("!") for e in ours), (composition, ours)
  expected = calls_per_primal_step(composition)
  if expected is None:
    theirs = observe("debug_callback", composition, jax_flavour=True)
    assert sorted(ours) == sorted(theirs), (composition, ours, theirs)
  else:
    assert len(ours) == expected, (composition, ours)


_compositions = st.lists(st.sampled_from(GENERATED), min_size=2, max_size=3)


def _settings(examples):
  return hypothesis.settings(max_examples=examples, deadline=None,
                             derandomize=True,
                             suppress_health_check=list(
                                 hypothesis.HealthCheck))


test_a_call_runs_once_per_primal_step = _settings(25)(
    hypothesis.given(_compositions)(the_rule_holds))
test_a_call_runs_once_per_primal_step_at_length = pytest.mark.heavy(
    _settings(400)(hypothesis.given(_compositions)(the_rule_holds)))


# --- generation of the observed table (for review) ------------------------------


def _observe_all(cell_list, sort=False):
  import contextlib
  table = {}
  for flavour, c in cell_list:
    out = io.StringIO()
    stdout_box = []

    def read():
      text = "".join(stdout_box)
      stdout_box.clear()
      return text
    with contextlib.redirect_stdout(out):
      ours = observe(flavour, c, read_stdout=lambda: out.getvalue())
    out.truncate(0)
    out.seek(0)
    if sort:
      ours = sorted(ours)
    note = "-"
    if flavour in JAX_SITES and not sort:
      with contextlib.redirect_stdout(out):
        theirs = observe(flavour, c, jax_flavour=True,
                         read_stdout=lambda: out.getvalue())
      note = "=" if theirs == ours else "JAX: " + " ".join(theirs)
    table[key(flavour, c)] = (" ".join(ours), note)
  return table


if __name__ == "__main__":
  if "--multidevice" in sys.argv:
    import contextlib
    with contextlib.redirect_stdout(sys.stderr):
      table = _observe_all(multidevice_cells(), sort=True)
    print(json.dumps({k: v[0].split() for k, v in table.items()}))
  elif "--observe" in sys.argv:
    table = _observe_all(cells())
    for k, v in table.items():
      print(f"    {k!r}: {v!r},", file=sys.stderr)

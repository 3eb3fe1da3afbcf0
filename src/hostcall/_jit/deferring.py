"""Taking a program's host calls out of its JAX effects (``hostcall.jit``).

A traced program whose host calls are all *deferrable* (taps and
result-less calls whose target allows it, ``HostTarget.deferrable``) is
evaluated again with each such call rebound one of two ways:

* queued (``evaluate_threaded``, CPU devices with the native queue):
  ``threaded``'s call, which queues the operands from the device without a
  JAX effect, ordered by a value threaded from call to call, through
  ``lax.scan`` and ``while_loop`` carries and ``cond`` branches; a target
  that is ``queueable`` may be (a progress bar's events too), and a call
  with results whose target has an ``answer`` gives the program a handle
  its device makes, queued with it (a bar's open: the invocation's);
* as outputs (``evaluate``, elsewhere): each call's operands become extra
  outputs of the program, packed into one flat buffer of words (read as
  bytes by the host; ``packing.py``), and a ``Plan`` (``plan.py``) says how the host replays the calls, in program
  order, once those outputs are ready (``hostcall._runtime.outputs_replay``).

Either way the program carries no JAX effect. Where the calls may sit: the
top level of the program, a ``jax.jit`` inside it (inlined, its arguments
and results held to the shardings it gave them), a ``lax.scan`` body
(recursively; as outputs, the values are stacked as extra ``ys``, one
``Loop`` node of the plan, replayed step by step, last step first for a
reverse scan) and, queued only, a ``while_loop`` body and a ``cond``
branch (a ``while_loop``'s predicate may not call the host).

A host call anywhere else (a ``shard_map``, a ``jax.checkpoint``, a
``custom_jvp`` or ``custom_vjp`` function), a call with results (unless
queued with an answer) or one whose target must be called live (as
outputs, a progress bar's event), and any other
effect, leave the program as it is (``analyse`` says None): its host calls
then run where ``jax.jit`` runs them, in their order. Host calls without an
effect (``pure_callback``) stay where they are and do not stop the others
from being taken out: JAX promises no order for them.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from hostcall import _jax_private
from hostcall._core.context import AFTER
from hostcall._core.primitive import hostcall_p
from hostcall._jit import deferrable, threaded
from hostcall._jit.plan import Call, Loop


class _AsOutputs:
  """What one trace level (the program, or one ``lax.scan`` body) takes
  out as outputs: the calls' ``nodes`` of the plan, and their ``values``."""

  rules = deferrable.AS_OUTPUTS

  def __init__(self):
    self.nodes: list = []
    self.values: list = []

  def record(self, eqn, invals) -> list:
    """Takes the call ``eqn`` out; returns its results (a tap's operands;
    as outputs, no call has others: ``rules``)."""
    params = eqn.params
    operands = [deferrable.physical(x, v.aval)
                for x, v in zip(invals, eqn.invars)]
    self.nodes.append(Call(
        params["target"], params["transforms"],
        tuple(tuple(o.shape) for o in operands),
        tuple(np.dtype(o.dtype) for o in operands),
        params["device_index"]))
    self.values.extend(operands)
    return invals if params["kind"] == "tap" else []

  def left_in_place(self, eqn, invals):
    """A host call not taken out (a pure callback), bound as it is."""
    return _jax_private.bind_equation(eqn, invals)

  def scan(self, eqn, invals) -> list:
    """A ``lax.scan`` whose body's calls are stacked as extra ``ys``: one
    ``Loop`` node of the plan."""
    inner = _AsOutputs()

    def step(carry, x):
      inner.nodes.clear()
      inner.values.clear()
      carry, ys = _scan_body(eqn, invals, inner, carry, x)
      values = list(inner.values)
      inner.values.clear()  # nothing keeps the body's tracers after it
      return carry, (ys, values)

    carry, (ys, stacked) = _lax_scan(eqn, invals, step, [])
    self.nodes.append(Loop(eqn.params["length"], eqn.params["reverse"],
                           tuple(inner.nodes)))
    self.values.extend(stacked)
    return [*carry, *ys]


class _Queued:
  """What one trace level (the program, or one loop body or branch)
  queues: calls threading the value ``order`` (``threaded``).

  A queued call is bound once it is known whether another follows it
  (reading ``order`` binds it, returning the value the next one takes;
  ``finish`` binds the program's last call returning nothing)."""

  rules = deferrable.QUEUED

  def __init__(self, order):
    self._order = order
    self._pending = None  # (operands, params) of a call not bound yet

  @property
  def order(self):
    """The value the next queued call (or loop, or branch) takes."""
    if self._pending is not None:
      self._order = self._bind_pending(returns=True)
    return self._order

  def _bind_pending(self, returns: bool):
    operands, params = self._pending
    self._pending = None
    return threaded.bind(self._order, operands, **params, returns=returns)

  @order.setter
  def order(self, value) -> None:
    self.order  # noqa: B018 - a pending call is bound first, in its place
    self._order = value

  def finish(self) -> None:
    """Ends the program: its last queued call is bound returning nothing;
    a last loop or branch that queued calls is kept (``threaded.end``)."""
    if self._pending is not None:
      self._bind_pending(returns=False)
    else:
      threaded.end(self._order)

  def live(self, eqn, invals) -> list:
    """Stages the live call ``eqn`` in its place in the order; returns its
    results."""
    params = eqn.params
    operands = [jnp.asarray(x, v.aval.dtype)
                for x, v in zip(invals, eqn.invars)]

    def call(order):
      return threaded.bind_live(
          order, operands, target=params["target"],
          transforms=params["transforms"],
          device_index=params["device_index"],
          result_avals=params["result_avals"])
    target = params["target"]
    if not target.schedule.asks_first or params["result_avals"]:
      self._order, results = call(self.order)
      return results
    # The device answers first; the host function runs only where it asks.
    self._order = jax.lax.cond(target.ask_first(*operands) != 0,
                               lambda order: call(order)[0],
                               lambda order: order, self.order)
    return []

  def record(self, eqn, invals) -> list:
    """Queues the call ``eqn``; returns its results: a tap's operands, or
    what a call with results answers (``Schedule.answer``): a handle its
    device makes, queued with the call as one more operand (with when it
    was made) for the host to adopt."""
    params = eqn.params
    operands = [deferrable.physical(x, v.aval)
                for x, v in zip(invals, eqn.invars)]
    outs = invals if params["kind"] == "tap" else []
    if eqn.outvars and params["kind"] != "tap":
      made = threaded.new_handle(params["target"].schedule.answer)
      outs = [jnp.broadcast_to(made[0], v.aval.shape).astype(v.aval.dtype)
              for v in eqn.outvars]
      operands.append(made)
    self.order  # noqa: B018 - binds the call before this one
    self._pending = (operands, {
        "target": params["target"], "transforms": params["transforms"],
        "device_index": params["device_index"]})
    return outs

  def left_in_place(self, eqn, invals):
    """A host call not taken out (a pure callback) runs after the queued
    calls before it: were it to fail first, they would never be queued,
    where jax.jit delivers them. It takes the order value as one more
    operand, which its host side drops (``lowering.AFTER``)."""
    params = dict(eqn.params, transforms=eqn.params["transforms"] + (AFTER,))
    return hostcall_p.bind(*invals, self.order, **params)

  def scan(self, eqn, invals) -> list:
    """A ``lax.scan`` threading the order value through its carry."""
    def step(carry, x):
      inner = _Queued(carry[0])
      carry, ys = _scan_body(eqn, invals, inner, carry[1:], x)
      return [inner.order, *carry], ys

    (self.order, *carry), ys = _lax_scan(eqn, invals, step, [self.order])
    return [*carry, *ys]

  def while_loop(self, eqn, invals) -> list:
    return _while(eqn, invals, self)

  def cond(self, eqn, invals) -> list:
    return _cond(eqn, invals, self)


def evaluate(closed_jaxpr, args: Sequence) -> tuple[list, list, tuple]:
  """Evaluates ``closed_jaxpr`` on ``args`` (in the current trace) with its
  deferrable calls taken out; returns ``(outputs, deferred values,
  nodes)``."""
  recorder = _AsOutputs()
  outs = _evaluate(deferrable.jaxpr_of(closed_jaxpr), closed_jaxpr.consts,
                   args, recorder)
  return outs, recorder.values, tuple(recorder.nodes)


def evaluate_threaded(closed_jaxpr, args: Sequence,
                      keep_order: bool = False):
  """Evaluates ``closed_jaxpr`` on ``args`` (in the current trace) with
  its deferrable calls queued without a JAX effect, in program order
  (``hostcall._jit.threaded``); returns the outputs, or with
  ``keep_order`` the outputs and the order value the program's last call
  returned (which is ready once every queued call has run: on several
  devices, what a barrier waits for)."""
  recorder = _Queued(threaded.start_order())
  outs = _evaluate(deferrable.jaxpr_of(closed_jaxpr), closed_jaxpr.consts,
                   args, recorder)
  if keep_order:
    return outs, recorder.order
  recorder.finish()
  return outs


def _evaluate(jaxpr, consts, args, recorder: _AsOutputs | _Queued) -> list:
  env: dict = {}
  rules = recorder.rules

  def read(atom):
    return atom.val if isinstance(atom, jex_core.Literal) else env[atom]

  def write(var, value):
    env[var] = value

  for var, value in zip(jaxpr.constvars, consts):
    write(var, value)
  for var, value in zip(jaxpr.invars, args):
    write(var, value)
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    name = eqn.primitive.name
    if eqn.primitive is hostcall_p and rules.runs_live_without_effect(eqn):
      outs = recorder.live(eqn, invals)
    elif eqn.primitive is hostcall_p and rules.deferrable_call(eqn):
      outs = recorder.record(eqn, invals)
    elif eqn.primitive is hostcall_p:
      outs = recorder.left_in_place(eqn, invals)
    elif deferrable.is_jit(eqn) and rules.analyse(eqn.params["jaxpr"]):
      inner = eqn.params["jaxpr"]
      outs = _constrained(_evaluate(
          deferrable.jaxpr_of(inner), inner.consts,
          _constrained(invals, eqn.params.get("in_shardings")), recorder),
          eqn.params.get("out_shardings"))
    elif name == "scan" and _takes_out_of(rules, eqn):
      outs = recorder.scan(eqn, invals)
    elif name == "while" and _takes_out_of(rules, eqn):
      outs = recorder.while_loop(eqn, invals)
    elif name == "cond" and _takes_out_of(rules, eqn):
      outs = recorder.cond(eqn, invals)
    else:
      outs = _jax_private.bind_equation(eqn, invals)
    if not eqn.primitive.multiple_results:
      outs = [outs]
    for var, value in zip(eqn.outvars, outs):
      write(var, value)
  return [read(v) for v in jaxpr.outvars]


def _takes_out_of(rules: deferrable.Rules, eqn) -> bool:
  """Whether the route of ``rules`` takes calls out of the jaxprs inside
  ``eqn`` (a ``scan``'s body; queued, a ``while_loop``'s body or a
  ``cond``'s branches): it looks into them, and one has calls to take."""
  return any(rules.analyse(inner) for inner in rules.looked_into(eqn))


def _constrained(values: list, shardings) -> list:
  """``values`` held to the shardings that an inlined ``jax.jit`` gave its
  arguments or results (where given; on a mesh of explicit axes a value's
  sharding is its type, which the inlined program keeps as it is)."""
  if not shardings:
    return values
  return [jax.lax.with_sharding_constraint(value, sharding)
          if _constraining(sharding) and isinstance(value, jax.Array)
          else value for value, sharding in zip(values, shardings)]


def _constraining(sharding) -> bool:
  if not isinstance(sharding, jax.sharding.Sharding):
    return False  # not given
  axis_types = getattr(getattr(sharding, "mesh", None), "axis_types", ())
  return jax.sharding.AxisType.Explicit not in tuple(axis_types)


def _lax_scan(eqn, invals, step, before: list):
  """``lax.scan`` of ``step`` as ``eqn`` runs its body: over ``eqn``'s
  ``xs``, its carry ``before`` and then ``eqn``'s."""
  num_consts, num_carry = deferrable.scan_layout(eqn)
  init = invals[num_consts:num_consts + num_carry]
  xs = invals[num_consts + num_carry:]
  return jax.lax.scan(step, [*before, *init], list(xs),
                      length=eqn.params["length"],
                      reverse=eqn.params["reverse"],
                      unroll=eqn.params.get("unroll", 1))


def _scan_body(eqn, invals, inner, carry, x) -> tuple[list, list]:
  """One step of ``eqn``'s body, its calls taken out by ``inner``:
  ``(carry, ys)``."""
  num_consts, num_carry = deferrable.scan_layout(eqn)
  body = eqn.params["jaxpr"]
  outs = _evaluate(deferrable.jaxpr_of(body), body.consts,
                   [*invals[:num_consts], *carry, *x], inner)
  return outs[:num_carry], outs[num_carry:]


def _while(eqn, invals, recorder: _Queued) -> list:
  """A ``while_loop`` whose body queues calls, threading the order value
  through its carry (queued calls only)."""
  params = eqn.params
  cond, body = params["cond_jaxpr"], params["body_jaxpr"]
  cond_consts = invals[:params["cond_nconsts"]]
  body_consts = invals[params["cond_nconsts"]:
                       params["cond_nconsts"] + params["body_nconsts"]]
  init = invals[params["cond_nconsts"] + params["body_nconsts"]:]

  # A vmap of a loop whose predicate is batched keeps it batched: the loop
  # runs while any lane's holds, and a lane whose predicate fails keeps its
  # carry, as JAX lowers such a loop (its body runs every lane).
  batched = bool(cond.out_avals[0].shape)

  def lanes_predicate(carry):
    return jex_core.jaxpr_as_fun(cond)(*cond_consts, *carry)[0]

  def predicate(carry):
    pred = lanes_predicate(carry[1:])
    return jnp.any(pred) if batched else pred

  def step(carry):
    order, *carry = carry
    inner = _Queued(order)
    outs = _evaluate(deferrable.jaxpr_of(body), body.consts, [*body_consts, *carry],
                     inner)
    if batched:
      running = lanes_predicate(carry)
      outs = [_select_lanes(running, new, old)
              for new, old in zip(outs, carry)]
    return [inner.order, *outs]

  recorder.order, *outs = jax.lax.while_loop(predicate, step,
                                             [recorder.order, *init])
  return outs


def _select_lanes(running, new, old):
  """``new`` in the lanes (leading axes, ``running``'s) still running,
  ``old`` in the others."""
  running = jax.lax.broadcast_in_dim(running, jnp.shape(new),
                                     tuple(range(jnp.ndim(running))))
  return jax.lax.select(running, new, old)


def _cond(eqn, invals, recorder: _Queued) -> list:
  """A ``cond`` whose branches queue calls (the branch taken queues its
  own), threading the order value through it (queued calls only)."""
  index, *operands = invals

  def branch(closed):
    def run(order, *operands):
      inner = _Queued(order)
      outs = _evaluate(deferrable.jaxpr_of(closed), closed.consts, operands, inner)
      return [inner.order, *outs]
    return run

  recorder.order, *outs = jax.lax.switch(
      index, [branch(b) for b in eqn.params["branches"]], recorder.order,
      *operands)
  return outs

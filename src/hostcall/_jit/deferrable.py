"""Which programs ``hostcall.jit`` can take host calls out of, and which
call keeps one as ``jax.jit`` compiles it (``analyse``, ``why_kept``): a
host call is *deferrable* where its target allows it and it sits where
``hostcall._jit.deferring`` can rebind it (the top level, an inner
``jax.jit``, a ``lax.scan`` body, and queued only a ``while_loop`` body or
a ``cond`` branch)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hostcall import _jax_private
from hostcall._core.primitive import hostcall_p


def runs_live(eqn) -> bool:
  """Whether ``eqn`` is a host call that a queued program runs live
  without a JAX effect (``Schedule.live_without_effect``: a steered
  loop's), where it runs on one device."""
  target = eqn.params.get("target")
  return (eqn.primitive is hostcall_p and target.schedule.live_without_effect
          and not target.queueable)


def is_loop_body_call(eqn) -> bool:
  """Whether ``eqn`` is a host call other than a chunked loop's own events
  (one its body makes). With a call that ``runs_live`` beside it, a
  program stays as ``jax.jit`` has it: a queued call's failure would reach
  the host after the loop's checks, which must stop the loop at it."""
  return (eqn.primitive is hostcall_p and not runs_live(eqn)
          and not eqn.params["target"].schedule.loop_event)


def _packable(aval) -> bool:
  dtype = getattr(aval, "dtype", None)
  # Numbers of every width (bfloat16, float8, int4 too), booleans and PRNG
  # keys (taken out as their key data, ``physical``); not float0 or
  # another extended dtype, which no output carries as they are.
  return dtype is not None and (jnp.issubdtype(dtype, jnp.number)
                                or jnp.issubdtype(dtype, jnp.bool_)
                                or _is_key(dtype))


def _is_key(dtype) -> bool:
  return jnp.issubdtype(dtype, jax.dtypes.prng_key)


def physical(value, aval):
  """An operand as a deferred call carries it: a PRNG key as its key data
  (``jax.random.key_data``: what the host function of a call in a program
  ``jax.jit`` compiles receives), any other value in its own dtype."""
  if _is_key(aval.dtype):
    return jax.random.key_data(value)
  return jnp.asarray(value, aval.dtype)


def is_jit(eqn) -> bool:
  return eqn.primitive.name in ("pjit", "jit") and "jaxpr" in eqn.params


@dataclasses.dataclass(frozen=True)
class Rules:
  """What a route may take out of a program: queued from the device
  (``queued``: ``hostcall._jit.threaded``, which reaches ``while_loop``
  bodies and ``cond`` branches too, and runs a steered loop's events live
  without an effect on one device), or as outputs (``evaluate``).

  Attributes:
    queued: the calls are queued from the device.
  """

  queued: bool

  def deferrable_call(self, eqn) -> bool:
    """Whether the host call ``eqn`` may be taken out: queued from the
    device (``queued``: its target is ``queueable``, and a call with results
    has an ``answer`` for the program), or as outputs (a result-less
    call whose target is ``deferrable``)."""
    params = eqn.params
    target = params["target"]
    if self.runs_live_without_effect(eqn):
      return True
    if params["partitioned"] or not all(_packable(v.aval) for v in eqn.invars):
      return False
    answers = params["kind"] == "call" and params["result_avals"]
    if self.queued:
      return target.queueable and (not answers
                                   or target.schedule.answer is not None)
    return not answers and target.deferrable

  def runs_live_without_effect(self, eqn) -> bool:
    """``runs_live`` in a queued program, on one device only (where a
    partitioned call is one call too)."""
    return self.queued and runs_live(eqn) and jax.device_count() == 1

  def why_kept(self, eqn) -> str:
    """Why ``keeps_live(eqn)``: what about ``eqn`` keeps its
    program as ``jax.jit`` compiles it, in words for the warning."""
    name = eqn.primitive.name
    if eqn.primitive is not hostcall_p:
      if self._calls_in_a_predicate(eqn):
        return "a while_loop whose predicate calls the host"
      if name == "io_callback":
        return ("an io_callback whose results the program uses (or with a "
                "sharding), which must run in place")
      if eqn.params.get("partitioned"):
        return "a partitioned call (one per shard), which stays in the program"
      if any(k.endswith("jaxpr") or k == "branches" for k in eqn.params):
        name = {"remat2": "jax.checkpoint", "checkpoint": "jax.checkpoint",
                "custom_jvp_call": "custom_jvp",
                "custom_vjp_call": "custom_vjp"}.get(name, name)
        return (f"the host calls (or other effects) inside a {name}, where "
                "hostcall.jit takes none out")
      effects = ", ".join(sorted({type(e).__name__ for e in eqn.effects}))
      return f"an effect hostcall.jit cannot take out ({name}: {effects})"
    params = eqn.params
    if params["partitioned"]:
      return "a partitioned call (one per shard), which stays in the program"
    unpackable = [v.aval for v in eqn.invars if not _packable(v.aval)]
    if unpackable:
      return (f"its operand of dtype {unpackable[0].dtype}, which a program "
              "cannot hand out as bytes to call the host later")
    if params["kind"] == "call" and params["result_avals"]:
      return "a call whose results the program uses, which must run in place"
    return "a host call that must run where the program makes it"

  def analyse(self, jaxpr) -> bool | None:
    """Whether ``jaxpr`` (a closed or open jaxpr) can be deferred: True if
    it has deferrable host calls and nothing that must stay live (see the
    module's docstring), False if it has nothing to defer, None if it has
    host calls or effects that must run where they are. ``queued``: the
    calls are to be queued from the device (``evaluate_threaded``), which
    reaches the bodies of ``while_loop`` and the branches of ``cond`` too."""
    found = False
    for eqn in jaxpr_of(jaxpr).eqns:
      if eqn.primitive is hostcall_p:
        if self.deferrable_call(eqn):
          found = True
          continue
        if eqn.effects:
          return None
        continue  # a call without an effect: no order to keep
      if self._calls_in_a_predicate(eqn):
        return None
      inners = self.looked_into(eqn)
      if inners:
        for inner in inners:
          verdict = self.analyse(inner)
          if verdict is None:
            return None
          found = found or verdict
      elif eqn.effects:
        return None
    return found

  def keeps_live(self, eqn) -> bool:
    """Whether ``eqn`` itself (not a jaxpr inside it) is what makes
    ``analyse`` keep a program as it is: an effectful host call that cannot
    be deferred, or another effect ``analyse`` does not look into."""
    if eqn.primitive is hostcall_p:
      return bool(eqn.effects) and not self.deferrable_call(eqn)
    return bool(eqn.effects) and (not self.looked_into(eqn)
                                  or self._calls_in_a_predicate(eqn))

  def looked_into(self, eqn) -> list:
    """The jaxprs ``analyse`` reads (and the route takes calls out of)
    inside ``eqn``: a nested ``jit``'s, a
    ``scan``'s body, and, queued, a ``while_loop``'s body and a ``cond``'s
    branches; [] for any other equation."""
    if is_jit(eqn) or (eqn.primitive.name == "scan"
                        and scan_layout(eqn) is not None):
      return [eqn.params["jaxpr"]]
    if self.queued and eqn.primitive.name == "while":
      return [eqn.params["body_jaxpr"]]
    if self.queued and eqn.primitive.name == "cond":
      return list(eqn.params["branches"])
    return []

  def _calls_in_a_predicate(self, eqn) -> bool:
    """Whether ``eqn`` is a queued ``while_loop`` whose predicate calls the
    host: the predicate stays as it is, so it may not."""
    return (self.queued and eqn.primitive.name == "while"
            and self.analyse(eqn.params["cond_jaxpr"]) is not False)


#: The rules of the routes that queue calls from the device, and of those
#: that make them outputs.
QUEUED = Rules(queued=True)
AS_OUTPUTS = Rules(queued=False)


def jaxpr_of(jaxpr):
  return getattr(jaxpr, "jaxpr", jaxpr)


def scan_layout(eqn):
  layout = _jax_private.scan_layout(eqn.params)
  if layout is None:
    return None
  num_consts, num_carry = layout
  length = eqn.params["length"]
  ys = eqn.outvars[num_carry:]
  if not all(getattr(v.aval, "shape", (None,))[:1] == (length,) for v in ys):
    return None  # a layout this release lays out otherwise
  return num_consts, num_carry


# --- evaluating a program with its calls deferred ---------------------------

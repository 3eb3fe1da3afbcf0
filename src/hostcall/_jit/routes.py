"""``hostcall.jit``'s routes: how a program's host calls leave its JAX
effects, and who delivers them.

A route is one way to take the calls out; ``choose`` picks it, in this one
place, from what the process's devices allow (``Process``, found once):

* ``Queued`` (a process of one CPU device, the native tap queue loaded):
  each call is queued from the device as the program runs
  (``hostcall._jit.threaded``: a custom call without a JAX effect, or with
  ``HOSTCALL_NATIVE=0`` a JAX Python callback, ordered by a value threaded
  through the program, ``lax.scan``, ``while_loop`` and ``cond``
  included), and the queue's consumer thread delivers it, as it delivers
  asynchronous taps, in the order the device made them. A barrier waits
  for a program dispatched after them.
* ``QueuedOnSeveral`` (several CPU devices, the native queue loaded): the
  same, and the program also returns the order value its last call
  returned, kept until a barrier (``deferred.keep_queueing``): the CPU
  runtime does not run several devices' programs in the order they were
  dispatched, so a barrier waits for each such program itself. A call
  whose program is a global view of several devices takes ``Marked``
  instead: its queued calls' order value would be replicated, a collective
  ``jax.jit``'s program lacks (threads dispatching such programs at once
  deadlocked at the runtime's rendezvous).
* ``Marked``: the calls' operands become extra outputs, and the program
  queues a marker where it runs (``hostcall._jit.marker``); the queue's
  consumer replays the calls when it reaches the marker, in order with
  other programs' asynchronous taps (``hostcall._runtime.markers``).
* ``AsOutputs`` (elsewhere: an accelerator, a CPU without the native
  extension): the calls' operands become extra outputs, and the
  ``hostcall-deferred`` thread replays the calls once those outputs are
  ready (``hostcall._runtime.outputs_replay``).

Each route owns the ``jax.jit`` function it compiles (its ``program``),
built the first time a call of its ``hostcall.jit`` function takes it. A
program with a host call that no route can take out is compiled by every
route as ``jax.jit`` compiles it, unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from typing import Callable, ClassVar

import jax

from hostcall import _jax_private
from hostcall._jit import deferrable, deferring, marker
from hostcall._jit import plan as replay_plan
from hostcall._runtime import (dispatch_stdout, emission, queue_library,
                               tap_queue)
from hostcall._runtime.markers import markers
from hostcall._runtime.outputs_replay import deferred


@dataclasses.dataclass(frozen=True)
class Process:
  """What this process's devices allow, found once (``process``).

  Attributes:
    queues: its devices are of a platform whose row of
      ``emission.PLATFORMS`` serves the native queue, and the native
      library loads (its FFI handlers registered or, with
      ``HOSTCALL_NATIVE=0``, not: the calls are then JAX Python callbacks
      pushing into the same queue).
    several: it has several local devices.
  """

  queues: bool
  several: bool


_process: Process | None = None
#: ``[the route every call takes]``, None until the first call chooses it
#: (a list that ``hostcall.jit``'s functions hold, to read it in one step).
current: list = [None]
#: Every program's calls become outputs (tests and benchmarks compare the
#: routes so; ``calls_as_outputs``).
_outputs_only = False


def process() -> Process:
  """This process's ``Process``, found the first time it is asked for
  (after JAX's backends are up: a program is being called)."""
  global _process
  if _process is None:
    _process = Process(
        queues=(emission.serves(jax.default_backend(), "enqueue")
                and _has_the_native_queue()),
        several=jax.local_device_count() > 1)
  return _process


def _has_the_native_queue() -> bool:
  """Whether the native queue's library loads; False where the extension
  is missing (the calls then become outputs, which need no native code)."""
  try:
    queue_library.ffi()
  except queue_library.libraries.HostcallNativeError:
    return False
  return True


def choose() -> type[Route]:
  """The route this process's calls take: queued where its devices serve
  the native queue, as outputs elsewhere (or where ``calls_as_outputs``
  says so)."""
  facts = process()
  if _outputs_only or not facts.queues:
    current[0] = AsOutputs
  else:
    current[0] = QueuedOnSeveral if facts.several else Queued
  return current[0]


def chosen() -> type[Route]:
  """The route this process's calls take (``choose``'s, kept)."""
  return current[0] or choose()


def queues() -> bool:
  """Whether this process's calls are queued from the device."""
  return issubclass(chosen(), Queued)


def set_outputs_only(outputs_only: bool) -> bool:
  """Makes every program's calls outputs (True) or lets ``choose`` pick
  the route again (False); returns the previous setting."""
  global _outputs_only
  previous, _outputs_only, current[0] = _outputs_only, bool(outputs_only), None
  return previous


@contextlib.contextmanager
def calls_as_outputs():
  """Within it, every program's calls become outputs (``AsOutputs``)."""
  previous = set_outputs_only(True)
  try:
    yield
  finally:
    set_outputs_only(previous)


def forget_process() -> None:
  """Finds ``Process`` again at the next call (tests that fake a
  platform)."""
  global _process
  _process = current[0] = None


class Route:
  """One way for a ``hostcall.jit`` function's calls to leave their
  program: ``rules`` (what it may take out), ``program`` (the ``jax.jit``
  function it compiles), ``call`` (a call dispatched at the top level).

  Built by the function's state (``hostcall._jit.jitted.Jitted``), which
  it reads: ``fun``, ``plain`` (``jax.jit``'s own), ``key``,
  ``trace_dynamic``, ``deferrable`` and ``route``."""

  rules: ClassVar[deferrable.Rules]

  def __init__(self, jitted, jit_kwargs: dict):
    self._jitted = jitted
    self.program = jax.jit(self._wrapped(self.traced), **jit_kwargs)

  def _wrapped(self, traced: Callable) -> Callable:
    # fun's signature (through __wrapped__): jax.jit finds static and
    # donated arguments by name or position in it, passed either way.
    def body(*args, **kwargs):
      return traced(args, kwargs)
    return functools.update_wrapper(body, self._jitted.fun)

  def traced(self, args: tuple, kwargs: dict):
    """The program's body, traced by ``program``."""
    raise NotImplementedError

  def call(self, args: tuple, kwargs: dict):
    """Dispatches the program, its calls handed to whoever delivers them."""
    raise NotImplementedError

  def clear_cache(self) -> None:
    self.program.clear_cache()


class Queued(Route):
  """One CPU device: each call queued from the device as it runs."""

  rules = deferrable.QUEUED
  keeps_order = False  # the program returns its last call's order value

  def __init__(self, jitted, jit_kwargs: dict):
    super().__init__(jitted, jit_kwargs if not self.keeps_order
                     else _with_extra_output(jit_kwargs))
    self._consumer = tap_queue.consumer
    self._noted_stdout = dispatch_stdout.NOTED

  def traced(self, args, kwargs):
    if _jax_private.is_top_level():
      # Called as it is, not traced: jax_debug_nans' de-optimized rerun of
      # a call whose outputs had a NaN. Its host calls run as it runs, as
      # in jax.jit's rerun.
      outs = self._jitted.fun(*args, **kwargs)
      return (outs, None) if self.keeps_order else outs
    closed, values, out_tree = self._jitted.trace_dynamic(args, kwargs)
    program = self._jitted.deferrable(closed, self.rules)
    last = None
    if program is None:
      outs = jax.extend.core.jaxpr_as_fun(closed)(*values)
    elif self.keeps_order:
      outs, last = deferring.evaluate_threaded(program, values,
                                               keep_order=True)
    else:
      outs = deferring.evaluate_threaded(program, values)
    outs = jax.tree_util.tree_unflatten(out_tree, outs)
    return (outs, last) if self.keeps_order else outs

  def _ready(self) -> bool:
    """Whether the consumer runs (started here), ``sys.stdout`` noted;
    False where the interpreter exits and no thread can start."""
    if not self._consumer.started and not _starts(self._consumer.start):
      return False
    if sys.stdout is not self._noted_stdout[0]:  # (its prints go there)
      dispatch_stdout.changed()
    return True

  def call(self, args, kwargs):
    # (_ready's checks, inlined: this is the fast path's one frame.)
    if not self._consumer.started and not _starts(self._consumer.start):
      return self._jitted.plain(*args, **kwargs)
    if sys.stdout is not self._noted_stdout[0]:
      dispatch_stdout.changed()
    # (Forwarding no keywords is the cheaper call.)
    program = self.program
    outs = program(*args, **kwargs) if kwargs else program(*args)
    # The barrier then waits for this program to have run: marked once it
    # is dispatched (a barrier another thread runs meanwhile, which takes
    # the mark, settles programs dispatched before it only).
    deferred.queued_since_barrier = True
    return outs


class QueuedOnSeveral(Queued):
  """Several CPU devices: queued, the barrier waiting for each program's
  last call; a global view's calls ``Marked``."""

  keeps_order = True

  def __init__(self, jitted, jit_kwargs: dict):
    super().__init__(jitted, jit_kwargs)
    # Shardings given: a program over several devices, maybe.
    self._sharded = (jit_kwargs.get("in_shardings") is not None
                     or jit_kwargs.get("out_shardings") is not None)
    self._global_view = jitted.route(Marked)

  def call(self, args, kwargs):
    if not self._ready():
      return self._jitted.plain(*args, **kwargs)
    if self._sharded or _spans_devices(args, kwargs):
      return self._global_view.call(args, kwargs)
    outs, last = self.program(*args, **kwargs)
    if last is not None:
      deferred.keep_queueing(last)
    return outs


@jax.tree_util.register_pytree_node_class
class _DeferredOutputs:
  """The packed deferred values of one call, with their plan as the
  pytree's static part (so that each cached executable keeps its own)."""

  def __init__(self, packs, plan):
    self.packs, self.plan = list(packs), plan

  def tree_flatten(self):
    return self.packs, self.plan

  @classmethod
  def tree_unflatten(cls, plan, packs):
    return cls(packs, plan)


class AsOutputs(Route):
  """The calls' operands made outputs, replayed by the deferred thread."""

  rules = deferrable.AS_OUTPUTS
  marks = False  # the program queues a marker (``Marked``)

  def __init__(self, jitted, jit_kwargs: dict):
    super().__init__(jitted, _with_extra_output(jit_kwargs))

  def traced(self, args, kwargs):
    if _jax_private.is_top_level():  # (see Queued.traced)
      return self._jitted.fun(*args, **kwargs), _DeferredOutputs([], None)
    closed, values, out_tree = self._jitted.trace_dynamic(args, kwargs)
    program = self._jitted.deferrable(closed, self.rules)
    if program is None:
      outs = jax.extend.core.jaxpr_as_fun(closed)(*values)
      return (jax.tree_util.tree_unflatten(out_tree, outs),
              _DeferredOutputs([], None))
    outs, extra, nodes = deferring.evaluate(program, values)
    packs, plan = replay_plan.pack(extra, nodes)
    if self.marks:
      marker.bind(self._jitted.key)
    return (jax.tree_util.tree_unflatten(out_tree, outs),
            _DeferredOutputs(packs, plan))

  def call(self, args, kwargs):
    if not deferred.started and not deferred.start():
      # The interpreter exits: no thread can start to replay the calls.
      return self._jitted.plain(*args, **kwargs)
    dispatch_stdout.noted()
    outs, extra = self.program(*args, **kwargs)
    if extra.plan is not None:
      deferred.submit(extra.plan, extra.packs)
    return outs


class Marked(AsOutputs):
  """A global view's calls made outputs, replayed by the queue's consumer
  where the program's marker sits in the queue. Its caller
  (``QueuedOnSeveral``) has started the consumer and noted ``sys.stdout``;
  the deferred thread plays no part."""

  marks = True

  def call(self, args, kwargs):
    key = self._jitted.key
    markers.begin(key)
    extra = None
    try:
      outs, extra = self.program(*args, **kwargs)
    finally:
      if extra is not None and extra.plan is not None:
        markers.hand_in(key, extra.plan, extra.packs)
        # A barrier waits for the program to have run (its marker queued).
        deferred.keep_queueing(extra.packs[0])
      else:  # it raised, or makes no host call (and queues no marker)
        markers.abandon(key)
    return outs


def _with_extra_output(jit_kwargs: dict) -> dict:
  """``jit_kwargs`` for a program that also returns a value of its own
  (the deferred outputs, an order value), whose sharding XLA chooses."""
  if "out_shardings" not in jit_kwargs:
    return jit_kwargs
  return dict(jit_kwargs, out_shardings=(jit_kwargs["out_shardings"], None))


def _spans_devices(args, kwargs) -> bool:
  """Whether an argument lies on several devices (the program is then a
  global view of them)."""
  for leaf in jax.tree_util.tree_leaves((args, kwargs)):
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None and len(sharding.device_set) > 1:
      return True
  return False


def _starts(start) -> bool:
  """Whether ``start()`` (of a delivery thread) succeeds; False where the
  interpreter exits and no thread can start (Python 3.12 on)."""
  try:
    start()
  except RuntimeError:
    return False
  return True

"""The runtime: waiting for effects and their tokens, telling JAX's and
the runtime's frames from the user's, and calling a debug callback as
JAX's eager implementation does."""

from __future__ import annotations

import contextlib
import inspect
import threading
import weakref

import jax
import numpy as np
from jax._src import callback as _callback
from jax._src import config as _config
from jax._src import core as _core
from jax._src import debugging as _debugging
from jax._src import dispatch as _dispatch
from jax._src import mesh as _mesh
from jax._src import sharding_impls as _sharding_impls
from jax._src import xla_bridge as _xla_bridge
from jax._src.lib import guard_lib as _guard_lib
from jax._src.lib import xla_client as _xla_client
from jax._src import source_info_util as _source_info_util
from jax._src import traceback_util as _traceback_util
from jax._src.interpreters import mlir as _private_mlir
from jax._src.lax.control_flow import loops as _loops


def user_frame_of(eqn) -> str | None:
  """``file:line`` of the user's code that staged ``eqn``, where known."""
  package = __file__.rsplit("/", 2)[0]  # hostcall's own files
  for frame in _source_info_util.user_frames(eqn.source_info.traceback):
    if not frame.file_name.startswith(package):
      return f"{frame.file_name}:{frame.start_line}"
  return None


def hide_frames_of(directory: str) -> None:
  """Leaves the frames of files under ``directory`` out of the tracebacks
  JAX filters (``JAX_TRACEBACK_FILTERING``), as JAX leaves out its own: an
  error raised while tracing a user's function points at that function."""
  _traceback_util.register_exclusion(directory)


# The modules whose frames call a host callback from the runtime (JAX's
# wrappers between the runtime and the Python function).
_CALLBACK_FILES = frozenset({_callback.__file__, _private_mlir.__file__})


def is_callback_frame(frame) -> bool:
  """Whether ``frame`` is JAX's, calling a host callback for the runtime:
  the frames below such a frame (if any) are those of the thread that waits
  for the computation."""
  return frame.f_code.co_filename in _CALLBACK_FILES


_JAX_DIR = jax.__file__.rsplit("__init__.py", 1)[0]


def is_jax_frame(frame) -> bool:
  """Whether ``frame`` runs JAX's code (its dispatch, say)."""
  return frame.f_code.co_filename.startswith(_JAX_DIR)


def wait_for_effects() -> None:
  """``jax.effects_barrier()``, except that a computation that failed ends
  its wait like any other. JAX's stops at the first failed computation's
  token and keeps it, so that every later effects barrier raises that old
  error again (seen on several devices), and waits for no other token."""
  tokens = _dispatch.runtime_tokens
  for token in [*tokens.current_tokens.values(),
                *tokens.output_runtime_tokens.values()]:
    try:
      token.block_until_ready()
    except jax.errors.JaxRuntimeError:
      pass  # its error reached whoever waits for its results
  tokens.clear()


def start_ordered_effects_afresh_after_a_failure() -> None:
  """Keeps one failed computation from failing every later one (JAX #37587).

  JAX threads a runtime token through every computation with ordered
  effects; a computation that failed leaves an errored token, which the
  next one takes as input and fails with, without running, and so on, and
  ``jax.effects_barrier()`` (and JAX's exit hook) raise it again every
  time. Here a token known to have failed (ready, with an error: whoever
  waited for the failed computation was told) is not handed on: the next
  computation starts a fresh sequence; and waiting for the tokens forgets
  them even when one failed, so a failure is raised once.
  """
  token_set = type(_dispatch.runtime_tokens)
  if getattr(token_set.get_token_input, "_hostcall_afresh", False):
    return
  get_token_input = token_set.get_token_input
  block_until_ready = token_set.block_until_ready

  def get_token_input_afresh(self, eff, devices):
    token = self.current_tokens.get(eff)
    if token is not None and _has_failed(token):
      del self.current_tokens[eff]
    return get_token_input(self, eff, devices)

  def block_until_ready_once(self):
    try:
      block_until_ready(self)
    finally:
      self.clear()
    _run_effects_barrier_hooks()

  get_token_input_afresh._hostcall_afresh = True
  token_set.get_token_input = get_token_input_afresh
  token_set.block_until_ready = block_until_ready_once


_effects_barrier_hooks: list = []
_in_effects_barrier_hooks = threading.local()


def on_effects_barrier(hook) -> None:
  """Runs ``hook()`` after every wait for JAX's runtime tokens that
  ``jax.effects_barrier()`` makes (and JAX's exit hook, and
  ``jax.clear_backends``), once JAX's own wait has ended: where the host
  calls that hostcall took out of JAX's effects (queued or deferred by
  ``hostcall.jit``, asynchronous taps) are waited for too. Not again from
  inside a hook."""
  if hook not in _effects_barrier_hooks:
    _effects_barrier_hooks.append(hook)


def _run_effects_barrier_hooks() -> None:
  if getattr(_in_effects_barrier_hooks, "running", False):
    return
  _in_effects_barrier_hooks.running = True
  try:
    for hook in _effects_barrier_hooks:
      hook()
  finally:
    _in_effects_barrier_hooks.running = False


def _has_failed(token) -> bool:
  """Whether a runtime token is ready and holds an error (never waits)."""
  buffer = getattr(token, "_buf", token)
  is_ready = getattr(buffer, "is_ready", None)
  if is_ready is None or not is_ready():
    return False
  try:
    buffer.block_until_ready()
  except jax.errors.JaxRuntimeError:
    return True
  return False


# Frames of JAX's loops, while they trace a body: lax.scan and the
# functions its body is traced in (lax.map and a fori_loop of static bounds
# go through them), lax.while_loop (a fori_loop of traced bounds too).
_SCAN_CODES = frozenset(
    inspect.unwrap(getattr(_loops, name)).__code__
    for name in ("scan", "scan_nocarry") if hasattr(_loops, name))
_WHILE_CODES = frozenset({inspect.unwrap(_loops.while_loop).__code__})


def loop_of_frame(frame) -> tuple[str, int | None] | None:
  """``("scan", length)`` where ``frame`` is ``lax.scan`` (its number of
  steps, where known), ``("while", None)`` where it is
  ``lax.while_loop``, None for any other frame. Walking up from a loop
  body being traced, the first one found is the loop that runs it."""
  if frame.f_code in _SCAN_CODES:
    length = frame.f_locals.get("length")
    return "scan", (length if isinstance(length, int) else None)
  if frame.f_code in _WHILE_CODES:
    return "while", None
  return None


# The frame of JAX's lowering of a while loop (lax.scan, fori_loop and
# while_loop are lowered as one), its body and condition lowered below it.
_WHILE_LOWERING_CODE = _loops._while_lowering.__code__


def is_loop_lowering_frame(frame) -> bool:
  """Whether ``frame`` lowers a loop: what is lowered while it is on the
  stack runs once per step of that loop, not once per run of its
  program."""
  return frame.f_code is _WHILE_LOWERING_CODE


def debug_callback_on_cpu(callback, avals):
  """What ``jax.debug.callback``'s eager implementation does with
  ``callback`` (a ``debug_callback`` equation's flat callback), as a
  function of NumPy values of ``avals``, or None where it would not be the
  same (a value of an extended dtype or ``float0``; no CPU device).

  The same: each value a committed ``jax.Array`` on the first CPU device,
  the callback called with that device as the default and, where this JAX
  release sets them (0.8.1 on), no concrete or abstract mesh, and its
  failure logged on JAX's logger in JAX's words, then raised; what the
  callback left in force put back as JAX's ``with`` puts it back. Quicker:
  each value placed by ``batched_device_put`` with the abstract value known
  beforehand (``device_put`` of a tuple costs ten times more; a value of
  another type, shape or dtype than ``avals`` says is placed by
  ``device_put`` itself), and JAX's settings swapped in and put back
  directly (``_eager_settings``), where its context managers would cost
  several times more. ``placement_of`` gives its placement and its call
  apart."""
  if any(not isinstance(a, _core.ShapedArray)
         or jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended)
         or a.dtype == jax.dtypes.float0 for a in avals):
    return None
  try:
    cpu, *_ = _xla_bridge.local_devices(backend="cpu")
  except RuntimeError:
    return None  # (JAX's implementation raises it, in its words)
  put = _placer(cpu)
  placed = [put(a) for a in avals]
  enter, leave = _eager_settings(cpu)
  log = _debugging.logger.exception

  users = _positional_function(callback, len(placed))

  def run(*arrays):
    before = enter()
    try:
      users(*arrays)
    except BaseException:
      log("jax.debug.callback failed")
      raise
    finally:
      leave(before)
    return ()

  if len(placed) == 1:  # (the common call: no list a call)
    (one,) = placed
    call = lambda value: run(one(value))  # noqa: E731
    _PLACEMENTS[call] = (lambda value: (one(value),)), run
    return call

  def places(*values):
    return [put_one(v) for put_one, v in zip(placed, values)]
  call = lambda *values: run(*places(*values))  # noqa: E731
  _PLACEMENTS[call] = places, run
  return call


#: Of each function ``debug_callback_on_cpu`` made: ``(places, call)``,
#: where ``call(*places(*values))`` is the function's ``(*values)``.
_PLACEMENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def placement_of(function):
  """``(places, call)`` of a function ``debug_callback_on_cpu`` made: its
  values' placement apart from the call with them (``call(*places(*values))``
  is ``function(*values)``); None for any other."""
  try:
    return _PLACEMENTS.get(function)
  except TypeError:  # (not weakly referable, so not one of them)
    return None


def _flat_callback_codes(code) -> frozenset:
  """The codes named ``_flat_callback`` defined in ``code``, at any depth."""
  found = set()
  for const in code.co_consts:
    if inspect.iscode(const):
      if const.co_name == "_flat_callback":
        found.add(const)
      found |= _flat_callback_codes(const)
  return frozenset(found)


# The code of the function ``jax.debug.callback`` stages (defined inside
# it): the user's function, its arguments put back together from the flat
# values.
_FLAT_CALLBACK_CODES = _flat_callback_codes(
    inspect.unwrap(_debugging.debug_callback).__code__)


def _positional_function(callback, n: int):
  """What calling ``callback`` (a ``debug_callback`` equation's) with ``n``
  values does, called the same way: the user's function itself where
  ``callback`` is JAX's flat callback for a ``jax.debug.callback(f, *xs)``
  of ``n`` array arguments (no static ones, no keywords: ``f`` gets the
  values as they come), saving the tree put back together a call; else
  ``callback``."""
  code = getattr(callback, "__code__", None)
  if code not in _FLAT_CALLBACK_CODES:
    return callback
  held = dict(zip(code.co_freevars,
                  (cell.cell_contents for cell in callback.__closure__)))
  positional = jax.tree_util.tree_structure(((0,) * n, {}))
  if held["static_args"] or held["in_tree"] != positional:
    return callback
  return held["callback"]


def _placer(cpu):
  """``put(aval)``: what places a NumPy value of ``aval`` as JAX's
  ``device_put(value, cpu)`` places it (a committed single-device array).
  A NumPy array or scalar of the abstract value's shape and dtype goes
  straight to the runtime's ``batched_device_put`` (what ``device_put``
  calls for it, without its dispatch: a tenth of the cost); anything else
  to ``device_put`` itself."""
  sharding = jax.sharding.SingleDeviceSharding(cpu)
  devices = [cpu]
  batched_device_put = _xla_client.batched_device_put
  device_put = jax.device_put
  guard_state = _guard_lib.thread_local_state

  def put(aval):
    shape, dtype = aval.shape, np.dtype(aval.dtype)
    aval = _core.ShapedArray(shape, dtype)
    plain = (np.ndarray, dtype.type)

    def put_one(value):
      if (type(value) in plain and value.shape == shape
          and (value.dtype is dtype or value.dtype == dtype)):
        # (x64 allowed: the value has the program's dtype already, where
        # this thread's default would narrow a float64 traced under
        # enable_x64.) An explicit transfer, as ``device_put`` marks it: a
        # transfer guard that disallows implicit ones lets it through.
        guard = guard_state()
        explicit = guard.explicit_device_put
        guard.explicit_device_put = True
        try:
          return batched_device_put(aval, sharding, [value], devices, True,
                                    enable_x64=True)
        finally:
          guard.explicit_device_put = explicit
      return device_put(value, cpu)
    return put_one
  return put


def _eager_settings(cpu):
  """``(enter, leave)``: JAX's thread-local settings that its eager
  implementation's ``with`` puts in force around the callback (the default
  device; from 0.8.1 on, empty concrete and abstract meshes), swapped in
  by ``enter()``, which returns what was in force, and put back by
  ``leave(that)``: the ``swap_local`` and ``set_local`` its context
  managers make, without them. Where JAX's default device setting has a
  thread-local hook (none in the releases hostcall supports), its own
  context manager runs instead."""
  default = _config.default_device
  if default._update_thread_local_hook is not None:
    return _eager_settings_by_contexts(cpu)
  if jax.__version_info__[:3] < (0, 8, 1):
    return (lambda: default.swap_local(cpu)), default.set_local
  # (Where JAX's own context managers read them: jax._src.config up to
  # 0.10, jax._src.mesh from 0.11 on.)
  home = _mesh if hasattr(_mesh, "device_context") else _config
  concrete, abstract = home.device_context, home.abstract_mesh_context_manager
  no_concrete, no_abstract = _mesh.empty_concrete_mesh, _mesh.empty_abstract_mesh

  def enter():
    return (default.swap_local(cpu), concrete.swap_local(no_concrete),
            abstract.swap_local(no_abstract))

  def leave(before):
    was_default, was_concrete, was_abstract = before
    abstract.set_local(was_abstract)
    concrete.set_local(was_concrete)
    default.set_local(was_default)
  return enter, leave


def _eager_settings_by_contexts(cpu):
  """``_eager_settings`` through JAX's own context managers."""
  def contexts():
    if jax.__version_info__[:3] < (0, 8, 1):
      return (_config.default_device(cpu),)
    return (_config.default_device(cpu),
            _sharding_impls._internal_use_concrete_mesh(
                _mesh.empty_concrete_mesh),
            _mesh.use_abstract_mesh(_mesh.empty_abstract_mesh))

  def enter():
    stack = contextlib.ExitStack()
    for context in contexts():
      stack.enter_context(context)
    return stack
  return enter, lambda stack: stack.close()

"""The runtime: waiting for effects and their tokens, telling JAX's and
the runtime's frames from the user's, and calling a debug callback as
JAX's eager implementation does."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading

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

  (Over 80 lines: one reading of JAX's eager implementation, step by step,
  each step beside the private names it needs; split, the steps would
  hand those names around.)

  The same: each value a committed ``jax.Array`` on the first CPU device,
  the callback called with that device as the default and, where this JAX
  release sets them (0.8.1 on), no concrete or abstract mesh, and its
  failure logged on JAX's logger in JAX's words, then raised. Quicker:
  each value placed by ``batched_device_put`` with the abstract value
  known beforehand (``device_put`` of a tuple costs about 40 us a call on
  a CPU, ten times more; the runtime's own ``batched_device_put``, 3 us);
  a value of another shape or dtype than ``avals`` says is placed by
  ``device_put`` itself. ``call.scope()`` enters JAX's contexts once for a
  run of calls (a context manager)."""
  if any(not isinstance(a, _core.ShapedArray)
         or jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended)
         or a.dtype == jax.dtypes.float0 for a in avals):
    return None
  try:
    cpu, *_ = _xla_bridge.local_devices(backend="cpu")
  except RuntimeError:
    return None  # (JAX's implementation raises it, in its words)
  sharding = jax.sharding.SingleDeviceSharding(cpu)
  placed = [(_core.ShapedArray(a.shape, a.dtype), a.shape, np.dtype(a.dtype))
            for a in avals]
  # (JAX's implementation empties both meshes from 0.8.1 on.)
  uses_empty_meshes = jax.__version_info__[:3] >= (0, 8, 1)

  def put(value, aval, shape, dtype):
    if isinstance(value, np.generic):
      value = np.asarray(value)
    if (type(value) is np.ndarray and value.shape == shape
        and value.dtype == dtype):
      # (What pxla.batched_device_put calls for a NumPy value, without
      # its checks for jax.Arrays: a fifth of the cost.)
      # (x64 allowed: the value has the program's dtype already, where
      # this thread's default would narrow a float64 traced under
      # enable_x64.)
      return _xla_client.batched_device_put(aval, sharding, [value], [cpu],
                                            True, enable_x64=True)
    return jax.device_put(value, cpu)

  def run(arrays):
    try:
      callback(*arrays)
    except BaseException:
      _debugging.logger.exception("jax.debug.callback failed")
      raise

  # ``contexts()`` for a run's scope; ``in_contexts`` spells the same out
  # for a call of its own, since an ExitStack there would cost about a
  # microsecond a call.
  if uses_empty_meshes:
    concrete, abstract = _mesh.empty_concrete_mesh, _mesh.empty_abstract_mesh

    def contexts():
      return (_config.default_device(cpu),
              _sharding_impls._internal_use_concrete_mesh(concrete),
              _mesh.use_abstract_mesh(abstract))

    def in_force():
      return (_config.default_device.value, _mesh.get_abstract_mesh(),
              _mesh.get_concrete_mesh())

    def in_contexts(arrays):
      with (_config.default_device(cpu),
            _sharding_impls._internal_use_concrete_mesh(concrete),
            _mesh.use_abstract_mesh(abstract)):
        run(arrays)
  else:
    def contexts():
      return (_config.default_device(cpu),)

    def in_force():
      return (_config.default_device.value,)

    def in_contexts(arrays):
      with _config.default_device(cpu):
        run(arrays)

  def call(*values):
    arrays = [put(v, *p) for v, p in zip(values, placed)]
    scope = _scopes.current
    if scope is None:
      in_contexts(arrays)
      return ()
    # In a run's scope: JAX's contexts are in force. None while the
    # callback runs, so that a call it makes enters its own.
    _scopes.current = None
    try:
      run(arrays)
    finally:
      _scopes.current = scope
      scope.restore()
    return ()

  # Entering JAX's contexts costs more than placing a scalar: a run of
  # calls delivered one after another (``calls.run_each``) enters them once.
  call.scope = functools.partial(_Scope, contexts, in_force)
  return call


class _Scopes(threading.local):
  current = None  # the run's _Scope, where no callback of it runs


_scopes = _Scopes()


class _Scope:
  """JAX's contexts of ``debug_callback_on_cpu``'s calls (``contexts()``)
  entered once for a run of them, each of which then runs in them as in
  its own: where a callback changed what is in force (``in_force()``: a
  ``jax.set_mesh``, a context it entered and left open), they are entered
  again before the next, as a call of its own would."""

  def __init__(self, contexts, in_force):
    self._contexts, self._in_force = contexts, in_force
    self._stack = self._expected = self._outer = None

  def _enter(self) -> None:
    self._stack = contextlib.ExitStack()
    for context in self._contexts():
      self._stack.enter_context(context)
    self._expected = self._in_force()

  def restore(self) -> None:
    """Enters the contexts again where a callback changed them."""
    for now, then in zip(self._in_force(), self._expected):
      if now is not then:
        self._stack.close()
        self._enter()
        return

  def __enter__(self):
    self._enter()
    self._outer, _scopes.current = _scopes.current, self
    return self

  def __exit__(self, *exc_info):
    _scopes.current = self._outer
    self._stack.close()
    return False

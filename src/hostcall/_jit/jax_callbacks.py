"""JAX's own callbacks made hostcall's, so that ``hostcall.jit`` defers them.

``jax.debug.print``, ``jax.debug.callback`` and a result-less
``jax.experimental.io_callback`` in a program compiled by ``hostcall.jit``
carry JAX's effects, which keep the whole program off JAX's fast dispatch
path. ``as_hostcalls`` rewrites each (wherever it sits: nested ``jit``s,
loop bodies, branches; see ``hostcall._core.rewriting``) into a hostcall
debug or io call of the same primitive's own eager implementation: on the
host, JAX formats, places the values on the CPU and calls the callback
exactly as it does outside ``jit``, with the same ordering (an ordered one
stays ordered) and JAX's failure log. A print whose format reads NumPy
values as it reads JAX's arrays is written without that placement
(``_Printed``); a debug callback's values are placed as JAX places them,
by a quicker path (``_jax_private.debug_callback_on_cpu``). ``first_kept`` names a call that
stays, for the one warning ``hostcall.jit`` gives.
"""

from __future__ import annotations

import functools
import string

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

from hostcall import _jax_private
from hostcall._core import rewriting
from hostcall._core.primitive import hostcall_p
from hostcall._flavours import _stage, debug
from hostcall._flavours.debug import stage_debug

_DEBUG = ("debug_callback", "debug_print")


def _ordered(eqn) -> bool:
  if "ordered" in eqn.params:
    return bool(eqn.params["ordered"])
  return any(_jax_private.is_ordered_effect(e) for e in eqn.effects)


def _unread_io_callbacks(jaxpr, found: set) -> set:
  """The ids of the io callback equations of ``jaxpr`` (and the jaxprs in
  it) whose results nothing reads."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  read = {v for eqn in jaxpr.eqns for v in eqn.invars
          if not isinstance(v, jax.extend.core.Literal)}
  read.update(v for v in jaxpr.outvars
              if not isinstance(v, jax.extend.core.Literal))
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "io_callback" and not any(
        v in read and not _jax_private.is_dropped(v) for v in eqn.outvars):
      found.add(id(eqn))
    for sub in rewriting.inner_jaxprs(eqn) or []:
      _unread_io_callbacks(sub, found)
  return found


def picker(closed):
  """Which equations of ``closed`` ``as_hostcalls`` rewrites: a debug
  callback or print (not partitioned), or an io callback whose results
  nothing reads."""
  unread = _unread_io_callbacks(closed, set())

  def is_jax_callback(eqn) -> bool:
    name = eqn.primitive.name
    if name in _DEBUG:
      return not eqn.params.get("partitioned", False)
    if name == "io_callback":
      return (_jax_private.io_callback_impl is not None
              and eqn.params.get("sharding") is None and id(eqn) in unread)
    return False
  return is_jax_callback


def _users_function(callback):
  """The user's function behind a JAX callback equation's ``callback``
  parameter, to name it by: ``jax.debug.callback``'s ``_flat_callback``
  closes over it (as ``callback``), ``io_callback``'s ``_FlatCallback``
  holds it (``callback_func``), a ``functools.partial`` wraps it (the
  user's too: its function is named). Where none of these holds, what
  was unwrapped so far."""
  seen = set()
  while id(callback) not in seen:
    seen.add(id(callback))
    if isinstance(callback, functools.partial):
      callback = callback.func
      continue
    held = getattr(callback, "callback_func", None)
    if callable(held):
      callback = held
      continue
    code = getattr(callback, "__code__", None)
    cells = getattr(callback, "__closure__", None) or ()
    # Only JAX's own wrappers are looked into: a user's closure over a
    # ``callback`` is the user's function itself.
    if (code is not None and "callback" in code.co_freevars
        and str(getattr(callback, "__module__", "")).startswith("jax")):
      try:
        inner = cells[code.co_freevars.index("callback")].cell_contents
      except (IndexError, ValueError):  # an empty cell
        break
      if callable(inner):
        callback = inner
        continue
    break
  return callback


def _name_of(eqn) -> str:
  """The name of the user's function a JAX callback equation calls, or
  the primitive's name (a print's)."""
  callback = eqn.params.get("callback")
  name = getattr(_users_function(callback), "__name__", None)
  return name if isinstance(name, str) else eqn.primitive.name


def _physical_avals(eqn) -> list:
  """The abstract values of ``eqn``'s operands as its host function gets
  them: a PRNG key as its key data (as in a program ``jax.jit`` compiles,
  and as ``deferring`` takes it out)."""
  avals = []
  for v in eqn.invars:
    aval = v.aval
    if jax.dtypes.issubdtype(getattr(aval, "dtype", None),
                             jax.dtypes.prng_key):
      data = jax.eval_shape(jax.random.key_data,
                            jax.ShapeDtypeStruct(aval.shape, aval.dtype))
      aval = _jax_private.ShapedArray(data.shape, data.dtype)
    avals.append(aval)
  return avals


class _Eager:
  """The host function of a rewritten call: the primitive's own eager
  implementation, called with its parameters (its results dropped); named
  after the user's function (``_name_of``), as hostcall's own calls are."""

  def __init__(self, eqn):
    self.primitive, self.params = eqn.primitive, dict(eqn.params)
    self.__name__ = _name_of(eqn)
    # jax.debug.callback's implementation, its placement of the values a
    # tenth of the cost (tens of microseconds a call under JAX's own).
    self._on_cpu = (_jax_private.debug_callback_on_cpu(
        self.params["callback"], _physical_avals(eqn))
        if eqn.primitive.name == "debug_callback" else None)

  def __call__(self, *args):
    if self._on_cpu is not None:
      self._on_cpu(*args)
      return
    if self.primitive.name != "io_callback":
      self.primitive.impl(*args, **self.params)
      return
    outs = _jax_private.io_callback_impl(*args, **self.params)
    _check_as_jax_does(outs, self.params["result_avals"])


def _host_function(eqn):
  """``_Eager(eqn)``, or for a debug callback its placement and call
  themselves (``debug_callback_on_cpu``'s, named as ``_Eager`` is): the
  host calls it with no frame between; for a print, ``_printed_as_jax``."""
  eager = _Eager(eqn)
  call = (_printed_as_jax(eqn) if eqn.primitive.name == "debug_print"
          else eager._on_cpu)
  if call is None:
    return eager
  call.__name__ = call.__qualname__ = eager.__name__
  call.__module__ = __name__
  return call


#: The parameters of a ``debug_print`` equation that hostcall's printing
#: reads (a release without one of them takes JAX's own path).
_PRINT_PARAMS = frozenset({"fmt", "in_tree", "static_args",
                           "np_printoptions"})


def _printed_as_jax(eqn):
  """The host function of a ``jax.debug.print`` whose format reads JAX's
  arrays themselves (``{!r}``): each value placed as
  JAX's implementation places it (``debug_callback_on_cpu``), the text
  formatted as it formats it (``debug.Printer``, given JAX's arrays) and
  written where the program's dispatch noted ``sys.stdout``. JAX's writes
  to ``sys.stdout`` as the call runs, which under ``hostcall.jit`` is after
  the dispatch returned, a ``redirect_stdout`` around it ended. None where
  JAX's own path runs: a print JAX logs, values of an extended dtype."""
  params = eqn.params
  if params.get("logging_record") or not _PRINT_PARAMS <= set(params):
    return None
  printer = debug.Printer(params["fmt"],
                          tuple(dict(params["np_printoptions"]).items()),
                          bool(params.get("has_placeholders", True)))
  return _jax_private.debug_callback_on_cpu(
      _jax_private.flat_debug_callback(params, printer),
      _physical_avals(eqn))


#: Attributes a format field may read that NumPy's arrays answer as JAX's
#: do (``{x.shape}``); any other (``{x.sharding}``) takes JAX's own path.
_SAME_ATTRIBUTES = frozenset({"dtype", "shape", "ndim", "size", "real",
                              "imag", "T"})


def _formats_as_jax(fmt: str) -> bool:
  """Whether ``fmt`` writes the same text for NumPy values as for the
  ``jax.Array``s JAX's eager print hands it: ``str`` and format specs read
  the same values (JAX's ``__str__`` and ``__format__`` are NumPy's). A
  ``!r`` (JAX's ``Array(...)``, which the printer only imitates) and any
  other attribute take JAX's own path."""
  try:
    fields = list(string.Formatter().parse(fmt))
  except ValueError:
    return False  # JAX's path raises it, in its words
  for _, name, spec, conversion in fields:
    if name is None:
      continue
    if conversion not in (None, "s") or "{" in (spec or ""):
      return False
    attributes = name.replace("]", "").split(".")[1:]
    if any(part.split("[")[0] not in _SAME_ATTRIBUTES for part in attributes):
      return False
  return True


class _Printed:
  """The host function of a rewritten ``jax.debug.print`` whose format
  reads NumPy values as it reads JAX's: written without placing the
  values on a device first (tens of microseconds a call), by
  ``hostcall.debug_print``'s printer (JAX's text: the drop-in's tests)
  with the trace's print options, or, for a print JAX logs instead
  (``logging_record``), by JAX's own formatting. Where the formatting
  fails, JAX's own path runs, to fail in its words."""

  def __init__(self, eqn):
    params = eqn.params
    if params.get("logging_record"):
      self.write = _jax_private.debug_print_writer(params)
    else:
      printer = debug.Printer(params["fmt"],
                              tuple(dict(params["np_printoptions"]).items()),
                              bool(params.get("has_placeholders", True)))
      self.write = _jax_private.flat_debug_callback(params, printer)
      # A run of calls written at once (``lines_of``) where the values are
      # the format's positional arguments, in order.
      positional = jax.tree_util.tree_structure(
          (tuple(range(len(eqn.invars))), {}))
      if params["in_tree"] == positional and not params["static_args"]:
        self._lines = printer
        self.write_delivered = printer.write_delivered
    self.eager = _Eager(eqn)
    self.__name__ = "debug_print"

  _lines: debug.Printer | None = None

  def lines_of(self, columns) -> str | None:
    """The text of a run of calls at once, or None (``Printer``'s)."""
    return None if self._lines is None else self._lines.lines_of(columns)

  def write_lines(self, text: str) -> None:
    self._lines.write_lines(text)

  def __call__(self, *args):
    try:
      self.write(*args)
    except Exception:  # noqa: BLE001 - JAX's path reports it as JAX does
      self.eager(*args)


def _printed_with_numpy(eqn) -> bool:
  params = eqn.params
  return (eqn.primitive.name == "debug_print" and _PRINT_PARAMS <= set(params)
          and _formats_as_jax(params["fmt"])
          and not any(jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended)
                      for a in _physical_avals(eqn)))


def _check_as_jax_does(outs, avals) -> None:
  """An io callback's results checked against its declaration, in JAX's
  words (its compiled callback's checks; none outside ``jit``)."""
  if len(outs) != len(avals):
    raise RuntimeError(
        "Mismatched number of outputs from callback. "
        f"Expected: {len(avals)}, Actual: {len(outs)}")
  for i, (out, aval) in enumerate(zip(outs, avals)):
    out = np.asarray(out)
    if out.shape != aval.shape:
      raise RuntimeError(
          f"Incorrect output shape for return value #{i}: "
          f"Expected: {aval.shape}, Actual: {out.shape}")
    if jax.dtypes.canonicalize_dtype(out.dtype) != aval.dtype:
      raise RuntimeError(
          f"Incorrect output dtype for return value #{i}: "
          f"Expected: {aval.dtype}, Actual: {out.dtype}")


def _rewrite(is_jax_callback, eqn, invals):
  if not is_jax_callback(eqn):
    return None
  ordered = _ordered(eqn)
  eager = _Printed(eqn) if _printed_with_numpy(eqn) else _host_function(eqn)
  if eqn.primitive.name in _DEBUG:
    stage_debug(eqn.primitive.name, eager, tuple(invals), {},
                "debug_ordered" if ordered else "unordered", False)
    return []
  _stage.stage("io_callback", eager, None, tuple(invals), {},
               ordering="io_ordered" if ordered else "io", sharding=None,
               partitioned=False, vmap_method="sequential", vmap_error=None,
               jvp_error=None)
  return [jnp.zeros(v.aval.shape, v.aval.dtype) for v in eqn.outvars]


def as_hostcalls(closed):
  """``closed`` with each of JAX's callbacks that ``picker`` picks made a
  hostcall call; ``closed`` itself where it holds none (or one past an
  effect the rewrite cannot reach)."""
  is_jax_callback = picker(closed)
  # hostcall's own calls beside JAX's are bound again as they are.
  if not rewriting.plan(closed, is_jax_callback,
                        passable=lambda eqn: eqn.primitive is hostcall_p):
    return closed
  specs = [jax.ShapeDtypeStruct(a.shape, a.dtype,
                                weak_type=getattr(a, "weak_type", False))
           for a in closed.in_avals]
  rewrite = functools.partial(_rewrite, is_jax_callback)
  return jax.make_jaxpr(rewriting.as_function(closed, rewrite))(*specs)


def first_kept(jaxpr, kept, why=None) -> str | None:
  """A description of the first equation of ``jaxpr`` (searched through
  nested jaxprs) for which ``kept(eqn)``, or None: what it is, the user's
  file and line that staged it, and (``why(eqn)``) why it is kept."""
  for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
    if kept(eqn):
      return _describe(eqn) + (f": {why(eqn)}" if why is not None else "")
    for sub in rewriting.inner_jaxprs(eqn) or []:
      found = first_kept(sub, kept, why)
      if found is not None:
        return found
  return None


def _describe(eqn) -> str:
  target = eqn.params.get("target")
  what = repr(target) if target is not None else eqn.primitive.name
  where = _jax_private.user_frame_of(eqn)
  return f"{what}{f' at {where}' if where else ''}"


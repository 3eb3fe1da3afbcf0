"""``hostcall.debug_callback`` and ``hostcall.debug_print``: JAX's, on hostcall."""

from __future__ import annotations

import dataclasses
import functools
import string
import threading
from typing import Any, Callable

import jax
import numpy as np

from hostcall._core.targets import KeyedFields, is_positional, key_of
from hostcall._core.checks import check_arguments, check_callable, is_array_like
from hostcall._flavours import _stage
from hostcall._runtime import dispatch_stdout, texts

_print_lock = threading.Lock()


def _static_key(static: dict) -> tuple:
  return tuple(sorted((i, repr(v)) for i, v in static.items()))


@dataclasses.dataclass(frozen=True)
class _WithStatic(KeyedFields):
  """Calls ``fn(*args, **kwargs)`` from the dynamic leaves, static ones kept.

  Compared by ``fn`` and the static leaves' reprs, so that equal call sites
  share one compilation.
  """

  fn: Callable = dataclasses.field(compare=False)
  in_tree: Any
  static: dict = dataclasses.field(compare=False)
  fn_key: Any = key_of("fn")
  static_key: tuple = key_of("static", _static_key)

  @property
  def __name__(self) -> str:  # noqa: PLW3201 - how errors name the callback
    return getattr(self.fn, "__name__", repr(self.fn))

  def direct_form(self) -> Callable:
    """What takes the dynamic leaves as ``__call__`` does, quicker: ``fn``
    itself where they are its positional arguments (its result ignored)."""
    if not self.static and is_positional(self.in_tree):
      return self.fn
    return self

  def __call__(self, *dynamic):
    dynamic = iter(dynamic)
    flat = [self.static[i] if i in self.static else next(dynamic)
            for i in range(self.in_tree.num_leaves)]
    args, kwargs = jax.tree_util.tree_unflatten(self.in_tree, flat)
    self.fn(*args, **kwargs)


def stage_debug(flavour: str, fn: Callable, args: tuple, kwargs: dict,
                ordering: str, partitioned: bool,
                vmap_method: str = "sequential") -> None:
  """Stages the result-less call ``fn(*args, **kwargs)`` as the debug
  flavours do: array leaves are operands, other leaves (text, ``None``)
  are kept on the host side. ``ordering``: the call's effect (see
  ``hostcall._core.effects``)."""
  flat, in_tree = jax.tree_util.tree_flatten((args, kwargs))
  static = {i: leaf for i, leaf in enumerate(flat) if not is_array_like(leaf)}
  dynamic = [leaf for leaf in flat if is_array_like(leaf)]
  _stage.stage(flavour, _WithStatic(fn, in_tree, static), None,
               tuple(dynamic), {},
               ordering=ordering, partitioned=partitioned,
               vmap_method=vmap_method,
               jvp_error=None)


def debug_callback(callback: Callable[..., None] | None = None, *args: Any,
                   ordered: bool = False, partitioned: bool = False,
                   **kwargs: Any):
  """Calls a Python function for its side effect; ``jax.debug.callback``'s
  drop-in, including its two-call form ``debug_callback(ordered=True)(f, x)``.

  Arguments:
    callback: called as ``callback(*args, **kwargs)`` with NumPy arrays (and
      non-array arguments as given); its return value is ignored.
    *args, **kwargs: what to pass it.
    ordered: sequence this call with the other ordered callbacks.
    partitioned: as in JAX: under ``jit`` of arrays sharded over several
      devices, call once per shard with the local shard instead of once
      with the gathered value (no all-gather); the shards' places in the
      global arrays are in ``hostcall.call_context().shard_indices``. Such
      calls are not ordered.

  Returns:
    None (or, in the two-call form, the function taking the callback).

  Under ``vmap`` the callback runs once per batch element, in index order;
  under ``jvp``/``grad`` once, on primal values. An exception in the callback
  fails the JAX call that ran it, as in JAX.

  Example:
    >>> import jax, jax.numpy as jnp, hostcall
    >>> jax.vmap(lambda x: hostcall.debug_callback(print, "x =", x))(
    ...     jnp.arange(2)); hostcall.barrier()
    x = 0
    x = 1
  """
  def staged(fn, *c_args, **c_kwargs):
    check_callable(fn, "debug_callback's callback")
    check_arguments(fn, [f"arg{i}" for i in range(len(c_args))],
                    dict.fromkeys(c_kwargs, None), "hostcall.debug_callback",
                    "debug_callback calls callback(*args, **kwargs) with the "
                    "arguments given after it.")
    # Ordered as JAX orders its debug callbacks: refused on several devices.
    stage_debug("debug_callback", fn, c_args, c_kwargs,
                "debug_ordered" if ordered else "unordered", partitioned)

  return _one_or_two_calls("debug_callback", staged, callback, args, kwargs)


def _one_or_two_calls(name, staged, first, args, kwargs):
  """JAX's two forms: ``name(first, *args)`` now, or ``name(**options)``
  returning the function that takes them."""
  if first is not None:
    staged(first, *args, **kwargs)
    return None
  if args or kwargs:
    raise TypeError(f"{name} received unexpected arguments in the two-call "
                    f"form: {args=} {kwargs=}")
  return staged


class _FormatChecker(string.Formatter):

  def format_field(self, value, format_spec):
    return ""

  def check_unused_args(self, used_args, args, kwargs):
    unused = [a for i, a in enumerate(args) if i not in used_args]
    unused_kw = [k for k in kwargs if k not in used_args]
    if unused:
      raise ValueError(
          f"Unused positional arguments to `jax.debug.print`: {unused}")
    if unused_kw:
      raise ValueError(
          f"Unused keyword arguments to `jax.debug.print`: {unused_kw}. You "
          "may be passing an f-string (i.e, `f\"{x}\"`) into "
          "`jax.debug.print` and instead should pass in a regular string.")


class _AsJaxArray(np.ndarray):
  """A NumPy array that prints as the CPU ``jax.Array`` that JAX's
  ``debug.print`` formats (``repr`` is ``Array(2, dtype=int32)``; ``str``
  and format specs as NumPy's)."""

  def __repr__(self):
    value = self.view(np.ndarray)
    prefix, dtype = "Array(", f"dtype={value.dtype.name}"
    width = np.get_printoptions()["linewidth"]
    if value.size == 0:
      text = f"[], shape={value.shape}"
    else:
      text = np.array2string(value, prefix=prefix, suffix=",",
                             separator=", ", max_line_width=width)
    last_line = len(text) - text.rfind("\n") + 1
    sep = " " if last_line + len(dtype) + 2 <= width else " " * len(prefix)
    return f"{prefix}{text},{sep}{dtype})"

  def __str__(self):
    return str(self.view(np.ndarray))

  def __format__(self, spec):
    value = self.view(np.ndarray)
    return format(value if value.ndim else value[()], spec)


def _as_jax_arrays(tree):
  return jax.tree_util.tree_map(
      lambda v: v.view(_AsJaxArray) if isinstance(v, np.ndarray) else v, tree)


@dataclasses.dataclass(frozen=True)
class Printer:
  """Formats and prints on the host, with the NumPy print options of the
  trace."""

  fmt: str
  printoptions: tuple
  has_placeholders: bool
  __name__ = "debug_print"

  def __call__(self, *args, **kwargs):
    args, kwargs = _as_jax_arrays((args, kwargs))
    if tuple(np.get_printoptions().items()) == self.printoptions:
      message = self._message(args, kwargs)  # entering them costs ~8 us
    else:
      with np.printoptions(**dict(self.printoptions)):
        message = self._message(args, kwargs)
    with _print_lock:
      dispatch_stdout.stream().write(message + "\n")

  def _message(self, args, kwargs) -> str:
    if self.has_placeholders:
      return self.fmt.format(*args, **kwargs)
    return " ".join((self.fmt, *(str(a) for a in args)))

  @functools.cached_property
  def _pieces(self) -> list[str] | None:
    """The format's text around its fields, a line's end after the last,
    where every field is a plain ``{}`` (no name, index, conversion or
    spec) and the text ASCII; else None."""
    if not self.has_placeholders:
      return None
    try:
      parsed = list(string.Formatter().parse(self.fmt))
    except ValueError:
      return None
    pieces, text = [], ""
    for literal, field, spec, conversion in parsed:
      text += literal
      if field is None:
        continue
      if field or spec or conversion:
        return None
      pieces.append(text)
      text = ""
    pieces.append(text + "\n")
    return pieces if all(p.isascii() for p in pieces) else None

  def lines_of(self, columns) -> str | None:
    """What ``__call__`` writes for each call of a run, ``columns`` their
    arguments (stacked, one row a call), formatted in one native call:
    a queued site's calls cost a fraction of a microsecond each instead of
    a ``str.format`` of NumPy values. None where it cannot be (see
    ``_pieces``; an argument other than a 0-d integer or float32/64)."""
    pieces = self._pieces
    if pieces is None or len(pieces) != len(columns) + 1:
      return None
    # ``{}`` formats a 0-d array as its Python number, a float32 as the
    # float64 it widens to (as JAX's arrays do: '0.10000000149011612').
    numbers = [c.astype(np.float64) if c.dtype == np.float32 else c
               for c in columns]
    text = texts.rows(pieces, numbers, json=False)
    return None if text is None else text.decode("ascii")

  def write_lines(self, text: str) -> None:
    """Writes what ``lines_of`` made, as ``__call__`` writes a line."""
    with _print_lock:
      dispatch_stdout.stream().write(text)

  def write_delivered(self, text: str) -> None:
    """``write_lines`` on a delivery thread (the caller knows it is one):
    a print between other calls is written a call."""
    with _print_lock:
      dispatch_stdout.delivered_stream().write(text)


def make_printer(fmt: str, args: tuple, kwargs: dict,
                 skip_format_check: bool = False) -> Callable[..., None]:
  """The host function that prints ``fmt.format(*args, **kwargs)`` as
  ``debug_print`` does (with the NumPy print options in force now), ``fmt``
  checked against the arguments unless ``skip_format_check``."""
  if not skip_format_check:
    _FormatChecker().format(fmt, *args, **kwargs)
  # JAX looks at the first piece of the format only; where that would
  # drop keyword values (JAX then fails at run time, '{{x}} = {x}'), any
  # replacement field counts.
  pieces = list(string.Formatter().parse(fmt)) if fmt else []
  has_placeholders = bool(pieces) and pieces[0][1] is not None
  if kwargs and not has_placeholders:
    has_placeholders = any(field is not None for _, field, _, _ in pieces)
  return Printer(fmt, tuple(np.get_printoptions().items()), has_placeholders)


def debug_print(fmt: str | None = None, *args: Any, ordered: bool = False,
                partitioned: bool = False, skip_format_check: bool = False,
                **kwargs: Any):
  """Prints runtime values from inside transformed code; ``jax.debug.print``'s
  drop-in (``fmt.format(*args, **kwargs)``, two-call form included).

  Arguments:
    fmt: a format string, with ``{}`` placeholders (not an f-string).
    *args, **kwargs: the values to format.
    ordered: sequence this print with the other ordered callbacks.
    partitioned: print each shard where it is, as for ``debug_callback``.
    skip_format_check: as in JAX: do not check ``fmt`` against the
      arguments when tracing.

  Returns:
    None.

  Example:
    >>> import jax, hostcall
    >>> jax.jit(lambda x: hostcall.debug_print("x = {}", x))(2); hostcall.barrier()
    x = 2
  """
  def staged(fmt: str, *c_args, **c_kwargs):
    printer = make_printer(fmt, c_args, c_kwargs, skip_format_check)
    stage_debug("debug_print", printer, c_args, c_kwargs,
                "debug_ordered" if ordered else "unordered", partitioned)

  return _one_or_two_calls("debug_print", staged, fmt, args, kwargs)

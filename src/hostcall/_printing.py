"""Rendering values the way the legacy ``id_print`` did."""

from __future__ import annotations

from typing import Any

import numpy as np

_WIDTH = 80


def _items(value) -> tuple[str, str, list] | None:
  if isinstance(value, tuple):
    return "( ", " )", list(value)
  if isinstance(value, list):
    return "[ ", " ]", list(value)
  if isinstance(value, dict):
    return "{ ", " }", [(k, v) for k, v in sorted(value.items())]
  return None


def _flat(value, threshold) -> str:
  parts = _items(value)
  if parts is None:
    return _leaf(value, threshold)
  opening, closing, items = parts
  return opening + " ".join(_flat_item(i, value, threshold)
                            for i in items) + closing


def _flat_item(item, container, threshold) -> str:
  if isinstance(container, dict):
    key, val = item
    return f"{key}=" + _flat(val, threshold)
  return _flat(item, threshold)


def _leaf(value, threshold) -> str:
  if isinstance(value, np.ndarray):
    return np.array2string(value, threshold=threshold)
  return str(value)


def format_value(value: Any, threshold: int | None = None,
                 indent: int = 0) -> str:
  """Formats ``value`` on one line when it fits in 80 columns, else one
  element per line, nested containers indented by two."""
  flat = _flat(value, threshold)
  parts = _items(value)
  if parts is None or ("\n" not in flat and indent + len(flat) <= _WIDTH):
    return flat
  opening, closing, items = parts
  inner = indent + 2
  rendered = []
  for item in items:
    if isinstance(value, dict):
      key, val = item
      rendered.append(f"{key}=" + format_value(val, threshold,
                                                inner + len(str(key)) + 1))
    else:
      rendered.append(format_value(item, threshold, inner))
  return opening + ("\n" + " " * inner).join(rendered) + closing


def format_tap(arg, transforms, *, device=None, threshold=None,
               **kwargs) -> list[str]:
  """The lines ``id_print`` emits: sorted keyword arguments, then the value."""
  if transforms:
    kwargs["transforms"] = [(name, params) if params else name
                            for name, params in transforms]
  if device is not None:
    kwargs["device"] = device
  lines = []
  if kwargs:
    lines.append(" ".join(f"{k}: {v}" for k, v in sorted(kwargs.items())))
  lines.append(format_value(arg, threshold))
  return lines

"""A run's config (``Run.config``, as W&B's ``wandb.config``): its
hyper-parameters as JSON values, updated after the run opens, handed to
every writer (``Writer.write_config``) and read back (``read_config``).

The file writers keep it beside their rows, in ``config.json``; the
tracking tools as their own config (MLflow's parameters, W&B's config,
TensorBoard's hparams, CLU's ``write_hparams``), nested dicts flattened
where they take flat names (``flat``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import math
import os
import pathlib
import threading
from typing import Any, Callable, Iterator, Mapping

import jax
import numpy as np

#: The file beside a run's rows that holds its config.
FILE = "config.json"

_TAKES = ("a number, a bool, text, None, or a list or dict (str keys) of "
          "them")


def sanitize(value, where: str):
  """``value`` as a JSON value: NumPy and JAX arrays (concrete) as numbers
  or nested lists, tuples as lists, paths as text, dataclasses as dicts.

  Arguments:
    value: a config value.
    where: its key, for the message.

  Raises:
    TypeError: a traced value, a dict key that is not text, or a value of
      another type, naming the key, what came and what is taken.
  """
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, jax.core.Tracer):
    raise TypeError(
        f"config {where}: got a traced value ({value!r}); a run's config "
        "is known when it is set, outside jit. Log values that the "
        "program computes with run.log.")
  if hasattr(value, "__array__") and hasattr(value, "dtype"):
    array = np.asarray(value)
    if array.dtype.kind in "biufU":
      return array.tolist() if array.ndim else array.item()
  if isinstance(value, os.PathLike):
    return os.fspath(value)
  if isinstance(value, Mapping):
    out = {}
    for key, item in value.items():
      if not isinstance(key, str):
        raise TypeError(f"config {where}: a dict's keys are text, got the "
                        f"key {key!r} of type {type(key).__name__}.")
      out[key] = sanitize(item, f"{where}.{key}")
    return out
  if isinstance(value, (list, tuple)):
    return [sanitize(item, f"{where}[{i}]") for i, item in enumerate(value)]
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return sanitize(dataclasses.asdict(value), where)
  raise TypeError(
      f"config {where}: expected {_TAKES}, got {value!r} of type "
      f"{type(value).__name__}. Give str(value) to keep it as text.")


def as_dict(values, what: str) -> dict[str, Any]:
  """``values`` (a dict, an ``argparse.Namespace`` or a dataclass) as a
  dict of sanitized values by key.

  Raises:
    TypeError: anything else, or a key that is not text.
  """
  if isinstance(values, argparse.Namespace):
    values = vars(values)
  elif dataclasses.is_dataclass(values) and not isinstance(values, type):
    values = dataclasses.asdict(values)
  if not isinstance(values, Mapping):
    raise TypeError(
        f"{what} takes a dict of hyper-parameters (or an argparse.Namespace "
        f"or a dataclass), e.g. {{'lr': 0.1}}; got {values!r} of type "
        f"{type(values).__name__}.")
  out = {}
  for key, value in values.items():
    if not isinstance(key, str):
      raise TypeError(f"{what}: config keys are text, got the key {key!r} "
                      f"of type {type(key).__name__}.")
    out[key] = sanitize(value, repr(key))
  return out


def same(a, b) -> bool:
  """Whether two config values are equal, as W&B compares them (``==``),
  NaN equal to NaN."""
  if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
    return math.isnan(b)
  return a == b


def flat(config: Mapping[str, Any]) -> dict[str, Any]:
  """``config`` with nested dicts flattened, their keys joined by ``.``
  (``{"opt": {"lr": 0.1}}`` is ``{"opt.lr": 0.1}``), as tools that take
  flat names (MLflow, TensorBoard's hparams, CLU) are given it.

  Example:
    >>> from hostcall._apps.metrics.config import flat
    >>> flat({"opt": {"lr": 0.1, "betas": [0.9, 0.99]}, "seed": 0})
    {'opt.lr': 0.1, 'opt.betas': [0.9, 0.99], 'seed': 0}
  """
  out = {}
  for key, value in config.items():
    if isinstance(value, Mapping) and value:
      for inner, item in flat(value).items():
        out[f"{key}.{inner}"] = item
    else:
      out[key] = value
  return out


def as_text(value) -> str:
  """A flat config value as text: text as it is, the rest as JSON."""
  return value if isinstance(value, str) else json.dumps(value)


def write_file(directory: pathlib.Path, config: Mapping[str, Any]) -> None:
  """Writes ``config`` to ``directory/config.json``, whole: written to a
  file of its own first, then renamed over the old one, so that a reader
  (or a crash) never meets half a config."""
  path = directory / FILE
  part = directory / f".{FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
  try:
    with open(part, "w", encoding="utf-8") as f:
      json.dump(config, f, indent=1)
      f.write("\n")
    os.replace(part, path)
  finally:
    part.unlink(missing_ok=True)


def read_config(path: str | os.PathLike) -> dict[str, Any]:
  """A run's config, as its file writers left it.

  Arguments:
    path: a run directory (``runs/<name>``), its ``config.json``, or its
      ``metrics.jsonl`` / ``metrics.csv``. A run that several processes
      wrote each to their own ``process_<k>/`` has process 0's config (the
      first process's there is).

  Returns:
    The config (``{}`` for a run that has none: no ``params`` given, no
    ``run.config`` set, or only writers that keep no files).

  Example:
    >>> import hostcall, tempfile
    >>> run = hostcall.metrics.Run("cfg", root=tempfile.mkdtemp(),
    ...                            params={"lr": 0.1})
    >>> run.config.update({"batch": 32})
    >>> run.close()
    >>> hostcall.metrics.read_config(run.dir)
    {'lr': 0.1, 'batch': 32}
  """
  if not isinstance(path, (str, os.PathLike)):
    raise TypeError(f"read_config takes a run directory (a str or "
                    f"os.PathLike, e.g. 'runs/fit'), got {path!r} of type "
                    f"{type(path).__name__}.")
  path = pathlib.Path(path)
  if path.is_file():
    path = path if path.name == FILE else path.parent / FILE
  elif path.is_dir():
    candidates = [path / FILE] + sorted(
        (p / FILE for p in path.glob("process_*")
         if p.name.partition("_")[2].isdigit()),
        key=lambda p: int(p.parent.name.partition("_")[2]))
    path = next((p for p in candidates if p.is_file()), path / FILE)
  else:
    raise FileNotFoundError(
        f"no run at {path}: expected a run directory (runs/<name>, written "
        "by hostcall.metrics.Run(name)) or a file in it.")
  if not path.is_file():
    return {}
  with open(path, encoding="utf-8") as f:
    config = json.load(f)
  if not isinstance(config, dict):
    raise ValueError(f"{path} holds {type(config).__name__}, not a run's "
                     "config (a JSON object).")
  return config


@dataclasses.dataclass(frozen=True)
class Update:
  """Handed to the writer thread in place of a block: the run's whole
  config, after a change (written in order with the rows)."""

  config: dict
  nbytes = 0


class Config:
  """A run's config: what ``Run(params=...)`` gave, updated as W&B's
  ``wandb.config`` is, each change handed to every writer of the run.

  Read it as a dict (``run.config["lr"]``, ``run.config.lr``, ``get``,
  ``keys``, ``items``, ``in``, ``as_dict()``); set it with ``update``,
  ``setdefaults``, ``run.config["lr"] = 0.1`` or ``run.config.lr = 0.1``.
  Values are kept as JSON values (NumPy and JAX arrays as numbers or
  lists, tuples as lists).

  Arguments:
    host: returns the run's host side now (its sink): its ``config``
      (a dict), ``config_lock``, held while the config is read or changed,
      and ``update_config(changes)``, which has every writer take the
      changes once checked against the values held.
  """

  __slots__ = ("_host",)

  def __init__(self, host: Callable[[], Any]):
    object.__setattr__(self, "_host", host)

  @contextlib.contextmanager
  def _held(self):
    host = self._host()
    with host.config_lock:
      yield host

  def update(self, values, allow_val_change: bool = False) -> None:
    """Adds ``values`` (a dict, an ``argparse.Namespace`` or a dataclass)
    to the config and hands the change to every writer.

    Arguments:
      values: the keys and values to set.
      allow_val_change: let a key already set take another value (as W&B
        has it, a key's value is refused a change unless asked for).

    Raises:
      ValueError: a key already set to another value (without
        ``allow_val_change``), or a value a writer of the run refuses
        (naming the writer and why); nothing is changed then.
      TypeError: a value that is not a JSON value (see ``sanitize``).
    """
    values = as_dict(values, "run.config.update")
    with self._held() as host:
      held = host.config
      changed = {k: v for k, v in values.items()
                 if k not in held or not same(held[k], v)}
      if not allow_val_change:
        for key, value in changed.items():
          if key in held:
            raise ValueError(
                f"run.config: attempted to change the value of key {key!r} "
                f"from {held[key]!r} to {value!r}; pass "
                "allow_val_change=True to run.config.update() to change it.")
      if changed:
        host.update_config(changed)

  def setdefaults(self, values) -> None:
    """Sets the keys of ``values`` that the config does not hold yet."""
    values = as_dict(values, "run.config.setdefaults")
    with self._held() as host:
      missing = {k: v for k, v in values.items() if k not in host.config}
      if missing:
        host.update_config(missing)

  def __setitem__(self, key: str, value) -> None:
    self.update({key: value})

  def __setattr__(self, key: str, value) -> None:
    self.update({key: value})

  def __getitem__(self, key: str):
    with self._held() as host:
      return host.config[key]

  def __getattr__(self, key: str):
    try:
      return self[key]
    except KeyError:
      raise AttributeError(f"run.config has no key {key!r}") from None

  def get(self, key: str, default=None):
    with self._held() as host:
      return host.config.get(key, default)

  def as_dict(self) -> dict[str, Any]:
    """A copy of the config, as a dict."""
    with self._held() as host:
      return copy.deepcopy(host.config)

  def keys(self):
    return self.as_dict().keys()

  def items(self):
    return self.as_dict().items()

  def values(self):
    return self.as_dict().values()

  def __contains__(self, key) -> bool:
    with self._held() as host:
      return key in host.config

  def __iter__(self) -> Iterator[str]:
    return iter(self.as_dict())

  def __len__(self) -> int:
    with self._held() as host:
      return len(host.config)

  def __eq__(self, other) -> bool:
    return self.as_dict() == (other.as_dict() if isinstance(other, Config)
                              else other)

  __hash__ = None

  def __repr__(self) -> str:
    return f"run.config({self.as_dict()!r})"

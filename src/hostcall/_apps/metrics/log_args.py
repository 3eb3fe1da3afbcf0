"""``Run.log``'s arguments: the step, the metrics (W&B's dict form and
name=value), nested dicts flattened as W&B names their keys, and text
values told from the values the program computes.

W&B keeps a nested dict as a tree and names each leaf by its path, the
keys joined by ``.`` (``{"train": {"loss": l}}`` is ``train.loss``, in its
history, its charts and its readers); hostcall flattens the dict at the
call, to that name. A text value (``{"phase": "train"}``) is known when the
call is traced: it stays on the host, in the call site's target, and never
reaches the device.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from hostcall._core.checks import describe_leaf, is_array_like

#: What joins a nested dict's keys into a metric's name (W&B's rule).
SEPARATOR = "."


def describe(value) -> str:
  """``value`` in words, for a message: an array's shape and dtype."""
  if hasattr(value, "shape") and hasattr(value, "dtype"):
    return f"an array of shape {tuple(value.shape)} and dtype {value.dtype}"
  return describe_leaf(value)


def check_step(step, example: str) -> None:
  """Refuses a ``step`` that is not one integer, or one that does not fit
  JAX's default integer."""
  if not is_array_like(step) or not jnp.issubdtype(
      jnp.result_type(step), jnp.integer) or jnp.ndim(step) != 0:
    raise TypeError(
        "step must be one integer (traced or not; under vmap, one per "
        f"member), got {describe(step)}: {example}. To log a vector of "
        "values per step, log it as a metric.")
  if isinstance(step, (int, np.integer)) and not isinstance(step, bool):
    dtype = jnp.result_type(int)  # int32, or int64 under x64
    if not jnp.iinfo(dtype).min <= int(step) <= jnp.iinfo(dtype).max:
      raise ValueError(
          f"step {int(step)} does not fit JAX's default integer "
          f"({jnp.dtype(dtype).name}): {example} takes steps "
          f"from {jnp.iinfo(dtype).min} to {jnp.iinfo(dtype).max}. "
          "Enable 64-bit integers (jax.config.update('jax_enable_x64', "
          "True)) for larger steps.")


def flatten(metrics: Mapping, labels: tuple = (), out: dict | None = None,
            paths: dict | None = None) -> dict[str, Any]:
  """``metrics`` with each nested dict's leaves named by their path, the
  keys joined by ``.`` as W&B names them (an empty dict gives no name).

  Arguments:
    metrics: the dict.
    labels: the keys of the dicts it is nested in.
    out: where to add the leaves (a new dict if None).
    paths: where to keep each nested leaf's keys, ``{name: (key, ...)}``
      (W&B is handed the tree again).

  Raises:
    TypeError: a key that is not text.
    ValueError: two leaves named alike (``{"a.b": x, "a": {"b": y}}``).

  Example:
    >>> from hostcall._apps.metrics.log_args import flatten
    >>> flatten({"train": {"loss": 1.0, "acc": {"top1": 0.5}}, "lr": 0.1})
    {'train.loss': 1.0, 'train.acc.top1': 0.5, 'lr': 0.1}
  """
  out = {} if out is None else out
  for key, value in metrics.items():
    if not isinstance(key, str):
      raise TypeError(f"Run.log's dict of metrics is keyed by names "
                      f"(str), got the key {key!r} of type "
                      f"{type(key).__name__}"
                      f"{f' in {SEPARATOR.join(labels)!r}' if labels else ''}.")
    path = labels + (key,)
    if isinstance(value, Mapping):
      flatten(value, path, out, paths)
      continue
    name = SEPARATOR.join(path)
    if name in out:
      raise ValueError(
          f"Run.log got two metrics named {name!r}: a nested dict's keys "
          f"are joined by {SEPARATOR!r} (W&B's names), and another key is "
          "that name already. Rename one of them.")
    out[name] = value
    if len(path) > 1 and paths is not None:
      paths[name] = path
  return out


def metrics_of(args: tuple, step, metrics: dict) -> tuple[Any, dict, dict]:
  """``(step, metrics, paths)`` of ``Run.log``'s arguments: ``log(step,
  **metrics)``, ``log({name: value}, step=step)`` (W&B's form) or
  ``log(step, {name: value})``; nested dicts flattened (``flatten``), the
  keys of each nested leaf in ``paths``."""
  given = [a for a in args if isinstance(a, Mapping)]
  others = [a for a in args if not isinstance(a, Mapping)]
  if len(args) > 2 or len(given) > 1 or len(others) > 1:
    raise TypeError(
        f"Run.log takes a step and a dict of metrics (or metrics as "
        f"name=value), e.g. run.log(step, loss=loss) or run.log({{'loss': "
        f"loss}}, step=step); got {len(args)} positional arguments: "
        f"{', '.join(describe(a) for a in args)}.")
  if others:
    if step is not None:
      raise TypeError(
          f"Run.log got the step twice: {describe(others[0])} "
          f"positionally and step={describe(step)}; give it once.")
    step = others[0]
  paths: dict = {}
  metrics = flatten(metrics, paths=paths)
  if given:
    if "step" in given[0]:
      raise ValueError(
          "Run.log's dict of metrics has the key 'step', the column of "
          "step numbers: give the step as run.log(metrics, step=step), or "
          "rename the metric.")
    named = flatten(given[0], paths=paths)
    both = sorted(set(named) & set(metrics))
    if both:
      raise ValueError(
          f"Run.log got the metric(s) {both} twice: in the dict and as "
          "name=value; give each once.")
    metrics = {**named, **metrics}
  return step, metrics, paths


def split_texts(metrics: dict) -> tuple[dict, dict[str, str]]:
  """``(values, texts)``: the metrics the program computes (arrays and
  numbers) and the text values, each by name, in the order given.

  Raises:
    TypeError: a value that is neither, naming it and what is taken.
  """
  values, texts = {}, {}
  for name, value in metrics.items():
    if isinstance(value, str):
      texts[name] = str(value)
    elif is_array_like(value):
      values[name] = value
    else:
      raise TypeError(
          f"metric {name!r}: expected a JAX array, a NumPy array of numbers "
          f"or booleans, a Python number, text (str) or a dict of them, got "
          f"{describe_leaf(value)}.")
  return values, texts

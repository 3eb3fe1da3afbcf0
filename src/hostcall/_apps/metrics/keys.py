"""A block's rows as scalars by key, the form of the tracking tools
(MLflow, Weights & Biases, CLU): one key per metric, process, device, vmap
member and array element, grouped by step (``steps``)."""

from __future__ import annotations

import numpy as np

from hostcall._apps.metrics.block import Block, plain


def key_of(name: str, process=None, device=None, member=None,
           element: tuple = ()) -> str:
  """The key of one scalar: ``name``, then ``/process_<p>``,
  ``/device_<d>``, ``/member_<k>`` where the row has them, then the array
  element's index (``/0``, ``/1/2``).

  Example:
    >>> from hostcall._apps.metrics.keys import key_of
    >>> key_of("loss", member=1), key_of("w", element=(0, 2))
    ('loss/member_1', 'w/0/2')
  """
  key = name
  if process is not None:
    key += f"/process_{process}"
  if device is not None:
    key += f"/device_{device}"
  if member is not None:
    key += f"/member_{member}"
  return key + "".join(f"/{i}" for i in element)


def steps(block: Block) -> list[tuple[int, dict[str, float | int]]]:
  """The rows of ``block``, each run of rows with one step (a step's vmap
  members, processes and devices) joined into one ``{key: value}``; a key
  met again in that run (the same step logged again, by another call)
  starts another ``{key: value}`` of that step, so that no value is lost.

  Arguments:
    block: the rows.

  Returns:
    ``[(step, {key: value}), ...]`` in the block's order; values are Python
    ints and floats (booleans 0/1, complex numbers their magnitude). An
    array metric gives one key per element.

  Example:
    >>> import numpy as np, hostcall
    >>> from hostcall._apps.metrics.keys import steps
    >>> steps(hostcall.metrics.Block(
    ...     step=np.array([0, 0, 1, 1]), member=np.array([0, 1, 0, 1]),
    ...     metrics={"loss": np.array([4.0, 3.0, 2.0, 1.0])}))
    [(0, {'loss/member_0': 4.0, 'loss/member_1': 3.0}), (1, {'loss/member_0': 2.0, 'loss/member_1': 1.0})]
    >>> steps(hostcall.metrics.Block(
    ...     step=np.array([2, 2]), metrics={"val": np.array([1.0, 2.0])}))
    [(2, {'val': 1.0}), (2, {'val': 2.0})]
  """
  rows = len(block)
  if not rows:
    return []
  def listed(column):
    return [None] * rows if column is None else column.tolist()
  processes, devices, members = (listed(block.process), listed(block.device),
                                 listed(block.member))
  where = [key_of("", p, d, m) for p, d, m in zip(processes, devices,
                                                  members)]
  values = {}
  for name, column in block.metrics.items():
    column = plain(np.asarray(column))
    if column.ndim == 1:
      values[name] = [[("", v)] for v in column.tolist()]
    else:
      elements = list(np.ndindex(column.shape[1:]))
      suffixes = [key_of("", element=e) for e in elements]
      flat = column.reshape(rows, -1).tolist()
      values[name] = [list(zip(suffixes, row)) for row in flat]
  out: list[tuple[int, dict]] = []
  step_list = block.step.tolist()
  for row, step in enumerate(step_list):
    keyed = {name + where[row] + suffix: value
             for name, per_row in values.items()
             for suffix, value in per_row[row]}
    if not out or out[-1][0] != step or not out[-1][1].keys().isdisjoint(
        keyed):
      out.append((step, {}))
    out[-1][1].update(keyed)
  return out


def check_collisions(shapes: dict[str, tuple], writer: str) -> None:
  """Refuses metrics of one call whose keys would be the same: an array
  ``w`` (keys ``w/0``, ``w/1``, ...) beside a scalar named ``w/0``.

  Arguments:
    shapes: ``{name: shape}`` of the call's metrics.
    writer: the writer's name, for the message.

  Raises:
    ValueError: naming both metrics and the key.
  """
  for name in shapes:
    head, parts = name, []
    while "/" in head:
      head, _, last = head.rpartition("/")
      parts.insert(0, last)
      shape = shapes.get(head)
      if (shape is not None and len(shape) == len(parts)
          and all(p.isdigit() and int(p) < n for p, n in zip(parts, shape))):
        raise ValueError(
            f"the {writer} writer keys an array metric's elements "
            f"{head}/0, {head}/1, ...: the array {head!r} (shape {shape}) "
            f"and the metric {name!r} would both be {name!r}, one value "
            "overwriting the other. Rename one of them.")

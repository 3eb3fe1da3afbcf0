"""``RaiseAfterAll``: several steps that must each run although one
raises (the registry ending its invocations, the bars closing theirs)."""

from __future__ import annotations


class RaiseAfterAll:
  """``with each:`` around each of several steps: one that raises does not
  stop the others (a bar that fails to close must not leave the others
  open); ``raise_first()`` once all have run."""

  def __init__(self):
    self.failure: Exception | None = None

  def __enter__(self):
    return self

  def __exit__(self, kind, failure, traceback):
    if not isinstance(failure, Exception):
      return None  # none, or an interrupt: it goes on
    self.failure = self.failure or failure
    return True

  def raise_first(self) -> None:
    if self.failure is not None:
      raise self.failure

"""Argument types shared by the commands: bad values exit with status 2."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
  """An int of at least 1, or argparse's usage error naming what came."""
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"expected a whole number of at least 1, got {text!r}") from None
  if value < 1:
    raise argparse.ArgumentTypeError(
        f"expected a whole number of at least 1, got {value}")
  return value

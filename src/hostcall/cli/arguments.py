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


def positive_float(text: str) -> float:
  """A finite number above 0, or argparse's usage error naming what came."""
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"expected a number of seconds above 0, got {text!r}") from None
  if not 0 < value < float("inf"):
    raise argparse.ArgumentTypeError(
        f"expected a number of seconds above 0, got {text}")
  return value

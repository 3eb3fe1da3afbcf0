"""Metric logging, public as ``hostcall.metrics``: one concept a module (see
docs/architecture.md, which lists them and says how to add a writer)."""

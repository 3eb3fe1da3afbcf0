"""The metrics writers' native number formatting (``_runtime/texts.py``,
``hostcall_texts.cc``): NumPy's words for every value, at native speed, and
NumPy's own formatting where the native one cannot."""

import errno
import json
import os

import ml_dtypes
import numpy as np
import pytest

from hostcall import metrics
from hostcall._runtime import texts


@pytest.fixture
def formatter():
  probe = texts.column(np.float32([0.5]), json=False)
  if probe is None:
    pytest.skip("this build has no floating-point std::to_chars")
  assert probe == ["0.5"]


def _numpy_words(values, json_style):
  words = values.astype(str).tolist()
  if json_style and values.dtype.kind == "f":
    nonfinite = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
    words = [nonfinite.get(w, w) for w in words]
  return words


def _around(values):
  """``values`` and their neighbours on either side."""
  values = np.asarray(values)
  with np.errstate(over="ignore"):
    return np.concatenate([values, np.nextafter(values, np.inf),
                           np.nextafter(values, -np.inf)]).astype(values.dtype)


_EDGES = [0.0, -0.0, 1e-4, 9.9e-5, 0.1, 1.0, 1e3, 123456.0, 1e6, 1234567.0,
          1e7, 16777216.0, 1e8, 1e15, 1e16, 1e17, 3e38, 1e-38, 1e-45, np.nan,
          -np.nan, np.inf, -np.inf]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("json_style", [True, False])
def test_floats_are_written_as_numpy_writes_them(formatter, dtype,
                                                 json_style):
  rng = np.random.default_rng(7)
  bits = np.uint32 if dtype == np.float32 else np.uint64
  random_bits = rng.integers(0, np.iinfo(bits).max, 200_000, dtype=bits,
                             endpoint=True).view(dtype)
  scaled = (rng.standard_normal(20_000)
            * 10.0 ** rng.integers(-9, 20, 20_000)).astype(dtype)
  values = np.concatenate([random_bits, scaled,
                           _around(np.array(_EDGES, dtype))])
  assert texts.column(values, json_style) == _numpy_words(values, json_style)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint32, np.int8,
                                   np.uint8, np.uint16, np.int16])
def test_integers_are_written_as_numpy_writes_them(formatter, dtype):
  info = np.iinfo(dtype)
  values = np.concatenate([
      np.random.default_rng(3).integers(info.min, info.max, 10_000,
                                        dtype=dtype, endpoint=True),
      np.array([info.min, info.max, 0], dtype)])
  assert texts.column(values, True) == _numpy_words(values, True)


@pytest.mark.parametrize("values", [
    np.array([1, 2], np.uint64),  # beyond int64: NumPy's words
    np.array([1.5], np.float16),
    np.ones((2, 2), np.float32),  # not a vector
])
def test_other_columns_are_left_to_numpy(formatter, values):
  assert texts.column(values, True) is None


def test_a_column_of_no_rows_is_no_text(formatter):
  assert texts.column(np.float32([]), True) == []
  assert texts.rows(["<", ">\n"], [np.float32([])], json=True) == b""


def test_rows_place_each_value_between_the_pieces(formatter):
  text = texts.rows(["{\"a\": ", ", \"b\": ", "}\n"],
                    [np.arange(3), np.float32([1.5, np.nan, -np.inf])],
                    json=True)
  assert text == (b'{"a": 0, "b": 1.5}\n{"a": 1, "b": NaN}\n'
                  b'{"a": 2, "b": -Infinity}\n')


def _block():
  rng = np.random.default_rng(5)
  n = 300
  return metrics.Block(
      step=np.arange(n) * 7 - 5,
      metrics={
          "loss": rng.standard_normal(n).astype(np.float32) * 1e-3,
          "big": (rng.standard_normal(n) * 1e12).astype(np.float64),
          "odd %s \"name\" \u00e9": np.where(
              np.arange(n) % 3 == 0, np.nan,
              rng.standard_normal(n)).astype(np.float32),
          "inf": np.full(n, np.inf, np.float32),
          "flag": np.arange(n) % 2 == 0,
          "half": rng.standard_normal(n).astype(np.float16),
          "bf16": rng.standard_normal(n).astype(ml_dtypes.bfloat16),
          "int4": (np.arange(n) % 8).astype(ml_dtypes.int4),
          "u64": np.arange(n, dtype=np.uint64) * 2**40,
          "complex": (rng.standard_normal(n) + 1j).astype(np.complex64),
          "pair": rng.standard_normal((n, 2)).astype(np.float32),
      },
      device=np.arange(n) % 2)


def test_jsonl_writes_the_same_text_with_or_without_the_formatter(
    formatter, tmp_path, monkeypatch):
  block = _block()
  fast = metrics.JsonlWriter(tmp_path / "fast.jsonl")
  fast.write(block)
  fast.close()
  assert texts.rows(["[", "]\n"], [np.float32([2.0])], json=True) == b"[2.0]\n"
  # What the writer does where the formatter declines (other dtypes).
  monkeypatch.setattr(texts, "_prepare", lambda pieces, columns: None)
  slow = metrics.JsonlWriter(tmp_path / "slow.jsonl")
  slow.write(block)
  slow.close()
  assert (tmp_path / "fast.jsonl").read_bytes() == (
      tmp_path / "slow.jsonl").read_bytes()
  rows = [json.loads(line) for line in
          (tmp_path / "fast.jsonl").read_text().splitlines()]
  assert len(rows) == 300
  assert rows[3]["odd %s \"name\" \u00e9"] != rows[3]["odd %s \"name\" \u00e9"]
  assert rows[0]["inf"] == float("inf")
  np.testing.assert_array_equal(np.float32([r["loss"] for r in rows]),
                                block.metrics["loss"])
  assert [r["step"] for r in rows] == list(block.step)


def test_jsonl_of_vectors_only_is_written_natively(formatter, tmp_path,
                                                   monkeypatch):
  block = metrics.Block(step=np.arange(4),
                        metrics={"x": np.float32([0.1, 2, 3e7, -0.0])})
  calls = []
  real = texts.write_rows
  monkeypatch.setattr(texts, "write_rows",
                      lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
  writer = metrics.JsonlWriter(tmp_path / "m.jsonl")
  writer.write(block)
  writer.close()
  assert calls == [True]
  assert (tmp_path / "m.jsonl").read_text() == (
      '{"step": 0, "x": 0.1}\n{"step": 1, "x": 2.0}\n'
      '{"step": 2, "x": 3e+07}\n{"step": 3, "x": -0.0}\n')


def test_many_rows_are_formatted_in_chunks_in_order(formatter, monkeypatch):
  monkeypatch.setattr(texts, "_CHUNK_ROWS", 7)
  values = np.arange(50, dtype=np.float32) / 4
  assert texts.column(values, True) == _numpy_words(values, True)
  assert texts.rows(["", "|", "\n"], [np.arange(15), values[:15]],
                    json=False).decode().splitlines() == [
                        f"{i}|{v}" for i, v in zip(range(15),
                                                   _numpy_words(values[:15],
                                                                False))]


def test_rows_written_to_a_file_are_the_rows_text_in_chunks(formatter,
                                                            tmp_path,
                                                            monkeypatch):
  monkeypatch.setattr(texts, "_CHUNK_ROWS", 7)
  values = np.arange(50, dtype=np.float32) / 4
  pieces, columns = ["", "|", "\n"], [np.arange(50) - 3, values]
  path = tmp_path / "rows.txt"
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
  try:
    assert texts.write_rows(fd, pieces, columns, json=False)
    assert texts.write_rows(fd, pieces, [c[:0] for c in columns], json=False)
  finally:
    os.close(fd)
  assert path.read_bytes() == texts.rows(pieces, columns, json=False)
  assert path.read_text().splitlines()[8] == "5|2.0"


def test_a_failed_write_of_rows_raises_the_oses_error(formatter):
  if not os.path.exists("/dev/full"):
    pytest.skip("no /dev/full here")
  fd = os.open("/dev/full", os.O_WRONLY)
  try:
    with pytest.raises(OSError, match="No space left on device") as caught:
      texts.write_rows(fd, ["", "\n"], [np.float32([1.5, 2.5])], json=True)
  finally:
    os.close(fd)
  assert caught.value.errno == errno.ENOSPC
  read_only = os.open(os.devnull, os.O_RDONLY)
  try:
    with pytest.raises(OSError) as caught:  # not open for writing
      texts.write_rows(read_only, ["", "\n"], [np.float32([1.5])], json=True)
  finally:
    os.close(read_only)
  assert caught.value.errno == errno.EBADF


def test_rows_the_formatter_cannot_take_are_not_written(formatter, tmp_path):
  fd = os.open(tmp_path / "none.txt", os.O_WRONLY | os.O_CREAT)
  try:
    assert not texts.write_rows(fd, ["", "\n"], [np.float16([1.5])],
                                json=True)
    assert not texts.write_rows(fd, ["", "|", "\n"],
                                [np.float32([1.5]), np.float32([1, 2])],
                                json=True)
  finally:
    os.close(fd)
  assert (tmp_path / "none.txt").read_bytes() == b""

"""The hostcall command: demo, bench, plot, info, tour; exit codes and output."""

import json
from importlib import metadata
import pathlib
import re
import site
import subprocess
import sys
import sysconfig

import pytest

ROOT = pathlib.Path(__file__).parent.parent
_EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


def _hostcall(*args, cwd=None):
  return subprocess.run([sys.executable, "-m", "hostcall", *args],
                        capture_output=True, text=True, timeout=300, cwd=cwd)


def test_demo_fits_the_model_with_a_bar_metrics_and_a_plot(tmp_path):
  proc = _hostcall("demo", cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  assert out.startswith("hostcall 0.1.0 demo: fitting y = a*J0(k*r) + c")
  assert "4 fits under vmap, 3000 Adam steps each" in out
  # Three starts find the true wavenumber 3 and amplitude 2; the farthest
  # stops in a local minimum.
  table = re.findall(r"^\s+(\d)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                     r"\s+([\d.]+)$", out, re.M)
  assert len(table) == 4
  for _, _, k, amplitude, offset, loss in table[:3]:
    assert abs(float(k) - 3.0) < 0.02 and abs(float(amplitude) - 2.0) < 0.05
    assert abs(float(offset) - 0.5) < 0.05 and float(loss) < 0.004
  assert float(table[3][5]) > 0.1
  assert "3 of 4 starts reach the true minimum" in out
  assert "member 3 stopped in a local minimum at k = 4.6" in out
  assert "metrics: 12000 rows (3000 steps x 4 members) in " \
      "runs/demo/metrics.jsonl" in out
  # One live bar for the ensemble on stderr, closed at 3000/3000.
  assert re.search(r"fit \(Ctrl-C stops\): 100%\|.*\| 3000/3000 .*lanes 4\]",
                   proc.stderr)
  assert "Ctrl-C stops the fit at its next check" in out
  assert "stopped early" not in out
  lines = (tmp_path / "runs/demo/metrics.jsonl").read_text().splitlines()
  assert len(lines) == 12000
  first = json.loads(lines[0])
  assert set(first) == {"step", "member", "loss", "grad_norm",
                        "learning_rate", "amplitude", "offset", "wavenumber"}
  assert (tmp_path / "runs/demo/metrics.png").read_bytes()[:4] == b"\x89PNG"


def test_demo_options():
  proc = _hostcall("demo", "--help")
  assert proc.returncode == 0
  assert "--steps" in proc.stdout and "--root" in proc.stdout
  assert "--time-limit" in proc.stdout
  for bad in ("0", "-1", "inf", "soon"):
    proc = _hostcall("demo", "--time-limit", bad)
    assert proc.returncode == 2 and "number of seconds above 0" in proc.stderr


def test_demo_stops_at_its_time_limit_and_reports_the_steps_done(tmp_path):
  proc = _hostcall("demo", "--steps", "200000", "--batch", "8",
                   "--time-limit", "0.5",
                   cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  found = re.search(r"stopped early \(time limit\) after (\d+) of 200000 "
                    r"steps: the results below are those of the steps done",
                    proc.stdout)
  assert found, proc.stdout
  steps = int(found.group(1))
  assert 0 < steps < 200_000 and steps % 2_000 == 0
  # Every row of the steps done was written, and none past them.
  lines = (tmp_path / "runs/demo/metrics.jsonl").read_text().splitlines()
  assert len(lines) == 4 * steps
  assert max(json.loads(line)["step"] for line in lines) == steps - 1
  assert f"({steps} steps x 4 members)" in proc.stdout


def test_plot_command(tmp_path):
  run = tmp_path / "runs" / "small"
  run.mkdir(parents=True)
  run.joinpath("metrics.jsonl").write_text(
      "".join(json.dumps({"step": i, "loss": 1.0 / (i + 1)}) + "\n"
              for i in range(10)))
  proc = _hostcall("plot", str(run))
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == str(run / "metrics.png")
  assert (run / "metrics.png").read_bytes()[:4] == b"\x89PNG"
  proc = _hostcall("plot", str(run), "-m", "loss", "-o",
                   str(tmp_path / "loss.png"))
  assert proc.returncode == 0 and (tmp_path / "loss.png").exists()
  missing = _hostcall("plot", str(tmp_path / "nothing"))
  assert missing.returncode == 2
  assert "hostcall plot: error: no run at" in missing.stderr
  unknown = _hostcall("plot", str(run), "-m", "nosuch")
  assert unknown.returncode == 2
  assert unknown.stderr.strip().endswith(
      f"hostcall plot: error: no metric 'nosuch' in {run}; it has 'loss'")
  assert "Traceback" not in missing.stderr + unknown.stderr


def test_info_names_versions_devices_and_fast_path():
  proc = _hostcall("info")
  assert proc.returncode == 0, proc.stderr
  out = proc.stdout
  assert out.startswith(f"hostcall 0.1.0\njax {metadata.version('jax')}, ")
  assert re.search(r"^supported: jax[<>=,\d.]+, jaxlib[<>=,\d.]+$", out,
                   re.M)
  assert "backend cpu" in out
  assert "async taps: native (XLA FFI handler" in out
  # Both components load the one extension built when hostcall was
  # installed (named for this Python).
  extension = re.escape(f"/hostcall/_native{_EXT_SUFFIX}")
  assert re.search(r"^async taps: native \(XLA FFI handler, /.*"
                   + extension + r"\)$", out, re.M)
  assert re.search(r"^steered loops' checks: native \(XLA FFI handler, /.*"
                   + extension + r"\)$", out, re.M)
  assert re.search(r"^native extension: /.*" + extension
                   + r" \(built when hostcall was installed\)$", out, re.M)
  assert "cache" not in out.lower() and "compiler" not in out
  assert "queue capacity: 67108864 bytes" in out
  assert re.search(r"^notebook widgets: (ipywidgets [\d.]+|not installed)",
                   out, re.M)
  assert re.search(r"extras: tqdm \d", out)


def test_version_and_help_for_every_option():
  version = _hostcall("--version")
  assert version.returncode == 0 and version.stdout == "hostcall 0.1.0\n"
  for command in ("demo", "bench", "plot", "info", "tour"):
    proc = _hostcall(command, "--help")
    assert proc.returncode == 0, command
    options = re.findall(r"^  (--?[a-z][\w-]*)(?:, (--[\w-]+))?(.*)$",
                         proc.stdout, re.M)
    for short, long, rest in options:
      if short not in ("-h",):
        assert rest.strip(), f"{command} {short} has no help text"
    # Plain text: no reStructuredText backticks from a docstring.
    assert "`" not in proc.stdout, command


def test_info_says_what_needs_an_extra_that_is_missing(monkeypatch, capsys):
  from hostcall.cli import info
  monkeypatch.setattr(info, "_version", lambda name: "not installed")
  assert info.run(None) == 0
  extras = next(line for line in capsys.readouterr().out.splitlines()
                if line.startswith("extras: "))
  assert ("pandas not installed (for hostcall.metrics.read's DataFrame; "
          "pip install 'hostcall[pandas]')") in extras
  assert "scipy not installed (for hostcall demo;" in extras


@pytest.mark.parametrize("args,words", [
    (["demo", "--steps", "0"], "argument --steps: expected a whole number of "
                               "at least 1, got 0"),
    (["demo", "--batch", "0"], "argument --batch: expected a whole number of "
                               "at least 1, got 0"),
    (["demo", "--steps", "ten"], "argument --steps: expected a whole number "
                                 "of at least 1, got 'ten'"),
    (["bench", "--repeats", "-1"], "argument --repeats: expected a whole "
                                   "number of at least 1, got -1"),
])
def test_bad_values_exit_2_with_a_message(args, words):
  proc = _hostcall(*args)
  assert proc.returncode == 2
  assert words in proc.stderr and "Traceback" not in proc.stderr
  assert proc.stdout == ""


def test_demo_without_its_extras_says_which_to_install(tmp_path):
  # A plain install: no SciPy, no matplotlib.
  blocker = tmp_path / "blocked"
  blocker.mkdir()
  for name in ("scipy", "matplotlib"):
    (blocker / name).mkdir()
    (blocker / name / "__init__.py").write_text(
        "raise ImportError('not installed')\n")
  code = ("import importlib.util, sys\n"
          "real = importlib.util.find_spec\n"
          "importlib.util.find_spec = lambda n, *a: None if n in "
          "('scipy', 'matplotlib') else real(n, *a)\n"
          "from hostcall.cli import main\n"
          "sys.exit(main(['demo', '--steps', '5']))\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=300, cwd=tmp_path)
  assert proc.returncode == 1
  assert proc.stderr.strip() == (
      "hostcall demo: the demo's model calls scipy.special on the host, and "
      "SciPy is not installed: pip install 'hostcall[demo]'")


def test_demo_without_matplotlib_still_prints_its_summary(tmp_path):
  code = ("import importlib.util, sys\n"
          "real = importlib.util.find_spec\n"
          "importlib.util.find_spec = lambda n, *a: None if n == "
          "'matplotlib' else real(n, *a)\n"
          "from hostcall.cli import main\n"
          "sys.exit(main(['demo', '--steps', '20']))\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=300, cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "starts reach the true minimum" in proc.stdout
  assert proc.stdout.rstrip().endswith(
      "plot:    skipped: matplotlib is not installed (pip install "
      "'hostcall[demo]')")
  assert not (tmp_path / "runs" / "demo" / "metrics.png").exists()


def test_tour_shows_and_runs_each_of_hostcalls_parts():
  proc = _hostcall("tour")
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = proc.stdout
  titles = re.findall(r"^== \d\. (.*)$", out, re.M)
  assert [t.split(":")[0].split(",")[0].split(" ")[0] for t in titles] == [
      "JAX's", "hostcall.jit", "jax.jit", "progress", "metrics", "steering",
      "gradients", "the"]
  # Each step shows its snippet, then what it printed.
  assert ">>> @hostcall.jit" in out and ">>> for _ in hostcall.progress" in out
  assert "sorted on the host: [1. 2. 3.]" in out
  assert ("step sees x = 1.0\nstep sees x = 2.0\nstep sees x = 4.0\n"
          "x = 8.0\n") in out
  # The same logging step under jax.jit and hostcall.jit, timed: the
  # cliff (15x to 60x on the project's box; 2x at the least here).
  times = {name: int(us) for name, us in re.findall(
      r"^((?:jax|hostcall)\.jit[\w ,.]*): (\d+) us a step$", out, re.M)}
  assert list(times) == ["jax.jit, no host call", "jax.jit with run.log",
                         "hostcall.jit with run.log"], out
  assert times["jax.jit with run.log"] > 2 * max(
      times["hostcall.jit with run.log"], times["jax.jit, no host call"])
  if times["jax.jit with run.log"] < 500:  # (the hint's pace, with room)
    assert proc.stderr.count("SlowDispatchWarning: the jax.jit program "
                             "called here ran") == 1, proc.stderr
    assert "<hostcall tour, step 3>:12: " in proc.stderr
  assert re.search(r"^calls: 100%.* 2/2 \[", out, re.M)
  assert "[(0, 2.0), (1, 0.5), (2, 0.125)]" in out
  assert re.search(r"^stopped: True after 1\d00 steps, by stop_when$", out,
                   re.M)
  assert "d/dx sin(x) at 0 = [1. 1.]" in out
  assert "what: x^2\n[4. 9.]" in out


@pytest.mark.parametrize("args", [["nope"], ["info", "--extra"], []])
def test_bad_commands_fail_with_usage(args):
  proc = _hostcall(*args)
  assert proc.returncode == 2
  assert "usage: hostcall" in proc.stderr


def test_benchmark_smoke_run_writes_to_a_temporary_directory(tmp_path):
  proc = _hostcall("bench", "--smoke", cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  written = re.search(r"^results: (.*latest\.json)$", proc.stdout, re.M)
  assert written and not written.group(1).startswith(str(tmp_path))
  assert pathlib.Path(written.group(1)).exists()
  assert list(tmp_path.iterdir()) == []   # nothing in the current directory


def test_benchmark_smoke_run(tmp_path):
  proc = _hostcall("bench", "--smoke", "--out", str(tmp_path))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "1. default tap, scalar" in proc.stdout
  assert "6. async taps with a busy Python thread" in proc.stdout
  assert "7. progress bar (hostcall.progress.scan)" in proc.stdout
  assert "7. per-step metrics (hostcall.scan, every=256)" in proc.stdout
  assert "7. ... per-step metrics / the floor" in proc.stdout
  # Issue 23's row stops its clock once every call is delivered; its
  # device side and that against XLA's floor are rows of their own.
  assert "7. progress bar + per-step metrics under hostcall.jit" in proc.stdout
  assert "7. ... under hostcall.jit, device side / the floor" in proc.stdout
  # Issue 54: a bar showing the step's loss, against the same bar (its
  # target: 0.02x over it); and no hint that hostcall.jit would be faster
  # from the jax.jit loops some rows measure on purpose.
  assert "7. progress bar + set_postfix(loss) / the bar alone" in proc.stdout
  # Issue 55: a short loop's bar, paired with tqdm's own in the same run.
  assert "7. 100-step bar under hostcall.jit / tqdm's own bar" in proc.stdout
  assert "SlowDispatchWarning" not in proc.stderr
  assert "9. interruptible loop, no bar (Ctrl-C, time limit)" in proc.stdout
  assert "9. ... stopped by a host predicate (stop_when)" in proc.stdout
  assert "10. grad_callback a step under grad, async" in proc.stdout
  # Measured where MLflow is installed, else a row that says how to.
  assert "11. per-step metrics, MLflow writer" in proc.stdout
  assert "12. one callback a call, hostcall.jit" in proc.stdout
  assert ("13. first call (compile) of a step logging 1000 values"
          in proc.stdout)
  # Issue 55: several calls in one step, against the sum of each alone.
  assert "14. 2 calls a step: hp+hc" in proc.stdout
  assert "14. 10 calls a step: hp+hc+jp+log+hc+hp+log+jp+hc+jc" in proc.stdout
  rows = json.loads((tmp_path / "latest.json").read_text())["rows"]
  assert any(r["row"].startswith("7. progress bar") for r in rows)


def test_benchmark_rows_of_one_group(tmp_path):
  proc = _hostcall("bench", "--smoke", "--rows", "compile time",
                   "--out", str(tmp_path))
  assert proc.returncode == 0, proc.stderr[-3000:]
  written = json.loads((tmp_path / "latest.json").read_text())
  assert written["groups"] == ["compile time"]
  rows = [r["row"] for r in written["rows"]]
  # The plain scan every ratio is against, and the group's rows alone.
  assert rows[0] == "no callback (64x64 matmul step)"
  assert len(rows) > 1 and all(r.startswith("13.") for r in rows[1:])


def test_benchmark_rows_of_an_unknown_group_exit_2_naming_the_groups():
  proc = _hostcall("bench", "--smoke", "--rows", "mixed")
  assert proc.returncode == 2 and proc.stdout == ""
  assert ("argument --rows: expected one of 'default tap', " in proc.stderr
          and "'mixed calls'; got 'mixed'" in proc.stderr)
  assert "Traceback" not in proc.stderr


def test_make_bench_script_is_the_same_benchmark(tmp_path):
  # An explicit --out wins over the script's benchmarks/results, which a
  # smoke run must not overwrite.
  proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"),
                         "--smoke", "--out", str(tmp_path)],
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "7. progress bar (hostcall.progress.scan)" in proc.stdout
  assert f"results: {tmp_path / 'latest.json'}" in proc.stdout


def test_bench_outside_a_source_checkout_says_where_the_benchmarks_are(
    tmp_path, monkeypatch, capsys):
  # The harness is not installed with the package: where no checkout is
  # found (a wheel's site-packages, another directory), it says so.
  import hostcall
  from hostcall.cli import main
  monkeypatch.setattr(hostcall, "__file__",
                      str(tmp_path / "site" / "hostcall" / "__init__.py"))
  monkeypatch.chdir(tmp_path)
  assert main(["bench", "--smoke"]) == 2
  err = capsys.readouterr().err
  assert "benchmarks/harness.py" in err and "make bench" in err
  installed = pathlib.Path(sys.modules["hostcall.cli"].__file__).parent
  assert not list(installed.glob("bench_*.py"))


def test_console_script_is_installed():
  script = pathlib.Path(sys.executable).parent / "hostcall"
  proc = subprocess.run([str(script), "info"], capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.startswith("hostcall 0.1.0\n")


def _run(args, env, cwd=None):
  import os
  return subprocess.run(args, capture_output=True, text=True, timeout=300,
                        cwd=cwd, env={**os.environ, **env})


def test_info_says_why_a_source_tree_has_no_native_extension(tmp_path):
  # hostcall imported from the source tree, never installed (``python -S``:
  # no .pth file, so no editable install's redirection; jax from
  # site-packages): info says so, names the fix and builds nothing.
  env = {"PYTHONPATH": ":".join([str(ROOT / "src"),
                                 *site.getsitepackages()]),
         "HOSTCALL_NATIVE": "1"}
  proc = _run([sys.executable, "-S", "-m", "hostcall", "info"], env,
              cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-2000:]
  src = ROOT / "src" / "hostcall"
  why = (f"hostcall's native extension hostcall._native is not installed "
         f"with the hostcall imported from {src}; installing hostcall "
         "builds it (`pip install .`, or `pip install -e .` in a source "
         "tree)")
  assert f"\nasync taps: unavailable ({why})\n" in proc.stdout
  assert f"\nnative extension: not installed ({why})\n" in proc.stdout
  assert list(tmp_path.iterdir()) == []

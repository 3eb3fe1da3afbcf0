"""In a real Jupyter kernel, each cell's host output lands in that cell."""

import os
import pathlib
import sys

import nbclient
import nbformat

ROOT = pathlib.Path(__file__).parent.parent

CELLS = [
    # 0: a progress bar without a barrier at the end of the cell
    """
import io, time, jax, jax.numpy as jnp, numpy as np, hostcall
from hostcall import host_callback as hcb
bar = io.StringIO()
def step(c, _):
  return c + 1.0, None
out = jax.jit(lambda: hostcall.progress.scan(step, 0.0, length=300, file=bar,
                                             desc="fit", every=10))()
print("cell0 result", float(out[0]))
""",
    # 1: what cell 0's bar drew was complete when cell 0 ended
    """
print("cell1 bar complete:", "300/300" in bar.getvalue())
""",
    # 2: debug_print inside jit
    """
jax.jit(lambda x: hostcall.debug_print("cell2 debug_print {}", x))(2)
""",
    # 3: id_print, synchronous, under vmap
    """
_ = jax.jit(jax.vmap(lambda x: hcb.id_print(x, what="cell3")))(jnp.arange(2.0))
""",
    # 4: asynchronous taps that the host delivers slowly
    """
def slow(a, t):
  time.sleep(0.05)
  print("cell4 async tap", int(a))
_ = jax.jit(lambda: jax.lax.fori_loop(0, 5, lambda i, c: (
    hcb.id_tap(slow, i, delivery="async"), c)[1], 0))()
""",
    # 5: a cell that prints nothing of hostcall's
    """
print("cell5 plain")
""",
    # 6: metrics rows are on disk when the cell ends
    """
import tempfile
root = tempfile.mkdtemp()
run = hostcall.metrics.Run("nb", root=root)
_ = jax.jit(lambda: [run.log(i, v=i * 1.0) for i in range(3)])()
""",
    """
print("cell7 rows", open(f"{root}/nb/metrics.jsonl").read().count("step"))
""",
]


def _text(cell) -> str:
  parts = []
  for output in cell.outputs:
    if output.get("output_type") == "stream":
      parts.append(output["text"])
    elif "data" in output and "text/plain" in output["data"]:
      parts.append(output["data"]["text/plain"])
  return "".join(parts)


def _executed(cells, tmp_path):
  """A notebook of ``cells`` run in a real kernel of this environment."""
  notebook = nbformat.v4.new_notebook()
  notebook.cells = [nbformat.v4.new_code_cell(c.strip()) for c in cells]
  env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
  client = nbclient.NotebookClient(
      notebook, timeout=240, kernel_name="python3",
      resources={"metadata": {"path": str(tmp_path)}})
  client.km = client.kernel_manager_class(kernel_name="python3")
  client.km.kernel_spec.argv[0] = sys.executable  # this environment's kernel
  client.km.kernel_spec.env.update(env)
  client.execute()
  return notebook


def test_each_cells_host_output_lands_in_that_cell(tmp_path):
  notebook = _executed(CELLS, tmp_path)
  texts = [_text(cell) for cell in notebook.cells]
  assert "cell0 result 300.0" in texts[0]
  assert texts[1].strip() == "cell1 bar complete: True"
  assert texts[2] == "cell2 debug_print 2\n"
  assert texts[3] == ("transforms: [('batch', {'batch_dims': (0,)})] what: "
                      "cell3\n[0. 1.]\n")
  assert texts[4] == "".join(f"cell4 async tap {i}\n" for i in range(5))
  assert texts[5] == "cell5 plain\n"
  assert texts[7] == "cell7 rows 3\n"


_LONG_LOOP = """
import jax, jax.numpy as jnp, numpy as np, hostcall
from hostcall import host_callback as hcb

def step(i, c):
  c = jnp.sin(c) * 0.5 + 1.0
  jax.lax.cond(i == 5000, lambda: hcb.id_tap(
      lambda *_: print("started", flush=True), 0, delivery="async"),
      lambda: 0)
  return c

n = 10**9
out = jax.jit(lambda x: hostcall.progress.fori_loop(
    0, n, step, x, every=20_000, interruptible=True, disable=True))(
        jnp.zeros(8))
steps = int(out.steps)
ref = jax.lax.fori_loop(0, steps, lambda i, c: jnp.sin(c) * 0.5 + 1.0,
                        jnp.zeros(8))
print("result", hostcall.control.reason_name(out.reason), 5000 < steps < n,
      bool(np.array_equal(out.value, ref)))
"""


def test_the_kernels_interrupt_button_stops_a_loop_and_keeps_its_state():
  from jupyter_client import KernelManager
  km = KernelManager(kernel_name="python3")
  km.kernel_spec.argv[0] = sys.executable  # this environment's kernel
  km.kernel_spec.env.update({**os.environ, "PYTHONPATH": str(ROOT / "src")})
  km.start_kernel()
  kc = km.client()
  kc.start_channels()
  try:
    kc.wait_for_ready(timeout=120)
    msg_id = kc.execute(_LONG_LOOP)
    text, interrupted = "", False
    while True:
      msg = kc.get_iopub_msg(timeout=240)
      if msg["parent_header"].get("msg_id") != msg_id:
        continue
      if msg["msg_type"] == "stream":
        text += msg["content"]["text"]
        if "started" in text and not interrupted:
          km.interrupt_kernel()  # what the notebook's interrupt button does
          interrupted = True
      elif msg["msg_type"] == "error":
        text += "\n".join(msg["content"]["traceback"])
      elif (msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"):
        break
  finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
  assert interrupted, text
  assert "result interrupted True True" in text, text
  assert "KeyboardInterrupt" not in text


_BAR_CELLS = [
    # 0: a bar over a Python loop with a live loss, a compiled loop inside
    """
import jax, jax.numpy as jnp, hostcall
step = jax.jit(lambda x: hostcall.progress.scan(
    lambda c, _: (c * 0.9, None), x, length=50, desc="inner")[0])
x = jnp.float32(1.0)
for i in hostcall.progress.trange(5, desc="outer"):
  x = step(x)
print("loop done", round(float(x), 6))
""",
    # 1: a bar in a cell of its own, closed, over an iterable
    """
total = sum(hostcall.progress.tqdm(range(7), desc="seven"))
print("sum", total)
""",
]


def _widgets(cell) -> list:
  return [output for output in cell.outputs
          if "application/vnd.jupyter.widget-view+json"
          in output.get("data", {})]


def test_python_loop_bars_are_widgets_in_their_own_cell(tmp_path):
  notebook = _executed(_BAR_CELLS, tmp_path)
  first, second = notebook.cells
  # Each cell draws its bars as widgets, in that cell: the outer bar (and
  # the compiled loop's, nested under it) in the first, "seven" in the
  # second.
  assert _widgets(first) and _widgets(second)
  assert "loop done" in _text(first) and "sum 21" in _text(second)
  # The widgets' final state (what the notebook shows): the loops' counts.
  state = notebook.metadata["widgets"][
      "application/vnd.jupyter.widget-state+json"]["state"]
  texts = " ".join(str(model["state"].get("value", ""))
                   for model in state.values())
  assert "7/7" in texts and "5/5" in texts, texts

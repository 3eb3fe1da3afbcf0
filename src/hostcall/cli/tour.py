"""A tour of what hostcall does: each step a tiny snippet, shown, then run."""

from __future__ import annotations

import textwrap

HELP = ("a tour of hostcall: callbacks, hostcall.jit, progress bars, "
        "metrics, steered loops, gradients and the legacy taps")

#: (title, snippet): each runs after the ones before it, in one namespace.
STEPS = [
    ("JAX's callbacks, renamed: hostcall.pure_callback and the others", """
        import jax, jax.numpy as jnp, numpy as np, hostcall
        f = jax.jit(lambda x: hostcall.pure_callback(
            np.sort, jax.ShapeDtypeStruct(x.shape, x.dtype), x))
        print("sorted on the host:", f(jnp.array([3.0, 1.0, 2.0])))
        """),
    ("hostcall.jit: a Python loop whose step prints without waiting", """
        @hostcall.jit
        def step(x):
          hostcall.debug_print("step sees x = {x}", x=x)
          return x * 2
        x = jnp.float32(1.0)
        for _ in range(3):
          x = step(x)        # returns at once; the host prints in order
        hostcall.barrier()   # waits for the prints
        print("x =", x)
        """),
    ("jax.jit or hostcall.jit: the same logging step, timed in a loop",
     """
        import time
        log = hostcall.metrics.Run("tour-loop", writers=["memory"])
        def plain_step(w):
          return w * 0.99
        def train_step(w):
          log.log({"loss": jnp.sum(w * w)})  # one metrics row a call
          return w * 0.99
        for name, step in (
            ("jax.jit, no host call", jax.jit(plain_step)),
            ("jax.jit with run.log", jax.jit(train_step)),
            ("hostcall.jit with run.log", hostcall.jit(train_step))):
          w = step(jnp.ones(16))  # compiled
          hostcall.barrier()
          start = time.perf_counter()
          for _ in range(300):
            w = step(w)       # under jax.jit, hostcall says once that it
          hostcall.barrier()  # sees this loop (a SlowDispatchWarning)
          spent = (time.perf_counter() - start) / 300 * 1e6
          print(f"{name}: {spent:.0f} us a step")
        log.close()
        """),
    ("progress bars for compiled loops and for Python loops", """
        import io
        out = io.StringIO()  # (a terminal or notebook without file=)
        run = jax.jit(lambda: hostcall.progress.scan(
            lambda c, _: (c + 1, None), 0, length=500, file=out, desc="scan"))
        for _ in hostcall.progress.trange(2, desc="calls", file=out):
          run()
        print(out.getvalue().split("\\r")[-1].strip())
        """),
    ("metrics: rows logged from inside jit", """
        log = hostcall.metrics.Run("tour", writers=["memory"])
        fit = jax.jit(lambda w: jax.lax.fori_loop(0, 3, lambda i, w: (
            log.log({"loss": jnp.sum(w * w)}, step=i), w * 0.5)[1], w))
        fit(jnp.ones(2))
        print([(row["step"], float(row["loss"])) for row in log.records()])
        log.close()
        """),
    ("steering: a compiled loop stopped by a host predicate", """
        out = jax.jit(lambda: hostcall.control.while_loop(
            lambda c: c < 10**9, lambda c: c + 1, 0, every=100,
            stop_when=lambda status: status.steps >= 1000))()
        print("stopped:", bool(out.stopped), "after", int(out.steps),
              "steps, by", hostcall.control.reason_name(out.reason))
        """),
    ("gradients through host functions", """
        sin = lambda x: hostcall.pure_callback(
            np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
            vjp=lambda p, ct: (np.cos(p[0]) * ct,))
        print("d/dx sin(x) at 0 =", jax.grad(lambda x: sin(x).sum())(
            jnp.zeros(2)))
        """),
    ("the legacy jax.experimental.host_callback, restored", """
        from hostcall import host_callback as hcb
        jax.jit(jax.vmap(lambda x: hcb.id_print(x * x, what="x^2")))(
            jnp.array([2.0, 3.0]))
        hcb.barrier_wait()
        """),
]


def add_arguments(parser) -> None:
  del parser  # no options


def run(args=None) -> int:
  del args
  namespace: dict = {}
  for number, (title, snippet) in enumerate(STEPS, 1):
    code = textwrap.dedent(snippet).strip("\n")
    print(f"\n== {number}. {title}")
    print(textwrap.indent(code, ">>> ", lambda line: True).replace(
        ">>>  ", "...  ").replace(">>> \n", "\n"))
    print("--")
    exec(compile(code, f"<hostcall tour, step {number}>", "exec"), namespace)
  return 0

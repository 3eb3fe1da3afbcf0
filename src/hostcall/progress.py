"""Progress bars for loops inside compiled JAX programs (tqdm underneath).

Wrap the loop:

```python
carry, ys = hostcall.progress.scan(step, init, xs, desc="fit")
carry = hostcall.progress.fori_loop(0, n, body, init)
carry = hostcall.progress.while_loop(cond, body, init)
```

show the step's values on the loop's bar, from its body:

```python
def step(state, batch):
  state, loss = train_step(state, batch)
  hostcall.progress.set_postfix(loss=loss)
  return state, None
```

or decorate a body whose loop call you cannot change:

```python
jax.lax.scan(hostcall.progress.track(step, total=n), init, xs)
```

and draw a Python loop's bar (tqdm's API) whose postfix takes JAX arrays
without waiting for them:

```python
for i in (bar := hostcall.progress.trange(steps)):
  state, loss = train_step(state)
  bar.set_postfix(loss=loss)
```
"""

from hostcall._apps.progress.compiled import (close_all, fori_loop, scan, track,
                                     while_loop)
from hostcall._apps.progress.postfix import set_postfix
from hostcall._apps.progress.python_loops import tqdm, trange

__all__ = ["close_all", "fori_loop", "scan", "set_postfix", "tqdm", "track",
           "trange", "while_loop"]

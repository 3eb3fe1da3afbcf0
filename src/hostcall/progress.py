"""Progress bars for loops inside compiled JAX programs (tqdm underneath).

Wrap the loop:

```python
carry, ys = hostcall.progress.scan(step, init, xs, desc="fit")
carry = hostcall.progress.fori_loop(0, n, body, init)
carry = hostcall.progress.while_loop(cond, body, init)
```

or decorate a body whose loop call you cannot change:

```python
jax.lax.scan(hostcall.progress.track(step, total=n), init, xs)
```
"""

from hostcall._apps.progress import (close_all, fori_loop, scan, track,
                                     while_loop)

__all__ = ["close_all", "fori_loop", "scan", "track", "while_loop"]

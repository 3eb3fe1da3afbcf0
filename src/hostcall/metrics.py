"""Metric logging from inside compiled JAX programs.

    run = hostcall.metrics.Run("fit")             # runs/fit/metrics.jsonl
    def step(params, batch):
      ...
      run.log(i, loss=loss, grad_norm=norm)        # inside jit/scan/vmap/grad
    hostcall.barrier()                             # or run.flush()
    hostcall.metrics.read("runs/fit")              # a pandas DataFrame
    hostcall.metrics.plot("runs/fit")              # runs/fit/metrics.png
"""

from hostcall._apps.metrics import Run, read
from hostcall._apps.plot import plot
from hostcall._apps.writers import (Block, CsvWriter, IncompleteRowsWarning,
                                    JsonlWriter, MemoryWriter,
                                    TensorBoardWriter, Writer)

__all__ = ["Block", "CsvWriter", "IncompleteRowsWarning", "JsonlWriter",
           "MemoryWriter", "Run", "TensorBoardWriter", "Writer", "plot",
           "read"]

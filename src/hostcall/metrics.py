"""Metric logging from inside compiled JAX programs.

    run = hostcall.metrics.Run("fit")             # runs/fit/metrics.jsonl
    def step(params, batch):
      ...
      run.log(i, loss=loss, grad_norm=norm)        # inside jit/scan/vmap/grad
      run.log({"loss": loss}, step=i)              # W&B's form works too
    hostcall.barrier()                             # or run.flush()
    hostcall.metrics.load("runs/fit")["loss"]      # NumPy arrays, and config
    hostcall.metrics.read("runs/lr-*")             # a pandas DataFrame, run column
    hostcall.metrics.plot("runs/fit")              # runs/fit/metrics.png

Writers: ``"jsonl"`` (the default), ``"csv"``, ``"tensorboard"``,
``"memory"``, ``"mlflow"`` and ``"wandb"`` by name, a CLU ``MetricWriter``
or a ``Writer`` subclass of one's own.
"""

from hostcall._apps.metrics.block import Block
from hostcall._apps.metrics.clu import CluWriter
from hostcall._apps.metrics.config import read_config
from hostcall._apps.metrics.csv import CsvWriter
from hostcall._apps.metrics.jsonl import JsonlWriter
from hostcall._apps.metrics.memory import MemoryWriter
from hostcall._apps.metrics.mlflow import MlflowWriter
from hostcall._apps.metrics.plot import plot
from hostcall._apps.metrics.reading import IncompleteRowsWarning, load, read
from hostcall._apps.metrics.run import Run
from hostcall._apps.metrics.table import Table
from hostcall._apps.metrics.tensorboard import TensorBoardWriter
from hostcall._apps.metrics.wandb import WandbWriter
from hostcall._apps.metrics.writer import Writer

__all__ = ["Block", "CluWriter", "CsvWriter", "IncompleteRowsWarning",
           "JsonlWriter", "MemoryWriter", "MlflowWriter", "Run", "Table",
           "TensorBoardWriter", "WandbWriter", "Writer", "load", "plot",
           "read", "read_config"]

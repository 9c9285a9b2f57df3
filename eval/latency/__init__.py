"""Timing: ``compress latency`` runs one process per model (``runs``) under its options (``config``), builds rows
from their results (``rows``) and renders them (``report``); the worker process (``worker``), what loads a folder for
timing (``backends``), what the products ran on (``kernels``), GEMM peaks (``peak``) and real-length batches
(``lengths``)."""

from compress.core.lazy import exports

__getattr__, __all__ = exports(__name__, {
    "measure_latency": "runs",
    "LatencyConfig": "config",
})

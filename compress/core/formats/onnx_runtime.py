"""The ``onnx`` format at run time: ``model.onnx`` in an ONNX Runtime session (fp32 or int8 graph), on CPU or CUDA.

Writing the graph is ``compress.core.formats.onnx``'s; this module only runs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from compress.core.errors import CompressError, foreign
from compress.core.formats.folder import ModelFolder
from compress.core.formats.layout import ONNX, ONNX_FILE
from compress.core.formats.load_checks import load_graph_runner
from compress.core.formats.runners import NumpyRunner


class OnnxRunner(NumpyRunner):
    """An ONNX Runtime session (all graph optimisations on; int64 numpy feeds)."""

    format = ONNX

    def __init__(self, path: Path, config, head: str, *, threads: int | None = None):
        self.threads = threads or torch.get_num_threads()
        super().__init__(path, config, head, ())
        self._make_session(["CPUExecutionProvider"])

    def _make_session(self, providers: list[str]) -> None:
        # deferred: a heavy import, paid only where it is used
        import onnxruntime as ort

        opts = ort.SessionOptions()
        # Fusions (attention, GELU, LayerNorm) happen here, at load: the file stays a plain graph.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1  # one forward at a time
        opts.log_severity_level = 3  # errors only
        try:
            session = ort.InferenceSession(str(self.path / ONNX_FILE), opts, providers=providers)
        except Exception as err:
            raise CompressError(f"ONNX Runtime cannot load {self.path / ONNX_FILE}: {foreign(err) or type(err).__name__}; "
                                "restore the folder's model.onnx, or export it again") from None
        # Hidden from nn.Module's registry: a session is not a submodule.
        object.__setattr__(self, "session", session)
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = tuple(o.name for o in session.get_outputs())
        self.output_list = list(self.output_names)  # what session.run takes, built once

    def set_device(self, device: torch.device) -> None:
        # deferred: a heavy import, paid only where it is used
        import onnxruntime as ort

        if device.type == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise CompressError(f"{self.path}: this onnxruntime build has no CUDA execution provider; use --device cpu")
            if self.device.type != "cuda":
                self._make_session(["CUDAExecutionProvider", "CPUExecutionProvider"])
        elif device.type != "cpu":
            raise CompressError(f"{self.path}: ONNX Runtime runs on cpu or cuda, not {device.type}")
        elif self.device.type != "cpu":
            self._make_session(["CPUExecutionProvider"])
        self.device = device

    def feeds(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # Only the inputs the graph declares (an export may drop an unused token_type_ids).
        return {name: np.ascontiguousarray(inputs[name], dtype=np.int64) for name in self.input_names}

    def call(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.output_list, feeds)


def load_onnx(folder: ModelFolder, options: dict[str, Any]):
    """Load an ``onnx`` directory as an :class:`OnnxRunner`."""
    return load_graph_runner(folder, options, ONNX, ONNX_FILE, OnnxRunner)

"""The base of every non-PyTorch model runner: a stored model behind the Hugging Face call convention.

A runner is a ``torch.nn.Module`` without parameters: called with ``input_ids`` /
``attention_mask`` / ``token_type_ids`` (batch, seq) tensors it returns the head's transformers
output object (``.logits``, ``.start_logits`` / ``.end_logits``, ``.last_hidden_state``) holding
torch tensors; it carries ``.config``, ``.head`` and a ``device``. :class:`NumpyRunner` is the base
of the runtimes fed numpy arrays (ONNX Runtime, OpenVINO). Each format's runner lives in its own
module (``onnx_runtime``, ``openvino_runtime``, ``pt2``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import modeling_outputs as mo

from compress.core.errors import CompressError
from compress.core.model.heads import get_head

INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the order exported graphs take (those of them the family has)


class Runner(torch.nn.Module):
    """A stored model behind the Hugging Face call convention; a Module without parameters.

    Subclasses implement :meth:`run` on a dict of int64 tensors (batch, seq) and return
    the output tensors in the order of ``output_names``.
    """

    format = "?"

    def __init__(self, path: Path, config, head: str, output_names: tuple[str, ...]):
        super().__init__()
        self.path = Path(path)
        self.config = config
        self.head = head
        self.output_names = tuple(output_names)
        self.device = torch.device("cpu")

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **unused):
        """Run on (batch, seq) token tensors; a transformers output object holding torch tensors."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        outputs = self.run(inputs)
        values = {name: value.to(self.device) for name, value in zip(self.output_names, outputs)}
        return getattr(mo, get_head(self.head).output_class)(**values)  # the head's transformers output object

    def run(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def to(self, *args, **kwargs):
        """Move to a device the runtime supports; refuse casts (the stored precision is the model)."""
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None and dtype != torch.float32:
            raise CompressError(f"{self.path} is a {self.format} model and runs in its stored precision; it cannot be cast to {dtype}")
        if device is not None:
            self.set_device(torch.device(device))
        return self

    def set_device(self, device: torch.device) -> None:
        if device.type != "cpu":
            raise CompressError(f"{self.path} is a {self.format} model, which runs on the CPU only; use --device cpu")
        self.device = device

    def extra_repr(self) -> str:
        return f"format={self.format}, head={self.head}, path={self.path}"


class NumpyRunner(Runner):
    """A runtime fed numpy arrays: :meth:`run` is :meth:`feeds` then :meth:`call`.

    The two halves exist apart for timing: ``compress latency`` builds each batch's feeds
    once, outside the timed region, and times :meth:`call` alone, the runtime's own work
    as a server holding numpy inputs would pay it. On a 2-layer int8 student at batch 1 on
    SST-2 dev sentences the wrapping around it (tensor conversions, the transformers output
    object, the module call) cost 0.05-0.06 ms of a 0.6-1.0 ms call
    (bench/results/2026-11-27/call-overhead).
    """

    def feeds(self, inputs: dict[str, np.ndarray]) -> Any:
        """``inputs`` ((batch, seq) integer arrays by name) in the form :meth:`call` takes."""
        raise NotImplementedError  # pragma: no cover - abstract

    def call(self, feeds: Any) -> list[np.ndarray]:
        """One forward on :meth:`feeds`'s result: arrays in ``output_names`` order, owned by the caller."""
        raise NotImplementedError  # pragma: no cover - abstract

    def run(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        arrays = {name: value.detach().cpu().numpy() for name, value in inputs.items()}
        return [torch.from_numpy(out) for out in self.call(self.feeds(arrays))]

"""The record between the int8 stage and its backends: a :class:`Job` (what to quantize, where, with which config).

run.py builds the job and picks the backend (``compress.quantize.config.BACKENDS``); each
backend module (torch, onnxruntime, inc, openvino) reads the job and writes its files; the
guards (``compress.quantize.checks``) score the result against the same job.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compress.core.data.tasks import Task
from compress.quantize.calibration import Calibration
from compress.quantize.config import QuantizeConfig


@dataclass
class Job:
    """What a backend needs (the parent, where to write, the config, calibration inputs), and the guards after it."""

    parent_dir: Path
    out: Path  # the temporary output directory
    cfg: QuantizeConfig
    head: str
    reference: Any  # the fp32 parent as loaded (torch model, or ONNX runner)
    calibration: Calibration
    # The task and its dev data, for a backend that scores candidates itself (openvino's accuracy control) and the guard.
    task: Task | None = None
    tokenizer: Any = None
    dev: dict[str, Any] | None = None  # split name -> raw dev examples, as the accuracy guard scores them
    max_length: int | None = None

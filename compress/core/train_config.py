"""The training loop's options (:class:`TrainConfig`), nested in every training stage's config.

Kept apart from :mod:`compress.core.train` (torch, Accelerate) so that a command's flags and its config checks
cost no heavy import: ``compress teacher finetune --help`` and a refused option answer at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from compress.core.config import SEEDS, option
from compress.core.errors import CompressError


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = option(3, "passes over the training data")
    max_steps: int | None = option(None, "stop after this many optimizer steps (overrides --epochs)")
    batch_size: int = option(32, "global batch: examples per optimizer step over all processes")
    grad_accum: int = option(1, "split each process's share of a batch into this many micro-batches")
    lr: float = option(2e-5, "peak learning rate (AdamW)")
    weight_decay: float = option(0.01, "AdamW weight decay (not applied to biases and LayerNorm)")
    adam_beta1: float = option(0.9, "AdamW beta1")
    adam_beta2: float = option(0.999, "AdamW beta2")
    adam_eps: float = option(1e-6, "AdamW epsilon")
    warmup_ratio: float = option(0.1, "fraction of steps with linear warm-up (then linear decay to 0)")
    warmup_steps: int | None = option(None, "warm-up steps (overrides --warmup-ratio)")
    max_grad_norm: float = option(1.0, "clip the gradient norm to this (0: no clipping)")
    precision: Literal["fp32", "bf16", "fp16"] = option("fp32", "fp32, or bf16/fp16 mixed precision")
    seed: int = option(42, "seed for initialisation, data order and dropout", bounds=SEEDS)
    eval_every: int | None = option(None, "evaluate every N steps (default: at the end of each epoch)")
    save_every: int | None = option(None, "checkpoint every N steps (default: at the end of each epoch)")
    keep_checkpoints: int = option(2, "checkpoints kept for --resume (the newest ones)")
    log_every: int = option(20, "record the running loss every N steps (a log line and the history in metrics.json)")
    group_by_length: bool = option(True, "batch examples of similar length together (less padding; order still random)")
    device: str = option("auto", "auto, cpu or cuda")

    def validate(self) -> None:
        for name in ("epochs", "batch_size", "grad_accum", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise CompressError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise CompressError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise CompressError(f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio}")
        for name in ("max_steps", "eval_every", "save_every", "warmup_steps"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "warmup_steps" else 1):
                raise CompressError(f"--{name.replace('_', '-')} must be positive, got {value}")
        if self.batch_size % self.grad_accum:
            raise CompressError(f"--batch-size {self.batch_size} is not divisible by --grad-accum {self.grad_accum}")
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise CompressError(f"unknown --device {self.device!r}; use auto, cpu or cuda")
        if self.device.startswith("cuda"):
            # deferred: torch is heavy, and only a CUDA device needs it this early
            import torch

            if not torch.cuda.is_available():  # as eval refuses it: never train elsewhere silently
                raise CompressError(f"--device {self.device} requested but CUDA is not available; use --device cpu (or auto)")

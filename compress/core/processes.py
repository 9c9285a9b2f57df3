"""The processes of a run: Accelerate's process group, rank 0 first or alone, the Accelerator a training run uses.

Single-process runs go through the same calls (rank 0 of one), so a stage never asks
whether it is distributed: it writes outputs where :func:`is_main_process` holds and
lets rank 0 build a shared cache first inside :func:`main_process_first`.
"""

from __future__ import annotations

import os

import torch

from compress.core.errors import CompressError


def make_accelerator(precision: str, device: str):
    """The Accelerator of one training run: mixed precision, CPU or GPU, data-parallel over the process group."""
    # deferred: a heavy import, paid only where it is used
    from accelerate import Accelerator

    # deferred: a heavy import, paid only where it is used
    from accelerate.state import AcceleratorState

    if precision == "fp16" and (device == "cpu" or not torch.cuda.is_available()):
        raise CompressError("--precision fp16 needs a CUDA GPU; on a CPU use bf16 or fp32")
    # One Accelerator per run: reset the mixed-precision state a previous run in this
    # process left behind (the process group, if any, is kept).
    AcceleratorState._reset_state(reset_partial_state=False)
    # deferred: a heavy import, paid only where it is used
    from accelerate.utils import DistributedDataParallelKwargs

    mixed = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[precision]
    # Some stages train parameters that a given step does not use (a classifier during
    # TinyBERT's intermediate stage): data-parallel training must tolerate that.
    ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
    state = distributed_state(device)  # the process group first, with the right CPU flag
    return Accelerator(mixed_precision=mixed, cpu=state.device.type == "cpu", kwargs_handlers=[ddp])


def distributed_state(device: str = "auto"):
    """The process group of this run (created on first use from torchrun/accelerate's environment).

    Accelerate sets up multi-process CPU training (gloo) only when told the run is on a
    CPU, so the flag is decided here once, for every caller.
    """
    # deferred: a heavy import, paid only where it is used
    from accelerate import PartialState

    cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    return PartialState(cpu=cpu)


def main_process_first():
    """A context in which rank 0 runs first and the others wait (e.g. to build a shared cache)."""
    return distributed_state().main_process_first()


def is_main_process() -> bool:
    """True on the process that writes outputs (rank 0), also outside distributed runs."""
    return int(os.environ.get("RANK", "0")) == 0

"""The ``inc`` int8 backend: Intel Neural Compressor 3.x static PT2E, and quantization-aware training on the same graph.

Static post-training quantization on a ``torch.export`` (PT2E) graph with dynamic batch and
sequence dimensions, int8 weights folded in, saved with ``torch.export.save`` as ``model.pt2``
(format ``inc-pt2e``); the runtime compiles it with inductor freezing, without which it is not
faster than fp32, one static graph per padded input shape
(``compress.core.formats.pt2.padded_shape``). Its ``qat`` scheme is quantization-aware
training on the same graph and the same x86 inductor int8 scheme (torchao's
``prepare_qat_pt2e``; INC 3.x has no PT2E QAT of its own): fake-quantized weights and
activations are trained for ``qat_steps`` to match the fp32 parent's outputs on the task's
training inputs (logit matching, no labels needed), then converted like the static result.
Embeddings stay fp32.
"""

from __future__ import annotations

import copy
import itertools
import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch.export import Dim

from compress.core.errors import CompressError, reason
from compress.core.formats.onnx import _Positional, copy_sidecars
from compress.core.formats.pt2 import PT2_FILE
from compress.core.logs import errors_only
from compress.core.model.heads import HEADS
from compress.core.model.structure import config_sizes, input_names
from compress.quantize.job import Job


def quantize_inc(job: Job) -> dict[str, Any]:
    """Neural Compressor 3.x static PT2E: export, prepare, calibrate, convert (int8 weights folded), save."""

    positional = _Positional(copy.deepcopy(job.reference), HEADS[job.head].outputs)
    wrapper, names = positional.module, positional.inputs
    example = job.calibration.example(names)
    batch = Dim("batch", min=1)
    seq = Dim("seq", min=2, max=config_sizes(job.reference.config).max_positions)
    dynamic = tuple({0: batch, 1: seq} for _ in names)  # one per positional input
    with quiet_inc():
        # deferred: a heavy import, paid only where it is used
        from neural_compressor.torch.algorithms.pt2e_quant.core import W8A8PT2EQuantizer

        # deferred: a heavy import, paid only where it is used
        from neural_compressor.torch.export import export

        # deferred: a heavy import, paid only where it is used
        from neural_compressor.torch.quantization import get_default_static_config, prepare

        try:
            exported = export(wrapper, example, dynamic_shapes=dynamic)
        except RuntimeError as err:
            raise CompressError(f"Neural Compressor could not export the model to a PT2E graph: {reason(err)}") from None
        if job.cfg.scheme == "qat":
            converted, extra = _qat_pt2e(exported, wrapper, job)
        else:
            qconfig = get_default_static_config()
            prepared = prepare(exported, qconfig)
            with torch.no_grad():
                for inputs in job.calibration.tensors(names):
                    prepared(*inputs)  # observers record activation ranges
            # INC's convert() does not pass fold_quantize on, which would leave fp32 weights
            # behind q/dq nodes ("int8" stored in fp32); its own quantizer folds them to int8.
            converted = W8A8PT2EQuantizer(qconfig).convert(prepared, fold_quantize=True)
            extra = {"inc_config": qconfig.to_dict()}
        drop_unused_parameters(converted)
        program = torch.export.export(converted, example, dynamic_shapes=dynamic)
    torch.export.save(program, str(job.out / PT2_FILE))
    copy_sidecars(job.parent_dir, job.out)
    return {**extra, "outputs": list(HEADS[job.head].outputs)}


def _qat_pt2e(exported, wrapper, job: Job) -> tuple[Any, dict[str, Any]]:
    """Fake-quantize the exported graph, train it to match the fp32 outputs, convert to int8.

    The observers first see every training batch once (the static calibration), then
    are frozen: moving ranges would coarsen the grid as batches vary and undo training.
    The loss is the mean squared error between the fake-quantized and the fp32 outputs
    (every output of the head: logits, or start and end logits), averaged over outputs;
    gradients pass the rounding by the straight-through estimator. The graph was
    exported in eval mode, so no dropout is in it.
    """
    # deferred: a heavy import, paid only where it is used
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e

    # deferred: a heavy import, paid only where it is used
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_qat=True))
    prepared = prepare_qat_pt2e(exported, quantizer)
    batches = list(job.calibration.tensors(input_names(job.reference)))
    with torch.no_grad():
        targets = [tuple(t.detach() for t in wrapper(*inputs)) for inputs in batches]  # fp32 parent's outputs
        for inputs in batches:  # start from the static result: observers see every batch once ...
            prepared(*inputs)
    for module in prepared.modules():  # ... then the ranges stay fixed while the weights learn around them
        if hasattr(module, "disable_observer"):
            module.disable_observer()
    def loss_of(index: int):
        outputs = prepared(*batches[index])
        return sum(torch.nn.functional.mse_loss(o.float(), t.float()) for o, t in zip(outputs, targets[index])) / len(outputs)

    def mean_loss() -> float:  # over every training batch: before vs after is a like-for-like comparison
        with torch.no_grad():
            return sum(float(loss_of(i)) for i in range(len(batches))) / len(batches)

    optimizer = torch.optim.AdamW(prepared.parameters(), lr=job.cfg.qat_lr, weight_decay=0.0)
    torch.manual_seed(job.cfg.seed)
    started, before = time.monotonic(), mean_loss()
    for _, index in zip(range(job.cfg.qat_steps), itertools.cycle(range(len(batches)))):
        loss = loss_of(index)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    after = mean_loss()
    converted = convert_pt2e(prepared, fold_quantize=True)
    return converted, {"qat": {"steps": job.cfg.qat_steps, "lr": job.cfg.qat_lr, "loss": "mse to fp32 outputs",
                               "loss_before": before, "loss_after": after, "seconds": round(time.monotonic() - started, 1),
                               "quantizer": "torchao X86InductorQuantizer (is_qat=True)"}}


def drop_unused_parameters(graph_module) -> list[str]:
    """Delete parameters no graph node reads (the fp32 originals of folded int8 weights); their names."""
    used = {node.target for node in graph_module.graph.nodes if node.op == "get_attr"}
    dropped = [name for name, _ in graph_module.named_parameters() if name not in used]
    for name in dropped:
        owner, _, leaf = name.rpartition(".")
        delattr(graph_module.get_submodule(owner) if owner else graph_module, leaf)
    return dropped


@contextmanager
def quiet_inc() -> Iterator[None]:
    """Neural Compressor logs every step at INFO on stderr; keep its errors only."""
    # deferred: a heavy import, paid only where it is used
    from neural_compressor.common.utils.logger import Logger

    with errors_only(Logger().get_logger()):  # the singleton resets the level when first created
        yield

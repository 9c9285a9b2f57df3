"""Export any model directory, pruned shapes included, to ONNX: deployable without this package.

The exporter traces the model as ``load_model`` rebuilt it, so per-layer head counts and
FFN widths survive (rebuilding from ``config.json`` alone, as generic exporters do,
would lose them). The graph takes the inputs the model's family takes (``input_ids``,
``attention_mask``, and ``token_type_ids`` except for DistilBERT and ModernBERT). The
output is a model directory like any other: ``model.onnx`` plus ``config.json``, the
tokenizer and ``compression.json`` (stage ``export``), and a sentence-transformers
folder's pooling files when the source is one. ``model.onnx`` stays at the root, the one place
every reader looks: sentence-transformers' ``backend="onnx"`` (before ``onnx/``), Text
Embeddings Inference (before ``onnx/model.onnx``), Optimum and ``runtime.load_model``.

A sequence-classification graph computes its last layer for the first token only (its
head reads nothing else; see ``first_token_only``): the same logits for less work. At batch
1 and 128 tokens on OpenVINO, a 2-layer int8 student's call took 29% less time, the
6-layer MiniLM teacher's fp32 call 12% less (bench/results/2026-11-28/first-token).

:func:`fuse_onnx` turns such a graph into ONNX Runtime's transformer-optimised one
(``onnxruntime.transformers.optimizer``): Attention, SkipLayerNormalization,
EmbedLayerNormalization and Gelu nodes of the ``com.microsoft`` domain, which ONNX Runtime
runs (and OpenVINO's ONNX reader reads), and it reports how many of each it fused.
"""

from __future__ import annotations

import shutil
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from compress.core.formats.artifacts import (
    clear_tokenizer_state,
    load_tokenizer,
    output_dir,
    save_tokenizer,
    saved_head,
)
from compress.core.formats.records import compression_record
from compress.core.formats.writes import write_json_atomic
from compress.core.preflight import require_model_dir
from compress.core.errors import CompressError
from compress.core.logs import quiet_root_logger
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import copy_sentence_files
from compress.core.model.heads import EXPORTABLE_HEADS, HEADS
from compress.core.model.structure import describe, first_token_only, input_names

INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # every input an exported graph may take, in order
# The fusions that make a graph "fused": at least one of them must fire (Gelu and EmbedLayerNormalization alone do not count).
CORE_FUSIONS = ("Attention", "MultiHeadAttention", "SkipLayerNormalization")
# ONNX Runtime's basic graph optimisations (constant folding) run before the Python fusions, as optimize_model does
# for BERT by default; higher levels would write CPU-specific nodes into the file.
FUSION_OPT_LEVEL = 1


class _Positional:
    """Call a Hugging Face model with positional inputs (those its family takes) and return a tuple of named outputs.

    ``first_token``: the model's head reads the first token only, so its last layer computes
    that token alone where its family can (:func:`first_token_only`, in place; ``describe``
    then records it).
    """

    def __init__(self, model, outputs: tuple[str, ...], *, first_token: bool = False):
        names = input_names(model)
        if first_token:
            first_token_only(model)

        class Wrapper(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, input_ids, attention_mask, token_type_ids=None):
                given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
                out = self.inner(**{name: given[name] for name in names})
                return tuple(getattr(out, name) for name in outputs)

        self.module = Wrapper(model).eval()
        self.inputs = names


def export_onnx(model_dir: str | Path, out: str | Path, *, opset: int = 17, overwrite: bool = False) -> Path:
    """Write ``out/model.onnx`` (dynamic batch and sequence axes) for the model in ``model_dir``."""

    model_dir = require_model_dir(model_dir)
    head = saved_head(model_dir)
    if head not in EXPORTABLE_HEADS:
        raise CompressError(f"ONNX export supports {', '.join(EXPORTABLE_HEADS)} models; {model_dir} is a {head} model")
    model = load_model(model_dir, attn_implementation="eager")  # plain ops: every ONNX runtime runs them
    tokenizer = load_tokenizer(model_dir)
    spec = HEADS[head]
    names = spec.outputs
    positional = _Positional(model, names, first_token=spec.first_token)
    wrapper, inputs = positional.module, positional.inputs
    example = tokenizer(["an example input", "a second, longer example input for tracing"], padding=True, return_tensors="pt")
    args = tuple(example[k] if k in example else torch.zeros_like(example["input_ids"]) for k in inputs)
    axes = {name: {0: "batch", 1: "sequence"} for name in inputs}
    # (batch, sequence[, width]) for an output per token; (batch, labels) for a sequence classifier's logits
    axes.update({name: {0: "batch", 1: "sequence"} if name in spec.per_token_outputs else {0: "batch"} for name in names})
    with output_dir(out, overwrite) as tmp:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer warnings about Python control flow on shapes
            torch.onnx.export(
                wrapper, args, str(tmp / "model.onnx"), input_names=list(inputs), output_names=list(names),
                dynamic_axes=axes, opset_version=opset, dynamo=False,
            )
        model.config.save_pretrained(tmp)
        save_tokenizer(tokenizer, tmp)
        copy_sentence_files(model_dir, tmp)  # a sentence-transformers folder stays one: pooling, Normalize
        record = compression_record(
            stage="export", method="onnx", parent=model_dir, structure=describe(model),
            config={"opset": opset, "inputs": list(inputs), "outputs": list(names)},
            extra={"format": "onnx", "backend": "onnxruntime", "head": head, "precision": "fp32"},
        )
        write_json_atomic(tmp / "compression.json", record)
        write_json_atomic(tmp / "metrics.json", {"results": []})
    return Path(out)


def copy_sidecars(source: Path, target: Path) -> None:
    """Copy config and tokenizer files from one model directory to another."""
    for path in source.iterdir():
        if path.is_file() and (path.name == "config.json" or "token" in path.name or path.name == "vocab.txt"):
            shutil.copy2(path, target / path.name)
    clear_tokenizer_state(target)  # a parent written before tokenizer state was cleared


def fuse_onnx(path: Path, structure: dict[str, Any], model_type: str, source: Path) -> dict[str, Any]:
    """Replace the fp32 graph at ``path`` by ONNX Runtime's transformer-optimised one; what fused and how.

    ``structure`` is the graph's (heads per layer, head size); ``model_type`` and ``source`` (the
    model folder it was made from) name it in a refusal. The optimizer's "bert" patterns
    cover the BERT-like families; it takes one head count, so it is given the most common
    one, and every fused Attention node then gets its own layer's count back from its weight
    width (:func:`set_attention_heads`): with per-layer heads the optimizer would otherwise fuse
    a 3-head layer as a 2-head one. Raises when neither Attention nor SkipLayerNormalization
    fused; the returned ``counts`` are the optimizer's own statistics (non-zero only).
    """
    # deferred: a heavy import, paid only where it is used
    from onnxruntime.transformers.optimizer import optimize_model

    heads = [h for h in structure["heads"] if h]
    num_heads = Counter(heads).most_common(1)[0][0] if heads else 0
    head_size = int(structure["head_size"])
    with quiet_root_logger():  # e.g. "input hidden size ... is not same as" on every pruned layer: expected here
        optimizer = optimize_model(str(path), model_type="bert", num_heads=num_heads, hidden_size=num_heads * head_size,
                                   opt_level=FUSION_OPT_LEVEL)
    corrected = set_attention_heads(optimizer.model, head_size)
    counts = {op: int(n) for op, n in optimizer.get_fused_operator_statistics().items() if n}
    if not any(counts.get(op) for op in CORE_FUSIONS):
        found = ", ".join(f"{n} {op}" for op, n in counts.items()) or "nothing"
        raise CompressError(
            f"ONNX Runtime's transformer optimizer fused no Attention and no SkipLayerNormalization in the {model_type} graph "
            f"of {source} (only {found}): its BERT patterns do not match this family's attention and residual "
            "LayerNorm subgraphs; export without --fuse (the plain graph, which ONNX Runtime still optimises when it loads it)"
        )
    optimizer.save_model_to_file(str(path))
    settings = {"optimizer": "onnxruntime.transformers.optimizer", "model_type": "bert", "num_heads": num_heads,
                "hidden_size": num_heads * head_size, "opt_level": FUSION_OPT_LEVEL, "attention_heads_corrected": corrected}
    return {"counts": counts, "settings": settings}


def format_fusion(counts: dict[str, int]) -> str:
    """The fused operators of an ONNX Runtime transformer-optimised graph (:func:`fuse_onnx`'s counts) as one line."""
    return "fused by ONNX Runtime's transformer optimizer: " + ", ".join(f"{op} {n}" for op, n in counts.items())


def set_attention_heads(model, head_size: int) -> int:
    """Give every fused attention node of ``model`` (an ONNX ModelProto, edited in place) the head count its Q width
    says (width / head size); the number of nodes changed. Pruning removes whole heads, so the head size is one."""
    initializers = {i.name: i for i in model.graph.initializer}
    changed = 0
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Attention" and node.input[1] in initializers:  # (input, qkv weight (in, q+k+v), ...)
            widths = attrs["qkv_hidden_sizes"].ints if "qkv_hidden_sizes" in attrs else None
            width = widths[0] if widths else initializers[node.input[1]].dims[1] // 3
        elif node.op_type == "MultiHeadAttention" and len(node.input) > 3 and node.input[3] in initializers:
            width = initializers[node.input[3]].dims[0] // 3  # (q, k, v, qkv bias (q+k+v,), ...)
        else:
            continue
        if "num_heads" in attrs and width % head_size == 0 and attrs["num_heads"].i != width // head_size:
            attrs["num_heads"].i = width // head_size
            changed += 1
    return changed

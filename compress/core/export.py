"""Export any model directory, pruned shapes included, to ONNX: deployable without this package.

The exporter traces the model as ``load_model`` rebuilt it, so per-layer head counts and
FFN widths survive (rebuilding from ``config.json`` alone, as generic exporters do,
would lose them). The graph takes the inputs the model's family takes (``input_ids``,
``attention_mask``, and ``token_type_ids`` except for DistilBERT and ModernBERT). The
output is a model directory like any other: ``model.onnx`` plus ``config.json``, the
tokenizer and ``compression.json`` (stage ``export``), and a sentence-transformers
folder's pooling files when the source is one.

A sequence-classification graph computes its last layer for the first token only (its
head reads nothing else; see ``first_token_only``): the same logits for less work. At batch
1 and 128 tokens on OpenVINO, a 2-layer int8 student's call took 29% less time, the
6-layer MiniLM teacher's fp32 call 12% less (bench/results/2026-11-28/first-token).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import torch

from compress.core.artifacts import (
    clear_tokenizer_state,
    compression_record,
    load_tokenizer,
    output_dir,
    require_model_dir,
    saved_head,
    save_tokenizer,
    write_json_atomic,
)
from compress.core.errors import CompressError
from compress.core.runtime import load_model
from compress.core.sentence import copy_sentence_files
from compress.core.structure import describe, first_token_only, input_names

INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # every input an exported graph may take, in order
OUTPUTS = {
    "sequence-classification": ("logits",),
    "token-classification": ("logits",),  # (batch, sequence, labels): every position keeps its output
    "question-answering": ("start_logits", "end_logits"),
    "base": ("last_hidden_state",),
    "masked-lm": ("logits",),
}
FIRST_TOKEN_HEADS = ("sequence-classification",)  # heads that read the first token's output only


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
    if head not in OUTPUTS:
        raise CompressError(f"ONNX export supports {', '.join(OUTPUTS)} models; {model_dir} is a {head} model")
    model = load_model(model_dir, attn_implementation="eager")  # plain ops: every ONNX runtime runs them
    tokenizer = load_tokenizer(model_dir)
    names = OUTPUTS[head]
    positional = _Positional(model, names, first_token=head in FIRST_TOKEN_HEADS)
    wrapper, inputs = positional.module, positional.inputs
    example = tokenizer(["an example input", "a second, longer example input for tracing"], padding=True, return_tensors="pt")
    args = tuple(example[k] if k in example else torch.zeros_like(example["input_ids"]) for k in inputs)
    axes = {name: {0: "batch", 1: "sequence"} for name in inputs}
    axes.update({name: {0: "batch"} if name == "logits" and head == "sequence-classification" else {0: "batch", 1: "sequence"} for name in names})
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

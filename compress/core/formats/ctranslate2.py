"""CTranslate2 Encoder folders of the toolkit's models: converted by CTranslate2's own converter, checked by the caller.

``export_ctranslate2(model_dir, out, quantization=...)`` writes a folder that ``ctranslate2.Encoder(out)`` loads::

    model.bin           the encoder's weights in the asked quantization (CTranslate2's file)
    vocabulary.json     its token list (CTranslate2's file; the toolkit feeds token ids)
    config.json         the Hugging Face config with CTranslate2's keys added (one file serves both readers)
    head.safetensors    a task model's head (classifier, qa_outputs...): CTranslate2 runs the encoder only
    tokenizer files, a sentence-transformers folder's pooling files, compression.json, metrics.json, README.md

The conversion is ``ctranslate2.converters.TransformersConverter``'s, handed the model as ``runtime.load_model``
rebuilds it (pruned shapes included: the converter's own ``from_pretrained`` would refuse heads removed on
transformers 5) and the folder's tokenizer. Two things it cannot know are set on the model or spec it builds:

* ``position_embedding_type``: transformers 5 dropped it from BERT and RoBERTa configs (absolute positions only),
  and the converter asserts it is ``absolute``;
* the head count and head width of a model whose heads were pruned alike in every layer: its loaders build the
  spec from the config's head count and leave the width at hidden / heads;
* the first position embedding a token uses (``Family.unused_positions``): its RoBERTa loaders skip padding id + 1
  rows only when the padding id is above 0.

What it refuses, each in one line (:func:`refusal`, which ``compress auto`` asks too): a family CTranslate2 has no
converter for (:data:`CONVERTED`: BERT, DistilBERT, RoBERTa, XLM-R; not MPNet, ModernBERT or ELECTRA), layers with
different head counts or FFN widths (its encoder takes one of each), a folder that is not PyTorch fp32 (an int8 or
graph folder: convert its parent), a head the family states no plain layers for (``Family.head_layers``), CTranslate2
not installed; and an unknown quantization.

The task head runs outside CTranslate2 (``compress.core.formats.ctranslate2_runtime``) from ``compression.json``'s
``ctranslate2`` record: what it reads (pooler output, first token or every token) and its Linear layers with their
activations, the tensors in ``head.safetensors``; the model card renders the same record as a NumPy snippet.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from compress.core.errors import CompressError, reason
from compress.core.formats.artifacts import output_dir, save_tokenizer
from compress.core.formats.folder import ModelFolder, open_folder
from compress.core.formats.layout import CTRANSLATE2, CTRANSLATE2_FILE, HEAD_FILE, QUANTIZATIONS, TORCH, check_quantization
from compress.core.formats.records import compression_record, parent_path, read_json
from compress.core.formats.runtime import load_folder_model
from compress.core.formats.sentence import copy_sentence_files
from compress.core.formats.writes import write_json_atomic
from compress.core.model import structure as st
from compress.core.model.families import Family
from compress.core.model.heads import HEADS
from compress.core.preflight import check_output

# The toolkit's families whose configs CTranslate2 4.x's TransformersConverter has a loader for (BertConfig,
# DistilBertConfig, RobertaConfig, XLMRobertaConfig); it has none for MPNet, ModernBERT or ELECTRA.
CONVERTED = ("bert", "distilbert", "roberta", "xlm-roberta")
EXTRA = "compress[ctranslate2]"  # what installs CTranslate2 (its converter and Encoder)


def export_ctranslate2(model_dir: str | Path, out: str | Path, *, quantization: str = "float32",
                       overwrite: bool = False) -> Path:
    """Write the PyTorch model in ``model_dir`` as a CTranslate2 Encoder folder ``out`` (module docstring); ``out``."""
    check_quantization(quantization)
    check_output(out, overwrite, inputs=model_dir)
    folder = open_folder(model_dir)
    family, head = check_source(folder)
    # Loaded for the converter alone: quantizing, it writes int8 values into the tensors it was handed.
    model = load_folder_model(folder)
    structure = st.describe(model)
    heads = uniform_heads(folder, structure)
    layers = family.head_layers.get(head)  # None for a bare encoder: its output is the last hidden state
    # Copied before the converter touches the model (it quantizes in place, and replaces the directory it writes).
    tensors = head_tensors(model, layers.linears) if layers is not None else None
    with output_dir(out, overwrite) as tmp:
        _convert(folder, encoder_of(model), tmp, quantization, (heads, int(structure["head_size"])))
        if tensors is not None:
            save_head(tensors, tmp / HEAD_FILE)
        write_config(folder, tmp)
        save_tokenizer(folder.tokenizer, tmp)
        copy_sentence_files(folder.path, tmp)  # a sentence-transformers folder stays one: pooling, Normalize
        spec = {"quantization": quantization, "compute_type": compute_type(tmp),
                "token_type_ids": "token_type_ids" in family.inputs,
                "head": None if layers is None else {"reads": layers.reads, "linears": [list(x) for x in layers.linears]}}
        record = compression_record(
            stage="export", method=CTRANSLATE2, parent=folder, structure=structure,
            config={"quantization": quantization, "outputs": list(HEADS[head].outputs)},
            extra={"format": CTRANSLATE2, "backend": CTRANSLATE2, "head": head, "precision": QUANTIZATIONS[quantization],
                   "outputs": list(HEADS[head].outputs), CTRANSLATE2: spec},
        )
        write_json_atomic(tmp / "compression.json", record)
        write_json_atomic(tmp / "metrics.json", {"results": []})
    return Path(out)


def check_source(folder: ModelFolder) -> tuple[Family, str]:
    """(family, head) of a folder CTranslate2 can take; anything else refused in one line saying why (:func:`refusal`)."""
    why = refusal(folder)
    if why:
        raise CompressError(why)
    return folder.family, folder.head


def refusal(folder: ModelFolder, structure: dict[str, Any] | None = None) -> str | None:
    """Why ``folder`` has no CTranslate2 export, in one line (None: it has one): a format other than PyTorch fp32, a
    family CTranslate2 has no converter for, a head its Encoder cannot run, CTranslate2 not installed and, given its
    ``structure`` (``structure.describe``'s), layers with different head counts or FFN widths."""
    path = folder.path
    if folder.format != TORCH:
        parent = parent_path(folder.record) or "the PyTorch folder it was made from"
        return (f"{path} is a {folder.format} model; CTranslate2 converts PyTorch fp32 weights (and quantizes "
                f"them itself with --quantization): export {parent} with --format ctranslate2")
    family, head = folder.family, folder.head
    if family.model_type not in CONVERTED:
        return (f"CTranslate2 has no converter for {family.model_type} models ({path}); it converts "
                f"{', '.join(CONVERTED)}: export this one with --format onnx or --format openvino")
    if head != "base" and head not in family.head_layers:
        return (f"{path} has a {head} head, which CTranslate2's Encoder cannot run (it returns hidden states "
                f"and the head runs beside it); it takes base, {', '.join(family.head_layers)} models")
    if find_spec("ctranslate2") is None:
        return f"CTranslate2 is not installed, so {path} cannot be converted: pip install '{EXTRA}'"
    for what, key in (("attention head counts", "heads"), ("FFN widths", "ffn")):
        values = list((structure or {}).get(key, ()))
        if len(set(values)) > 1:
            return (f"{path} has {what} {values} per layer; CTranslate2's encoder takes one for every layer, so it "
                    "cannot hold this pruned shape: export it with --format onnx or --format openvino (any shape), or "
                    "prune uniformly for CTranslate2")
    return None


def uniform_heads(folder: ModelFolder, structure: dict[str, Any]) -> int:
    """The one head count of every layer; layers whose head counts or FFN widths differ are refused in one line."""
    why = refusal(folder, structure)
    if why:
        raise CompressError(why)
    return int(structure["heads"][0])


def encoder_of(model: nn.Module) -> nn.Module:
    """The base encoder as CTranslate2's loaders read it: a pooler always there (zeros when the model has none:
    BERT's loader reads one, and a token or span head's base model is built without), absolute positions stated."""
    base = st.base_model(model)
    if getattr(base, "pooler", False) is None:
        width = int(st.describe(model)["hidden_size"])
        pooler = nn.Module()
        pooler.dense = nn.Linear(width, width)  # tanh(0 x + 0) = 0: pooler_output is zeros
        nn.init.zeros_(pooler.dense.weight)
        nn.init.zeros_(pooler.dense.bias)
        base.pooler = pooler
    kind = getattr(base.config, "position_embedding_type", "absolute")
    if kind != "absolute":
        raise CompressError(f"the model counts positions as {kind!r}; CTranslate2 converts absolute position embeddings "
                            "only: export it with --format onnx or --format openvino")
    base.config.position_embedding_type = "absolute"  # transformers 5: no such attribute, absolute positions only
    return base


def head_tensors(model: nn.Module, linears: tuple[tuple[str, str | None], ...]) -> dict[str, torch.Tensor]:
    """Copies of the head's Linear weights and biases under their names in the task model (``classifier.weight``...)."""
    tensors = {}
    for path, _ in linears:
        linear = model.get_submodule(path)
        tensors[f"{path}.weight"] = linear.weight.detach().float().contiguous().clone()  # (out, in)
        tensors[f"{path}.bias"] = linear.bias.detach().float().contiguous().clone()  # (out,)
    return tensors


def save_head(tensors: dict[str, torch.Tensor], file: Path) -> None:
    """``head.safetensors``: what the runtime and the model card's snippet read (safetensors, no pickle)."""
    save_file(tensors, str(file))


def _convert(folder: ModelFolder, base: nn.Module, out: Path, quantization: str, heads: tuple[int, int]) -> None:
    """CTranslate2's TransformersConverter on ``base`` and the folder's tokenizer, written into ``out``."""
    # deferred: the converter imports CTranslate2's specs and extension, paid by this export only
    from ctranslate2.converters import TransformersConverter

    class Converter(TransformersConverter):
        """Its loaders' model and tokenizer are the toolkit's, and the spec gets the pruned head layout."""

        def load_model(self, model_class, model_name_or_path, **kwargs):
            if isinstance(base, model_class):
                return base
            # XLM-R's loader reads a sequence classifier (its .roberta): the encoder under that name.
            return SimpleNamespace(config=base.config, **{model_class.base_model_prefix: base})

        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return folder.tokenizer

        def _load(self):
            spec = super()._load()
            set_head_layout(spec, *heads, width=int(st.describe(base)["hidden_size"]))
            # Position k is the family's embedding row unused + k. The RoBERTa loaders skip padding id + 1 rows only
            # when that id is above 0, so a RoBERTa whose padding id is 0 would read every position one row early.
            positions = base.get_submodule(folder.family.embeddings).position_embeddings.weight  # (positions, hidden)
            spec.encoder.position_encodings.encodings = positions[folder.family.unused_positions(base.config):]
            return spec

    try:
        with torch.no_grad():
            Converter(str(folder.path)).convert(str(out), quantization=quantization, force=True)
    except (ValueError, KeyError, AssertionError, AttributeError, NotImplementedError, RuntimeError) as err:
        why = reason(err)
        raise CompressError(f"CTranslate2 could not convert {folder.path}: {type(err).__name__}: {why}") from None


def set_head_layout(spec, heads: int, head_size: int, *, width: int) -> None:
    """Give an encoder spec ``heads`` heads of ``head_size`` in every layer (``width``: the hidden size).

    The loaders pass the config's head count and no head width, so CTranslate2 would split each layer's
    ``heads * head_size`` projection into the config's count of ``width / count``-wide heads. The encoder spec takes
    a head width in its constructor only (``TransformerEncoderSpec(head_dim=...)``) and is frozen after it, so the
    width is set past the freeze; the C++ attention reads ``head_dim`` where present.
    """
    spec.encoder.num_heads = np.dtype("int16").type(heads)
    if heads * head_size != width:
        for layer in spec.encoder.layer:
            object.__setattr__(layer.self_attention, "head_dim", np.dtype("int32").type(head_size))


def write_config(folder: ModelFolder, out: Path) -> None:
    """One config.json for both readers: the source's Hugging Face config plus CTranslate2's keys (unk_token,
    layer_norm_epsilon...), which no Hugging Face config uses and CTranslate2 needs; extra keys are ignored by both."""
    ct2 = read_json(out / "config.json")
    folder.config.save_pretrained(out)
    write_json_atomic(out / "config.json", {**read_json(out / "config.json"), **ct2})


def compute_type(path: Path) -> str:
    """The compute type ``ctranslate2.Encoder(path)`` picks on this CPU (``compute_type="default"``: the stored one
    where this build runs it, e.g. bfloat16 weights run in float32 without bf16 kernels)."""
    # deferred: CTranslate2's extension
    import ctranslate2

    if not (path / CTRANSLATE2_FILE).is_file():
        raise CompressError(f"CTranslate2's converter wrote no {CTRANSLATE2_FILE} in {path}")
    return ctranslate2.Encoder(str(path), device="cpu", compute_type="default").compute_type

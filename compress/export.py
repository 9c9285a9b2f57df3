"""`compress export`: any model directory the toolkit makes, as a file another runtime loads.

``export(model_dir, out, cfg)`` writes ONNX (``model.onnx``, ONNX Runtime / Optimum), OpenVINO IR
(``openvino_model.xml`` + ``.bin``) or a CTranslate2 Encoder folder (``model.bin`` + ``head.safetensors``) for

======================  ===========================  ==========================  =========================
source format           --format onnx                --format openvino           --format ctranslate2
======================  ===========================  ==========================  =========================
torch (any structure)   torch.onnx export            OpenVINO conversion         CTranslate2's converter
                                                                                 (uniform shapes only)
onnx (fp32 or int8)     copied (it is ONNX already)  OpenVINO conversion         refused: export the parent
openvino                refused                      copied                      refused: the same
torch-int8-dynamic      refused: quantize the fp32 parent with --backend onnxruntime/openvino
inc-pt2e                refused: the same
======================  ===========================  ==========================  =========================

``--format ctranslate2`` (:mod:`compress.core.formats.ctranslate2`) takes the families CTranslate2 converts (BERT,
DistilBERT, RoBERTa, XLM-R) with one head count and FFN width in every layer, stores the weights as
``--quantization`` asks (float32, int8, int8_float32, bfloat16) and keeps the task head beside the encoder, run in
NumPy on its outputs; an int8 folder is checked against the int8 tolerance, a bfloat16 one against the bf16 one.

Every export is checked: the exported model and the source run on the same sentences and
the largest absolute output difference is recorded (``compression.json``'s ``check``) and
printed; a difference above ``cfg.tolerance`` removes the output and fails.

``--fuse`` (ONNX, an fp32 source) writes ONNX Runtime's transformer-optimised graph instead of
the plain one (:func:`compress.core.formats.onnx.fuse_onnx`: Attention, SkipLayerNormalization,
EmbedLayerNormalization, Gelu nodes of the ``com.microsoft`` domain); the number of each fused
operator is recorded (``fusion``) and printed, and a graph where neither Attention nor
SkipLayerNormalization fused is refused. It is checked like any export.

``--precision bf16`` (OpenVINO) keeps fp32 weights and records ``inference_precision_hint: bf16``:
every loader asks the CPU plugin for bf16 where the CPU has bf16 kernels, f32 elsewhere
(:func:`compress.core.formats.openvino_runtime.recorded_precision`); the check runs what the loaders will run,
against :data:`BF16_TOLERANCE`.

A sentence-embedding folder stays one: its pooling files travel with the graph, which is
stored once at the root (``model.onnx`` or ``openvino_model.xml``), where sentence-transformers'
``backend="onnx"``/``"openvino"``, Optimum, Text Embeddings Inference (ONNX) and compress read
it; the card names the exact ``SentenceTransformer(...)`` call (``compress.core.formats.card``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from compress.core.formats.artifacts import load_config, load_tokenizer, output_dir
from compress.core.formats.folder import open_folder
from compress.core.formats.layout import COMPRESSION_FILE, CTRANSLATE2, METRICS_FILE, ONNX, ONNX_FILE, TORCH
from compress.core.formats.records import compression_record, parent_path, read_compression
from compress.core.formats.writes import write_json_atomic
from compress.core.preflight import check_output
from compress.core.formats.card import sentence_loading_line
from compress.core.errors import CompressError
from compress.core.formats.ctranslate2 import export_ctranslate2
from compress.core.formats.onnx import export_onnx, format_fusion, fuse_onnx
from compress.core.formats.openvino import export_openvino
from compress.core.registry import Registry
from compress.core.data.resolve import task_fields, task_of_folder
from compress.core.formats.architecture import structure_of
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import is_sentence_folder
from compress.core.model.heads import EXPORTABLE_HEADS, HEADS
from compress.core.model.structure import model_inputs
from compress.export_config import ExportConfig

# The check's default largest difference for a bf16 folder: bf16 keeps 8 bits of mantissa, so each product carries a
# relative error near 0.4%: on the check's sentences all-MiniLM-L6-v2's last_hidden_state moved by up to 0.024, and
# its SST-2 fine-tuned logits by 0.014 (AMD Zen 4, AVX512_BF16), so 0.1 leaves room for larger models.
BF16_TOLERANCE = 0.1
# The check's default for an int8 folder (an int8 source's graph re-fused by a converter, or weights quantized here).
INT8_TOLERANCE = 0.5

# Sentences both models run on for the check: short and long, with a pair (token types).
CHECK_TEXTS = (
    ("the film was a delight from start to finish .", None),
    ("a dull , plodding mess that never finds its footing", "the plot made no sense at all ."),
    ("It rained all day in Paris, so the museums were full.", "Were the museums busy?"),
    ("no", None),
)


Exporter = Callable[[Path, Path, ExportConfig], None]  # (source, staged output dir, cfg) -> files written
EXPORTERS: Registry[dict[str, Exporter]] = Registry("export format")


def _refuse(source_fmt: str) -> Exporter:
    def refuse(source: Path, tmp: Path, cfg: ExportConfig) -> None:
        parent = parent_path(read_compression(source)) or "FP32_PARENT"
        raise CompressError(
            f"{source} is {source_fmt} int8, which has no {cfg.format} form; quantize its fp32 parent for that runtime "
            f"instead: compress quantize --model {parent} --backend {'onnxruntime' if cfg.format == 'onnx' else 'openvino'} "
            f"--out DIR"
        )
    return refuse


def _copy(source: Path, tmp: Path, cfg: ExportConfig) -> None:
    tmp.mkdir()
    for item in source.iterdir():
        if item.name not in (COMPRESSION_FILE, METRICS_FILE, "README.md"):
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)


def _torch_to_onnx(source: Path, tmp: Path, cfg: ExportConfig) -> None:
    export_onnx(source, tmp, opset=cfg.opset, overwrite=True)


def _to_openvino(source: Path, tmp: Path, cfg: ExportConfig) -> None:
    export_openvino(source, tmp, overwrite=True, precision="bf16" if cfg.precision == "bf16" else "f32")


def _to_ctranslate2(source: Path, tmp: Path, cfg: ExportConfig) -> None:
    export_ctranslate2(source, tmp, quantization=cfg.quantization, overwrite=True)


def _refuse_openvino_to_onnx(source: Path, tmp: Path, cfg: ExportConfig) -> None:
    raise CompressError(f"{source} is an OpenVINO IR, which has no ONNX export; export its parent (the PyTorch or ONNX "
                        "directory it was made from) with --format onnx")


EXPORTERS.register("onnx", {
    TORCH: _torch_to_onnx, ONNX: _copy, "openvino": _refuse_openvino_to_onnx,
    "torch-int8-dynamic": _refuse("torch dynamic"), "inc-pt2e": _refuse("Neural Compressor PT2E"),
})
EXPORTERS.register("openvino", {
    TORCH: _to_openvino, ONNX: _to_openvino, "openvino": _copy,
    "torch-int8-dynamic": _refuse("torch dynamic"), "inc-pt2e": _refuse("Neural Compressor PT2E"),
})
# CTranslate2 converts PyTorch weights only; export_ctranslate2 refuses every other format naming the parent.
EXPORTERS.register(CTRANSLATE2, {fmt: _to_ctranslate2 for fmt in (TORCH, ONNX, "openvino", CTRANSLATE2,
                                                                  "torch-int8-dynamic", "inc-pt2e")})


def export(model_dir: str | Path, out: str | Path, cfg: ExportConfig, *, overwrite: bool = False) -> Path:
    """Write ``model_dir`` as ``cfg.format`` to ``out`` and check its outputs against the source's."""
    cfg.validate()
    check_output(out, overwrite, inputs=model_dir)
    folder = open_folder(model_dir)
    source, fmt = folder.path, folder.format
    if cfg.fuse and folder.quantized:
        raise CompressError(f"{source} is int8; --fuse optimises an fp32 graph: export its fp32 parent with --fuse, or "
                            "quantize that parent's fused graph with compress quantize --backend onnxruntime --fuse")
    exporter = EXPORTERS.get(cfg.format).get(fmt)
    if exporter is None:
        raise CompressError(f"{source} has format {fmt}, which compress export does not know; "
                            f"it exports {', '.join(EXPORTERS.get(cfg.format))}")
    head = folder.head
    if head not in EXPORTABLE_HEADS:
        raise CompressError(f"export supports {', '.join(EXPORTABLE_HEADS)} models; {source} is a {head} model")
    with output_dir(out, overwrite) as tmp:
        staged = tmp / "model"  # the exporters write a complete directory of their own
        exporter(source, staged, cfg)
        for item in staged.iterdir():
            item.rename(tmp / item.name)
        staged.rmdir()
        if cfg.precision == "bf16":  # asked before the check, so the check runs what every loader of the folder will
            write_json_atomic(tmp / "compression.json", {**read_compression(tmp), "inference_precision_hint": "bf16"})
        fusion = _fuse(source, tmp) if cfg.fuse else {}
        tolerance = _tolerance(cfg, folder.quantized, read_compression(tmp).get("precision"))
        check = compare_outputs(source, tmp, HEADS[head].outputs)
        if check["max_abs_diff"] > tolerance:
            raise CompressError(
                f"the {cfg.format} export of {source} differs from it by {check['max_abs_diff']:.3g} "
                f"(tolerance {tolerance:g}); nothing was written"
            )
        before = folder.record
        written = read_compression(tmp)
        own = task_of_folder(folder)  # the task travels with the export, which may be copied without its parent
        record = compression_record(
            stage="export", method=cfg.format, config=cfg, parent=folder,
            structure=written.get("structure") or before.get("structure"),  # the graph's (a classifier's last layer: first token)
            extra={**{k: before[k] for k in ("head", "task", "precision", "backend", "scheme") if k in before},
                   **{k: written[k] for k in ("format", "backend", "precision", "inference_precision",
                                              "inference_precision_hint", CTRANSLATE2) if k in written},
                   **(task_fields(own) if own is not None else {}),
                   "format": written.get("format") or fmt, "source_format": fmt, "check": {**check, "tolerance": tolerance},
                   **fusion},
        )
        write_json_atomic(tmp / COMPRESSION_FILE, record)
        write_json_atomic(tmp / METRICS_FILE, {"results": []})
    return Path(out)


def _tolerance(cfg: ExportConfig, quantized_source: bool, written_precision: str | None) -> float:
    """The check's largest difference: the asked one, else by what the source and the written folder hold."""
    if cfg.tolerance is not None:
        return cfg.tolerance
    if quantized_source or written_precision == "int8":
        return INT8_TOLERANCE
    return BF16_TOLERANCE if "bf16" in (cfg.precision, written_precision) else 1e-3


def _fuse(source: Path, tmp: Path) -> dict[str, Any]:
    """Fuse the exported ``tmp/model.onnx`` in place; the record's ``fusion`` (operator -> count) and ``fused`` (how)."""
    # The graph's structure: the export's record, else (a copied ONNX folder) the source's.
    structure = read_compression(tmp).get("structure") or structure_of(source)
    done = fuse_onnx(tmp / ONNX_FILE, structure, load_config(source).model_type, source)
    return {"fusion": done["counts"], "fused": done["settings"]}


def compare_outputs(source: Path, exported: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """Largest absolute difference of every output between two directories on :data:`CHECK_TEXTS`."""
    tokenizer = load_tokenizer(source)
    first, second = zip(*CHECK_TEXTS)
    pairs = [(a, b) for a, b in CHECK_TEXTS if b is not None]
    batches = [
        tokenizer(list(first[:1]), return_tensors="pt"),  # batch 1, no padding
        tokenizer([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt"),  # pairs, padded
        tokenizer(list(first), padding=True, return_tensors="pt"),  # padded to the longest
    ]
    diffs, agree, total = [], 0, 0
    models = [load_model(source), load_model(exported)]
    with torch.no_grad():
        for batch in batches:
            a, b = (m(**model_inputs(m, dict(batch))) for m in models)
            mask = batch["attention_mask"].bool()
            for name in names:
                x, y = getattr(a, name).float(), getattr(b, name).float()
                if x.dim() >= 2 and x.shape[:2] == mask.shape:
                    x, y = x[mask], y[mask]  # padded positions are not outputs
                for which, values in (("the source", x), ("the export", y)):
                    if not bool(torch.isfinite(values).all()):  # NaN - NaN is NaN, which no tolerance rejects
                        raise CompressError(
                            f"{which} gives NaN or infinite {name} on the check sentences; nothing was written "
                            f"(check {source} with compress eval: its weights or config overflow)"
                        )
                diffs.append(float((x - y).abs().max()))
                if name == "logits" and x.dim() == 2:
                    agree += int((x.argmax(-1) == y.argmax(-1)).sum())
                    total += x.shape[0]
    check = {"max_abs_diff": max(diffs), "examples": sum(len(b["input_ids"]) for b in batches)}
    if total:
        check["argmax_agreement"] = agree / total
    return check


def summarize(out: Path, cfg: ExportConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    record = read_compression(out)
    check = record["check"]
    text = (f"exported {record['source_format']} -> {record['format']}: largest output difference "
            f"{check['max_abs_diff']:.2e} (tolerance {check['tolerance']:g}) on {check['examples']} sentences")
    if "argmax_agreement" in check:
        text += f", argmax agreement {100 * check['argmax_agreement']:.0f}%"
    if record.get("fusion"):
        text += "\n" + format_fusion(record["fusion"])
    if isinstance(record.get(CTRANSLATE2), dict):  # what the weights are stored as and what this CPU runs them in
        ct2 = record[CTRANSLATE2]
        text += f"\nCTranslate2: weights {ct2.get('quantization')}, compute type {ct2.get('compute_type')} on this CPU"
    line = sentence_loading_line(out, record["format"]) if is_sentence_folder(out) else None
    if line:  # the card's call (README.md; an ONNX card also says how Text Embeddings Inference reads the folder)
        text += "\n" + line
    return text + "\n", []

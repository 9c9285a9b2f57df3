"""`compress export`: any model directory the toolkit makes, as a file another runtime loads.

``export(model_dir, out, cfg)`` writes ONNX (``model.onnx``, ONNX Runtime / Optimum) or
OpenVINO IR (``openvino_model.xml`` + ``.bin``) for

======================  ===========================  ======================================
source format           --format onnx                --format openvino
======================  ===========================  ======================================
torch (any structure)   torch.onnx export            OpenVINO conversion
onnx (fp32 or int8)     copied (it is ONNX already)  OpenVINO conversion of the graph
openvino                refused                      copied
torch-int8-dynamic      refused: quantize the fp32 parent with --backend onnxruntime/openvino
inc-pt2e                refused: the same
======================  ===========================  ======================================

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import torch

from compress.core.formats.artifacts import load_config, load_tokenizer, output_dir
from compress.core.formats.folder import open_folder
from compress.core.formats.layout import COMPRESSION_FILE, METRICS_FILE, ONNX, ONNX_FILE, TORCH
from compress.core.formats.records import compression_record, parent_path, read_compression
from compress.core.formats.writes import write_json_atomic
from compress.core.preflight import check_output
from compress.core.formats.card import sentence_loading_line
from compress.core.config import option
from compress.core.errors import CompressError
from compress.core.formats.onnx import export_onnx, format_fusion, fuse_onnx
from compress.core.formats.openvino import export_openvino
from compress.core.registry import Registry
from compress.core.data.resolve import task_fields, task_of_folder
from compress.core.formats.architecture import structure_of
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import is_sentence_folder
from compress.core.model.heads import EXPORTABLE_HEADS, HEADS
from compress.core.model.structure import model_inputs

# The check's default largest difference for a bf16 folder: bf16 keeps 8 bits of mantissa, so each product carries a
# relative error near 0.4%: on the check's sentences all-MiniLM-L6-v2's last_hidden_state moved by up to 0.024, and
# its SST-2 fine-tuned logits by 0.014 (AMD Zen 4, AVX512_BF16), so 0.1 leaves room for larger models.
BF16_TOLERANCE = 0.1

# Sentences both models run on for the check: short and long, with a pair (token types).
CHECK_TEXTS = (
    ("the film was a delight from start to finish .", None),
    ("a dull , plodding mess that never finds its footing", "the plot made no sense at all ."),
    ("It rained all day in Paris, so the museums were full.", "Were the museums busy?"),
    ("no", None),
)


@dataclass(frozen=True)
class ExportConfig:
    format: Literal["onnx", "openvino"] = option("onnx", "target format: onnx (ONNX Runtime, Optimum) or openvino (OpenVINO IR)")
    opset: int = option(17, "ONNX opset of a torch -> ONNX export")
    tolerance: float | None = option(None, "largest output difference accepted by the check (default: 1e-3 for fp32 "
                                           "sources, 0.5 for int8 ones, whose graphs a converter may re-fuse)")
    precision: Literal["fp32", "bf16"] = option(
        "fp32", "openvino: the precision the folder asks the CPU plugin to run its floating-point layers in; bf16 runs "
                "the matrix products on AVX512_BF16 or AMX-BF16 units where the CPU has them (its weights stay fp32, and "
                "on a CPU without bf16 kernels it runs in fp32); the export's check then uses a bf16 tolerance")
    fuse: bool = option(False, "onnx: write ONNX Runtime's transformer-optimised graph (fused Attention, SkipLayerNormalization, "
                               "EmbedLayerNormalization, Gelu nodes of the com.microsoft domain, which ONNX Runtime runs) "
                               "instead of the plain one; the number of each fused operator is recorded")

    def validate(self) -> None:
        if self.precision != "fp32" and self.format != "openvino":
            raise CompressError(f"--precision {self.precision} is an OpenVINO inference precision; use it with --format openvino "
                                "(for ONNX Runtime int8: compress quantize --backend onnxruntime)")
        if self.fuse and self.format != "onnx":
            raise CompressError(f"--fuse writes ONNX Runtime's fused graph, an ONNX file; use it with --format onnx "
                                f"(--format {self.format} converts the plain graph and fuses it in its own compiler)")

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
    tolerance = cfg.tolerance if cfg.tolerance is not None else (0.5 if folder.quantized else BF16_TOLERANCE
                                                                 if cfg.precision == "bf16" else 1e-3)
    with output_dir(out, overwrite) as tmp:
        staged = tmp / "model"  # the exporters write a complete directory of their own
        exporter(source, staged, cfg)
        for item in staged.iterdir():
            item.rename(tmp / item.name)
        staged.rmdir()
        if cfg.precision == "bf16":  # asked before the check, so the check runs what every loader of the folder will
            write_json_atomic(tmp / "compression.json", {**read_compression(tmp), "inference_precision_hint": "bf16"})
        fusion = _fuse(source, tmp) if cfg.fuse else {}
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
                                              "inference_precision_hint") if k in written},
                   **(task_fields(own) if own is not None else {}),
                   "format": written.get("format") or fmt, "source_format": fmt, "check": {**check, "tolerance": tolerance},
                   **fusion},
        )
        write_json_atomic(tmp / COMPRESSION_FILE, record)
        write_json_atomic(tmp / METRICS_FILE, {"results": []})
    return Path(out)


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
    line = sentence_loading_line(out, record["format"]) if is_sentence_folder(out) else None
    if line:  # the card's call (README.md; an ONNX card also says how Text Embeddings Inference reads the folder)
        text += "\n" + line
    return text + "\n", []

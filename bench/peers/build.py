"""Stage 1 of ``bench.peers.run``: make each contender's files with its own tool, one step per process.

    PYTHON -m bench.peers.build STEP --work WORK --data DATA --teacher DIR --settings JSON

run by the coordinator under the step's environment (``bench.peers.contenders.STEPS``).
A step writes its contenders' files under ``WORK/peers`` (the peers') or ``WORK/toolkit``
(the toolkit's), skipping any already there, and one record per contender in
``WORK/builds/NAME.json``: ``{"folder", "options", "weights" (files that hold the weights,
relative to folder; empty: every weight file), "made_with" (what was run, in words), "key"}``.
Only the step's own tool is imported (this module imports nothing heavy at the top), so a step
runs in an environment that lacks the other steps' packages.

The peers are made as their documentation shows (sentence-transformers' backend exports and
helpers, ONNX Runtime's transformer optimizer and quantizer, CTranslate2's converter, model2vec's
``distill``); the toolkit's through its Python entry functions (``export``, ``quantize``,
``distill_embedding``, ``distill_static``), as the CLI calls them.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench.peers.contenders import STEP_BY_NAME, step_contenders

# GLUE training files whose sentences (labels unused) join the corpora as "the user's sentences": distillation,
# static refinement and static int8 calibration read the same pool (no dev sentence is in it).
GLUE_SENTENCES = ("stsb", "mrpc", "rte", "sst2", "cola", "wnli")
ST_PRESETS = {"avx512_vnni": "qint8", "avx2": "quint8", "arm64": "qint8"}  # ST's helper names the file model_{q}_{preset}.onnx


@dataclass(frozen=True)
class Ctx:
    work: Path
    data: Path
    teacher: Path  # the packaged all-MiniLM-L6-v2 sentence-transformers folder (read only)
    settings: dict[str, Any]  # PeersConfig as a dict
    int8_preset: str  # ONNX Runtime's int8 preset for this CPU: compress.core.hardware.precisions().int8_preset
    wanted: tuple[str, ...] = ()  # the step's contenders the run selected (empty: all); the toolkit's steps make only these

    @property
    def peers(self) -> Path:
        return self.work / "peers"

    @property
    def toolkit(self) -> Path:
        return self.work / "toolkit"


def record(folder: Path, made_with: str, options: dict[str, Any] | None = None, weights: list[str] | None = None) -> dict:
    return {"folder": str(folder.resolve()), "options": options or {}, "weights": weights or [], "made_with": made_with}


# ---------------------------------------------------------------------------- the peers' steps


def st_torch(ctx: Ctx) -> dict[str, dict]:
    """The packaged folder as it is: what ``SentenceTransformer("all-MiniLM-L6-v2")`` runs."""
    return {"st-torch": record(ctx.teacher, "SentenceTransformer(DIR) (PyTorch), the packaged folder",
                              weights=["model.safetensors"])}


def st_copy(ctx: Ctx) -> Path:
    """The user's own copy of the ST folder (downloaded once): ST's exports are saved into it, as on the hub."""
    folder = ctx.peers / "st"
    if not (folder / "modules.json").is_file():
        shutil.copytree(ctx.teacher, folder, dirs_exist_ok=True)
    return folder


def st_onnx(ctx: Ctx) -> dict[str, dict]:
    """``SentenceTransformer(dir, backend="onnx")`` + ``save_pretrained``; ``export_dynamic_quantized_onnx_model``."""
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model  # deferred: the peer

    folder, preset = st_copy(ctx), ctx.int8_preset
    exported = not (folder / "onnx" / "model.onnx").is_file()
    model = SentenceTransformer(str(folder), backend="onnx", device="cpu",
                                model_kwargs=None if exported else {"file_name": "onnx/model.onnx"})
    if exported:
        model.save_pretrained(str(folder))
    int8 = f"onnx/model_{ST_PRESETS[preset]}_{preset}.onnx"
    if not (folder / int8).is_file():
        export_dynamic_quantized_onnx_model(model, preset, str(folder))
    if not (folder / int8).is_file():  # another release may name it otherwise: take the file it wrote for the preset
        int8 = next(p.relative_to(folder).as_posix() for p in sorted((folder / "onnx").glob(f"model_*_{preset}.onnx")))
    return {"st-onnx": record(folder, "SentenceTransformer(DIR, backend=\"onnx\") then save_pretrained(DIR)",
                              {"backend": "onnx", "file_name": "onnx/model.onnx"}, ["onnx/model.onnx"]),
            "st-onnx-int8": record(folder, f"export_dynamic_quantized_onnx_model(model, \"{preset}\", DIR)",
                                   {"backend": "onnx", "file_name": int8}, [int8])}


def sst2_calibration(ctx: Ctx) -> Path:
    """A local copy of the calibration set ST's OpenVINO helper loads from the hub by default (GLUE SST-2 train,
    column ``sentence``), as a folder ``datasets.load_dataset`` reads (the hub is unreachable here)."""
    folder = ctx.peers / "calibration-sst2"
    if not (folder / "train.csv").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with open(ctx.data / "glue" / "SST-2" / "train.tsv", encoding="utf-8") as f, \
                open(folder / "train.csv", "w", newline="", encoding="utf-8") as out:
            rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            writer = csv.writer(out)
            writer.writerow(["sentence"])
            writer.writerows([row["sentence"]] for row in rows)
    return folder


def st_openvino(ctx: Ctx) -> dict[str, dict]:
    """``SentenceTransformer(dir, backend="openvino")`` + ``save_pretrained``; ``export_static_quantized_openvino_model``
    with its own calibration set (SST-2 train) read from a local folder and ``num_samples`` stated."""
    from optimum.intel import OVQuantizationConfig  # deferred: the peer
    from sentence_transformers import SentenceTransformer, export_static_quantized_openvino_model

    folder, fp32, int8 = st_copy(ctx), "openvino/openvino_model.xml", "openvino/openvino_model_qint8_quantized.xml"
    exported = not (folder / fp32).is_file()
    model = SentenceTransformer(str(folder), backend="openvino", device="cpu",
                                model_kwargs=None if exported else {"file_name": fp32})
    if exported:
        model.save_pretrained(str(folder))
    samples = int(ctx.settings["ov_calibration_samples"])
    if not (folder / int8).is_file():
        calibration = sst2_calibration(ctx)
        export_static_quantized_openvino_model(
            model, OVQuantizationConfig(num_samples=samples), str(folder),
            dataset_name=str(calibration), dataset_config_name="default", dataset_split="train", column_name="sentence")
    return {"st-openvino": record(folder, "SentenceTransformer(DIR, backend=\"openvino\") then save_pretrained(DIR)",
                                  {"backend": "openvino", "file_name": fp32}, [fp32, fp32.replace(".xml", ".bin")]),
            "st-openvino-int8": record(
                folder, f"export_static_quantized_openvino_model(model, OVQuantizationConfig(num_samples={samples}), DIR, "
                "dataset_name=<local folder of GLUE SST-2 train sentences>, \"default\", \"train\", \"sentence\")",
                {"backend": "openvino", "file_name": int8}, [int8, int8.replace(".xml", ".bin")])}


def _tokenizer_files(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)


def ort_fused(ctx: Ctx) -> dict[str, dict]:
    """ONNX Runtime's own recipe on ST's ONNX export: ``optimize_model(model_type="bert")``, then for int8
    ``quant_pre_process`` (its documented pre-processing: symbolic shape inference) and ``quantize_dynamic``
    (uint8 weights without VNNI, the U8U8 its docs advise against AVX2 saturation; int8 with VNNI)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic  # deferred: the peer
    from onnxruntime.quantization.shape_inference import quant_pre_process
    from onnxruntime.transformers.optimizer import optimize_model

    source = ctx.peers / "st" / "onnx" / "model.onnx"
    if not source.is_file():
        raise SystemExit(f"{source} is missing: the st-onnx step makes it (run it first)")
    config = json.loads((ctx.teacher / "config.json").read_text())
    fused, int8 = ctx.peers / "ort-fused", ctx.peers / "ort-fused-int8"
    for folder in (fused, int8):
        _tokenizer_files(ctx.peers / "st", folder)
    if not (fused / "model.onnx").is_file():
        optimized = optimize_model(str(source), model_type="bert", num_heads=config["num_attention_heads"],
                                   hidden_size=config["hidden_size"])
        optimized.save_model_to_file(str(fused / "model.onnx"))
    weight = "QInt8" if ctx.int8_preset != "avx2" else "QUInt8"
    if not (int8 / "model.onnx").is_file():
        quant_pre_process(str(fused / "model.onnx"), str(int8 / "pre.onnx"), skip_optimization=True)
        quantize_dynamic(str(int8 / "pre.onnx"), str(int8 / "model.onnx"), weight_type=getattr(QuantType, weight))
        (int8 / "pre.onnx").unlink()
    return {"ort-fused": record(fused, "onnxruntime.transformers.optimizer.optimize_model(ST's onnx/model.onnx, "
                                "model_type=\"bert\")", {"file": "model.onnx"}, ["model.onnx"]),
            "ort-fused-int8": record(int8, f"quant_pre_process(fused, skip_optimization=True) + quantize_dynamic("
                                     f"weight_type=QuantType.{weight})", {"file": "model.onnx"}, ["model.onnx"])}


def ctranslate2_step(ctx: Ctx) -> dict[str, dict]:
    """``ctranslate2.converters.TransformersConverter(teacher).convert(out, quantization=...)``, float32 and int8."""
    from ctranslate2.converters import TransformersConverter  # deferred: the peer

    out = {}
    for name, quantization in (("ct2-fp32", "float32"), ("ct2-int8", "int8")):
        folder = ctx.peers / name
        if not (folder / "model.bin").is_file():
            TransformersConverter(str(ctx.teacher)).convert(str(folder), quantization=quantization, force=True)
        _tokenizer_files(ctx.teacher, folder)
        out[name] = record(folder, f"TransformersConverter(DIR).convert(OUT, quantization=\"{quantization}\"); "
                           "Encoder(compute_type=\"default\")", {"compute_type": "default"}, ["model.bin"])
    return out


def model2vec_step(ctx: Ctx) -> dict[str, dict]:
    """``model2vec.distill.distill(teacher)`` with its defaults (PCA 256, SIF 1e-4, [unusedN] removed, float16)."""
    from model2vec.distill import distill  # deferred: the peer

    folder = ctx.peers / "model2vec"
    if not (folder / "model.safetensors").is_file():
        distill(model_name=str(ctx.teacher), pca_dims=256).save_pretrained(str(folder))
    return {"model2vec": record(folder, "model2vec.distill.distill(DIR, pca_dims=256) (its defaults), save_pretrained",
                                weights=["model.safetensors"])}


# ---------------------------------------------------------------------------- the toolkit's steps


def _sentences(ctx: Ctx) -> dict[str, Any]:
    """The user's sentences, as the toolkit's configs name them: the corpora and the GLUE training files."""
    from bench.pretrain import corpus_paths  # deferred: the toolkit's environment only

    return {"corpus": corpus_paths(ctx.data), "sentences_from": list(GLUE_SENTENCES), "data_dir": str(ctx.data / "glue")}


def _export(source: Path, out: Path, **options: Any) -> None:
    from compress.export import ExportConfig, export  # deferred: the toolkit

    export(source, out, ExportConfig(**options), overwrite=True)


def _quantize(source: Path, out: Path, options: dict[str, Any]) -> None:
    from compress.core.config import from_dict  # deferred: the toolkit
    from compress.quantize.config import QuantizeConfig
    from compress.quantize.run import quantize

    quantize(source, out, from_dict(QuantizeConfig, options), overwrite=True)


# compress export --format ctranslate2's variants: the folder suffix and its --quantization.
CT2_VARIANTS = {"ct2": "float32", "ct2-int8": "int8"}


def export_command(source: Path, out: Path, quantization: str) -> list[str]:
    """The ``compress`` arguments that write ``source`` as a CTranslate2 folder ``out`` with ``quantization`` weights."""
    return ["export", "--model", str(source), "--out", str(out), "--format", "ctranslate2",
            "--quantization", quantization, "--overwrite"]


def run_cli(argv: list[str]) -> None:
    """``compress ARGV`` in this process, as a user types it; a failure stops the step with its exit status."""
    from compress.cli import main  # deferred: the toolkit

    status = main(argv)
    if status != 0:
        raise SystemExit(f"compress {' '.join(argv)} failed (exit {status}); its message is above")


def recipes(ctx: Ctx, source: Path) -> dict[str, tuple[str, Callable[[Path], Any]]]:
    """Each variant's (what was run, in the CLI's words; the call that makes it into a folder), nothing run yet."""
    examples = int(ctx.settings["calibration_examples"])
    corpus = f"--corpus ... --sentences-from {','.join(GLUE_SENTENCES)} --calibration-examples {examples}"

    def static(backend: str) -> Callable[[Path], Any]:
        return lambda out: _quantize(source, out, {"backend": backend, "scheme": "static", **_sentences(ctx),
                                                   "calibration_examples": examples})

    out: dict[str, tuple[str, Callable[[Path], Any]]] = {
        "onnx": ("compress export --format onnx", lambda out: _export(source, out, format="onnx")),
        "fused": ("compress export --format onnx --fuse", lambda out: _export(source, out, format="onnx", fuse=True)),
        "openvino": ("compress export --format openvino", lambda out: _export(source, out, format="openvino")),
        "int8": ("compress quantize --backend onnxruntime --scheme dynamic",
                 lambda out: _quantize(source, out, {"backend": "onnxruntime", "scheme": "dynamic"})),
        "fused-int8": ("compress quantize --backend onnxruntime --scheme dynamic --fuse",
                       lambda out: _quantize(source, out, {"backend": "onnxruntime", "scheme": "dynamic", "fuse": True})),
        "static-int8": (f"compress quantize --backend onnxruntime --scheme static {corpus}", static("onnxruntime")),
        "ov-int8": (f"compress quantize --backend openvino --scheme static {corpus}", static("openvino")),
    }
    for variant, quantization in CT2_VARIANTS.items():
        out[variant] = (f"compress export --format ctranslate2 --quantization {quantization}",
                        lambda folder, q=quantization: run_cli(export_command(source, folder, q)))
    return out


def _toolkit_variants(ctx: Ctx, source: Path, prefix: str, variants: tuple[str, ...]) -> dict[str, dict]:
    """The ``variants`` of ``source`` the run selected (:func:`recipes`), each skipped when made; their records."""
    made = recipes(ctx, source)
    out = {}
    for variant in variants:
        name = f"tk-{prefix}-{variant}"
        if ctx.wanted and name not in ctx.wanted:
            continue
        made_with, make = made[variant]
        folder = ctx.toolkit / f"{prefix}-{variant}"
        if not (folder / "compression.json").is_file():
            print(f"== {prefix}-{variant}: {made_with}", flush=True)
            make(folder)
        out[name] = record(folder, made_with)
    return out


TEACHER_VARIANTS = ("onnx", "fused", "openvino", "int8", "fused-int8", "static-int8", "ov-int8", *CT2_VARIANTS)
STUDENT_VARIANTS = {"3L": ("fused", "openvino", "int8", "fused-int8", "ov-int8", *CT2_VARIANTS),
                    "2L": ("fused", "openvino", "int8", "fused-int8", "ov-int8")}


def tk_teacher(ctx: Ctx) -> dict[str, dict]:
    from bench.embeddings import teacher_folder  # deferred: the toolkit's environment only

    teacher = teacher_folder(ctx.toolkit)  # symbolic links: nothing is written into the package's folder
    return _toolkit_variants(ctx, teacher, "teacher", TEACHER_VARIANTS)


STUDENTS = {"3L": {"student": "3L-384", "init_layers": [1, 3, 5]}, "2L": {"student": "2L-384", "heads": 12}}


def tk_student(ctx: Ctx, size: str) -> dict[str, dict]:
    """``distill_embedding`` of a student on a seeded sample of the user's sentences, then its exports and int8."""
    from bench.embeddings import teacher_folder  # deferred: the toolkit's environment only
    from compress.core.config import from_dict
    from compress.distill.embedding import EmbeddingDistillConfig, distill_embedding

    s, folder = ctx.settings, ctx.toolkit / f"student-{size}-384"
    if not (folder / "config.json").is_file():
        cfg = from_dict(EmbeddingDistillConfig, {
            **_sentences(ctx), **STUDENTS[size], "max_sentences": s["distill_sentences"], "losses": ["mse", "cosine"],
            "max_length": 128, "epochs": s["epochs"], "batch_size": s["batch_size"], "lr": s["lr"], "warmup_ratio": 0.05,
            "eval_every": 250, "save_every": 250, "seed": s["seed"]})
        print(f"== distilling the {size}-384 student on {s['distill_sentences']} sentences", flush=True)
        distill_embedding(teacher_folder(ctx.toolkit), folder, cfg, overwrite=True)
    return _toolkit_variants(ctx, folder, size, STUDENT_VARIANTS[size])


def tk_static(ctx: Ctx, refined: bool) -> dict[str, dict]:
    """``distill_static`` with its defaults (PCA 256); refined: on a seeded sample of the user's sentences."""
    from bench.embeddings import teacher_folder  # deferred: the toolkit's environment only
    from compress.core.config import from_dict
    from compress.distill.static import StaticDistillConfig, distill_static

    name = "tk-static-refined" if refined else "tk-static"
    folder, s = ctx.toolkit / name.removeprefix("tk-"), ctx.settings
    # The user's own sentences: the STS-B training side (the scored task's domain, labels unused), or the whole pool.
    sentences = _sentences(ctx) if s["refine_on"] == "pool" else {"sentences_from": ["stsb"], "data_dir": str(ctx.data / "glue")}
    options = {**sentences, "max_sentences": s["refine_sentences"], "seed": s["seed"]} if refined else {}
    if not (folder / "compression.json").is_file():
        distill_static(teacher_folder(ctx.toolkit), folder, from_dict(StaticDistillConfig, options), overwrite=True)
    source = f"--corpus ... --sentences-from {','.join(GLUE_SENTENCES)}" if s["refine_on"] == "pool" else "--sentences-from stsb"
    made_with = "compress distill-static (defaults: PCA 256, SIF 1e-4)" + (
        f" {source} --max-sentences {s['refine_sentences']}" if refined else "")
    return {name: record(folder, made_with), f"{name}-m2v": record(folder, made_with + "; run by model2vec.StaticModel",
                                                                    weights=["model.safetensors"])}


STEP_FUNCTIONS: dict[str, Callable[[Ctx], dict[str, dict]]] = {
    "st-torch": st_torch, "st-onnx": st_onnx, "st-openvino": st_openvino, "ort-fused": ort_fused,
    "ctranslate2": ctranslate2_step, "model2vec": model2vec_step, "tk-teacher": tk_teacher,
    "tk-3L": lambda ctx: tk_student(ctx, "3L"), "tk-2L": lambda ctx: tk_student(ctx, "2L"),
    "tk-static": lambda ctx: tk_static(ctx, False), "tk-static-refined": lambda ctx: tk_static(ctx, True),
}


def outputs(step: str) -> list[str]:
    """What a rebuild of ``step`` removes first (paths relative to WORK): the files that depend on its settings."""
    int8 = "peers/st/openvino/openvino_model_qint8_quantized"
    return {
        "st-openvino": [f"{int8}.xml", f"{int8}.bin"],
        "tk-teacher": [f"toolkit/teacher-{v}" for v in TEACHER_VARIANTS],
        "tk-3L": ["toolkit/student-3L-384", *(f"toolkit/3L-{v}" for v in STUDENT_VARIANTS["3L"])],
        "tk-2L": ["toolkit/student-2L-384", *(f"toolkit/2L-{v}" for v in STUDENT_VARIANTS["2L"])],
        "tk-static-refined": ["toolkit/static-refined"],
    }.get(step, [])


def remove_outputs(work: Path, step: str) -> None:
    """The step's settings-dependent files, and every record of its contenders: one the run did not select would
    otherwise name a folder removed here."""
    for contender in step_contenders(step):
        (work / "builds" / f"{contender.name}.json").unlink(missing_ok=True)
    for name in outputs(step):
        path = work / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def step_key(step: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The settings a step's artefacts depend on: a record made under other values is rebuilt."""
    return {name: settings.get(name) for name in STEP_BY_NAME[step].settings}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=list(STEP_FUNCTIONS))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--settings", required=True, help="the coordinator's PeersConfig as JSON")
    parser.add_argument("--int8-preset", default="avx2", choices=sorted(ST_PRESETS),
                        help="ONNX Runtime's int8 preset for this CPU (the coordinator's compress.core.hardware.precisions())")
    parser.add_argument("--rebuild", action="store_true", help="remove the step's settings-dependent files first")
    parser.add_argument("--contenders", default="",
                        help="comma-separated contenders of the step the run selected (default: all of them)")
    args = parser.parse_args(argv)
    settings = json.loads(args.settings)
    ctx = Ctx(args.work.resolve(), args.data.resolve(), args.teacher.resolve(), settings, args.int8_preset,
              tuple(filter(None, args.contenders.split(","))))
    if args.rebuild:
        remove_outputs(ctx.work, args.step)
    began = time.monotonic()
    records = STEP_FUNCTIONS[args.step](ctx)
    seconds = round(time.monotonic() - began, 1)
    builds = ctx.work / "builds"
    builds.mkdir(parents=True, exist_ok=True)
    for name, rec in records.items():
        rec = {**rec, "step": args.step, "key": step_key(args.step, settings), "step_seconds": seconds}
        (builds / f"{name}.json").write_text(json.dumps(rec, indent=1), encoding="utf-8")
        print(f"built {name}: {rec['folder']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

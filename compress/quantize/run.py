"""Post-training int8 quantization of a model directory, with checked outputs and an accuracy guard.

``quantize(model_dir, out, cfg)`` turns an fp32 model directory into an int8 one that
``compress eval`` and ``compress latency`` load like any other (through
``compress.core.formats.runtime``). Four backends, chosen by name from
:data:`compress.quantize.config.BACKENDS` (with :class:`~compress.quantize.config.QuantizeConfig`), one
module each (its docstring says what it does and stores):

* ``torch`` (``compress.quantize.torch``): PyTorch dynamic quantization of every ``nn.Linear``,
  stored as int8 values + scales in ``model.int8.safetensors`` (format ``torch-int8-dynamic``).
* ``onnxruntime`` (``compress.quantize.onnxruntime``): ``onnxruntime.quantization`` of the fp32
  ONNX export (or, with ``fuse``, ONNX Runtime's fused graph) with the CPU's preset, dynamic or
  static; ``model.onnx`` (format ``onnx``).
* ``inc`` (``compress.quantize.inc``): Intel Neural Compressor 3.x static PT2E, or
  quantization-aware training on the same graph (``qat``); ``model.pt2`` (format ``inc-pt2e``).
* ``openvino`` (``compress.quantize.openvino``): NNCF static int8 of the OpenVINO IR, pooler and
  head fp32, with NNCF's accuracy control under ``max_drop``; an int8 IR (format ``openvino``).

Embeddings stay fp32 in the torch and inc backends (ONNX Runtime's dynamic preset also
quantizes the embedding Gathers), so a BERT-base shrinks about 2.4x there, not 4x.

Nothing is trusted blindly (``compress.quantize.checks``): the int8 model is run next to the
fp32 one on a few examples and degenerate outputs (NaN/inf, all zeros, one constant output
while the fp32 outputs vary) abort the run with nothing written. With a task, both are scored
on its dev split (at the eval batch size ``compress eval`` uses by default, recorded: dynamic
int8 scores move with batch composition); with ``max_drop`` a larger drop of the primary
metric moves the result to ``<out>.rejected`` and fails. The command prints both scores,
the drop and the output check.

A sentence-embedding folder (a base encoder, sentence-transformers files beside it) has no
task: with ``corpus`` / ``sentences_from`` its unlabelled sentences (gathered as embedding
distillation gathers them) calibrate the static schemes, tokenised as SentenceTransformer
tokenises them, and a disjoint held-out set checks the result (``compress.quantize.calibration``):
the mean cosine between each sentence's fp32 and int8 embeddings (pooled and normalised as the
folder says), refused below ``min_cosine``, and with ``eval_tasks`` the pair tasks' embedding
scores, refused when one drops more than ``max_drop``.
"""

from __future__ import annotations

import os
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

from compress.core.data.resolve import resolve_task, task_fields, task_of_folder
from compress.core.data.sources import TaskData, load_split
from compress.core.data.tasks import Task
from compress.core.errors import CompressError
from compress.core.lazy import load
from compress.core.formats import runtime
from compress.core.formats.artifacts import output_dir
from compress.core.formats.folder import open_folder
from compress.core.formats.layout import COMPRESSION_FILE, METRICS_FILE
from compress.core.formats.records import compression_record, read_compression, read_metrics
from compress.core.formats.writes import apply_umask, write_json_atomic
from compress.core.preflight import check_output, require_model_dir
from compress.core.formats.card import sentence_loading_line
from compress.core.formats.onnx import format_fusion
from compress.core.formats.architecture import structure_of
from compress.core.formats.runners import Runner
from compress.core.formats.runtime import load_folder_model
from compress.core.formats.sentence import copy_sentence_files, is_sentence_folder
from compress.core.model.heads import HEADS
from compress.core.model.structure import config_sizes, describe
from compress.eval.embeddings import EMBEDDING_EVAL
from compress.eval.evaluate import format_table
from compress.eval.latency.rows import megabytes, size_on_disk
from compress.quantize.calibration import CHECK_EXAMPLES, random_calibration, sentence_calibration, task_calibration
from compress.quantize.checks import accuracy_guard, check_outputs, embedding_guard
from compress.quantize.config import BACKENDS, Backend, QuantizeConfig
from compress.quantize.job import Job

# ---------------------------------------------------------------------------- entry point


def quantize(model_dir: str | Path, out: str | Path, cfg: QuantizeConfig, *, overwrite: bool = False) -> Path:
    """Quantize the fp32 model in ``model_dir`` to int8 with ``cfg.backend``; the output directory."""
    cfg.validate()
    backend = BACKENDS.get(cfg.backend)
    model_dir = require_model_dir(model_dir)
    out = check_output(out, overwrite, inputs=(model_dir, cfg))
    folder = open_folder(model_dir)
    if folder.quantized:
        raise CompressError(f"{model_dir} is already quantized to int8; quantize the fp32 model it was made from instead")
    head = folder.head
    task = resolve_task(cfg.task, cfg.data.own, train_file=cfg.data.train_file, model=folder) if cfg.has_task else None
    _check_head(backend, cfg, head, model_dir, task)
    if backend.needs_torch and folder.format != "torch":
        raise CompressError(f"the {cfg.backend} backend needs PyTorch weights; {model_dir} holds an {folder.format} model")
    own = task or task_of_folder(folder)  # recorded in the int8 folder, which may travel without its parent
    tokenizer = folder.tokenizer
    reference = load_folder_model(folder)  # the fp32 parent: quantized from (torch backends) and compared with
    max_positions = config_sizes(reference.config).max_positions
    max_length = cfg.data.resolved_max_length(task, max_positions) if task else None
    sentences = None  # a sentence-embedding folder's held-out check sentences
    if task:
        n = cfg.calibration_examples if cfg.scheme in ("static", "qat") else CHECK_EXAMPLES
        calibration = task_calibration(task, tokenizer, cfg, max_length, n)
    elif cfg.embedding:
        calibration, sentences = sentence_calibration(model_dir, tokenizer, cfg, max_positions)
    else:
        calibration = random_calibration(tokenizer, max_positions, cfg.seed)
    dev = _dev_splits(task, cfg.data) if task else None

    with output_dir(out, overwrite) as tmp:
        job = Job(model_dir, tmp, cfg, head, reference, calibration, task=task, tokenizer=tokenizer, dev=dev, max_length=max_length)
        extra = load(backend.run)(job)  # config.py names each backend's function without importing it
        copy_sentence_files(model_dir, tmp)  # a sentence-transformers folder keeps its pooling and normalisation
        record = _record(job, backend, extra)
        if own is not None:
            record.update(task_fields(own))
        write_json_atomic(tmp / COMPRESSION_FILE, record)  # the loader reads format and structure from it
        write_json_atomic(tmp / METRICS_FILE, {"results": []})
        quantized = runtime.load_model(tmp)  # looked up on the module at call time: tests break the runtime
        names = tuple(record["outputs"])
        record["check"] = check_outputs(reference, quantized, calibration, names, cfg.backend, per_row=not HEADS[head].per_token)
        rejection = None
        if task:
            rejection = accuracy_guard(job, quantized, record)
        elif sentences is not None:
            rejection = embedding_guard(job, quantized, sentences, record)
        if rejection:
            write_json_atomic(tmp / COMPRESSION_FILE, record)
            rejected = _reject(tmp, out)
            raise CompressError(f"{rejection}; the rejected int8 model is in {rejected}")
        write_json_atomic(tmp / COMPRESSION_FILE, record)
    return out




def _check_head(backend: Backend, cfg: QuantizeConfig, head: str, model_dir: Path, task: Task | None) -> None:
    if backend.heads is not None and head not in backend.heads:
        raise CompressError(f"the {cfg.backend} backend quantizes {', '.join(backend.heads)} models; {model_dir} is a {head} model")
    if cfg.embedding and head != "base":
        raise CompressError(f"{model_dir} is a {head} model; --corpus/--sentences-from are for sentence-embedding (base "
                            "encoder) folders: calibrate a task model on its task's rows with --task")
    if task is not None:
        wanted = task.behaviour.head
        if head != wanted:
            raise CompressError(f"{model_dir} is a {head} model but {task.display} needs a {wanted} model; fine-tune it on {task.name} first")


def _dev_splits(task: Task, data: TaskData) -> dict[str, Any]:
    """The raw dev split(s) (MNLI: matched and mismatched), as fine-tuning loads them."""
    _, dev_src = data.sources()
    names = [s.name for s in task.resolve_splits("dev")]
    if data.dev_file:
        names = names[:1]
    return {name: load_split(task, name, dev_src, data.max_eval_examples) for name in names}


def _record(job: Job, backend: Backend, extra: dict[str, Any]) -> dict[str, Any]:
    """compression.json for the int8 directory."""
    cfg = job.cfg
    structure = extra.pop("structure", None) or (structure_of(job.parent_dir) if isinstance(job.reference, Runner) else describe(job.reference))
    outputs = extra.pop("outputs", None) or list(HEADS[job.head].outputs)
    return compression_record(
        stage="quantize", method=f"{cfg.backend}-{cfg.scheme}", config=cfg, parent=job.parent_dir, structure=structure,
        seed=cfg.seed,
        extra={
            "format": backend.format,
            "backend": cfg.backend,
            "scheme": cfg.scheme,
            "precision": "int8",
            "per_channel": cfg.per_channel,
            "head": job.head,
            "outputs": outputs,
            "preset": extra.pop("preset", None),
            "calibration": job.calibration.source if cfg.scheme == "static" else None,
            "check_inputs": job.calibration.source,
            "packages": _versions(backend.packages),
            **extra,
        },
    )


def _versions(names: tuple[str, ...]) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def summarize(out: Path, cfg: QuantizeConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress quantize`` prints: backend, scheme and weights on disk before and after, the dev results,
    the fp32 and int8 scores with the drop (a sentence-embedding folder: the mean cosine of int8 to fp32 embeddings
    and any eval task's scores), the output check and, for a fused graph, its fused operators (all as recorded in
    metrics.json / compression.json)."""
    record = read_compression(out)
    before, after = size_on_disk(inputs["model"]), size_on_disk(out)
    lines = [f"{record.get('backend')} {record.get('scheme')} int8: weights {megabytes(before):.1f} MB -> {megabytes(after):.1f} MB"]
    results = read_metrics(out)
    evals = [r for r in results if r.get("kind") in ("eval", EMBEDDING_EVAL)]
    if evals:
        lines.append(format_table(evals))
    summary = next((r for r in reversed(results) if r.get("kind") == "quantize"), None)
    if summary and summary.get("embedding"):
        lines.extend(format_cosine(summary))
    elif summary:
        lines.append(f"{summary['task']} dev {summary['metric']}: fp32 {summary['parent']:.2f} -> int8 {summary['quantized']:.2f}, "
                     f"drop {summary['drop']:.2f} points (eval batch size {summary.get('batch_size')})")
    else:
        lines.append("dev score: not measured (no --task); the output check is the only test of the int8 model")
    check = (summary or {}).get("check") or record.get("check")
    if check:
        lines.append(format_check(check))
    if record.get("fusion"):
        lines.append(format_fusion(record["fusion"]))
    line = sentence_loading_line(out, record["format"]) if is_sentence_folder(out) else None
    if line:  # the card's call, as export prints it
        lines.append(line)
    return "\n".join(lines), []


def format_cosine(summary: dict[str, Any]) -> list[str]:
    """A sentence-embedding folder's check (:func:`compress.quantize.checks.embedding_guard`): the cosine line, and a line per eval task."""
    line = (f"embeddings of {summary['sentences']} held-out sentences: mean cosine int8 to fp32 {summary['mean_cosine']:.5f} "
            f"(lowest {summary['min_cosine']:.5f})")
    if summary.get("min_required") is not None:
        line += f", required at least {summary['min_required']:g}"
    lines = [line]
    for name, t in (summary.get("tasks") or {}).items():
        lines.append(f"{name} dev {t['metric']} of the embeddings: fp32 {t['parent']:.2f} -> int8 {t['quantized']:.2f}, "
                     f"drop {t['drop']:.2f} points")
    return lines


def format_check(check: dict[str, Any]) -> str:
    """The output check (:func:`check_outputs`) as one line."""
    line = (f"output check on {check['examples']} examples: max |int8 - fp32| {check['max_abs_diff']:.4f} "
            f"(fp32 max |output| {check['fp32_max_abs']:.4f})")
    if check.get("argmax_agreement") is not None:
        line += f", argmax agreement {100 * check['argmax_agreement']:.1f}%"
    return line


def rejected_path(out: Path) -> Path:
    """Where a result that failed the accuracy guard goes: ``<out>.rejected`` next to ``out``."""
    out = Path(out).absolute()
    return out.parent / f"{out.name}.rejected"


def _reject(tmp: Path, out: Path) -> Path:
    """Move the finished temporary directory to ``<out>.rejected`` (replacing an older rejection)."""
    target = rejected_path(out)
    if target.exists():
        shutil.rmtree(target)
    apply_umask(tmp)  # mkdtemp made it private
    os.replace(tmp, target)
    return target

"""Fine-tune a BERT on a task, as in Devlin et al. 2019 (section 4): GLUE, SQuAD or the user's own.

``finetune(model, out, cfg)`` takes a model directory, an alias (``bert-base``) or a hub
id, adds the task's head (classification from [CLS], regression for STS-B, a sigmoid per
label for multi-label, a tag per word for token classification, start/end span logits for
SQuAD), trains with the paper's recipe (AdamW, linear warm-up and decay, batch 32, 2-4
epochs), evaluates on dev with the task's metrics after every epoch, and writes the best
checkpoint as a model directory (scored on ``--test-file`` too when given). The task is a
preset name, a kind with the user's files (labels read from the training file), or the
model's own (``compress.core.data.resolve``). ``finetune_grid`` sweeps the paper's grid and
keeps the run that is best on dev.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
from pathlib import Path
from typing import Any

from compress.core.formats.artifacts import save_model_dir
from compress.core.formats.records import append_metrics, compression_record, read_compression, read_metrics, utc_now
from compress.core.formats.writes import publish, write_json_atomic
from compress.core.preflight import check_output
from compress.core.data.features import collate, train_features
from compress.core.data.sources import read_task_data
from compress.core.errors import CompressError
from compress.core.data.resolve import resolve_task, task_fields
from compress.core.formats.runtime import load_folder_for_task
from compress.core.model.structure import config_sizes, count_parameters, model_inputs
from compress.core.data.tasks import Task
from compress.core.checkpoints import load_weights, prepare_work_dir, work_dir_for
from compress.core.processes import is_main_process
from compress.core.train import train
from compress.eval.evaluate import dev_evaluator, format_table, split_records, test_records
from compress.teacher.config import FinetuneConfig
from compress.teacher.presets import open_model

# The BERT paper's fine-tuning grid (appendix A.3).
PAPER_GRID = {"batch_size": (16, 32), "lr": (5e-5, 3e-5, 2e-5), "epochs": (2, 3, 4)}


def finetune(model: str | Path, out: str | Path, cfg: FinetuneConfig, *, overwrite: bool = False,
             task: Task | None = None) -> Path:
    """Fine-tune ``model`` on its task and write the best dev checkpoint to ``out``.

    The task is ``task`` when a caller has resolved it, else what ``cfg.task`` (or the model) names.
    """
    out = Path(out)
    check_output(out, overwrite, inputs=(model, cfg), resume=cfg.resume)
    folder = open_model(model).check_torch("fine-tuning")
    source = folder.path
    task = task or resolve_task(cfg.task, cfg.data.own, train_file=cfg.data.train_file, model=folder)
    # Every split is read and checked before the tokenizer and the weights are loaded: a data error costs no model.
    splits = read_task_data(task, cfg.data, seed=cfg.train.seed)
    dev, test, n_train = splits.dev, splits.test, splits.n_train
    tokenizer = folder.tokenizer
    net = load_folder_for_task(folder, task, seed=cfg.train.seed)  # a bare encoder's new head: from --seed
    max_length = cfg.data.resolved_max_length(task, config_sizes(net.config).max_positions)
    features = train_features(splits.train, task, tokenizer, max_length, doc_stride=cfg.data.doc_stride)
    pad = collate(tokenizer, task)

    def collate_step(items, step):
        return pad(items)

    def loss_fn(m, batch):
        return m(**model_inputs(m, batch, targets=True)).loss, {}  # a tokenizer's extra inputs never reach the model

    work = prepare_work_dir(work_dir_for(out), cfg.resume)
    evaluate = dev_evaluator(task, tokenizer, dev, max_length, batch_size=cfg.data.eval_batch_size, doc_stride=cfg.data.doc_stride)
    result = train(
        net, features, collate_step, cfg.train, loss_fn=loss_fn, work_dir=work, evaluate=evaluate,
        select=task.primary_metric, resume=cfg.resume, run_key=[str(source), task.name, n_train, max_length],
        desc=f"fine-tuning {task.display}", lengths=[len(ids) for ids in features["input_ids"]],
    )
    if not is_main_process():
        return out  # rank 0 writes the output
    if result.best_weights is not None:
        load_weights(net, result.best_weights)  # keep the best epoch, not the last one
    records = split_records(task, dev, result.best or {}, data=cfg.data.describe("dev"), max_length=max_length)
    records += test_records(net, tokenizer, task, test, cfg.data, max_length)
    training = {
        "kind": "training", "stage": "finetune", "task": task.name, "steps": result.steps,
        "seconds": round(result.seconds, 1), "best_step": result.best_step, "n_train": n_train,
        "processes": result.processes, "history": result.history, "when": utc_now(),
    }
    record = compression_record(
        stage="finetune", method="finetune", config=cfg, parent=folder, seed=cfg.train.seed,
        extra={**task_fields(task), "params": count_parameters(net), "best": result.best, "best_step": result.best_step},
    )
    save_model_dir(net, out, tokenizer=tokenizer, record=record, overwrite=overwrite,
                   metrics=[*records, training])
    shutil.rmtree(work, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------- the paper's grid


def grid_runs(grid: dict[str, tuple] | None = None) -> list[dict[str, Any]]:
    grid = grid or PAPER_GRID
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def run_name(params: dict[str, Any]) -> str:
    return "-".join(f"{k.replace('batch_size', 'bs').replace('epochs', 'ep')}{v:g}" if isinstance(v, float) else
                    f"{k.replace('batch_size', 'bs').replace('epochs', 'ep')}{v}" for k, v in params.items())


def finetune_grid(
    model: str | Path, out: str | Path, cfg: FinetuneConfig, *, grid: dict[str, tuple] | None = None, overwrite: bool = False,
) -> Path:
    """Sweep batch size x learning rate x epochs, select on dev, keep only the best run's weights.

    ``out`` receives the best model directory with ``grid.md`` / ``grid.json`` (every run's
    dev metrics) beside its weights.
    """
    out = Path(out)
    check_output(out, overwrite, inputs=(model, cfg))
    task = resolve_task(cfg.task, cfg.data.own, train_file=cfg.data.train_file,
                        model=open_model(model).check_torch("fine-tuning"))
    scratch = out.parent / f".{out.name}.grid"
    scratch.mkdir(parents=True, exist_ok=True)
    rows, best_dir, best_value = [], None, None
    for params in grid_runs(grid):
        name = run_name(params)
        run_cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **params))
        run_out = scratch / name
        if not (cfg.resume and (run_out / "config.json").is_file()):
            finetune(model, run_out, run_cfg, overwrite=True, task=task)

        best = read_compression(run_out).get("best") or {}
        value = best.get(task.primary_metric)
        rows.append({"run": name, **params, **best})
        if value is not None and (best_value is None or value > best_value):
            if best_dir is not None and best_dir != run_out:
                shutil.rmtree(best_dir, ignore_errors=True)
            best_dir, best_value = run_out, value
        elif run_out != best_dir:
            shutil.rmtree(run_out, ignore_errors=True)
    if best_dir is None:
        raise CompressError("no grid run produced a dev metric; check the dev data")
    table = format_grid(rows, task.primary_metric, best_dir.name)
    (best_dir / "grid.md").write_text(table, encoding="utf-8")
    write_json_atomic(best_dir / "grid.json", {"task": task.name, "select": task.primary_metric, "best": best_dir.name, "runs": rows})
    append_metrics(best_dir, {"kind": "grid", "task": task.name, "select": task.primary_metric, "best": best_dir.name, "runs": rows})

    publish(best_dir, out.absolute(), overwrite)
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def format_grid(rows: list[dict[str, Any]], metric: str, best: str) -> str:
    keys = ["run", "batch_size", "lr", "epochs", metric]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{row.get(k):.2f}" if k == metric and isinstance(row.get(k), float) else
                 (f"{row.get(k):g}" if isinstance(row.get(k), float) else str(row.get(k, ""))) for k in keys]
        if row["run"] == best:
            cells[0] = f"**{cells[0]}** (selected)"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summarize(out: Path, cfg: FinetuneConfig, inputs: dict[str, Any]) -> tuple[str, list[str]]:
    """What ``compress teacher finetune`` prints: the dev results, then the grid's table after a sweep."""
    records = [r for r in read_metrics(out) if r.get("kind") == "eval"]
    parts = [format_table(records)] if records else []
    if (out / "grid.md").is_file():
        parts.append((out / "grid.md").read_text())
    return "\n".join(parts), []

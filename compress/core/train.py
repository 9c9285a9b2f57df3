"""The one training loop every stage uses: pretraining, fine-tuning, distillation, recovery.

Built on Accelerate, so the same code runs on a CPU, a GPU (bf16/fp16) and across
processes (``torchrun`` / ``accelerate launch``, gloo on CPU, NCCL on GPUs). The loop
owns what makes runs trustworthy:

* **The global batch is preserved.** ``batch_size`` is the number of examples per
  optimizer step summed over processes and accumulation steps; each process takes an
  interleaved share of every global batch, so 1 process and N processes see the same
  examples per step.
* **Exact resume.** Data order is a function of (seed, epoch), batch randomness (e.g.
  MLM masks) of (seed, step), and checkpoints store model, optimizer, scheduler and the
  torch RNG (dropout). Killing a run at any moment and resuming from its last
  checkpoint ends with the same weights as an uninterrupted run (CPU, fixed threads).
* **Atomic checkpoints.** Each is written to a temporary directory and renamed (see
  :mod:`compress.core.checkpoints`).
* **Failing loudly.** A NaN/inf loss, an optimizer step that overflows or inf/nan
  weights stop the run with a one-line error that names the last good checkpoint; a
  resume may lower the learning rate (see :data:`RESUMABLE_SETTINGS`). A run that fails
  before its first checkpoint leaves no work directory behind.
* **Trusted checkpoints only.** Optimizer, scheduler and RNG files are read as plain
  tensors; anything else is refused, never run.
* **Readable progress.** Every ``log_every`` steps one plain line (step, loss and the
  loss terms, learning rate, examples per second) and one per evaluation, above the bar
  on a terminal and alone in a redirected log (see :mod:`compress.core.logs`); the
  history so far is in ``work_dir/metrics.json`` while the run goes.

A stage supplies ``loss_fn(model, batch) -> (loss, logs)``, a ``collate(items, step)``
and optionally ``evaluate(model) -> metrics`` with the metric to select the best
checkpoint by.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from compress.core.batches import epoch_order, global_batches
from compress.core.checkpoints import (
    BEST,
    PROGRESS_FILE,
    STATE_FILE,
    discard_failed_run,
    fingerprint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    save_weights,
)
from compress.core.errors import CompressError
from compress.core.formats.records import utc_now
from compress.core.formats.writes import write_json_atomic
from compress.core.logs import progress
from compress.core.processes import is_main_process, make_accelerator
from compress.core.train_config import TrainConfig

PROGRESS_SHARE = 0.05  # rewriting PROGRESS_FILE may take at most this share of the training time (a long history is MBs)
# Settings a --resume may change (e.g. a lower --lr after a NaN): neither the data order nor the
# number of steps depends on them, so they are left out of the run key; a change is recorded in the history.
RESUMABLE_SETTINGS = ("lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "max_grad_norm")

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a run produced: its log, the best evaluation and where the best weights are."""

    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per log/eval event
    best: dict[str, Any] | None = None  # metrics of the best evaluation
    best_step: int | None = None
    steps: int = 0
    best_weights: Path | None = None  # safetensors file of the best evaluation, if any
    seconds: float = 0.0
    processes: int = 1  # data-parallel processes the run was spread over



def param_groups(model, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: no decay on biases and LayerNorm weights (as in BERT)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def linear_schedule(optimizer, warmup: int, total: int):
    """Linear warm-up from 0 to the peak over ``warmup`` steps, then linear decay to 0 at ``total``."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ---------------------------------------------------------------------------- the loop


LossFn = Callable[[Any, dict], tuple[Any, dict[str, Any]]]


@dataclass
class Phase:
    """A stretch of training with its own data, batching and length (BERT's 128 -> 512 phases).

    ``steps`` None means ``cfg.max_steps`` or ``cfg.epochs`` passes over ``dataset``.
    """

    dataset: Sequence[Any]
    collate: Callable[[list[Any], int], dict]  # (a process's items, global step) -> tensors
    batch_size: int | None = None  # global batch; None: cfg.batch_size
    steps: int | None = None
    lengths: Sequence[int] | None = None  # tokens per example, for group_by_length
    name: str = "train"


def train(
    model,
    dataset: Sequence[Any],
    collate: Callable[[list[Any], int], dict],
    cfg: TrainConfig,
    *,
    lengths: Sequence[int] | None = None,
    **kwargs: Any,
) -> TrainResult:
    """Train ``model`` in place on one dataset (see :func:`train_phases` for the options)."""
    return train_phases(model, [Phase(dataset, collate, lengths=lengths)], cfg, **kwargs)


@dataclass(frozen=True)
class _Job:
    """What :func:`train_phases` is asked to do besides the model, phases and config (its keyword options)."""

    loss_fn: LossFn  # (model, batch) -> (loss, logs)
    work_dir: Path  # checkpoints, best weights and the progress file
    evaluate: Callable[[Any], dict[str, float]] | None  # model -> metrics; None: no evaluation
    select: str | None  # the metric of ``evaluate`` that picks the best weights (higher is better)
    resume: bool  # continue from the newest checkpoint in work_dir, if any
    run_key: Any  # JSON-able; must match for a checkpoint to be resumed
    desc: str  # the progress bar's label and the progress file's "desc"
    shuffle: bool  # a random example order per epoch (else the dataset's order)


@dataclass
class _Run:
    """A run in progress: what the steps of :func:`train_phases` share, and what a checkpoint keeps."""

    cfg: TrainConfig
    plan: list[dict[str, Any]]  # per phase: its batches and step counts (see _plan)
    accelerator: Any
    optimizer: Any
    scheduler: Any
    job: _Job
    key: str  # fingerprint of the settings and data sizes: a checkpoint resumes only the same run
    total: int  # optimizer steps over all phases
    eval_every: int
    save_every: int
    result: TrainResult
    step: int = 0  # optimizer steps done
    best_value: float | None = None  # the selected metric's best value so far
    running: dict[str, float] = field(default_factory=dict)  # logs summed since the last history entry
    running_n: int = 0
    order_of: tuple[int, int] | None = None  # (phase, epoch) whose example order `order` holds
    order: list[int] = field(default_factory=list)
    examples: int = 0  # examples (over all processes) trained on since the last history entry
    seconds: float = 0.0  # time spent in training steps since then (evaluations and checkpoints excluded)
    written_at: float = -math.inf  # when the progress file was last written (time.monotonic), and how long it took
    write_cost: float = 0.0
    legacy_key: str = ""  # the key as computed before RESUMABLE_SETTINGS left it: older checkpoints still resume

    @property
    def main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def work_dir(self) -> Path:
        return self.job.work_dir

    @property
    def settings(self) -> dict[str, Any]:
        """The values of :data:`RESUMABLE_SETTINGS` this run trains with."""
        return {name: getattr(self.cfg, name) for name in RESUMABLE_SETTINGS}

    @property
    def best_file(self) -> Path:
        return self.work_dir / BEST / "model.safetensors"

    def state(self) -> dict[str, Any]:
        """What a checkpoint stores besides weights, optimizer, scheduler and RNG."""
        return {
            "step": self.step, "key": self.key, "history": self.result.history, "best": self.result.best,
            "best_step": self.result.best_step, "best_value": self.best_value, "total": self.total,
            "settings": self.settings,
        }


def train_phases(
    model,
    phases: Sequence[Phase],
    cfg: TrainConfig,
    *,
    loss_fn: LossFn,
    work_dir: str | Path,
    evaluate: Callable[[Any], dict[str, float]] | None = None,
    select: str | None = None,
    resume: bool = False,
    run_key: Any = None,
    desc: str = "training",
    shuffle: bool = True,
) -> TrainResult:
    """Train ``model`` in place through ``phases``; checkpoints, the best weights and the history so far go to ``work_dir``.

    One optimizer and one warm-up/decay schedule span all phases. ``collate(items, step)``
    turns a process's share of a batch into tensors; the step number lets it draw
    reproducible randomness (see :func:`compress.core.batches.step_seed`). ``select``
    names the metric in ``evaluate``'s result that picks the best checkpoint (higher is
    better). ``run_key`` (anything JSON-able: config, data sizes) must match for
    ``resume`` to accept a checkpoint. A run that fails before its first checkpoint
    removes what it wrote (``work_dir`` itself if it created it, and an empty
    :func:`compress.core.checkpoints.prepare_work_dir` around it).
    """
    job = _Job(loss_fn=loss_fn, work_dir=Path(work_dir), evaluate=evaluate, select=select, resume=resume,
               run_key=run_key, desc=desc, shuffle=shuffle)
    created = not job.work_dir.exists()
    try:
        return _train(model, phases, cfg, job)
    except BaseException:
        if is_main_process():
            with contextlib.suppress(OSError):  # the run's own error is the one to report
                discard_failed_run(job.work_dir, created)
        raise


def _train(model, phases: Sequence[Phase], cfg: TrainConfig, job: _Job) -> TrainResult:
    """The body of :func:`train_phases`."""
    started = time.monotonic()
    run = _start(model, phases, cfg, job)
    if job.resume:
        _resume(run, model)
    if run.result.best_step is not None and run.best_file.is_file():
        run.result.best_weights = run.best_file
    model, run.optimizer = run.accelerator.prepare(model, run.optimizer)
    model.train()
    _write_progress(run, force=True)
    bar = progress(total=run.total, initial=run.step, desc=job.desc, unit="step", disable=not run.main)
    while run.step < run.total:
        p, local = _locate(run.plan, run.step)
        phase = run.plan[p]["phase"]
        tick = time.monotonic()
        logs = _accumulate(run, model, phase, _my_share(run, p, local))
        _optimizer_step(run, model)
        run.seconds += time.monotonic() - tick
        run.examples += _global_batch_size(run, p, local)
        bar.update(1)
        epoch = round((local + 1) / run.plan[p]["steps_per_epoch"], 3)  # epochs of this phase done, as logged
        _log(run, logs, epoch, phase.name, bar)
        evaluating = job.evaluate is not None and (run.step % run.eval_every == 0 or run.step == run.total)
        saving = run.step % run.save_every == 0 and run.step < run.total
        if evaluating or saving or run.step == run.total:
            _check_weights(run, model)  # no checkpoint, best or final weights are ever inf/nan
        if evaluating:
            _evaluate_and_keep_best(run, model, epoch)
        if saving:
            _checkpoint(run, model)
    bar.close()
    model = run.accelerator.unwrap_model(model)
    model.eval()
    run.result.steps = run.step
    run.result.seconds = time.monotonic() - started
    _write_progress(run, status="done")
    return run.result


def _start(model, phases: Sequence[Phase], cfg: TrainConfig, job: _Job) -> _Run:
    """A new run: accelerator, plan, seeded RNG, optimizer and schedule (the model is not wrapped yet)."""
    accelerator = make_accelerator(cfg.precision, cfg.device)
    world = accelerator.num_processes
    plan = _plan(phases, cfg, world)
    total = sum(p["steps"] for p in plan)
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else int(cfg.warmup_ratio * total)
    sizes = [(len(p["phase"].dataset), p["batch_size"], p["steps"]) for p in plan]
    settings = asdict(cfg) | {"device": None, "keep_checkpoints": None}
    key = fingerprint(settings | dict.fromkeys(RESUMABLE_SETTINGS), sizes, world, job.run_key)
    torch.manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps
    )
    return _Run(
        cfg, plan, accelerator, optimizer, linear_schedule(optimizer, warmup, total), job, key, total,
        eval_every=cfg.eval_every or plan[0]["steps_per_epoch"], save_every=cfg.save_every or plan[0]["steps_per_epoch"],
        result=TrainResult(processes=world), legacy_key=fingerprint(settings, sizes, world, job.run_key),
    )


def _resume(run: _Run, model) -> None:
    """Continue from the newest complete checkpoint, if there is one; refuse one made with other settings or data.

    Only :data:`RESUMABLE_SETTINGS` may differ from the checkpoint's: the optimizer uses
    the new values from this step on, and the history records the change at this step.
    """
    checkpoints = list_checkpoints(run.work_dir)
    if not checkpoints:
        return
    path = checkpoints[-1]
    state = json.loads((path / STATE_FILE).read_text())
    if state.get("key") not in (run.key, run.legacy_key):
        flags = ", ".join("--" + name.replace("_", "-") for name in RESUMABLE_SETTINGS)
        raise CompressError(
            f"the checkpoint in {path} was made with other settings or data (only {flags} may change on --resume); "
            f"run with the same options, or remove {run.work_dir} to start over"
        )
    built = [{k: v for k, v in group.items() if k not in ("params", "lr")} for group in run.optimizer.param_groups]
    load_checkpoint(path, model, run.optimizer, run.scheduler)  # also restores the RNG
    run.step = state["step"]
    run.result.history = state["history"]
    run.result.best, run.result.best_step, run.best_value = state["best"], state["best_step"], state["best_value"]
    saved = state.get("settings", {})  # absent in a checkpoint older than RESUMABLE_SETTINGS: then it matched the key
    changed = {k: {"from": saved[k], "to": v} for k, v in run.settings.items() if k in saved and saved[k] != v}
    if changed:
        _use_settings(run, built)
        run.result.history.append({"step": run.step, "changed": changed})
    if run.main:
        log.info(f"resuming from {path} (step {run.step}/{run.total})"
                 + "".join(f"; {k} {c['from']:g} -> {c['to']:g}" for k, c in changed.items()))


def _use_settings(run: _Run, built: list[dict[str, Any]]) -> None:
    """Give the optimizer and schedule just loaded from a checkpoint this run's hyper-parameters (``built``).

    ``built`` holds each parameter group's hyper-parameters as this run constructed
    them (peak lr as ``initial_lr``, weight decay, betas, eps); the learning rate at
    the current step follows the same schedule from the new peak.
    """
    for group, fresh, factor in zip(run.optimizer.param_groups, built, run.scheduler.lr_lambdas):
        group.update(fresh)
        group["lr"] = fresh["initial_lr"] * factor(run.scheduler.last_epoch)
    run.scheduler.base_lrs = [fresh["initial_lr"] for fresh in built]


def _my_share(run: _Run, p: int, local: int) -> list[int]:
    """Example indices of this process's interleaved share of the global batch at step ``local`` of phase ``p``."""
    entry = run.plan[p]
    epoch, index_in_epoch = divmod(local, entry["steps_per_epoch"])
    if run.order_of != (p, epoch):  # one permutation per (phase, epoch): a pure function of the seed
        run.order_of = (p, epoch)
        grouped = entry["phase"].lengths if run.cfg.group_by_length else None
        run.order = epoch_order(len(entry["phase"].dataset), run.cfg.seed + 7 * p, epoch, run.job.shuffle, grouped,
                                entry["batch_size"])
    start, end = entry["batches"][index_in_epoch]
    return run.order[start:end][run.accelerator.process_index :: run.accelerator.num_processes]


def _global_batch_size(run: _Run, p: int, local: int) -> int:
    """Examples in the global batch at step ``local`` of phase ``p`` (the last one of an epoch may be short)."""
    entry = run.plan[p]
    start, end = entry["batches"][local % entry["steps_per_epoch"]]
    return end - start


def _accumulate(run: _Run, model, phase: Phase, mine: list[int]) -> dict[str, float]:
    """Forward and backward over ``mine`` in ``grad_accum`` micro-batches; gradients sync across processes once.

    Returns the loss and the job's ``loss_fn``'s logs, averaged over the micro-batches.
    """
    accelerator, world = run.accelerator, run.accelerator.num_processes
    micro = max(1, len(mine) // run.cfg.grad_accum)
    chunks = [mine[i : i + micro] for i in range(0, len(mine), micro)]
    logs_sum: dict[str, float] = {}
    for c, chunk in enumerate(chunks):
        batch = phase.collate([phase.dataset[i] for i in chunk], run.step)
        batch = {k: v.to(accelerator.device) if hasattr(v, "to") else v for k, v in batch.items()}
        sync = c == len(chunks) - 1  # only the last micro-batch all-reduces the gradients
        with contextlib.nullcontext() if sync or world == 1 else accelerator.no_sync(model):
            with accelerator.autocast():
                loss, logs = run.job.loss_fn(model, batch)
            _check_finite(run, loss)
            accelerator.backward(loss / len(chunks))
        for k, v in {"loss": loss, **logs}.items():
            value = v.detach() if hasattr(v, "detach") else v
            logs_sum[k] = logs_sum.get(k, 0.0) + float(value) / len(chunks)
    return logs_sum


def _optimizer_step(run: _Run, model) -> None:
    """Clip the gradients, step the optimizer and the schedule, clear the gradients: one step done."""
    if run.cfg.max_grad_norm > 0:
        run.accelerator.clip_grad_norm_(model.parameters(), run.cfg.max_grad_norm)
    try:
        run.optimizer.step()
    except RuntimeError as err:  # "value cannot be converted to type float without overflow": lr x update > float max
        if "overflow" not in str(err):
            raise
        raise _stopped(run, "the optimizer step overflowed (the learning rate is far too large)", run.step + 1) from err
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.step += 1


def _log(run: _Run, logs: dict[str, float], epoch: float, phase_name: str, bar) -> None:
    """Add a step's logs to the running sums; every ``log_every`` steps (and at the end) record their mean.

    A recorded entry is also one log line and goes into the progress file.
    """
    for k, v in logs.items():
        run.running[k] = run.running.get(k, 0.0) + v
    run.running_n += 1
    if run.step % run.cfg.log_every != 0 and run.step != run.total:
        return
    entry = {"step": run.step, "epoch": epoch, "lr": run.scheduler.get_last_lr()[0]}
    if len(run.plan) > 1:
        entry["phase"] = phase_name
    entry.update({k: v / run.running_n for k, v in run.running.items()})
    if run.seconds > 0:
        entry["examples_per_second"] = round(run.examples / run.seconds, 1)
    run.result.history.append(entry)
    run.running, run.running_n, run.examples, run.seconds = {}, 0, 0, 0.0
    if run.main:
        bar.set_postfix(loss=f"{entry['loss']:.4f}", lr=f"{entry['lr']:.2e}")
        log.info(_step_line(run, entry))
        _write_progress(run)


SHOWN_APART = ("step", "epoch", "lr", "phase", "loss", "examples_per_second")  # history keys with their own place in a line


def _step_line(run: _Run, entry: dict[str, Any]) -> str:
    """``step 120/900  loss 0.4123  loss_kd 0.3012  lr 4.1e-05  12.3 ex/s``: one history entry as a log line."""
    parts = [f"step {entry['step']}/{run.total}"]
    if "phase" in entry:
        parts.append(f"phase {entry['phase']}")
    parts.append(f"loss {entry['loss']:.4f}")
    parts += [f"{k} {v:.4f}" for k, v in entry.items() if k not in SHOWN_APART and isinstance(v, (int, float))]
    parts.append(f"lr {entry['lr']:.1e}")
    if "examples_per_second" in entry:
        parts.append(f"{entry['examples_per_second']:.1f} ex/s")
    return "  ".join(parts)


def _write_progress(run: _Run, *, force: bool = False, status: str = "running") -> None:
    """The training record so far (status, step, history) in ``work_dir/metrics.json``, rewritten atomically.

    Rank 0 writes it at every log step, evaluation and at the end, shaped like a model
    directory's metrics.json; a log step skips the write while the last one would take
    more than :data:`PROGRESS_SHARE` of the time since (a history of 1M steps is MBs).
    """
    now = time.monotonic()
    if not run.main or (status == "running" and not force and (now - run.written_at) * PROGRESS_SHARE < run.write_cost):
        return
    record = {
        "kind": "training", "status": status, "desc": run.job.desc,
        "step": run.step, "total": run.total, "processes": run.accelerator.num_processes,
        "best_step": run.result.best_step, "history": run.result.history, "when": utc_now(),
    }
    write_json_atomic(run.work_dir / PROGRESS_FILE, {"results": [record]})
    run.written_at = time.monotonic()
    run.write_cost = run.written_at - now


def _evaluate_and_keep_best(run: _Run, model, epoch: float) -> None:
    """Evaluate on rank 0 (the others wait); a new best by ``job.select`` (higher is better) has its weights saved."""
    accelerator = run.accelerator
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        inner = accelerator.unwrap_model(model)
        inner.eval()
        metrics = run.job.evaluate(inner)
        inner.train()
        run.result.history.append({"step": run.step, "epoch": epoch, "eval": metrics})
        select = run.job.select
        value = metrics.get(select) if select else None
        if value is not None and (run.best_value is None or value > run.best_value):
            run.best_value, run.result.best, run.result.best_step = float(value), metrics, run.step
            run.best_file.parent.mkdir(parents=True, exist_ok=True)
            save_weights(inner, run.best_file)
            run.result.best_weights = run.best_file
        shown = "  ".join(f"{k} {v:.2f}" for k, v in metrics.items() if isinstance(v, float))
        log.info(f"step {run.step}/{run.total}  eval  {shown}" + ("  (best)" if run.result.best_step == run.step else ""))
        _write_progress(run, force=True)
    accelerator.wait_for_everyone()


def _checkpoint(run: _Run, model) -> None:
    """Save a checkpoint to resume from: rank 0 writes it, every process waits until it is complete."""
    accelerator = run.accelerator
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        save_checkpoint(run.work_dir, accelerator.unwrap_model(model), run.optimizer, run.scheduler, run.state(),
                        run.cfg.keep_checkpoints)
    accelerator.wait_for_everyone()


def _plan(phases: Sequence[Phase], cfg: TrainConfig, world: int) -> list[dict[str, Any]]:
    """Batches and step counts of each phase."""
    if not phases:
        raise ValueError("train_phases needs at least one phase")
    plan = []
    for phase in phases:
        batch_size = phase.batch_size or cfg.batch_size
        if batch_size % (world * cfg.grad_accum):
            raise CompressError(
                f"--batch-size {batch_size} must be divisible by processes x --grad-accum ({world} x {cfg.grad_accum})"
            )
        batches = global_batches(len(phase.dataset), batch_size, world)
        if not batches:
            raise CompressError(
                f"the {phase.name} data has {len(phase.dataset)} examples, fewer than the {world} processes; add data"
            )
        steps = phase.steps
        if steps is None:
            steps = cfg.max_steps or len(batches) * cfg.epochs
        plan.append({"phase": phase, "batch_size": batch_size, "batches": batches, "steps_per_epoch": len(batches), "steps": steps})
    return plan


def _locate(plan: list[dict[str, Any]], step: int) -> tuple[int, int]:
    """(phase index, step within that phase) of a global step."""
    for p, entry in enumerate(plan):
        if step < entry["steps"]:
            return p, step
        step -= entry["steps"]
    return len(plan) - 1, plan[-1]["steps"] - 1


def _check_finite(run: _Run, loss) -> None:
    """Stop the run if the loss of the step under way is inf/nan on any process."""
    accelerator = run.accelerator
    finite = torch.isfinite(loss.detach()).to(torch.float32)
    if accelerator.num_processes > 1:
        finite = accelerator.reduce(finite, reduction="sum") / accelerator.num_processes
    if float(finite) < 1.0:
        raise _stopped(run, f"the loss became {float(loss.detach())}", run.step + 1)


def _check_weights(run: _Run, model) -> None:
    """Stop the run if the steps so far left an inf/nan weight (before it is evaluated, saved or returned)."""
    trained = [torch.isfinite(p.detach()).all() for p in model.parameters() if p.requires_grad]
    if trained and not bool(torch.stack(trained).all()):  # one sync, not one per tensor
        raise _stopped(run, "the weights became inf or nan", run.step)


def _stopped(run: _Run, what: str, step: int) -> CompressError:
    """The one-line error that stops a diverged run: what happened, the last good checkpoint, what to do next.

    The advice is what works: --resume accepts a lower --lr (see :data:`RESUMABLE_SETTINGS`),
    but another --precision only by starting over.
    """
    last = list_checkpoints(run.work_dir)
    if last:
        where = f"the last good checkpoint is {last[-1]}; resume from it with the same options plus --resume and a lower --lr"
    else:
        where = "no checkpoint was written yet; run again with a lower --lr"
    fp32 = ", or start over with --precision fp32" if run.cfg.precision != "fp32" else ""
    return CompressError(f"{what} at step {step}; training stopped and {where}{fp32}, or check the data")

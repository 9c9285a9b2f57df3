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
* **Atomic checkpoints.** Each is written to a temporary directory and renamed.
* **Failing loudly.** A NaN/inf loss stops the run with a one-line error that names
  the last good checkpoint.

A stage supplies ``loss_fn(model, batch) -> (loss, logs)``, a ``collate(items, step)``
and optionally ``evaluate(model) -> metrics`` with the metric to select the best
checkpoint by.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from compress.core.config import option
from compress.core.errors import CompressError

CHECKPOINTS = "checkpoints"
BEST = "best"
STATE_FILE = "trainer_state.json"


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = option(3, "passes over the training data")
    max_steps: int | None = option(None, "stop after this many optimizer steps (overrides --epochs)")
    batch_size: int = option(32, "global batch: examples per optimizer step over all processes")
    grad_accum: int = option(1, "split each process's share of a batch into this many micro-batches")
    lr: float = option(2e-5, "peak learning rate (AdamW)")
    weight_decay: float = option(0.01, "AdamW weight decay (not applied to biases and LayerNorm)")
    adam_beta1: float = option(0.9, "AdamW beta1")
    adam_beta2: float = option(0.999, "AdamW beta2")
    adam_eps: float = option(1e-6, "AdamW epsilon")
    warmup_ratio: float = option(0.1, "fraction of steps with linear warm-up (then linear decay to 0)")
    warmup_steps: int | None = option(None, "warm-up steps (overrides --warmup-ratio)")
    max_grad_norm: float = option(1.0, "clip the gradient norm to this (0: no clipping)")
    precision: Literal["fp32", "bf16", "fp16"] = option("fp32", "fp32, or bf16/fp16 mixed precision")
    seed: int = option(42, "seed for initialisation, data order and dropout")
    eval_every: int | None = option(None, "evaluate every N steps (default: at the end of each epoch)")
    save_every: int | None = option(None, "checkpoint every N steps (default: at the end of each epoch)")
    keep_checkpoints: int = option(2, "checkpoints kept for --resume (the newest ones)")
    log_every: int = option(20, "record the running loss every N steps")
    group_by_length: bool = option(True, "batch examples of similar length together (less padding; order still random)")
    device: str = option("auto", "auto, cpu or cuda")

    def validate(self) -> None:
        for name in ("epochs", "batch_size", "grad_accum", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise CompressError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise CompressError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise CompressError(f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio}")
        for name in ("max_steps", "eval_every", "save_every", "warmup_steps"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "warmup_steps" else 1):
                raise CompressError(f"--{name.replace('_', '-')} must be positive, got {value}")
        if self.batch_size % self.grad_accum:
            raise CompressError(f"--batch-size {self.batch_size} is not divisible by --grad-accum {self.grad_accum}")


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


# ---------------------------------------------------------------------------- helpers


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-able parts (configs, data sizes) to match checkpoints to runs."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def step_seed(seed: int, step: int) -> int:
    """A per-step seed for batch randomness (MLM masks) that does not depend on history."""
    return (seed * 1_000_003 + step * 7919) % (2**63 - 1)


def epoch_order(
    n: int, seed: int, epoch: int, shuffle: bool = True, lengths: Sequence[int] | None = None, batch_size: int = 1
) -> list[int]:
    """The example order of one epoch: a permutation fixed by (seed, epoch).

    With ``lengths``, examples are grouped by length as in Hugging Face's
    ``group_by_length``: the permutation is cut into mega-batches of 50 batches, each
    sorted by length, so a batch holds similar lengths (little padding) while the data
    order stays random. The batches are then shuffled too, keeping the longest first
    (an out-of-memory error shows up at step one, not hours later).
    """
    import torch

    if not shuffle:
        return list(range(n))
    g = torch.Generator().manual_seed(seed * 1009 + epoch)
    order = torch.randperm(n, generator=g).tolist()
    if lengths is None or batch_size <= 1:
        return order
    mega = batch_size * 50
    grouped: list[int] = []
    for start in range(0, n, mega):
        grouped.extend(sorted(order[start : start + mega], key=lambda i: -lengths[i]))
    batches = [grouped[i : i + batch_size] for i in range(0, n, batch_size)]
    full = [b for b in batches if len(b) == batch_size]
    tail = [b for b in batches if len(b) < batch_size]  # a short batch stays last
    longest = max(range(len(full)), key=lambda b: lengths[full[b][0]]) if full else None
    rest = [b for i, b in enumerate(full) if i != longest]
    shuffled = [rest[i] for i in torch.randperm(len(rest), generator=g).tolist()]
    head = [full[longest]] if longest is not None else []
    return [i for b in head + shuffled + tail for i in b]


def global_batches(n: int, batch_size: int, world: int) -> list[tuple[int, int]]:
    """(start, end) of each global batch; the last one is trimmed to a multiple of ``world``."""
    out = []
    for start in range(0, n, batch_size):
        end = min(start + batch_size, n)
        end = start + ((end - start) // world) * world
        if end > start:
            out.append((start, end))
    return out


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
    import torch

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_accelerator(precision: str, device: str):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    import torch

    if precision == "fp16" and (device == "cpu" or not torch.cuda.is_available()):
        raise CompressError("--precision fp16 needs a CUDA GPU; on a CPU use bf16 or fp32")
    # One Accelerator per run: reset the mixed-precision state a previous run in this
    # process left behind (the process group, if any, is kept).
    AcceleratorState._reset_state(reset_partial_state=False)
    from accelerate.utils import DistributedDataParallelKwargs

    mixed = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[precision]
    # Some stages train parameters that a given step does not use (a classifier during
    # TinyBERT's intermediate stage): data-parallel training must tolerate that.
    ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
    state = distributed_state(device)  # the process group first, with the right CPU flag
    return Accelerator(mixed_precision=mixed, cpu=state.device.type == "cpu", kwargs_handlers=[ddp])


def _atomic_dir(final: Path) -> contextlib.AbstractContextManager[Path]:
    @contextlib.contextmanager
    def manager():
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            yield tmp
            if final.exists():
                old = final.parent / f".{final.name}.old"
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    return manager()


def _save_weights(model, path: Path) -> None:
    from safetensors.torch import save_model

    tmp = path.with_name(f".{path.name}.tmp")
    save_model(model, str(tmp))  # handles tied weights (MLM decoder = word embeddings)
    os.replace(tmp, path)


def load_weights(model, path: Path) -> None:
    """Load a safetensors state (written by this loop) into ``model`` in place."""
    from safetensors.torch import load_model

    missing, unexpected = load_model(model, str(path), strict=False)
    if unexpected or [k for k in missing if "position_ids" not in k]:
        raise CompressError(f"{path} does not match the model being trained; remove it or start without --resume")


# ---------------------------------------------------------------------------- checkpoints


def list_checkpoints(work_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (partial ones are temporary dirs and never listed)."""
    root = Path(work_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and (p / STATE_FILE).is_file()]
    return sorted(done, key=lambda p: int(p.name.split("-")[1]))


def save_checkpoint(work_dir: Path, model, optimizer, scheduler, state: dict[str, Any], keep: int) -> Path:
    import torch

    final = Path(work_dir) / CHECKPOINTS / f"step-{state['step']:08d}"
    with _atomic_dir(final) as tmp:
        _save_weights(model, tmp / "model.safetensors")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, tmp / "rng.pt")
        # The state file is written last: a checkpoint without it is never resumed from.
        (tmp / STATE_FILE).write_text(json.dumps(state, default=str))
    for old in list_checkpoints(work_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler) -> dict[str, Any]:
    import torch

    load_weights(model, path / "model.safetensors")
    # weights_only: a checkpoint must never be able to run code when it is read.
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=True))
    rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return json.loads((path / STATE_FILE).read_text())


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
    """Train ``model`` in place through ``phases``; checkpoints and the best weights go to ``work_dir``.

    One optimizer and one warm-up/decay schedule span all phases. ``collate(items, step)``
    turns a process's share of a batch into tensors; the step number lets it draw
    reproducible randomness (see :func:`step_seed`). ``select`` names the metric in
    ``evaluate``'s result that picks the best checkpoint (higher is better). ``run_key``
    (anything JSON-able: config, data sizes) must match for ``resume`` to accept a
    checkpoint.
    """
    import torch
    from tqdm.auto import tqdm

    started = time.monotonic()
    work_dir = Path(work_dir)
    accelerator = make_accelerator(cfg.precision, cfg.device)
    world, rank = accelerator.num_processes, accelerator.process_index
    plan = _plan(phases, cfg, world)
    total = sum(p["steps"] for p in plan)
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else int(cfg.warmup_ratio * total)
    eval_every = cfg.eval_every or plan[0]["steps_per_epoch"]
    save_every = cfg.save_every or plan[0]["steps_per_epoch"]
    sizes = [(len(p["phase"].dataset), p["batch_size"], p["steps"]) for p in plan]
    key = fingerprint(asdict(cfg) | {"device": None, "keep_checkpoints": None}, sizes, world, run_key)
    torch.manual_seed(cfg.seed)

    optimizer = torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps
    )
    scheduler = linear_schedule(optimizer, warmup, total)
    result = TrainResult(processes=world)
    best_value: float | None = None
    step = 0
    if resume:
        checkpoints = list_checkpoints(work_dir)
        if checkpoints:
            state = load_checkpoint(checkpoints[-1], model, optimizer, scheduler)
            if state.get("key") != key:
                raise CompressError(
                    f"the checkpoint in {checkpoints[-1]} was made with other settings or data; "
                    f"run with the same options, or remove {work_dir} to start over"
                )
            step = state["step"]
            result.history = state["history"]
            result.best, result.best_step, best_value = state["best"], state["best_step"], state["best_value"]
            if accelerator.is_main_process:
                tqdm.write(f"resuming from {checkpoints[-1]} (step {step}/{total})")
    best_file = work_dir / BEST / "model.safetensors"
    if result.best_step is not None and best_file.is_file():
        result.best_weights = best_file

    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    running: dict[str, float] = {}
    running_n = 0
    bar = tqdm(total=total, initial=step, desc=desc, unit="step", disable=not accelerator.is_main_process, dynamic_ncols=True)

    def state_dict() -> dict[str, Any]:
        return {
            "step": step, "key": key, "history": result.history, "best": result.best,
            "best_step": result.best_step, "best_value": best_value, "total": total,
        }

    cached: tuple[int, int] | None = None  # (phase, epoch) whose order is in `order`
    order: list[int] = []
    while step < total:
        p, local = _locate(plan, step)
        phase, spe = plan[p]["phase"], plan[p]["steps_per_epoch"]
        epoch, index_in_epoch = divmod(local, spe)
        if cached != (p, epoch):  # one permutation per (phase, epoch): a pure function of the seed
            cached = (p, epoch)
            grouped = phase.lengths if cfg.group_by_length else None
            order = epoch_order(len(phase.dataset), cfg.seed + 7 * p, epoch, shuffle, grouped, plan[p]["batch_size"])
        start, end = plan[p]["batches"][index_in_epoch]
        mine = order[start:end][rank::world]  # this process's interleaved share of the global batch
        micro = max(1, len(mine) // cfg.grad_accum)
        chunks = [mine[i : i + micro] for i in range(0, len(mine), micro)]
        logs_sum: dict[str, float] = {}
        for c, chunk in enumerate(chunks):
            batch = phase.collate([phase.dataset[i] for i in chunk], step)
            batch = {k: v.to(accelerator.device) if hasattr(v, "to") else v for k, v in batch.items()}
            sync = c == len(chunks) - 1
            with contextlib.nullcontext() if sync or world == 1 else accelerator.no_sync(model):
                with accelerator.autocast():
                    loss, logs = loss_fn(model, batch)
                _check_finite(loss, step, work_dir, accelerator)
                accelerator.backward(loss / len(chunks))
            for k, v in {"loss": loss, **logs}.items():
                value = v.detach() if hasattr(v, "detach") else v
                logs_sum[k] = logs_sum.get(k, 0.0) + float(value) / len(chunks)
        if cfg.max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        bar.update(1)
        for k, v in logs_sum.items():
            running[k] = running.get(k, 0.0) + v
        running_n += 1
        if step % cfg.log_every == 0 or step == total:
            entry = {"step": step, "epoch": round((local + 1) / spe, 3), "lr": scheduler.get_last_lr()[0]}
            if len(plan) > 1:
                entry["phase"] = phase.name
            entry.update({k: v / running_n for k, v in running.items()})
            result.history.append(entry)
            bar.set_postfix(loss=f"{entry['loss']:.4f}", lr=f"{entry['lr']:.2e}")
            running, running_n = {}, 0
        if evaluate is not None and (step % eval_every == 0 or step == total):
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                inner = accelerator.unwrap_model(model)
                inner.eval()
                metrics = evaluate(inner)
                inner.train()
                result.history.append({"step": step, "epoch": round((local + 1) / spe, 3), "eval": metrics})
                value = metrics.get(select) if select else None
                if value is not None and (best_value is None or value > best_value):
                    best_value, result.best, result.best_step = float(value), metrics, step
                    best_file.parent.mkdir(parents=True, exist_ok=True)
                    _save_weights(inner, best_file)
                    result.best_weights = best_file
                shown = ", ".join(f"{k} {v:.2f}" for k, v in metrics.items() if isinstance(v, float))
                tqdm.write(f"step {step}: {shown}" + (" (best)" if result.best_step == step else ""))
            accelerator.wait_for_everyone()
        if step % save_every == 0 and step < total:
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                save_checkpoint(work_dir, accelerator.unwrap_model(model), optimizer, scheduler, state_dict(), cfg.keep_checkpoints)
            accelerator.wait_for_everyone()
    bar.close()
    model = accelerator.unwrap_model(model)
    model.eval()
    result.steps = step
    result.seconds = time.monotonic() - started
    return result


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


def _check_finite(loss, step: int, work_dir: Path, accelerator) -> None:
    import torch

    finite = torch.isfinite(loss.detach()).to(torch.float32)
    if accelerator.num_processes > 1:
        finite = accelerator.reduce(finite, reduction="sum") / accelerator.num_processes
    if float(finite) < 1.0:
        last = list_checkpoints(work_dir)
        where = f"the last good checkpoint is {last[-1]} (resume with --resume)" if last else "no checkpoint was written yet"
        raise CompressError(
            f"the loss became {float(loss.detach())} at step {step + 1}; training stopped and {where}; "
            "lower --lr, use fp32, or check the data"
        )


def distributed_state(device: str = "auto"):
    """The process group of this run (created on first use from torchrun/accelerate's environment).

    Accelerate sets up multi-process CPU training (gloo) only when told the run is on a
    CPU, so the flag is decided here once, for every caller.
    """
    import torch
    from accelerate import PartialState

    cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    return PartialState(cpu=cpu)


def main_process_first():
    """A context in which rank 0 runs first and the others wait (e.g. to build a shared cache)."""
    return distributed_state().main_process_first()


def prepare_work_dir(work: Path, resume: bool) -> Path:
    """Create the checkpoint directory (emptied first unless resuming), once, on rank 0."""
    with main_process_first():
        if is_main_process():
            if not resume and work.exists():
                shutil.rmtree(work)
            work.mkdir(parents=True, exist_ok=True)
    return work


def is_main_process() -> bool:
    """True on the process that writes outputs (rank 0), also outside distributed runs."""
    return int(os.environ.get("RANK", "0")) == 0

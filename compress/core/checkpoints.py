"""A run's work directory: atomic checkpoints to resume from, their weights, and removing what a failed run left.

Layout of ``work_dir``: ``checkpoints/step-NNNNNNNN/`` (model.safetensors, optimizer.pt,
scheduler.pt, rng.pt, and trainer_state.json written last: a checkpoint without it is
never resumed from), ``best/model.safetensors`` (the best evaluation) and ``metrics.json``
(the training record so far). Each checkpoint is written to a temporary directory and
renamed; optimizer, scheduler and RNG files are read as plain tensors, anything else is
refused, never run. A work directory that holds no checkpoint when its run fails (or at
exit) is removed: nothing in it can be resumed.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from compress.core.errors import CompressError
from compress.core.formats.writes import atomic_path, writing
from compress.core.paths import work_dir_for  # noqa: F401  (where a run's checkpoints live: a path rule)
from compress.core.processes import is_main_process, main_process_first

CHECKPOINTS = "checkpoints"
BEST = "best"
STATE_FILE = "trainer_state.json"
PROGRESS_FILE = "metrics.json"  # in the work directory: the training record so far, while the run goes


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-able parts (configs, data sizes) to match checkpoints to runs."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _atomic_dir(final: Path) -> contextlib.AbstractContextManager[Path]:
    """A temporary directory beside ``final`` that replaces it once the block completes (and is removed if it fails)."""
    @contextlib.contextmanager
    def manager():
        with writing(final):
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            with writing(final, staging=tmp):  # a full disk or a size limit named, whatever library wrote
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


def save_weights(model, path: Path) -> None:
    """Write ``model``'s weights to a safetensors file, atomically."""
    with atomic_path(path) as tmp:
        save_model(model, str(tmp))  # handles tied weights (MLM decoder = word embeddings)


def load_weights(model, path: Path) -> None:
    """Load a safetensors state (written by the training loop) into ``model`` in place."""
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
    """Write a checkpoint for ``state['step']`` atomically and keep only the newest ``keep``."""
    final = Path(work_dir) / CHECKPOINTS / f"step-{state['step']:08d}"
    with _atomic_dir(final) as tmp:
        save_weights(model, tmp / "model.safetensors")
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
    """Restore weights, optimizer, scheduler and the torch RNG from ``path``; return its state file."""
    load_weights(model, path / "model.safetensors")
    optimizer.load_state_dict(_load_plain(path / "optimizer.pt"))
    scheduler.load_state_dict(_load_plain(path / "scheduler.pt"))
    rng = _load_plain(path / "rng.pt")
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return json.loads((path / STATE_FILE).read_text())


def _load_plain(file: Path) -> Any:
    """A checkpoint file of tensors and plain containers; anything else (a pickle that could run code) is refused."""
    try:
        # weights_only: a checkpoint must never be able to run code when it is read.
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # what weights_only raises for anything but tensors and plain data
        work_dir = file.parent.parent.parent  # work_dir / checkpoints / step-N / file
        raise CompressError(
            f"the checkpoint at {file.parent} is not trusted: {file.name} holds more than plain tensors and could run "
            f"code if read; it was not read, remove {work_dir} to start over"
        ) from err


# ---------------------------------------------------------------------------- work directories


_fresh_work_dirs: set[Path] = set()  # work directories prepare_work_dir created in this process (rank 0)


def _holds_checkpoint(directory: Path) -> bool:
    """Whether a complete checkpoint lies anywhere below ``directory`` (e.g. in a stage's subdirectory)."""
    return any(directory.glob(f"**/{CHECKPOINTS}/step-*/{STATE_FILE}"))


def discard_unused_work_dirs(around: Path | None = None) -> None:
    """Remove the work directories this process created that hold no checkpoint: nothing in them can be resumed.

    A command that succeeds removes its own; this catches one that failed before its
    first checkpoint, at exit, or at once when training in ``around`` (the work
    directory or a subdirectory of it, such as a distillation stage's) fails.
    """
    for work in sorted(_fresh_work_dirs):
        if around is not None and work != around and work not in around.parents:
            continue
        if work.is_dir() and not _holds_checkpoint(work):
            shutil.rmtree(work, ignore_errors=True)
        if not work.is_dir():
            _fresh_work_dirs.discard(work)


atexit.register(discard_unused_work_dirs)  # a failure outside training (a later validation) leaves nothing behind either


def discard_failed_run(work_dir: Path, created: bool) -> None:
    """After a failed run: unless it wrote a checkpoint (what --resume continues), remove what it left in ``work_dir``."""
    if list_checkpoints(work_dir):
        return
    if created:
        shutil.rmtree(work_dir, ignore_errors=True)
    else:  # a directory that was there before (e.g. made by prepare_work_dir): only this run's files
        with contextlib.suppress(FileNotFoundError):
            (work_dir / PROGRESS_FILE).unlink()
        for name in (BEST, CHECKPOINTS):
            shutil.rmtree(work_dir / name, ignore_errors=True)
    discard_unused_work_dirs(around=work_dir.absolute())


def prepare_work_dir(work: Path, resume: bool) -> Path:
    """Create the checkpoint directory (emptied first unless resuming), once, on rank 0.

    One this call creates is removed again, when training fails or at exit, as long as
    it holds no checkpoint (see :func:`discard_unused_work_dirs`): a command that fails
    before its first checkpoint (a bad option, a NaN at step 2) leaves nothing behind.
    """
    with main_process_first():
        if is_main_process():
            if not resume and work.exists():
                shutil.rmtree(work)
            if not work.is_dir():
                work.mkdir(parents=True)
                _fresh_work_dirs.add(Path(work).absolute())
    return work


"""Stages 2 and 3 of ``bench.peers.run``: every contender embeds the scored sentences, then all take turns being timed.

One worker process per contender (``bench.peers.worker``, under the contender's own
environment's python), started once and kept loaded. Each worker, as it starts: loads its
model, embeds the scored sentences to ``WORK/embeddings/NAME.npy`` (kept for the next run
when the sentences and the build are unchanged) and makes ``warmup_passes`` untimed passes
over the timing sentences at batch 1 and at batch 32 (every shape seen once: lazy kernels,
allocations, caches). Then ``rounds`` rounds: in each, every worker in turn (the order
rotated by one each round) embeds the timing sentences one at a time, then in consecutive
chunks of 32; the others wait, idle, so a slow spell of the machine lands on everyone alike.
Each worker's threads are fixed by its environment (``thread_env``) and its runtime's own
setting (see the loaders).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from bench.peers.contenders import Contender

ROOT = Path(__file__).resolve().parents[2]  # the repository: bench is importable from here under either environment
B32 = 32
# A worker is not started when less memory than this is available (all stay loaded at once: about 0.1-0.9 GB each).
MIN_FREE_MB = 1500


def thread_env(threads: int) -> dict[str, str]:
    """The environment of every child process: thread pools fixed, offline, the repository importable."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS", "RAYON_RS_NUM_CPUS"):
        env[var] = str(threads)  # RAYON: the tokenizers' batch encoding pool
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")})
    return env


@dataclass
class Worker:
    """One contender's process: requests as JSON lines on its stdin, one answer line each on its stdout."""

    contender: Contender
    process: subprocess.Popen
    log: TextIO
    timings: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"1": [], str(B32): []})
    ready: dict[str, Any] | None = None
    embedded: bool = False  # WORK/embeddings/NAME.npy holds this build's embeddings of the scored sentences
    error: str | None = None

    @classmethod
    def start(cls, contender: Contender, python: str, env: dict[str, str], log_path: Path) -> "Worker":
        log = open(log_path, "a", encoding="utf-8")
        process = subprocess.Popen([python, "-m", "bench.peers.worker"], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=log, text=True, encoding="utf-8")
        return cls(contender, process, log)

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one request and read its answer; a dead worker or an error answer marks the worker failed."""
        if self.error:
            return {"error": self.error}
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except (BrokenPipeError, OSError) as err:
            line = json.dumps({"error": f"worker died: {err}"})
        answer = json.loads(line) if line else {"error": f"worker exited (code {self.process.poll()}); see {self.log.name}"}
        if "error" in answer:
            self.error = answer["error"]
        return answer

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"quit": True}) + "\n")
                self.process.stdin.flush()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
        self.log.close()


def embeddings_key(texts_file: Path, build: dict[str, Any]) -> str:
    """What a cached .npy was made from: the scored sentences and the build record (folder, options, settings)."""
    return json.dumps({"texts": texts_file.read_text(encoding="utf-8"), "build": build}, sort_keys=True)


def start_all(contenders: list[Contender], builds: dict[str, dict], pythons: dict[str, str], *, threads: int,
              work: Path, texts: dict[str, Path], warmup_passes: int) -> dict[str, Worker]:
    """Start, load, score and warm up every contender whose build exists, one after another."""
    env, workers = thread_env(threads), {}
    (work / "embeddings").mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    for c in contenders:
        build = builds.get(c.name) or {}
        if "error" in build or not build:
            continue
        free = available_mb()
        if free is not None and free < MIN_FREE_MB:
            build["error"] = f"not started: {free:.0f} MB of memory available with {len(workers)} workers loaded"
            print(f"== {c.name}: {build['error']}", flush=True)
            continue
        print(f"== {c.name}: loading in {c.venv}", flush=True)
        worker = Worker.start(c, pythons[c.venv], env, work / "logs" / f"worker-{c.name}.log")
        workers[c.name] = worker
        worker.ready = worker.request({"load": {"loader": c.loader, "folder": build["folder"],
                                                "options": build.get("options") or {}, "threads": threads}}).get("ready")
        npy, key_file = work / "embeddings" / f"{c.name}.npy", work / "embeddings" / f"{c.name}.key"
        key = embeddings_key(texts["score"], build)
        worker.embedded = npy.is_file() and key_file.is_file() and key_file.read_text(encoding="utf-8") == key
        if not worker.error and not worker.embedded:
            began = time.monotonic()
            worker.request({"embed": {"texts": str(texts["score"]), "out": str(npy), "batch": 64}})
            if not worker.error:
                key_file.write_text(key, encoding="utf-8")
                worker.embedded = True
                print(f"   embedded the scored sentences in {time.monotonic() - began:.0f} s", flush=True)
        for _ in range(warmup_passes):
            for batch in (1, B32):
                worker.request({"time": {"texts": str(texts["timing"]), "batch": batch}})
        if worker.error:
            print(f"   FAILED: {worker.error}", flush=True)
    return workers


def available_mb() -> float | None:
    """MemAvailable from /proc/meminfo (None off Linux)."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None


def rounds(workers: dict[str, Worker], n_rounds: int, timing_file: Path,
           landed: Callable[[int], None] | None = None) -> None:
    """``n_rounds`` rounds of turns: every live worker times batch 1 then batch 32; the order rotates each round.

    ``landed(r)`` is called after round ``r`` (1-based), so a caller can write what has been measured so far.
    """
    names = list(workers)
    for r in range(n_rounds):
        began = time.monotonic()
        order = names[r % len(names):] + names[: r % len(names)] if names else []
        for name in order:
            worker = workers[name]
            for batch in (1, B32):
                answer = worker.request({"time": {"texts": str(timing_file), "batch": batch}})
                if "seconds" in answer:
                    worker.timings[str(batch)].append(answer)
        print(f"== round {r + 1}/{n_rounds}: {time.monotonic() - began:.0f} s", flush=True)
        if landed is not None:
            landed(r + 1)


def summary(worker: Worker, n_sentences: int) -> dict[str, Any]:
    """Sentences per second at batch 1 and 32 (median over rounds), batch-1 per-call p50 ms, what each round measured."""
    import numpy as np  # deferred: the coordinator's environment has it; kept out of the import-time path

    per_round = {b: [n_sentences / t["seconds"] for t in ts] for b, ts in worker.timings.items()}
    calls = [c for t in worker.timings["1"] for c in t["calls"]]
    rss = [t.get("rss_mb") for ts in worker.timings.values() for t in ts if t.get("rss_mb")]
    return {
        "b1": float(np.median(per_round["1"])) if per_round["1"] else None,
        "b32": float(np.median(per_round[str(B32)])) if per_round[str(B32)] else None,
        "b1_ms": float(np.median(calls) * 1000) if calls else None,
        "rounds": per_round,
        "load_seconds": (worker.ready or {}).get("seconds"),
        "rss_mb": max(rss) if rss else (worker.ready or {}).get("rss_mb"),
        "versions": (worker.ready or {}).get("versions"),
        "error": worker.error,
    }

"""Where a model's latency goes (matmuls vs everything else), and what the runtime path saves.

Each measurement runs in its own process (``python -m bench.profile --worker JSON``) with
a fixed thread count, so torch and ONNX Runtime never share a thread pool:

* ``torch-profile``: torch.profiler over eager fp32 forwards, self CPU time by operator;
* ``ort-profile``: ONNX Runtime's own profiler, time by graph node type;
* ``ort-latency``: p50 of an ONNX session at a given graph-optimisation level and thread
  count (the before/after of the runtime path's settings);
* ``ov-profile``: OpenVINO's per-layer counters of an IR compiled as the toolkit compiles it,
  time by executed layer type and kernel (``FullyConnected brgemm_avx512_I8``: an int8 GEMM).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from compress.core.formats.runtime import load_model

# Operator names that are matrix products (PyTorch eager and ONNX Runtime graph nodes).
TORCH_MATMUL = ("aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm",
                "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention")
ORT_MATMUL = ("MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
              "QAttention", "Attention", "MultiHeadAttention", "QGemm", "MatMulNBits")


def run_worker(job: dict, threads: int) -> dict:
    """Run one profiling job in a fresh process with ``threads`` threads."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, "-m", "bench.profile", "--worker", json.dumps({**job, "threads": threads})],
                          capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"profile worker failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _inputs(vocab: int, batch: int, seq: int):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, vocab, size=(batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def torch_profile(model_dir: str, batch: int, seq: int, threads: int, repeats: int = 20) -> dict:
    torch.set_num_threads(threads)
    model = load_model(model_dir)
    feeds = {k: torch.from_numpy(v) for k, v in _inputs(model.config.vocab_size, batch, seq).items()}
    with torch.inference_mode():
        for _ in range(5):
            model(**feeds)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(repeats):
                model(**feeds)
    by_op = {}
    for evt in prof.key_averages():
        by_op[evt.key] = by_op.get(evt.key, 0.0) + evt.self_cpu_time_total / repeats / 1000  # ms per forward
    total = sum(by_op.values())
    matmul = sum(v for k, v in by_op.items() if k in TORCH_MATMUL)
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:8]
    return {"total_ms": total, "matmul_ms": matmul, "matmul_share": matmul / total if total else None,
            "top": [{"op": k, "ms": v} for k, v in top]}


def _session(model_path: str, level: str, threads: int, profile_prefix: str | None = None):
    # deferred: a heavy import, paid only where it is used
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    if profile_prefix:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])


def ort_latency(model_dir: str, batch: int, seq: int, threads: int, level: str = "ORT_ENABLE_ALL", repeats: int = 30) -> dict:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    sess = _session(str(Path(model_dir) / "model.onnx"), level, threads)
    names = {i.name for i in sess.get_inputs()}
    feeds = {k: v for k, v in _inputs(config["vocab_size"], batch, seq).items() if k in names}
    for _ in range(5):
        sess.run(None, feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - start)
    return {"p50_ms": float(np.percentile(times, 50) * 1000), "level": level, "threads": threads}


def ort_profile(model_dir: str, batch: int, seq: int, threads: int, repeats: int = 20) -> dict:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        sess = _session(str(Path(model_dir) / "model.onnx"), "ORT_ENABLE_ALL", threads, profile_prefix=f"{tmp}/ort")
        names = {i.name for i in sess.get_inputs()}
        feeds = {k: v for k, v in _inputs(config["vocab_size"], batch, seq).items() if k in names}
        for _ in range(repeats + 5):
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    by_type: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            by_type[op] = by_type.get(op, 0.0) + e["dur"] / 1000 / (repeats + 5)  # ms per run
    total = sum(by_type.values())
    matmul = sum(v for k, v in by_type.items() if k in ORT_MATMUL)
    top = sorted(by_type.items(), key=lambda kv: -kv[1])[:8]
    return {"total_ms": total, "matmul_ms": matmul, "matmul_share": matmul / total if total else None,
            "top": [{"op": k, "ms": v} for k, v in top]}


# Executed OpenVINO layer types that are matrix products; "Subgraph" is a fused snippet (in a BERT IR: attention).
OV_MATMUL = ("FullyConnected", "FullyConnectedQuantizedLegacy", "MatMul")


def ov_profile(model_dir: str, batch: int, seq: int, threads: int, repeats: int = 200) -> dict:
    from compress.core.formats.layout import OPENVINO_FILE
    from compress.core.formats.openvino_runtime import compile_openvino

    config = json.loads((Path(model_dir) / "config.json").read_text())
    compiled = compile_openvino(Path(model_dir) / OPENVINO_FILE, threads=threads, perf_count=True)
    request = compiled.create_infer_request()
    names = {port.get_any_name() for port in compiled.inputs}
    feeds = {k: v for k, v in _inputs(config["vocab_size"], batch, seq).items() if k in names}
    for _ in range(20):
        request.infer(feeds)
    by_kind: dict[str, float] = {}
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        request.infer(feeds)
        walls.append((time.perf_counter() - started) * 1e3)
        for layer in request.profiling_info:
            kind = f"{layer.node_type} {layer.exec_type}"
            by_kind[kind] = by_kind.get(kind, 0.0) + layer.real_time.total_seconds() * 1e3 / repeats  # ms per run
    total = sum(by_kind.values())
    matmul = sum(v for k, v in by_kind.items() if k.split()[0] in OV_MATMUL)
    top = sorted(by_kind.items(), key=lambda kv: -kv[1])[:8]
    return {"total_ms": total, "p50_ms": float(np.median(walls)), "matmul_ms": matmul,
            "matmul_share": matmul / total if total else None, "top": [{"op": k, "ms": v} for k, v in top]}


JOBS = {"torch-profile": torch_profile, "ort-profile": ort_profile, "ort-latency": ort_latency, "ov-profile": ov_profile}


def _worker(job: dict) -> None:
    kind = job.pop("kind")
    result = JOBS[kind](**job)
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(json.loads(sys.argv[2]))
    else:
        print("usage: python -m bench.profile --worker JSON (used by the benchmarks)", file=sys.stderr)
        raise SystemExit(2)

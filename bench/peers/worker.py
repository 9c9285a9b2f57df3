"""One contender in its own process: load it, embed sentences to .npy, time it on request (``bench.peers.run``).

Started by the coordinator as ``PYTHON -m bench.peers.worker`` under the contender's own
environment (``.venv`` or ``.venv-transformers4``), with every thread count fixed in its
environment before any runtime is imported. It reads one JSON request a line on stdin and
answers each with one JSON line on the real stdout (anything a library prints goes to
stderr, which the coordinator writes to the worker's log)::

    {"load": {"loader": L, "folder": DIR, "options": {...}, "threads": N}} -> {"ready": {"seconds", "rss_mb", "versions"}}
    {"embed": {"texts": FILE.json, "out": FILE.npy, "batch": 64}}          -> {"done": {"seconds", "shape"}}
    {"time": {"texts": FILE.json, "batch": B}}                             -> {"seconds": total, "calls": [s, ...]}
    {"quit": true}                                                         -> (exits)
    any failure                                                            -> {"error": "one line"}

An embedder is ``embed(texts: list[str]) -> (len(texts), d) float32``: one call is one batch, from
text to the embedding a user of that tool gets (tokenising, the forward pass, pooling and
normalisation as the ST folder says). ``time`` calls it on the sentences one by one (batch 1)
or in consecutive chunks of B, in the file's order, and returns the seconds of each call.
Only this module's loaders import runtimes, each its own, so a worker holds one runtime.
"""

from __future__ import annotations

import json
import os
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import numpy as np

Embedder = Callable[[list[str]], np.ndarray]

# Packages whose versions each worker reports (those installed in its environment).
VERSIONED = ("torch", "transformers", "tokenizers", "sentence-transformers", "optimum", "optimum-onnx", "optimum-intel",
             "onnxruntime", "openvino", "nncf", "ctranslate2", "model2vec", "numpy", "compress")
# The ST folder's truncation (sentence_bert_config.json max_seq_length), for the loaders that tokenise themselves.
DEFAULT_MAX_LENGTH = 256


def versions() -> dict[str, str]:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _torch_threads(threads: int) -> None:
    import torch  # deferred: only the loaders that run torch pay for it

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set
        pass


# ---------------------------------------------------------------------------- loaders: (folder, options, threads) -> Embedder


def load_st(folder: Path, options: dict[str, Any], threads: int) -> Embedder:
    """sentence-transformers as its docs show: ``SentenceTransformer(dir, backend=...)`` and ``encode``."""
    _torch_threads(threads)
    from sentence_transformers import SentenceTransformer  # deferred: the peer's own package

    backend = options.get("backend", "torch")
    kwargs: dict[str, Any] = {}
    if backend == "onnx":
        import onnxruntime as ort  # deferred: as above

        session = ort.SessionOptions()
        session.intra_op_num_threads, session.inter_op_num_threads = threads, 1
        kwargs = {"file_name": options["file_name"], "session_options": session, "provider": "CPUExecutionProvider"}
    elif backend == "openvino":
        # optimum-intel's default ov_config is PERFORMANCE_HINT=LATENCY; the thread count is ours.
        kwargs = {"file_name": options["file_name"],
                  "ov_config": {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": str(threads)}}
    model = SentenceTransformer(str(folder), device="cpu", backend=backend, model_kwargs=kwargs or None)

    def embed(texts: list[str]) -> np.ndarray:
        return model.encode(texts, batch_size=len(texts), show_progress_bar=False, convert_to_numpy=True)

    return embed


def _tokenizer(folder: Path, max_length: int):
    """The folder's tokenizer.json with the ST folder's truncation and padding to the longest (HF ``tokenizers``)."""
    from tokenizers import Tokenizer  # deferred: as above

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_truncation(max_length)
    pad = tok.token_to_id("[PAD]")
    tok.enable_padding(pad_id=0 if pad is None else pad, pad_token="[PAD]")
    return tok


def _mean_normalise(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over real tokens, then L2 (the ST folder's Pooling + Normalize): ``(b, s, d), (b, s) -> (b, d)``."""
    keep = mask[..., None].astype(np.float32)  # (b, s, 1)
    pooled = (hidden * keep).sum(axis=1) / np.clip(keep.sum(axis=1), 1e-9, None)
    return (pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)).astype(np.float32)


def load_ort(folder: Path, options: dict[str, Any], threads: int) -> Embedder:
    """ONNX Runtime called directly on a graph (``options["file"]``), as its transformer-optimizer docs deploy one."""
    import onnxruntime as ort  # deferred: the peer's own package

    session_options = ort.SessionOptions()
    session_options.intra_op_num_threads, session_options.inter_op_num_threads = threads, 1
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(folder / options["file"]), session_options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    tok = _tokenizer(folder, int(options.get("max_length", DEFAULT_MAX_LENGTH)))

    def embed(texts: list[str]) -> np.ndarray:
        enc = tok.encode_batch([t.strip() for t in texts])  # stripped, as ST's Transformer module does
        feeds = {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                 "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
                 "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64)}
        hidden = session.run(None, {k: feeds[k] for k in names})[0]  # (b, s, d) last_hidden_state
        return _mean_normalise(hidden, feeds["attention_mask"])

    return embed


def load_ct2(folder: Path, options: dict[str, Any], threads: int) -> Embedder:
    """CTranslate2's ``Encoder``: ``forward_batch`` on token ids, its ``last_hidden_state`` mean-pooled over the mask."""
    import ctranslate2  # deferred: the peer's own package

    encoder = ctranslate2.Encoder(str(folder), device="cpu", compute_type=options.get("compute_type", "default"),
                                  intra_threads=threads, inter_threads=1)
    tok = _tokenizer(folder, int(options.get("max_length", DEFAULT_MAX_LENGTH)))
    tok.no_padding()  # CTranslate2 takes ragged id lists and pads itself

    def embed(texts: list[str]) -> np.ndarray:
        ids = [e.ids for e in tok.encode_batch([t.strip() for t in texts])]
        hidden = np.asarray(encoder.forward_batch(ids).last_hidden_state)  # (b, s, d), s = the longest
        lengths = np.array([len(i) for i in ids])
        mask = np.arange(hidden.shape[1])[None, :] < lengths[:, None]  # (b, s)
        return _mean_normalise(hidden, mask)

    return embed


def load_model2vec(folder: Path, options: dict[str, Any], threads: int) -> Embedder:
    """model2vec's ``StaticModel.from_pretrained`` and ``encode`` (numpy; no process pool at these sizes)."""
    from model2vec import StaticModel  # deferred: the peer's own package

    model = StaticModel.from_pretrained(str(folder))

    def embed(texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(texts, batch_size=len(texts), show_progress_bar=False, use_multiprocessing=False),
                          dtype=np.float32)

    return embed


def load_toolkit(folder: Path, options: dict[str, Any], threads: int) -> Embedder:
    """The toolkit's own path: ``load_model(dir, head="base")`` (any format) and ``compress.core.formats.sentence.encode``."""
    _torch_threads(threads)
    from compress.core.formats.artifacts import load_tokenizer  # deferred: the toolkit, in its own environment
    from compress.core.formats.runtime import load_model
    from compress.core.formats.sentence import encode, read_spec

    model = load_model(folder, head="base", threads=threads)
    tokenizer, spec = load_tokenizer(folder), read_spec(folder)

    def embed(texts: list[str]) -> np.ndarray:
        return encode(model, tokenizer, texts, spec, batch_size=len(texts)).astype(np.float32)

    return embed


LOADERS: dict[str, Callable[[Path, dict[str, Any], int], Embedder]] = {
    "st": load_st, "ort": load_ort, "ct2": load_ct2, "model2vec": load_model2vec, "toolkit": load_toolkit,
}


# ---------------------------------------------------------------------------- requests


def _texts(path: str, cache: dict[str, list[str]]) -> list[str]:
    if path not in cache:
        cache[path] = json.loads(Path(path).read_text(encoding="utf-8"))
    return cache[path]


def embed_file(embed: Embedder, texts: list[str], batch: int) -> np.ndarray:
    """Embeddings of ``texts`` in their order, ``(n, d)`` float32; batched longest first (less padding)."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    out: np.ndarray | None = None
    for start in range(0, len(texts), batch):
        rows = order[start : start + batch]
        vectors = embed([texts[i] for i in rows])  # (b, d)
        if out is None:
            out = np.zeros((len(texts), vectors.shape[1]), dtype=np.float32)
        out[rows] = vectors
    return out


def time_calls(embed: Embedder, texts: list[str], batch: int) -> list[float]:
    """Seconds of each call: the sentences one by one (batch 1) or in consecutive chunks of ``batch``, in order."""
    seconds = []
    for start in range(0, len(texts), batch):
        chunk = texts[start : start + batch]
        began = time.perf_counter()
        embed(chunk)
        seconds.append(time.perf_counter() - began)
    return seconds


def rss_mb() -> float | None:
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def serve(stdin, emit: Callable[[dict], None]) -> None:
    """Answer requests until ``quit`` or the end of stdin."""
    embed: Embedder | None = None
    cache: dict[str, list[str]] = {}
    for line in stdin:
        request = json.loads(line)
        try:
            if "load" in request:
                job, began = request["load"], time.perf_counter()
                embed = LOADERS[job["loader"]](Path(job["folder"]), job.get("options") or {}, int(job["threads"]))
                emit({"ready": {"seconds": time.perf_counter() - began, "rss_mb": rss_mb(), "versions": versions()}})
            elif "embed" in request:
                job, began = request["embed"], time.perf_counter()
                vectors = embed_file(embed, _texts(job["texts"], cache), int(job.get("batch", 64)))
                np.save(job["out"], vectors)
                emit({"done": {"seconds": time.perf_counter() - began, "shape": list(vectors.shape)}})
            elif "time" in request:
                job = request["time"]
                calls = time_calls(embed, _texts(job["texts"], cache), int(job["batch"]))
                emit({"seconds": float(sum(calls)), "calls": calls, "rss_mb": rss_mb()})
            elif request.get("quit"):
                return
        except Exception as err:  # one line back to the coordinator, which records it against the contender
            emit({"error": f"{type(err).__name__}: {err}".splitlines()[0][:500]})


def main() -> int:
    # The protocol owns the real stdout; anything a library prints (even from C) goes to stderr.
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def emit(message: dict) -> None:
        proto.write(json.dumps(message) + "\n")
        proto.flush()

    serve(sys.stdin, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The options of ``compress latency`` (:class:`LatencyConfig`) and the limits the parent, the worker and the report share.

The parent (``compress.eval.latency.runs``) validates the config and sends it to every
worker (``compress.eval.latency.worker``) as JSON; the report
(``compress.eval.latency.report``) names the same limits (:data:`MIN_PASSES`,
:data:`REAL_SLICE_S`) in its header, so they live here, below all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from compress.core.config import THREADS, option
from compress.core.errors import CompressError

# Every latency backend, in the order --help lists them (the fp32 baseline first): the names the registry of
# compress.eval.latency.backends implements (a test keeps the two equal), named here so that the flags cost no import.
LATENCY_BACKENDS = ("torch", "auto", "static", "torch-int8", "torch-bf16", "onnxruntime", "inc", "openvino", "ctranslate2",
                    "openvino-bf16")

# The backends that run an fp32 folder in fp32: the candidates for the reference's fastest.
FP32_BACKENDS = ("torch", "onnxruntime", "openvino")

# Real inputs are cut where tasks cut them by default (a longer model still sees the same set).
MAX_REAL_LENGTH = 128

# How OpenVINO rows compile: per grid point for its fixed shape, or once for any shape.
OPENVINO_SHAPES = ("static", "dynamic")

# Timed passes a point keeps under --max-seconds: a median needs a few.
MIN_PASSES = 3

# A model's turn on the real inputs when models take turns: short against the slow spells of a shared host (seconds
# to minutes), long against a call (a BERT-base batch of 32 is the longest, about a second; a turn ends after a call).
REAL_SLICE_S = 0.5


@dataclass(frozen=True)
class LatencyConfig:
    batch: tuple[int, ...] = option((1,), "batch sizes to time", metavar="N[,...]")
    seq: tuple[int, ...] = option((128,), "sequence lengths (tokens) to time", metavar="N[,...]")
    warmup: int = option(5, "untimed forward passes before timing each (batch, seq)")
    repeats: int = option(30, "timed forward passes per (batch, seq)")
    min_seconds: float = option(0.0, "keep repeating until the timed passes add up to at least this long (a point's "
                                "passes, and the passes over the --lengths set)")
    max_seconds: float = option(0.0, "stop timing a point once its passes add up to this long, even short of --repeats "
                                f"(never fewer than {MIN_PASSES}), and start no pass over the --lengths set past it: "
                                "a slow reference model (BERT-base at batch 32) needs fewer passes (0: no limit)")
    threads: int | None = option(None, "intra-op threads, by default the usable physical cores", bounds=THREADS)
    backend: str = option("auto", "latency backend: auto (by the directory's format), torch (fp32), torch-int8, torch-bf16, onnxruntime, inc, openvino, openvino-bf16",
                          choices=LATENCY_BACKENDS)
    openvino_shapes: str = option("static", "OpenVINO rows: static compiles the model once more for each grid point's "
                                  "fixed [batch, seq] and, with --lengths, for each padded shape of the real inputs (see "
                                  "--lengths-multiple), as a deployment padding to a few lengths would; dynamic compiles "
                                  "it once for any shape", choices=OPENVINO_SHAPES)
    peak: bool = option(True, "also measure the fp32 GEMM peak and report each model's % of it")
    repeat_runs: int = option(1, "repeat the whole measurement (every model in turn) K times: rows give the median of the "
                              "runs' medians, their spread, and the speed-up of the worst run (a speed-up holds only if it "
                              "holds in every run)", metavar="K")
    bursts: int = option(1, "split each point's timed passes into N bursts taken in turn by every model (all loaded at "
                         "once, one process each, idle while another times), so that a slow spell of the machine hits "
                         "every model alike instead of whichever was timing then; --lengths passes are then taken in "
                         "turns of half a second, the faster models timing extra passes until the slowest is done",
                         metavar="N")
    reference_backends: tuple[str, ...] = option((), "also time the FIRST model on these fp32 backends (e.g. torch,"
                                                 "onnxruntime,openvino): rows then give speed-ups against its fastest "
                                                 "fp32 backend and against PyTorch eager", metavar="B[,...]")
    lengths: str | None = option(None, "also time on real inputs at their own lengths: a TASK's dev set (with --data-dir), a "
                                 "FILE of texts (.txt lines, .tsv/.jsonl with sentence or sentence1/sentence2), or a data "
                                 "file of the models' own task (csv/tsv/jsonl/CoNLL..., read through the task their folder "
                                 "records): batch 1 one sentence at a time, and --lengths-batch sorted by length with "
                                 "dynamic padding", metavar="TASK|FILE")
    lengths_batch: int = option(32, "the batch size of the sorted, dynamically padded pass of --lengths")
    lengths_passes: int = option(3, "timed passes over the --lengths set (each batch's median is kept)")
    lengths_multiple: int = option(8, "with --openvino-shapes static, OpenVINO pads --lengths inputs to a multiple of this "
                                   "many tokens and compiles one model per padded shape (fewer shapes, more padding)",
                                   metavar="N")
    data_dir: str | None = option(None, "GLUE data folder for --lengths TASK (default: the hub's copy)", metavar="DIR")
    record: bool = option(True, "append the results to each model's metrics.json")
    out: str | None = option(None, "directory for latency.json and latency.md", metavar="DIR")

    def validate(self) -> None:
        for name in ("batch", "seq"):
            values = getattr(self, name)
            if not values:
                raise CompressError(f"--{name} needs at least one value, e.g. --{name} 1,8")
            if min(values) < 1:
                raise CompressError(f"--{name} values must be at least 1, got {min(values)}")
        if self.warmup < 0:
            raise CompressError(f"--warmup must be 0 or more, got {self.warmup}")
        if self.repeats < 1:
            raise CompressError(f"--repeats must be at least 1, got {self.repeats}")
        if self.min_seconds < 0:
            raise CompressError(f"--min-seconds must be 0 or more, got {self.min_seconds}")
        if self.max_seconds < 0 or (self.max_seconds and self.max_seconds < self.min_seconds):
            raise CompressError(f"--max-seconds must be 0 (no limit) or at least --min-seconds ({self.min_seconds:g}), "
                                f"got {self.max_seconds:g}")
        if self.lengths_batch < 1 or self.lengths_passes < 1 or self.lengths_multiple < 1:
            raise CompressError("--lengths-batch, --lengths-passes and --lengths-multiple must be at least 1")
        if self.repeat_runs < 1:
            raise CompressError(f"--repeat-runs must be at least 1, got {self.repeat_runs}")
        if not 1 <= self.bursts <= self.repeats:
            raise CompressError(f"--bursts must be between 1 and --repeats ({self.repeats}), got {self.bursts}")
        for name in self.reference_backends:
            if name not in FP32_BACKENDS:
                raise CompressError(f"--reference-backends takes fp32 backends ({', '.join(FP32_BACKENDS)}); got {name!r}")
        if self.threads is not None and not THREADS[0] <= self.threads <= THREADS[1]:
            raise CompressError(f"--threads must be from {THREADS[0]} to {THREADS[1]}, got {self.threads}")
        if self.openvino_shapes not in OPENVINO_SHAPES:
            raise CompressError(f"--openvino-shapes is static or dynamic, got {self.openvino_shapes!r}")
        if self.backend not in LATENCY_BACKENDS:
            raise CompressError(f"unknown latency backend {self.backend!r}; valid: {', '.join(LATENCY_BACKENDS)}")

    def grid(self) -> list[tuple[int, int]]:
        """Every (batch, seq) to time, in a stable order."""
        return [(b, s) for b in self.batch for s in self.seq]


def real_batches(cfg: LatencyConfig) -> list[int]:
    """The batch sizes the real inputs are timed at: 1 (one sentence at a time) and ``--lengths-batch``."""
    return list(dict.fromkeys((1, cfg.lengths_batch)))


def check_seq(seqs: tuple[int, ...], max_positions: int, model_dir: Path | str) -> None:
    """Refuse sequence lengths the model's position embeddings cannot cover."""
    too_long = max(seqs)
    if too_long > max_positions:
        raise CompressError(
            f"--seq {too_long} is longer than {model_dir}'s max_position_embeddings ({max_positions}); "
            f"use --seq {max_positions} or less"
        )

"""Who takes part in ``bench.peers.run``: every contender, the build step that makes it, and where it runs (pure data).

Two environments, because the peers' pins clash: ``main`` is ``.venv`` (transformers 5,
sentence-transformers 6, CTranslate2, model2vec, the toolkit) and ``t4`` is
``.venv-transformers4`` (transformers 4.57 with optimum-onnx and optimum-intel, which
sentence-transformers' ONNX and OpenVINO backends and export helpers need). A build step
runs once in its environment (``python -m bench.peers.build STEP``) and writes a record
per contender it makes (``WORK/builds/NAME.json``: folder, loader options, weight files);
each contender is then embedded and timed by its own worker in its own environment.
"""

from __future__ import annotations

from dataclasses import dataclass

PEER, TOOLKIT = "peer", "toolkit"
MAIN, T4 = "main", "t4"


@dataclass(frozen=True)
class Step:
    name: str
    venv: str  # MAIN or T4: the environment the step runs in
    settings: tuple[str, ...] = ()  # the PeersConfig fields its artefacts depend on (a change rebuilds them)


@dataclass(frozen=True)
class Contender:
    name: str
    side: str  # PEER or TOOLKIT
    step: str  # the Step that makes it
    venv: str  # the environment its worker runs in
    loader: str  # bench.peers.worker.LOADERS key
    precision: str  # fp32, fp16 or int8 (of the matrix multiplications' weights): int8 rows are judged against int8
    label: str  # what it is, for the report

    @property
    def model(self) -> str:
        """Which weights it runs: "teacher" (all-MiniLM-L6-v2 in any runtime or precision), "3L", "2L" or "static"."""
        if self.name.startswith(("tk-3L", "tk-2L")):
            return self.name[3:5]
        # tk-teacher-static-int8 is the teacher (ONNX Runtime's static int8), not a static-embedding model
        return "static" if self.name.startswith("tk-static") or self.name == "model2vec" else "teacher"


# In build order: a later step may read an earlier one's files (ort-fused optimises ST's ONNX export).
STEPS = (
    Step("st-torch", MAIN),
    Step("st-onnx", T4),
    Step("st-openvino", T4, ("ov_calibration_samples",)),
    Step("ort-fused", MAIN),
    Step("ctranslate2", MAIN),
    Step("model2vec", MAIN),
    Step("tk-teacher", MAIN, ("calibration_examples",)),
    Step("tk-3L", MAIN, ("distill_sentences", "epochs", "batch_size", "lr", "calibration_examples", "seed")),
    Step("tk-2L", MAIN, ("distill_sentences", "epochs", "batch_size", "lr", "calibration_examples", "seed")),
    Step("tk-static", MAIN),
    Step("tk-static-refined", MAIN, ("refine_sentences", "refine_on", "seed")),
)


def _ct2(prefix: str, step: str, what: str) -> tuple[Contender, ...]:
    """``compress export --format ctranslate2`` of a toolkit folder, float32 and int8 weights, run by the toolkit."""
    return (
        Contender(f"tk-{prefix}-ct2", TOOLKIT, step, MAIN, "toolkit", "fp32",
                  f"{what}; compress export --format ctranslate2 --quantization float32"),
        Contender(f"tk-{prefix}-ct2-int8", TOOLKIT, step, MAIN, "toolkit", "int8",
                  f"{what}; compress export --format ctranslate2 --quantization int8"),
    )


def _student(size: str, layers: str, ct2: bool = False) -> tuple[Contender, ...]:
    step = f"tk-{size}"
    what = f"student {size}-384 ({layers}), distilled by compress distill-embedding"
    return (
        Contender(f"tk-{size}-fused", TOOLKIT, step, MAIN, "toolkit", "fp32", f"{what}; compress export --fuse (ONNX Runtime)"),
        Contender(f"tk-{size}-openvino", TOOLKIT, step, MAIN, "toolkit", "fp32", f"{what}; compress export --format openvino"),
        Contender(f"tk-{size}-int8", TOOLKIT, step, MAIN, "toolkit", "int8", f"{what}; compress quantize --backend onnxruntime (dynamic)"),
        Contender(f"tk-{size}-fused-int8", TOOLKIT, step, MAIN, "toolkit", "int8",
                  f"{what}; compress quantize --backend onnxruntime --fuse (dynamic)"),
        Contender(f"tk-{size}-ov-int8", TOOLKIT, step, MAIN, "toolkit", "int8",
                  f"{what}; compress quantize --backend openvino --scheme static --corpus"),
        *(_ct2(size, step, what) if ct2 else ()),
    )


CONTENDERS = (
    Contender("st-torch", PEER, "st-torch", MAIN, "st", "fp32", "sentence-transformers, PyTorch backend (the packaged folder)"),
    Contender("st-onnx", PEER, "st-onnx", T4, "st", "fp32", "sentence-transformers backend=\"onnx\" (its optimum export)"),
    Contender("st-onnx-int8", PEER, "st-onnx", T4, "st", "int8",
              "sentence-transformers export_dynamic_quantized_onnx_model, the CPU's preset"),
    Contender("st-openvino", PEER, "st-openvino", T4, "st", "fp32", "sentence-transformers backend=\"openvino\" (optimum-intel export)"),
    Contender("st-openvino-int8", PEER, "st-openvino", T4, "st", "int8",
              "sentence-transformers export_static_quantized_openvino_model (local SST-2 calibration)"),
    Contender("ort-fused", PEER, "ort-fused", MAIN, "ort", "fp32",
              "ONNX Runtime transformers optimizer (fused BERT graph) on ST's export, called directly"),
    Contender("ort-fused-int8", PEER, "ort-fused", MAIN, "ort", "int8",
              "the fused graph after quant_pre_process + quantize_dynamic"),
    Contender("ct2-fp32", PEER, "ctranslate2", MAIN, "ct2", "fp32", "CTranslate2 Encoder, converted with quantization float32"),
    Contender("ct2-int8", PEER, "ctranslate2", MAIN, "ct2", "int8", "CTranslate2 Encoder, converted with quantization int8"),
    Contender("model2vec", PEER, "model2vec", MAIN, "model2vec", "fp16",
              "model2vec distill() with its defaults (PCA 256, SIF 1e-4, float16)"),
    Contender("tk-teacher-onnx", TOOLKIT, "tk-teacher", MAIN, "toolkit", "fp32", "teacher; compress export --format onnx"),
    Contender("tk-teacher-fused", TOOLKIT, "tk-teacher", MAIN, "toolkit", "fp32", "teacher; compress export --fuse"),
    Contender("tk-teacher-openvino", TOOLKIT, "tk-teacher", MAIN, "toolkit", "fp32", "teacher; compress export --format openvino"),
    Contender("tk-teacher-int8", TOOLKIT, "tk-teacher", MAIN, "toolkit", "int8", "teacher; compress quantize --backend onnxruntime (dynamic)"),
    Contender("tk-teacher-fused-int8", TOOLKIT, "tk-teacher", MAIN, "toolkit", "int8",
              "teacher; compress quantize --backend onnxruntime --fuse (dynamic)"),
    Contender("tk-teacher-static-int8", TOOLKIT, "tk-teacher", MAIN, "toolkit", "int8",
              "teacher; compress quantize --backend onnxruntime --scheme static --corpus"),
    Contender("tk-teacher-ov-int8", TOOLKIT, "tk-teacher", MAIN, "toolkit", "int8",
              "teacher; compress quantize --backend openvino --scheme static --corpus"),
    *_ct2("teacher", "tk-teacher", "teacher"),
    *_student("3L", "teacher layers 1,3,5", ct2=True),
    *_student("2L", "teacher layers the toolkit spaces evenly, 12 heads"),
    Contender("tk-static", TOOLKIT, "tk-static", MAIN, "toolkit", "fp32", "compress distill-static (PCA 256), not refined"),
    Contender("tk-static-refined", TOOLKIT, "tk-static-refined", MAIN, "toolkit", "fp32",
              "compress distill-static (PCA 256) refined on the user's sentences"),
    # The same two folders run by model2vec's own StaticModel: a static folder is model2vec's format, and the toolkit's
    # generic encode (a transformers tokenizer call and torch per batch) costs more per call than the lookup itself.
    Contender("tk-static-m2v", TOOLKIT, "tk-static", MAIN, "model2vec", "fp32",
              "the tk-static folder run by model2vec.StaticModel (the folder is model2vec's format)"),
    Contender("tk-static-refined-m2v", TOOLKIT, "tk-static-refined", MAIN, "model2vec", "fp32",
              "the tk-static-refined folder run by model2vec.StaticModel"),
)

BY_NAME = {c.name: c for c in CONTENDERS}
STEP_BY_NAME = {s.name: s for s in STEPS}
# The reference every contender's embeddings are compared with (cosine, same sentences).
REFERENCE = "st-torch"


def step_contenders(step: str) -> list[Contender]:
    return [c for c in CONTENDERS if c.step == step]


def select(only: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> list[Contender]:
    """The contenders to run, in table order; ``only``/``skip`` name contenders or steps (unknown names refused)."""
    known = set(BY_NAME) | set(STEP_BY_NAME)
    unknown = [n for n in (*only, *skip) if n not in known]
    if unknown:
        raise SystemExit(f"unknown contender or step {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    chosen = [c for c in CONTENDERS if not only or c.name in only or c.step in only]
    return [c for c in chosen if c.name not in skip and c.step not in skip]

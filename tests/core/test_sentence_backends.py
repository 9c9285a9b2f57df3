"""Every embedding folder compress writes loads in sentence-transformers as its card says; an ONNX one also in the
layout Text Embeddings Inference reads (tiny random BERTs; docs/artifacts.md, "Sentence-transformers folders").

The folders: a distill-embedding student (PyTorch), its exports (ONNX, ONNX fused, OpenVINO), its int8 forms
(ONNX Runtime dynamic and static, OpenVINO static) and a distill-static (model2vec) folder. Each card's
``SentenceTransformer(...)`` call is parsed out of the written README.md and run; its embeddings must equal those of
compress's own runtime on the same folder (``compress eval --embedding``'s path): the same file on the same runtime,
so ~1e-7 apart, int8 included (both batch the texts longest first, so dynamic int8 sees the same batches). fp32
exports must also stay within 1e-4 of the PyTorch student. ``backend="onnx"``/``"openvino"`` need Optimum (the
transformers 4.57 set); those tests skip without it. The folders are made once per module, when a test first asks.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from compress.core.formats.artifacts import load_tokenizer
from compress.core.config import from_dict
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import SentenceSpec, encode, read_spec, write_sentence_files
from compress.distill.embedding import EmbeddingDistillConfig, distill_embedding
from compress.export import ExportConfig, export
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny
from tests.core.test_sentence import corpus, st_folder

# Depends on the installed transformers version: the transformers 4.57 set runs it too (make test-transformers4).
pytestmark = pytest.mark.versions

TEXTS = ["the movie was good .", "a cat sat on the mat", "what is the capital city of france ?",
         "she did not love the boring plot", "dog", "  they really hate   the acting ! "]
# The runtime each kind's card names, and how the folder is made from the student (or, static, from its teacher).
KINDS = {
    "student": "torch",
    "onnx": "onnx", "onnx-fused": "onnx", "openvino": "openvino",
    "onnxruntime-dynamic": "onnx", "onnxruntime-static": "onnx", "openvino-static": "openvino",
    "static": "torch",
}
EXPORTS = {"onnx": {"format": "onnx"}, "onnx-fused": {"format": "onnx", "fuse": True}, "openvino": {"format": "openvino"}}
INT8 = {"onnxruntime-dynamic": ("onnxruntime", "dynamic"), "onnxruntime-static": ("onnxruntime", "static"),
        "openvino-static": ("openvino", "static")}
# What each backend of SentenceTransformer imports: Optimum's ONNX Runtime and OpenVINO integrations.
OPTIMUM = {"onnx": "optimum.onnxruntime", "openvino": "optimum.intel"}
# The card's call: SentenceTransformer("DIR") or SentenceTransformer("DIR", backend="...", model_kwargs={...}).
CALL = re.compile(r'SentenceTransformer\("DIR"(?:, backend="(\w+)", model_kwargs=(\{.*\}))?\)`')


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> SimpleNamespace:
    """A teacher folder (mean pooling + Normalize, max_seq_length 48) and a 1-layer student distilled from it."""
    root = tmp_path_factory.mktemp("sentence-backends")
    tokenizer = make_tokenizer(root / "tok")
    teacher = st_folder(root, tokenizer, name="teacher", num_hidden_layers=2, seed=1)
    text = corpus(root / "c.txt", n=120)
    cfg = from_dict(EmbeddingDistillConfig, {
        "corpus": [str(text)], "student": "1L-32-37-4H", "init_layers": [1], "max_length": 32, "heldout_sentences": 8,
        "epochs": 1, "batch_size": 16, "lr": 2e-3, "warmup_ratio": 0.0, "seed": 0,
    })
    student = distill_embedding(teacher, root / "student", cfg)
    return SimpleNamespace(root=root, teacher=teacher, student=student, text=text, made={"student": student})


def made(env, kind: str) -> Path:
    """The folder of ``kind`` (see KINDS), made on first use."""
    if kind not in env.made:
        out = env.root / kind
        if kind in EXPORTS:
            env.made[kind] = export(env.student, out, from_dict(ExportConfig, EXPORTS[kind]))
        elif kind in INT8:
            backend, scheme = INT8[kind]
            calibration = {"corpus": [str(env.text)], "calibration_examples": 24, "check_sentences": 16}
            env.made[kind] = quantize(env.student, out, from_dict(QuantizeConfig, {
                "backend": backend, "scheme": scheme, **(calibration if scheme == "static" else {})}))
        else:  # static: model2vec's distillation of the teacher, PCA to 16 dimensions
            from compress.distill.static import StaticDistillConfig, distill_static

            env.made[kind] = distill_static(env.teacher, out, from_dict(StaticDistillConfig, {"pca_dims": 16}))
    return env.made[kind]


def needs(kind: str) -> None:
    """Skip (with the reason) where a package the kind needs is missing; before anything is made."""
    pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed")
    if kind == "static":
        pytest.importorskip("model2vec", reason="compress distill-static needs model2vec (the static extra)")
    if kind.startswith("openvino"):
        pytest.importorskip("nncf" if kind in INT8 else "openvino", reason="OpenVINO / NNCF are not installed")
    if KINDS[kind] in OPTIMUM:
        pytest.importorskip(OPTIMUM[KINDS[kind]], reason=f"SentenceTransformer(backend={KINDS[kind]!r}) needs Optimum's "
                                                          "integration (the optimum extra, transformers 4.57 set)")


def toolkit(folder: Path, batch_size: int = 32) -> np.ndarray:
    """The folder's embeddings as ``compress eval --embedding`` computes them, in SentenceTransformer's batches: (texts, d).

    Whole batches (``call_tokens=inf``), as SentenceTransformer makes them: a dynamic int8 graph quantizes each
    activation with its batch's range, so an embedding moves (by ~5e-5 here) with its batch-mates.
    """
    return encode(load_model(folder, head="base"), load_tokenizer(folder), TEXTS, read_spec(folder), batch_size=batch_size,
                  call_tokens=float("inf"))


def card_call(folder: Path) -> tuple[str, dict]:
    """(backend, model_kwargs) of the one SentenceTransformer call the folder's card names."""
    calls = CALL.findall((folder / "README.md").read_text())
    assert len(calls) == 1, f"{folder.name}'s card names {len(calls)} SentenceTransformer calls"
    backend, kwargs = calls[0]
    return backend or "torch", ast.literal_eval(kwargs) if kwargs else {}


# ---------------------------------------------------------------------------- sentence-transformers


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_cards_sentence_transformers_call_loads_the_folder_and_gives_compress_embeddings(env, kind):
    needs(kind)
    from sentence_transformers import SentenceTransformer

    folder = made(env, kind)
    backend, kwargs = card_call(folder)
    assert backend == KINDS[kind]
    if backend != "torch":  # one copy of the model, at the root, where the card says: no onnx/ or openvino/ subfolder
        assert (folder / kwargs["file_name"]).is_file() and not (folder / backend).exists()
    model = SentenceTransformer(str(folder), device="cpu", backend=backend, model_kwargs=kwargs or None)
    if backend != "torch":  # really the runtime named, not an export made on the fly from PyTorch weights
        assert type(model[0].auto_model).__name__.startswith({"onnx": "ORTModel", "openvino": "OVModel"}[backend])
    got = model.encode(TEXTS)
    np.testing.assert_allclose(got, toolkit(folder), atol=1e-5, rtol=0)
    if kind in EXPORTS:  # fp32 to fp32: the exported graph is the student's
        np.testing.assert_allclose(got, toolkit(env.student), atol=1e-4, rtol=0)
    elif kind in INT8:  # the int8 model is the student's, approximately (unit vectors: the cosine)
        assert np.sum(got * toolkit(env.student), axis=1).min() > 0.9


def test_the_cards_say_where_each_reader_looks_and_export_prints_the_call(env):
    pytest.importorskip("onnxruntime")
    from compress.export import summarize

    onnx = made(env, "onnx")
    card = (onnx / "README.md").read_text()
    assert "Text Embeddings Inference" in card and "`model.onnx` at the root" in card and "Layout:" in card
    assert "Text Embeddings Inference" not in (env.student / "README.md").read_text()
    text, _ = summarize(onnx, ExportConfig(), {})
    assert f'SentenceTransformer({json.dumps(str(onnx))}, backend="onnx", model_kwargs={{"file_name": "model.onnx"}})' in text
    if importlib.util.find_spec("openvino") is not None:
        card = (made(env, "openvino") / "README.md").read_text()
        assert '"INFERENCE_PRECISION_HINT": "f32"' in card and "Text Embeddings Inference" not in card


# ---------------------------------------------------------------------------- Text Embeddings Inference


def tei_embed(folder: Path, texts: list[str]) -> np.ndarray:
    """What Text Embeddings Inference's ONNX Runtime backend reads from ``folder`` and computes, one request per text.

    Its rules (router/src/lib.rs and backends/ort/src/lib.rs, 2026-07): ``model.onnx`` at the root, else
    ``onnx/model.onnx``; config.json with ``architectures``, ``model_type``, ``hidden_size`` and
    ``num_hidden_layers``; ``tokenizer.json``; the pooling from ``1_Pooling/config.json`` (both
    ``pooling_mode_cls_token`` and ``pooling_mode_mean_tokens`` required; CLS, else mean); the length limit from
    sentence_bert_config.json's required ``max_seq_length`` when the file exists; inputs ``input_ids``,
    ``attention_mask`` (and ``token_type_ids`` when the graph takes it); output ``last_hidden_state``; the pooled
    vector L2-normalised (a request's default). Returns (texts, d).
    """
    import onnxruntime as ort
    from tokenizers import Tokenizer

    path = folder / "model.onnx" if (folder / "model.onnx").exists() else folder / "onnx" / "model.onnx"
    config = json.loads((folder / "config.json").read_text())
    assert isinstance(config["architectures"], list) and isinstance(config["model_type"], str)
    assert isinstance(config["hidden_size"], int) and isinstance(config["num_hidden_layers"], int)
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    cls, mean = pooling["pooling_mode_cls_token"], pooling["pooling_mode_mean_tokens"]
    assert isinstance(cls, bool) and isinstance(mean, bool) and (cls or mean)
    limit_file = folder / "sentence_bert_config.json"
    limit = json.loads(limit_file.read_text())["max_seq_length"] if limit_file.exists() else config["max_position_embeddings"]
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    takes = {i.name for i in session.get_inputs()}
    rows = []
    for text in texts:
        encoding = tokenizer.encode(text)
        assert len(encoding.ids) <= limit
        ids = np.array([encoding.ids], dtype=np.int64)  # (1, seq)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "token_type_ids" in takes:
            feeds["token_type_ids"] = np.array([encoding.type_ids], dtype=np.int64)
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        hidden = outputs["last_hidden_state"][0]  # (seq, d)
        vector = hidden[0] if cls else hidden.mean(0)
        rows.append(vector / np.linalg.norm(vector))
    return np.stack(rows)


@pytest.mark.parametrize("kind", ["onnx", "onnx-fused", "onnxruntime-dynamic", "onnxruntime-static"])
def test_an_onnx_folder_has_the_layout_text_embeddings_inference_reads(env, kind):
    pytest.importorskip("onnxruntime")
    folder = made(env, kind)
    assert (folder / "model.onnx").is_file() and not (folder / "onnx").exists()  # where TEI looks first; no copy
    # One text at a time on both sides (dynamic int8 scales by batch); the folder has a Normalize module.
    np.testing.assert_allclose(tei_embed(folder, TEXTS), toolkit(folder, batch_size=1), atol=1e-5, rtol=0)


def test_a_sentence_config_saying_only_defaults_is_not_written_and_loads_alike(env, tmp_path):
    """Text Embeddings Inference refuses a sentence_bert_config.json without max_seq_length; without the file it and
    sentence-transformers take the model's limit."""
    st = pytest.importorskip("sentence_transformers")
    tokenizer = load_tokenizer(env.student)
    folder = save_tiny(make_tiny_model("base", seed=2), tokenizer, tmp_path / "plain")
    write_sentence_files(folder, SentenceSpec(pooling="mean", normalize=True), 32)
    assert not (folder / "sentence_bert_config.json").exists() and read_spec(folder).max_seq_length is None
    want = encode(load_model(folder, head="base"), tokenizer, TEXTS, read_spec(folder))
    np.testing.assert_allclose(st.SentenceTransformer(str(folder), device="cpu").encode(TEXTS), want, atol=1e-5, rtol=0)
    write_sentence_files(folder, SentenceSpec(pooling="mean", do_lower_case=True), 32)  # not a default: kept
    assert json.loads((folder / "sentence_bert_config.json").read_text()) == {"do_lower_case": True}

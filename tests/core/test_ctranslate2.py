"""CTranslate2: export of every family it converts, the task heads beside its Encoder against torch, refusals, eval, latency.

Tiny random models (tests.core.test_families' configs: vocab ~100, hidden 32, 4 heads, FFN 37, 2 layers) with their
query and key weights scaled up (:func:`sharpen`), so that attention depends on how each layer is split into heads:
on the plain random models a layer split into 4 heads or 1 gives hidden states within 1e-4 of each other, which
would hide a wrong head width. Tolerances: float32 exports give torch's outputs to ~1e-6, so 1e-4 is asserted.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import transformers
from torch import nn

from compress.cli import main
from compress.core.errors import CompressError
from compress.core.formats.artifacts import artifact_format, is_quantized, load_tokenizer
from compress.core.formats.ctranslate2 import CONVERTED
from compress.core.formats.records import read_compression
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import SentenceSpec, encode, is_sentence_folder, read_spec, write_sentence_files
from compress.core.model import structure as st
from compress.core.model.families import get_family
from compress.core.model.heads import HEADS
from compress.export import ExportConfig, export
from compress.core.compat import wordpiece_tokenizer
from tests.conftest import save_tiny, write_vocab
from tests.core.test_families import family_config, make_tokenizer

# Depends on the installed transformers version (transformers 5 dropped position_embedding_type, which the converter
# asserts): the transformers 4.57 set runs it too (make test-transformers4).
pytestmark = pytest.mark.versions

ctranslate2 = pytest.importorskip("ctranslate2")

FP32_TOLERANCE = 1e-4
TEXTS = ["the movie was good", "a very boring film , not fun at all", "paris is the capital of france .", "no"]


def sharpen(model: nn.Module, factor: float = 8.0) -> nn.Module:
    """Scale every query and key projection by ``factor``: attention scores grow by its square (see the docstring)."""
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in ("query", "key", "q_lin", "k_lin"):
                module.weight.mul_(factor)
                module.bias.mul_(factor)
    return model


def build(family: str, head: str = "sequence-classification", *, labels: int = 2, seed: int = 0) -> nn.Module:
    """A tiny random ``family`` model with ``head`` (``labels`` outputs: 1 is a regression), attention sharpened."""
    torch.manual_seed(seed)
    config = family_config(family)
    config.num_labels = labels
    if labels == 1:
        config.problem_type = "regression"
    if head == "token-classification":  # a tagger's labels are BIO tags (its task is read from them)
        config.id2label = dict(enumerate(["O", "B-X", "I-X"][:labels]))
        config.label2id = {tag: i for i, tag in config.id2label.items()}
    model = getattr(transformers, get_family(config.model_type).head_class(head))(config)
    return sharpen(model.eval())


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """The test vocabulary's tokenizer per family; RoBERTa's and XLM-R's return no token_type_ids, as theirs do (their
    models have one segment embedding: a pair's second segment would index past it)."""
    root = tmp_path_factory.mktemp("ct2-tokenizers")
    found = {name: make_tokenizer(name, root / name) for name in ("bert", "distilbert", "mpnet")}
    for name in ("roberta", "xlm-roberta"):
        found[name] = wordpiece_tokenizer(write_vocab(root / name), do_lower_case=True, model_max_length=64,
                                          model_input_names=["input_ids", "attention_mask"])
    return found


def save(model: nn.Module, tokenizers, path):
    return save_tiny(model, tokenizers[model.config.model_type], path)


def outputs(path, tokenizer, texts=TEXTS) -> dict[str, np.ndarray]:
    """Every output of the folder's head on ``texts`` (one padded batch); per-token outputs at real tokens only."""
    model = load_model(path)
    batch = st.model_inputs(model, dict(tokenizer(list(texts), padding=True, return_tensors="pt")))
    with torch.no_grad():
        out = model(**batch)
    mask = batch["attention_mask"].bool()
    found = {}
    for name in out.keys():  # the outputs it returned (a ModelOutput lists those that are set)
        value = getattr(out, name)
        found[name] = (value[mask] if value.dim() >= 2 and value.shape[:2] == mask.shape else value).float().numpy()
    return found


def hidden_states(source, out, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(torch's, the Encoder's) last hidden states at the real tokens of TEXTS: (tokens, hidden) each."""
    model = load_model(source)
    batch = st.model_inputs(model, dict(tokenizer(TEXTS, padding=True, return_tensors="pt")))
    with torch.no_grad():
        want = st.base_model(model)(**batch).last_hidden_state[batch["attention_mask"].bool()]
    encoded = tokenizer(TEXTS)  # ragged: the Encoder pads itself
    hidden = np.array(load_model(out).encoder.forward_batch(encoded["input_ids"],
                                                            token_type_ids=encoded.get("token_type_ids")).last_hidden_state)
    got = np.concatenate([row[:len(ids)] for row, ids in zip(hidden, encoded["input_ids"])])
    return want.numpy(), got


def assert_same_outputs(a: dict, b: dict, atol: float = FP32_TOLERANCE) -> None:
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=atol, err_msg=name)


def one_line_refusal(capsys, args) -> str:
    """The one line ``compress export ARGS`` fails with (a usage error's included: argparse exits while parsing)."""
    capsys.readouterr()  # what building the source printed
    try:
        code = main(["export", *args])
    except SystemExit as usage:
        code = usage.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


# ---------------------------------------------------------------------------- export and parity


@pytest.mark.e2e
@pytest.mark.parametrize("family", CONVERTED)
def test_each_family_it_converts_exports_a_classifier_with_the_torch_logits(family, tokenizers, tmp_path):
    source = save(build(family), tokenizers, tmp_path / "src")
    out = export(source, tmp_path / "ct2", ExportConfig(format="ctranslate2"))
    record = read_compression(out)
    assert artifact_format(out) == "ctranslate2" and record["source_format"] == "torch" and record["precision"] == "fp32"
    assert record["check"]["max_abs_diff"] < FP32_TOLERANCE and record["check"]["argmax_agreement"] == 1.0
    # The family's own classifier on the Encoder's outputs: BERT's reads the pooler, the others the first token.
    head = record["ctranslate2"]["head"]
    assert head["reads"] == get_family(family).head_layers["sequence-classification"].reads
    assert record["ctranslate2"]["token_type_ids"] is (family != "distilbert")
    assert all((out / name).is_file() for name in ("model.bin", "vocabulary.json", "head.safetensors", "README.md"))
    ctranslate2.Encoder(str(out))  # the folder is CTranslate2's own: its Encoder loads it as it is
    assert_same_outputs(outputs(out, tokenizers[family]), outputs(source, tokenizers[family]))
    # A random classifier's logits are small (~0.1): the hidden states say more about the encoder.
    want, got = hidden_states(source, out, tokenizers[family])
    np.testing.assert_allclose(got, want, atol=FP32_TOLERANCE)


@pytest.mark.e2e
@pytest.mark.parametrize("family, head, labels", [
    ("bert", "token-classification", 3), ("roberta", "token-classification", 3),
    ("bert", "question-answering", 2), ("distilbert", "question-answering", 2),
    ("bert", "sequence-classification", 1), ("xlm-roberta", "sequence-classification", 1),  # regression: one output
])
def test_a_task_head_beside_the_encoder_gives_the_torch_outputs(family, head, labels, tokenizers, tmp_path):
    source = save(build(family, head, labels=labels), tokenizers, tmp_path / "src")
    out = export(source, tmp_path / "ct2", ExportConfig(format="ctranslate2"))
    got, want = outputs(out, tokenizers[family]), outputs(source, tokenizers[family])
    assert set(got) == set(HEADS[head].outputs) and got[HEADS[head].outputs[0]].shape[-1:] == want[HEADS[head].outputs[0]].shape[-1:]
    assert_same_outputs(got, want)


@pytest.mark.e2e
def test_a_sentence_transformers_folder_stays_one_with_the_same_embeddings(tokenizers, tmp_path):
    source = save(build("bert", "base"), tokenizers, tmp_path / "src")
    write_sentence_files(source, SentenceSpec(pooling="mean", normalize=True, max_seq_length=32), 32)
    out = export(source, tmp_path / "ct2", ExportConfig(format="ctranslate2"))
    assert is_sentence_folder(out) and read_spec(out) == read_spec(source) and not (out / "head.safetensors").exists()
    tokenizer = load_tokenizer(source)
    got = encode(load_model(out, head="base"), tokenizer, TEXTS, read_spec(out))
    want = encode(load_model(source, head="base"), tokenizer, TEXTS, read_spec(source))
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # the Normalize module ran
    assert "Sentence embeddings: pool `hidden`" in (out / "README.md").read_text(encoding="utf-8")


@pytest.mark.e2e
@pytest.mark.parametrize("family", ["bert", "distilbert"])
def test_a_uniformly_pruned_model_keeps_its_narrower_heads(family, tokenizers, tmp_path):
    # 2 heads of width 8 in a hidden size of 32: CTranslate2's default split would be 2 heads of width 16, which on
    # these sharpened models moves the hidden states by ~0.4.
    model = build(family)
    st.prune_heads(model, {0: [0, 3], 1: [1, 2]})
    for layer in range(2):
        st.resize_ffn(model, layer, range(17))
    source = save(model, tokenizers, tmp_path / "src")
    out = export(source, tmp_path / "ct2", ExportConfig(format="ctranslate2"))
    assert read_compression(out)["structure"]["heads"] == [2, 2] and read_compression(out)["structure"]["ffn"] == [17, 17]
    assert_same_outputs(outputs(out, tokenizers[family]), outputs(source, tokenizers[family]))
    want, got = hidden_states(source, out, tokenizers[family])
    np.testing.assert_allclose(got, want, atol=FP32_TOLERANCE)


@pytest.mark.e2e
def test_int8_and_bfloat16_are_stored_as_asked_and_checked_against_their_tolerances(tokenizers, tmp_path):
    source = save(build("bert"), tokenizers, tmp_path / "src")
    fp32 = export(source, tmp_path / "fp32", ExportConfig(format="ctranslate2"))
    int8 = export(source, tmp_path / "int8", ExportConfig(format="ctranslate2", quantization="int8"))
    bf16 = export(source, tmp_path / "bf16", ExportConfig(format="ctranslate2", quantization="bfloat16"))
    r8, r16 = read_compression(int8), read_compression(bf16)
    assert r8["precision"] == "int8" and is_quantized(int8) and r8["ctranslate2"]["compute_type"].startswith("int8")
    assert r8["check"]["tolerance"] == 0.5 and r16["check"]["tolerance"] == 0.1 and r16["precision"] == "bf16"
    assert r16["ctranslate2"]["compute_type"] in ("bfloat16", "float32")  # float32 where this CPU has no bf16 kernels
    # int8 weights take a quarter of the bytes of float32 ones (the embeddings, norms and biases keep theirs).
    assert (int8 / "model.bin").stat().st_size < 0.6 * (fp32 / "model.bin").stat().st_size
    got, want = outputs(int8, tokenizers["bert"])["logits"], outputs(source, tokenizers["bert"])["logits"]
    assert 0 < np.abs(got - want).max() <= 0.5  # really int8: not the float32 outputs


@pytest.mark.e2e
@pytest.mark.parametrize("family, head", [("bert", "sequence-classification"), ("distilbert", "question-answering"),
                                          ("roberta", "sequence-classification")])
def test_the_cards_snippet_runs_the_folder_without_compress(family, head, tokenizers, tmp_path):
    source = save(build(family, head), tokenizers, tmp_path / "src")
    out = export(source, tmp_path / "ct2", ExportConfig(format="ctranslate2"))
    card = (out / "README.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", card, re.S).group(1).replace('"DIR', f'"{out}')
    names: dict = {}
    exec(code, names)  # plain CTranslate2, NumPy, safetensors and the tokenizer: what the card promises
    texts = ["a first sentence", "and a second, longer one"]  # the snippet's own
    want = outputs(out, load_tokenizer(out), texts)
    for name in HEADS[head].outputs:
        got = names[name]
        if got.ndim == 2 and HEADS[head].per_token:  # (batch, longest) at real tokens, as `outputs` keeps them
            got = np.concatenate([row[:len(ids)] for row, ids in zip(got, names["batch"]["input_ids"])])
        np.testing.assert_allclose(got, want[name], atol=1e-5, err_msg=name)


# ---------------------------------------------------------------------------- refusals


def test_a_family_ctranslate2_does_not_convert_is_refused_in_one_line(tokenizers, tmp_path, capsys):
    source = save(build("mpnet"), tokenizers, tmp_path / "mpnet")
    message = one_line_refusal(capsys, ["--model", str(source), "--format", "ctranslate2", "--out", str(tmp_path / "out")])
    assert message.endswith(f"CTranslate2 has no converter for mpnet models ({source.resolve()}); it converts bert, "
                            "distilbert, roberta, xlm-roberta: export this one with --format onnx or --format openvino")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("what, shape, values", [("attention head counts", "heads", "[3, 4]"),
                                                 ("FFN widths", "ffn", "[37, 20]")])
def test_a_non_uniform_pruned_shape_is_refused_in_one_line(what, shape, values, tokenizers, tmp_path, capsys):
    model = build("bert")
    if shape == "heads":
        st.prune_heads(model, {0: [1]})
    else:
        st.resize_ffn(model, 1, range(20))
    source = save(model, tokenizers, tmp_path / "pruned")
    message = one_line_refusal(capsys, ["--model", str(source), "--format", "ctranslate2", "--out", str(tmp_path / "out")])
    assert f"has {what} {values} per layer; CTranslate2's encoder takes one for every layer" in message
    assert "--format onnx or --format openvino" in message and not (tmp_path / "out").exists()


def test_an_unknown_or_misplaced_quantization_is_refused_in_one_line(tokenizers, tmp_path, capsys):
    source = save(build("bert"), tokenizers, tmp_path / "src")
    message = one_line_refusal(capsys, ["--model", str(source), "--format", "ctranslate2", "--quantization", "int4",
                                        "--out", str(tmp_path / "out")])
    assert "--quantization" in message and "'int4'" in message and "bfloat16" in message
    with pytest.raises(CompressError, match=r"^unknown CTranslate2 quantization 'int4'; valid: float32, int8, "
                                            r"int8_float32, bfloat16$"):
        ExportConfig(format="ctranslate2", quantization="int4").validate()  # a recipe's value, past argparse
    message = one_line_refusal(capsys, ["--model", str(source), "--format", "onnx", "--quantization", "int8",
                                        "--out", str(tmp_path / "out")])
    assert "--quantization int8 is CTranslate2's weight type; use it with --format ctranslate2" in message
    with pytest.raises(CompressError, match=r"^unknown export format 'ct2'; valid: ctranslate2, onnx, openvino$"):
        ExportConfig(format="ct2").validate()  # the formats are the exporters' registry
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- eval and latency


@pytest.fixture(scope="module")
def sst2(tmp_path_factory):
    """An SST-2 classifier (random weights, BERT) with synthetic data, and its CTranslate2 export."""
    from compress.core.data import synthetic
    from compress.core.model.shapes import Shape
    from compress.teacher.create import create_model

    root = tmp_path_factory.mktemp("ct2-sst2")
    synthetic.write_sst2_layout(root / "glue", n_train=16, n_dev=32, n_test=4)
    parent = create_model(Shape(2, 32, 4, 37), root / "sst2", tokenizer=synthetic.write_vocab(root / "vocab.txt"),
                          task="sst2", max_positions=64)
    return root, parent, export(parent, root / "ct2", ExportConfig(format="ctranslate2"))


@pytest.mark.e2e
def test_compress_eval_scores_the_folder_as_its_torch_parent(sst2):
    from compress.eval.evaluate import EvalConfig, evaluate

    root, parent, out = sst2
    cfg = EvalConfig(task="sst2", data_dir=str(root / "glue"), record=False)
    (ours,), (torch_record,) = evaluate(out, cfg), evaluate(parent, cfg)
    assert ours["n"] == torch_record["n"] == 32 and ours["metrics"] == pytest.approx(torch_record["metrics"])


@pytest.mark.e2e
def test_latency_times_the_folder_on_ctranslate2_and_names_its_kernels(sst2):
    from compress.core.config import from_dict
    from compress.eval.latency.config import LatencyConfig
    from compress.eval.latency.runs import measure_latency

    _, _, out = sst2
    cfg = from_dict(LatencyConfig, {"backend": "auto", "warmup": 1, "repeats": 2, "seq": (16,), "threads": 1,
                                    "peak": False, "record": False})
    (row,) = measure_latency([out], cfg)["rows"]
    assert row.backend == "ctranslate2" and row.p50_ms > 0 and "CTranslate2 compute type float32" in row.note
    # Its own log at the worker's first load: the GEMM library of float32 products and its kernels' ISA.
    assert row.kernels["runtime"] == "ctranslate2" and row.kernels["reported"] and "SGEMM on" in row.kernels["summary"]


def test_the_kernel_record_is_ctranslate2s_own_log_or_says_it_has_none():
    from compress.eval.latency.kernels import kernels_used

    log = ("[2026-12-07 19:37:21.013] [ctranslate2] [thread 1] [info] CPU: AuthenticAMD (SSE4.1=true, AVX=true, "
           "AVX2=true, AVX512=true)\n"
           "[2026-12-07 19:37:21.013] [ctranslate2] [thread 1] [info]  - Selected ISA: AVX2\n"
           "[2026-12-07 19:37:21.013] [ctranslate2] [thread 1] [info]  - Use Intel MKL: false\n"
           "[2026-12-07 19:37:21.013] [ctranslate2] [thread 1] [info]  - SGEMM backend: DNNL (packed: false)\n"
           "[2026-12-07 19:37:21.013] [ctranslate2] [thread 1] [info]  - GEMM_S8 backend: DNNL (packed: false, u8s8 "
           "preferred: true)\n"
           "[2026-12-07 19:37:21.253] [ctranslate2] [thread 1] [info]  - Selected compute type: int8_float32\n")
    record = kernels_used("ctranslate2", lambda: None, "int8", log)
    assert record["summary"] == "CTranslate2 GEMM_S8 on DNNL; its own kernels AVX2; compute type int8_float32"
    assert record["reported"] and record["isa"] is None and record["detail"]["Use Intel MKL"] == "false"
    assert kernels_used("ctranslate2", lambda: None, "fp32", log)["summary"].startswith("CTranslate2 SGEMM on DNNL;")
    silent = kernels_used("ctranslate2", lambda: None, "fp32", "")  # not the process's first load: nothing logged
    assert not silent["reported"] and silent["summary"].startswith("unknown (CTranslate2 logs its kernels")

"""MPNet through the stages around the model: fine-tune and prune a saved folder, head analysis, OpenVINO, sentence folders
in and out, a student cut from the teacher, compress auto and latency.

One tiny random MPNet (3 layers, hidden 32, 4 heads, FFN 37, MPNet's tokenizer with <pad> id 1) whose shared
``relative_attention_bias`` table is drawn large and different per head, so a layer that read another head's column of
it would change every number asserted here. tests/core/test_families.py covers the model itself (surgery, masking,
int8, ONNX); this file covers what the stages do with it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from torch import nn

from compress.core.config import from_dict
from compress.core.data import synthetic
from compress.core.errors import CompressError
from compress.core.formats.artifacts import load_tokenizer, saved_head
from compress.core.formats.records import read_compression
from compress.core.formats.runtime import load_model
from compress.core.formats.sentence import SentenceSpec, encode, read_spec, write_sentence_files
from compress.core.model import structure as st
from compress.core.model.families import HEAD_IDS
from compress.core.model.importance import ffn_gates, layer_gates, masked_heads
from compress.core.model.shapes import Shape
from tests.conftest import save_tiny
from tests.core.test_families import TEXTS, inputs_for, logits, make_model, mpnet_tokenizer

pytestmark = pytest.mark.versions  # MPNet's modules differ between transformers 4.57 and 5.x

LONG = " ".join(["the movie is very good ."] * 30)  # far beyond the 64 tokens the model takes: truncated
FP32_TOLERANCE = 1e-4  # an fp32 graph against torch, as tests/core/test_openvino.py and test_families.py assert


def strong_position_bias(model, seed: int = 3) -> None:
    """Redraw the shared (buckets, heads) table large and different per head: a wrong column shows in every output.
    A classifier's two Linears are scaled up too, so its logits are of order 1 (BERT's init gives ~0.01)."""
    table = st.base_model(model).encoder.relative_attention_bias.weight
    with torch.no_grad():
        table.copy_(torch.randn(table.shape, generator=torch.Generator().manual_seed(seed)) * 2)
        head = getattr(model, "classifier", None)  # dense + tanh + out_proj; a base model has none
        for linear in head.children() if head is not None else ():
            if isinstance(linear, nn.Linear):
                linear.weight.mul_(20.0)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A saved 3-layer MPNet, fine-tuned on a generated SST-2, then pruned by ``compress prune`` on the command line:
    layer 1 dropped, 3 heads removed across the rest (so two layers keep different counts), 30% of FFN neurons."""
    from compress.cli import main
    from compress.teacher.finetune import FinetuneConfig, finetune

    root = tmp_path_factory.mktemp("mpnet")
    glue = synthetic.write_sst2_layout(root / "glue", n_train=16, n_dev=8, n_test=4)
    tok = mpnet_tokenizer(root / "tok")
    model = make_model("mpnet", layers=3)
    strong_position_bias(model)
    parent = save_tiny(model, tok, root / "fp32")
    tuned = finetune(parent, root / "tuned", from_dict(FinetuneConfig, {"task": "sst2", "data_dir": str(glue), "epochs": 1,
                                                                        "batch_size": 8}))
    pruned = root / "pruned"
    assert main(["prune", "--model", str(tuned), "--task", "sst2", "--data-dir", str(glue), "--remove-layers", "1",
                 "--remove-heads", "3", "--remove-ffn", "0.3", "--out", str(pruned)]) == 0
    return {"root": root, "glue": glue, "tok": tok, "tuned": tuned, "pruned": pruned}


def kept_rows(pruned: torch.Tensor, full: torch.Tensor) -> list[int]:
    """The rows of ``full`` that ``pruned`` holds, in order (each found by exact equality)."""
    return [int((full == row).all(dim=1).nonzero().item()) for row in pruned]


def reference_masks(env) -> tuple[torch.Tensor, list[list[bool]], list[torch.Tensor]]:
    """The pruned folder's cuts as gates on the fine-tuned model: layers, heads (original ids), FFN neurons."""
    tuned, pruned = load_model(env["tuned"]), load_model(env["pruned"])
    structure = read_compression(env["pruned"])["structure"]
    kept, removed = structure["kept_layers"], structure["pruned_heads"]
    layer_gate = torch.tensor([1.0 if i in kept else 0.0 for i in range(3)])
    heads = [[True] * 4 for _ in range(3)]
    ffn = [torch.ones(37) for _ in range(3)]
    for current, original in enumerate(kept):
        for h in removed.get(str(current), []):
            heads[original][h] = False
        ids = kept_rows(st.layers(pruned)[current].ffn_in.weight, st.layers(tuned)[original].ffn_in.weight)
        ffn[original] = torch.zeros(37).index_fill(0, torch.tensor(ids), 1.0)
    return layer_gate, heads, ffn


# ---------------------------------------------------------------------------- 1. fine-tune, prune, reload


def test_the_pruned_folder_reloads_with_the_masked_teachers_logits(env):
    structure = read_compression(env["pruned"])["structure"]
    assert structure["kept_layers"] == [0, 2] and structure["ffn"] == [26, 26]
    assert sum(structure["heads"]) == 5 and len(set(structure["heads"])) == 2  # 3 of 8 heads: never the same count
    loaded = load_model(env["pruned"])
    assert st.heads_per_layer(loaded) == structure["heads"] and len(st.encoder_layers(loaded)) == 2
    # Each layer that lost heads reads its kept heads' columns of the one shared table (buffer rebuilt from the record).
    for index, layer in enumerate(st.encoder_layers(loaded)):
        removed = structure["pruned_heads"].get(str(index), [])
        attention = layer.attention.attn
        assert getattr(attention, HEAD_IDS, torch.arange(4)).tolist() == [h for h in range(4) if h not in removed]
    x = inputs_for(loaded, env["tok"])
    assert "token_type_ids" not in x and x["input_ids"][-1, -1] == 1  # padded with MPNet's id 1
    layer_gate, heads, ffn = reference_masks(env)
    teacher = load_model(env["tuned"])
    with layer_gates(teacher, layer_gate), masked_heads(teacher, heads), ffn_gates(teacher, ffn):
        reference = logits(teacher, x)
    got = logits(loaded, x)
    assert torch.allclose(got, reference, atol=1e-5), (got, reference)
    assert torch.equal(logits(load_model(env["pruned"]), x), got)  # a second load: identical
    with pytest.raises(Exception, match="(?i)mismatch"):  # the stock loader refuses rather than add the full bias
        transformers.AutoModelForSequenceClassification.from_pretrained(env["pruned"])


def test_the_longest_sequence_is_two_fewer_than_the_position_embeddings(env):
    """MPNet numbers tokens from the padding id + 1: 66 position embeddings take 64 tokens, and stages say 64."""
    from compress.eval.latency.config import check_seq

    model = load_model(env["pruned"])
    assert model.config.max_position_embeddings == 66 and st.config_sizes(model.config).max_positions == 64
    ids = torch.full((1, 64), 7)
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits).all()
    with pytest.raises(CompressError, match="use --seq 64 or less"):
        check_seq((65,), st.config_sizes(model.config).max_positions, env["pruned"])


# ---------------------------------------------------------------------------- 2. compress heads


def entropy_by_hand(model, tok, inputs: list[tuple[str, ...]], max_length: int) -> torch.Tensor:
    """Per head of layer 0: -sum p log p averaged over every real query row of every input (each alone, unpadded)."""
    total, rows = 0.0, 0
    for parts in inputs:
        enc = tok(*parts, truncation=True, max_length=max_length, return_tensors="pt")
        with torch.no_grad():
            att = model(**st.model_inputs(model, dict(enc)), output_attentions=True).attentions[0][0]  # (heads, n, n)
        total = total + (-(att * att.clamp_min(1e-30).log()).sum(-1)).sum(-1)  # (heads,)
        rows += att.shape[-1]
    return total / rows


def test_compress_heads_reports_each_kept_heads_entropy(env, capsys):
    """On the pruned folder. Its layer 0 is the fine-tuned layer 0 less some heads, on the same input, so each kept
    head's entropy is that head's in the fine-tuned model, with its own column of the position bias."""
    from compress.cli import main

    inputs = [("the film was not boring .",), ("what a charming story !", "the plot is dull ."), (LONG,)]
    text = env["root"] / "heads.txt"
    text.write_text("".join("\t".join(parts) + "\n" for parts in inputs), encoding="utf-8")
    out = env["root"] / "heads"
    assert main(["heads", "--model", str(env["pruned"]), "--text", str(text), "--out", str(out)]) == 0
    assert "Most specialised heads" in capsys.readouterr().out
    result = json.loads((out / "heads.json").read_text())
    structure = read_compression(env["pruned"])["structure"]
    kept = [[h for h in range(4) if h not in structure["pruned_heads"].get(str(i), [])] for i in range(2)]
    assert result["heads"]["ids"] == kept and result["heads"]["layers"] == [0, 2]
    assert result["inputs"]["max_length"] == 64 and result["inputs"]["n"] == 3  # the long line cut at 64 tokens
    entropy = result["statistics"]["entropy"]
    assert [len(row) for row in entropy] == structure["heads"]
    assert max(v for row in entropy for v in row) <= result["uniform_entropy"] + 1e-5  # no attention on padding
    by_hand = entropy_by_hand(load_model(env["tuned"], attn_implementation="eager"), env["tok"], inputs, 64)
    np.testing.assert_allclose(entropy[0], by_hand[kept[0]].numpy(), atol=1e-4)
    assert by_hand.max() - by_hand.min() > 1e-2  # the heads differ: another head's column would show


# ---------------------------------------------------------------------------- 3. OpenVINO


def test_openvino_export_of_the_pruned_folder_gives_the_torch_logits(env):
    """The pruned layers' pre-hooks (their columns of the position bias) are traced into the IR."""
    pytest.importorskip("openvino")
    from compress.core.formats.openvino import export_openvino

    out = export_openvino(env["pruned"], env["root"] / "ov")
    model, runner = load_model(env["pruned"]), load_model(out)
    record = read_compression(out)
    assert record["format"] == "openvino" and record["precision"] == "fp32"
    assert record["structure"] == st.describe(model)  # every layer whole: MPNet's last layer has no first-token shortcut
    batches = [dict(env["tok"](texts, padding=True, truncation=True, max_length=64, return_tensors="pt"))
               for texts in (TEXTS, [LONG])]  # a padded batch of 3, and one text of another length (64 tokens)
    want = [logits(model, st.model_inputs(model, batch)) for batch in batches]
    for batch, expected in zip(batches, want):
        np.testing.assert_allclose(logits(runner, batch).numpy(), expected.numpy(), atol=FP32_TOLERANCE, rtol=0)
    # The check can fail: a pruned layer reading a removed head's column moves the logits well beyond the tolerance.
    attention = next(a for a in (layer.attention.attn for layer in st.encoder_layers(model)) if hasattr(a, HEAD_IDS))
    kept = getattr(attention, HEAD_IDS).tolist()
    setattr(attention, HEAD_IDS, torch.tensor([next(h for h in range(4) if h not in kept), *kept[1:]]))
    assert (logits(model, st.model_inputs(model, batches[0])) - want[0]).abs().max() > 10 * FP32_TOLERANCE


# ---------------------------------------------------------------------------- 4. sentence-transformers folders


def all_mpnet_like(env, name: str = "all-mpnet"):
    """A folder laid out as sentence-transformers/all-mpnet-base-v2 on the hub: MPNetModel weights under a config.json
    naming MPNetForMaskedLM, Transformer + mean Pooling + Normalize, max_seq_length in sentence_bert_config.json."""
    folder = env["root"] / name
    model = make_model("mpnet", head="base", seed=5)
    strong_position_bias(model)
    model.save_pretrained(folder)
    env["tok"].save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["MPNetForMaskedLM"]}))
    modules = [{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
               for i, (path, kind) in enumerate([("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")])]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 48, "do_lower_case": False}))
    for sub in ("1_Pooling", "2_Normalize"):
        (folder / sub).mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
    return folder


def test_an_mpnet_sentence_transformers_folder_is_read_as_sentence_transformers_reads_it(env):
    """config.json names MPNetForMaskedLM, but SentenceTransformer reads the root with AutoModel: so do the stages (an
    export of the masked-LM head would have drawn that head at random and given logits, not token states)."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from compress.core.formats.onnx import export_onnx

    folder = all_mpnet_like(env)
    spec = read_spec(folder)
    assert (spec.pooling, spec.normalize, spec.max_seq_length, spec.dimension) == ("mean", True, 48, 32)
    assert saved_head(folder) == "base" and type(load_model(folder)).__name__ == "MPNetModel"
    texts = [*TEXTS, LONG]  # the long one truncated at 48 tokens
    theirs = sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(texts, batch_size=2)
    ours = encode(load_model(folder), load_tokenizer(folder), texts, spec, batch_size=3)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    exported = export_onnx(folder, env["root"] / "all-mpnet-onnx")
    assert read_compression(exported)["config"]["outputs"] == ["last_hidden_state"] and read_spec(exported) == spec
    np.testing.assert_allclose(encode(load_model(exported), load_tokenizer(exported), texts, spec), theirs, atol=1e-5)


def test_an_mpnet_written_as_a_sentence_folder_loads_in_sentence_transformers_and_a_pruned_one_never_wrongly(env):
    """The toolkit's folder files beside a base MPNet: SentenceTransformer gives the toolkit's embeddings. With heads
    removed from one layer, the toolkit's embeddings are the masked model's, and the stock loader refuses the folder
    (or, should it ever load it, reproduces them)."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    spec = SentenceSpec(pooling="mean", normalize=True, max_seq_length=48)
    model = make_model("mpnet", head="base", seed=6)
    strong_position_bias(model)
    folder = save_tiny(model, env["tok"], env["root"] / "st-written")
    write_sentence_files(folder, spec, 32)
    texts = [*TEXTS, LONG]
    ours = encode(load_model(folder), env["tok"], texts, read_spec(folder))
    theirs = sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(texts)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    keep = [[True, False, True, False], [True] * 4]
    with masked_heads(model, keep):
        masked = encode(model, env["tok"], texts, spec)
    st.prune_heads(model, {0: [1, 3]})
    pruned = save_tiny(model, env["tok"], env["root"] / "st-pruned")
    write_sentence_files(pruned, spec, 32)
    ours = encode(load_model(pruned), env["tok"], texts, read_spec(pruned))
    np.testing.assert_allclose(ours, masked, atol=1e-5)
    try:
        theirs = sentence_transformers.SentenceTransformer(str(pruned), device="cpu").encode(texts)
    except Exception as error:  # noqa: BLE001 - any loud failure is a refusal
        assert "mismatch" in str(error).lower()
    else:  # never silently wrong: loaded, it must reproduce
        np.testing.assert_allclose(theirs, ours, atol=1e-5)


# ---------------------------------------------------------------------------- a student cut from the teacher


def test_a_student_with_fewer_heads_keeps_the_same_teacher_heads_in_every_layer_and_their_table_columns(env, tmp_path):
    """Every MPNet layer reads one (buckets, heads) table, so a student cut from the teacher keeps the same teacher
    heads in every layer and their columns of the table (per-layer choices could not share one table)."""
    from compress.students.init import init_student

    teacher = load_model(env["tuned"])
    student, info = init_student(teacher, Shape(2, 16, 2, 20), "teacher")
    assert info["method"] == "teacher-slices" and st.heads_per_layer(student) == [2, 2]
    t_base, s_base = st.base_model(teacher), st.base_model(student)
    t_table, s_table = t_base.encoder.relative_attention_bias.weight, s_base.encoder.relative_attention_bias.weight
    heads = kept_rows(s_table.T, t_table.T)  # (heads, buckets): the teacher columns the student kept
    assert len(heads) == 2 and heads == sorted(heads)
    hidden = kept_rows(s_base.embeddings.word_embeddings.weight.T, t_base.embeddings.word_embeddings.weight.T)
    for s_layer, source in zip(st.layers(student), info["teacher_layers"]):
        t_layer = st.layers(teacher)[source]
        rows = torch.cat([torch.arange(h * 8, h * 8 + 8) for h in heads])  # 8-wide heads: whole teacher heads
        for s_w, t_w in zip(s_layer.qkv_weights, t_layer.qkv_weights):
            assert torch.equal(s_w, t_w[rows][:, hidden])
    # A stock MPNet of 2 heads: it round-trips, and transformers' own loader reads it to the same logits.
    x = inputs_for(student, env["tok"])
    folder = save_tiny(student.eval(), env["tok"], tmp_path / "student")
    assert torch.equal(logits(load_model(folder), x), logits(student, x))
    stock = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert torch.allclose(logits(stock, x), logits(student, x), atol=1e-6)


# ---------------------------------------------------------------------------- 5. compress auto


@pytest.mark.e2e
def test_compress_auto_on_an_mpnet_teacher_chooses_an_mpnet_student_that_scores_what_it_reports(env, tmp_path):
    """The smallest search of tests/auto (its fake timer) over students with fewer heads than the teacher: every
    candidate is an MPNet cut from it, and the chosen one scores on dev what the report says."""
    from compress.auto.run import auto
    from compress.eval.evaluate import EvalConfig, evaluate
    from tests.auto.test_auto import _cfg, fake_timer

    shapes = ["1L-16-18", "2L-24-27"]  # 2 and 3 heads of the teacher's 4
    cfg = _cfg(env["glue"], "p50<=2.2ms@b1,s32", shapes=shapes, probes=2, candidates=2, rounds=1, backends=["torch"])
    out = auto(env["tuned"], tmp_path / "auto", cfg, timer=fake_timer())
    report = json.loads((out / "search" / "search.json").read_text())
    assert sorted(t["label"] for t in report["trained"]) == shapes
    chosen = next(r for r in report["results"] if r["name"] == report["chosen"]["name"])
    assert all(chosen["meets"].values()) and chosen["measured_p50_ms"] <= 2.2
    model = load_model(out)
    assert model.config.model_type == "mpnet" and load_tokenizer(out).pad_token_id == 1
    heads = st.heads_per_layer(model)
    assert heads[0] < 4 and st.base_model(model).encoder.relative_attention_bias.weight.shape == (32, heads[0])
    (evaluated,) = evaluate(out, from_dict(EvalConfig, {"task": "sst2", "data_dir": str(env["glue"]), "max_length": 32}))
    assert evaluated["metrics"]["accuracy"] == pytest.approx(chosen["accuracy"], abs=1e-9)


# ---------------------------------------------------------------------------- 6. latency


def flops_by_hand(structure: dict, seq: int) -> int:
    """Multiply-adds x 2 per sequence: per layer Q, K, V, O 4*s*h*a, scores and context 2*s*s*a, FFN 2*s*h*f."""
    h, d = structure["hidden_size"], structure["head_size"]
    return 2 * sum(4 * seq * h * n * d + 2 * seq * seq * n * d + 2 * seq * h * f
                   for n, f in zip(structure["heads"], structure["ffn"]))


@pytest.mark.e2e
def test_latency_times_the_pruned_folder_on_torch_and_onnxruntime(env, tmp_path):
    """One worker per backend times the pruned MPNet; the sessions they time compute its logits, and every layer is
    counted whole on both (MPNet's last layer has no first-token shortcut, in torch or in the exported graph)."""
    from compress.core.formats.onnx import export_onnx
    from compress.eval.latency.backends import BACKENDS
    from compress.eval.latency.runs import measure_latency
    from tests.eval.test_latency import fast

    model = load_model(env["pruned"])
    enc = env["tok"](TEXTS, padding=True, return_tensors="pt")
    batch = {name: enc[name].numpy() for name in ("input_ids", "attention_mask")}  # padded with id 1
    want = logits(model, {name: torch.from_numpy(a) for name, a in batch.items()}).numpy()
    for name in ("torch", "onnxruntime"):
        session = BACKENDS.get(name)(env["pruned"], fast())
        out = session.forward(session.prepare(batch))
        got = out.logits.numpy() if name == "torch" else out[0]
        np.testing.assert_allclose(got, want, atol=FP32_TOLERANCE, rtol=0)
        assert session.max_positions == 64
    exported = export_onnx(env["pruned"], tmp_path / "onnx")  # backend auto: an ONNX folder runs on onnxruntime
    rows = measure_latency([env["pruned"], exported], fast(record=False))["rows"]
    assert [row.backend for row in rows] == ["torch", "onnxruntime"]
    structure = read_compression(env["pruned"])["structure"]
    for row in rows:
        assert row.seq == 16 and 0 < row.p50_ms <= row.p99_ms
        assert row.gflops_per_seq == pytest.approx(flops_by_hand(structure, 16) / 1e9, rel=1e-12)
        assert row.params == st.count_parameters(model)

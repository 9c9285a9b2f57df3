"""Every encoder family (BERT, RoBERTa, XLM-R, DistilBERT, ELECTRA, MPNet, ModernBERT) through the whole toolkit.

Tiny random models built from each family's config (vocab ~100, hidden 32, 4 heads,
FFN 37), saved as model directories with a WordPiece tokenizer (MPNet's own, padding id 1), then: round trips,
physical pruning (heads, FFN neurons, layers) against masking, importance scores, a
student from teacher layers, int8 (torch and ONNX Runtime), ONNX export.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from transformers import modeling_outputs

from compress.core.formats import pt2
from compress.core.data import synthetic
from compress.core.model import structure as st
from compress.core.formats.artifacts import saved_head
from compress.core.formats.records import read_compression
from compress.core.compat import STOCK_PRUNED_HEADS, TRANSFORMERS_MAJOR, has_module, wordpiece_tokenizer
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.formats.onnx import export_onnx
from compress.core.model.families import FAMILIES, get_family, head_of_class
from compress.core.model.graph_pruning import prune_ffn_neurons
from compress.core.model.heads import HEADS
from compress.core.model.importance import (
    ffn_gates,
    ffn_importance_magnitude,
    ffn_importance_taylor,
    head_importance_entropy,
    head_importance_gradient,
    head_importance_magnitude,
    layer_gates,
    layer_importance_gradient,
    masked_heads,
)
from compress.core.formats.runtime import load_model
from compress.core.model.shapes import Shape
from compress.quantize.config import QuantizeConfig
from compress.quantize.run import quantize
from compress.students.init import init_from_teacher
from tests.conftest import VOCAB, make_tiny_model, save_tiny, tiny_config, write_vocab

# Depends on the installed transformers version: the transformers 4.57 set runs it too (make test-transformers4).
pytestmark = pytest.mark.versions

TEXTS = ["the movie was good", "a very boring film , not fun at all", "paris is the capital of france ."]
NAMES = ["bert", "roberta", "xlm-roberta", "distilbert", "electra", "mpnet", "modernbert"]
# Families whose last layer cannot compute the first token alone: ModernBERT (rotary, fused attention), MPNet
# (the layer adds a position bias the encoder computes for every token).
NO_FIRST_TOKEN = ("modernbert", "mpnet")
SIZES = dict(hidden=32, heads=4, ffn=37)


def family_config(name: str, layers: int = 2):
    """A tiny random config of family ``name``: no dropout, 2 labels, the test vocabulary."""
    v = len(VOCAB)
    if name == "bert":
        return tiny_config(num_hidden_layers=layers)
    common = dict(vocab_size=v, num_labels=2, pad_token_id=0)
    bert_like = dict(hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=37,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common)
    if name in ("roberta", "xlm-roberta"):
        # Positions start after the padding id: 64 tokens need 66 position embeddings.
        cls = transformers.RobertaConfig if name == "roberta" else transformers.XLMRobertaConfig
        return cls(max_position_embeddings=66, type_vocab_size=1, **bert_like)
    if name == "mpnet":  # positions counted from the padding id 1, like RoBERTa's; LayerNorm eps 1e-5 as released
        mpnet = {**bert_like, "pad_token_id": 1}
        return transformers.MPNetConfig(max_position_embeddings=66, layer_norm_eps=1e-5, relative_attention_num_buckets=32,
                                        **mpnet)
    if name == "electra":  # embeddings narrower than the encoder: the projection is part of the model
        return transformers.ElectraConfig(embedding_size=16, max_position_embeddings=64, **bert_like)
    if name == "distilbert":
        return transformers.DistilBertConfig(dim=32, n_layers=layers, n_heads=4, hidden_dim=37, max_position_embeddings=64,
                                             dropout=0.0, attention_dropout=0.0, **common)
    if name == "modernbert":
        # A 4-token window makes global and sliding-window layers differ on these sentences.
        return transformers.ModernBertConfig(
            hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
            local_attention=4, global_attn_every_n_layers=2, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3,
            **common,
        )
    raise AssertionError(name)


def make_model(name: str, head: str = "sequence-classification", layers: int = 2, seed: int = 0, attn: str | None = None):
    torch.manual_seed(seed)
    config = family_config(name, layers)
    if attn:
        config._attn_implementation = attn  # before construction: 4.x picks attention classes then
    model = getattr(transformers, get_family(config.model_type).classes[head])(config)
    return model.eval()


def make_tokenizer(name: str, directory):
    """The test WordPiece tokenizer; without token_type_ids for families that take none (as their own tokenizers).
    MPNet's: its own class and special tokens, padding id 1 (its positions count from it)."""
    names = list(get_family(name).inputs)
    if name == "mpnet":
        return mpnet_tokenizer(directory)
    return wordpiece_tokenizer(write_vocab(directory), do_lower_case=True, model_max_length=64, model_input_names=names)


MPNET_SPECIAL = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]  # all-mpnet-base-v2's order: <pad> is id 1


def mpnet_tokenizer(directory):
    """An MPNet tokenizer over the test vocabulary with MPNet's special tokens in place of BERT's."""
    directory.mkdir(parents=True, exist_ok=True)
    tokens = MPNET_SPECIAL + VOCAB[len(MPNET_SPECIAL):]
    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    if TRANSFORMERS_MAJOR < 5:  # 4.x reads the file
        return transformers.MPNetTokenizerFast(vocab_file=str(vocab), model_max_length=64)
    return transformers.MPNetTokenizer(vocab={t: i for i, t in enumerate(tokens)}, model_max_length=64)  # 5.x: a dict


def inputs_for(model, tokenizer) -> dict:
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")  # padded: the attention mask matters
    return st.model_inputs(model, dict(enc))


def logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


@pytest.fixture(params=NAMES)
def name(request):
    return request.param


@pytest.fixture
def tok(name, tmp_path):
    return make_tokenizer(name, tmp_path / "tok")


def test_every_family_is_registered_once_with_its_classes():
    assert FAMILIES.names() == sorted(NAMES)
    for family in NAMES:
        for head, cls in get_family(family).classes.items():
            assert hasattr(transformers, cls) and head_of_class(cls) == head


@pytest.mark.parametrize("name", list(HEADS))
def test_each_head_record_says_what_a_model_with_that_head_returns(name):
    """The record's outputs and per-token outputs are what a tiny BERT with the head returns, and its output class
    (what a runner answers with) holds them."""
    head = HEADS[name]
    assert hasattr(transformers, head.auto_class) and get_family("bert").head_class(name) == "Bert" + head.class_suffix
    batch, seq = 2, 7
    with torch.inference_mode():
        out = make_tiny_model(name)(input_ids=torch.ones(batch, seq, dtype=torch.long))
    for output in head.outputs:  # (batch, seq[, width]) per token; a sequence classifier's (batch, labels)
        shape = getattr(out, output).shape
        assert shape[0] == batch and (len(shape) >= 2 and shape[1] == seq) == (output in head.per_token_outputs)
    assert set(head.per_token_outputs) <= set(head.outputs)
    values = {output: getattr(out, output) for output in head.outputs}
    rebuilt = getattr(modeling_outputs, head.output_class)(**values)
    assert all(getattr(rebuilt, output) is value for output, value in values.items())


def test_unknown_family_is_refused_in_one_line(tmp_path, tokenizer):
    out = save_tiny(make_model("bert"), tokenizer, tmp_path / "m")
    config = json.loads((out / "config.json").read_text())
    config["model_type"] = "gpt2"
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(CompressError) as err:
        load_model(out)
    message = str(err.value)
    assert "model_type 'gpt2' is not supported; known encoder families: bert, distilbert, electra, modernbert, mpnet, roberta, xlm-roberta" in message
    assert "\n" not in message


def test_round_trip(name, tok, tmp_path):
    model = make_model(name)
    out = save_tiny(model, tok, tmp_path / "m")
    loaded = load_model(out)
    assert type(loaded) is type(model) and saved_head(out) == "sequence-classification"
    x = inputs_for(model, tok)
    assert set(x) == set(get_family(name).inputs)
    assert torch.equal(logits(model, x), logits(loaded, x))
    structure = read_compression(out)["structure"]
    assert structure["heads"] == [4, 4] and structure["ffn"] == [37, 37] and structure["hidden_size"] == 32


@pytest.mark.parametrize("head", ["base", "question-answering", "masked-lm"])
def test_every_head_round_trips(name, tok, tmp_path, head):
    family = get_family(name)
    if head not in family.classes:
        with pytest.raises(CompressError, match=f"no {head} head"):
            family.head_class(head)
        return
    model = make_model(name, head=head)
    loaded = load_model(save_tiny(model, tok, tmp_path / head))
    x = inputs_for(model, tok)
    with torch.no_grad():
        want, got = model(**x), loaded(**x)
    for key in ("last_hidden_state", "start_logits", "end_logits", "logits"):
        if getattr(want, key, None) is not None:
            assert torch.equal(getattr(got, key), getattr(want, key)), key
    if head == "masked-lm":  # the head general distillation runs on selected positions only
        with torch.no_grad():
            hidden = st.base_model(model)(**x).last_hidden_state
            assert torch.allclose(st.mlm_head(model)(hidden), want.logits, atol=1e-6)


def test_pruned_heads_and_ffn_match_masking_and_round_trip(name, tok, tmp_path):
    model = make_model(name)
    x = inputs_for(model, tok)
    keep_ffn = sorted(torch.randperm(37, generator=torch.Generator().manual_seed(1))[:20].tolist())
    ffn_mask = [torch.ones(37), torch.zeros(37).index_fill(0, torch.tensor(keep_ffn), 1.0)]
    with masked_heads(model, [[True, False, True, True], [True] * 4]), ffn_gates(model, ffn_mask):
        masked = logits(model, x)
    st.prune_heads(model, {0: [1]})
    st.resize_ffn(model, 1, keep_ffn)
    assert st.heads_per_layer(model) == [3, 4] and st.ffn_widths(model) == [37, 20]
    pruned = logits(model, x)
    assert torch.allclose(pruned, masked, atol=1e-5), (pruned, masked)  # removed == masked (zero-gated)
    out = save_tiny(model, tok, tmp_path / "pruned")
    loaded = load_model(out)
    assert st.heads_per_layer(loaded) == [3, 4] and st.ffn_widths(loaded) == [37, 20]
    assert torch.equal(logits(loaded, x), pruned)
    assert read_compression(out)["structure"]["pruned_heads"] == {"0": [1]}
    assert st.count_parameters(loaded) == st.count_parameters(model)


def test_graph_pruning_removes_the_same_neurons_as_the_surgery(name, tok):
    # torch-pruning's dependency graph finds every coupled weight (ModernBERT: input and gate rows).
    keep = [list(range(0, 37, 2)), list(range(10, 30))]
    by_hand, by_graph = make_model(name), make_model(name)
    for layer, ids in enumerate(keep):
        st.resize_ffn(by_hand, layer, ids)
    prune_ffn_neurons(by_graph, keep)
    assert st.ffn_widths(by_graph) == [19, 20]
    x = inputs_for(by_hand, tok)
    assert torch.equal(logits(by_graph, x), logits(by_hand, x))


def test_dropped_layer_matches_skipping_it_and_round_trips(name, tok, tmp_path):
    model = make_model(name, layers=3)
    x = inputs_for(model, tok)
    with layer_gates(model, torch.tensor([0.0, 1.0, 1.0])), masked_heads(model, [[True] * 4, [True, True, False, True], [True] * 4]):
        skipped = logits(model, x)
    st.prune_heads(model, {1: [2]})
    st.drop_layers(model, [1, 2])  # ModernBERT: the first layer is now one that has a pre-attention norm
    dropped = logits(model, x)
    assert torch.allclose(dropped, skipped, atol=1e-5)
    out = save_tiny(model, tok, tmp_path / "dropped")
    loaded = load_model(out)
    assert torch.equal(logits(loaded, x), dropped)
    structure = read_compression(out)["structure"]
    assert structure["kept_layers"] == [1, 2] and structure["heads"] == [3, 4]


def test_stock_loader_reproduces_or_refuses(name, tok, tmp_path):
    # A uniformly pruned folder loads stock where the family's stock loader reads
    # config.pruned_heads (transformers 4.x); elsewhere it is refused, never filled at random.
    model = make_model(name)
    for layer in range(2):
        st.resize_ffn(model, layer, range(20))
    st.prune_heads(model, {0: [2]})
    out = save_tiny(model, tok, tmp_path / "uniform")
    x = inputs_for(model, tok)
    if STOCK_PRUNED_HEADS and get_family(name).stock_pruned_heads:
        stock = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
        assert torch.allclose(logits(stock, x), logits(model, x), atol=1e-6)
    else:
        with pytest.raises(Exception, match="(?i)mismatch"):
            transformers.AutoModelForSequenceClassification.from_pretrained(out)


def test_importance_scores(name, tok):
    model = make_model(name, attn="eager")  # attention maps for the entropy criterion
    batch = {**inputs_for(model, tok), "labels": torch.tensor([0, 1, 1])}
    grads = head_importance_gradient(model, [batch])
    assert [len(s) for s in grads] == [4, 4] and all(torch.isfinite(s).all() and s.sum() > 0 for s in grads)
    layer = st.layers(model)[0]
    with torch.no_grad():  # zero head 1's Q/K/V rows and output columns: its magnitude must be 0, the others not
        for weight in layer.qkv_weights:
            weight[8:16] = 0.0
        layer.output.weight[:, 8:16] = 0.0
    magnitude = head_importance_magnitude(model)
    assert magnitude[0][1] == 0 and (magnitude[0][[0, 2, 3]] > 0).all()
    entropy = head_importance_entropy(model, [batch])
    assert [len(s) for s in entropy] == [4, 4] and all((s < 0).all() for s in entropy)
    taylor = ffn_importance_taylor(model, [batch])
    assert [len(s) for s in taylor] == [37, 37] and all(s.sum() > 0 for s in taylor)
    assert [len(s) for s in ffn_importance_magnitude(model)] == [37, 37]
    assert layer_importance_gradient(model, [batch]).shape == (2,)


def test_student_from_teacher_layer(name, tok, tmp_path):
    teacher = make_model(name)
    student, used = init_from_teacher(teacher, Shape(1, **SIZES), [1])
    assert used == [1]
    source = st.encoder_layers(teacher)[1].state_dict()
    copied = st.encoder_layers(student)[0].state_dict()
    assert source.keys() == copied.keys() and all(torch.equal(copied[k], source[k]) for k in source)
    x = inputs_for(teacher, tok)
    with layer_gates(teacher, torch.tensor([0.0, 1.0])):  # the student is the teacher without layer 0
        expected = logits(teacher, x)
    assert torch.allclose(logits(student.eval(), x), expected, atol=1e-5)
    loaded = load_model(save_tiny(student, tok, tmp_path / "student"))
    assert torch.equal(logits(loaded, x), logits(student, x))


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    """A generated SST-2 (train for calibration, dev for the accuracy guard)."""
    root = tmp_path_factory.mktemp("glue")
    synthetic.write_sst2_layout(root, n_train=16, n_dev=8, n_test=4)
    return root


@pytest.mark.e2e
@pytest.mark.parametrize("backend,scheme", [("torch", "dynamic"), ("onnxruntime", "dynamic"), ("inc", "static")])
def test_int8(name, tok, tmp_path, glue, backend, scheme, monkeypatch):
    if backend == "inc" and not has_module("neural_compressor"):
        pytest.skip("Neural Compressor is not installed")
    monkeypatch.setenv(pt2.NO_COMPILE_ENV, "1")  # INC programs run uncompiled (no C++ compiler needed)
    model = make_model(name)
    parent = save_tiny(model, tok, tmp_path / "fp32")
    # With a task: calibration from its training split and both models scored on its dev split.
    cfg = from_dict(QuantizeConfig, {"backend": backend, "scheme": scheme, "task": "sst2", "data_dir": str(glue),
                                     "calibration_examples": 8})
    out = quantize(parent, tmp_path / f"int8-{backend}", cfg)
    loaded = load_model(out)
    x = inputs_for(model, tok)
    reference, got = logits(model, x), logits(loaded, x)
    assert got.shape == reference.shape and torch.isfinite(got).all()
    assert (got - reference).abs().max() <= 0.1 * reference.abs().max() + 1e-3
    record = read_compression(out)
    assert record["precision"] == "int8" and record["structure"]["heads"] == [4, 4]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])  # each hands its layers its own mask format
def test_a_last_layer_of_the_first_token_only_gives_the_same_logits(name, tok, attn):
    try:
        model = make_model(name, attn=attn)
    except ValueError as err:  # transformers 4.x: ELECTRA has no SDPA attention
        if "does not support an attention implementation" not in str(err):
            raise
        pytest.skip(f"{name} has no {attn} attention in this transformers")
    st.prune_heads(model, {1: [0, 2]})  # the last layer: 2 heads of 4
    x = inputs_for(model, tok)  # padded rows
    full = logits(model, x)
    assert st.first_token_only(model) is (name not in NO_FIRST_TOKEN)
    if name in NO_FIRST_TOKEN:
        return
    assert torch.allclose(logits(model, x), full, atol=1e-5)
    with torch.no_grad():
        hidden = st.base_model(model)(**x).last_hidden_state
    assert hidden.shape == (len(TEXTS), 1, 32)  # the last layer computed one token
    assert st.describe(model)["first_token_last_layer"] is True


@pytest.mark.e2e
def test_onnx_export_parity(name, tok, tmp_path):
    model = make_model(name)
    st.prune_heads(model, {0: [1]})
    st.resize_ffn(model, 1, range(20))
    parent = save_tiny(model, tok, tmp_path / "pruned")
    out = export_onnx(parent, tmp_path / "onnx")
    # A classifier reads the first token only: the graph's last layer computes that one (see NO_FIRST_TOKEN).
    assert read_compression(out)["structure"].get("first_token_last_layer", False) is (name not in NO_FIRST_TOKEN)
    assert "first_token_last_layer" not in read_compression(export_onnx(
        save_tiny(make_model(name, head="base"), tok, tmp_path / "base"), tmp_path / "base-onnx"))["structure"]
    runner = load_model(out)
    assert list(runner.input_names) == list(get_family(name).inputs)  # only the inputs the model takes
    x = inputs_for(model, tok)
    assert torch.allclose(logits(runner, x), logits(model, x), atol=1e-4)
    longer = st.model_inputs(model, dict(tok([" ".join(TEXTS) * 2], return_tensors="pt")))  # longer than the traced example
    assert torch.allclose(logits(runner, longer), logits(model, longer), atol=1e-4)
    # The runner takes the BERT call convention whatever the family: an extra token_type_ids is ignored.
    full = tok(TEXTS, padding=True, return_tensors="pt", return_token_type_ids=True)
    assert torch.allclose(logits(runner, dict(full)), logits(model, x), atol=1e-4)


@pytest.mark.parametrize("family", ["distilbert", "modernbert"])
def test_a_bert_tokenizer_beside_a_family_without_token_type_ids(family, tmp_path, glue):
    """A tokenizer that returns token_type_ids (a BERT one) drives fine-tuning, distillation and pruning of a
    family whose forward takes none: the toolkit passes each model only the inputs its family takes."""
    from compress.distill.task import DistillConfig, distill
    from compress.prune import PruneConfig, prune
    from compress.teacher.finetune import FinetuneConfig, finetune
    from tests.conftest import make_tokenizer as bert_tokenizer

    tok = bert_tokenizer(tmp_path / "tok")
    assert "token_type_ids" in tok("a b")
    parent = save_tiny(make_model(family), tok, tmp_path / "fp32")
    common = {"task": "sst2", "data_dir": str(glue), "epochs": 1, "batch_size": 8}
    tuned = finetune(parent, tmp_path / "tuned", from_dict(FinetuneConfig, common))
    student = distill(tuned, tmp_path / "student", from_dict(DistillConfig, {**common, "student": "1L-32-37-4H",
                                                                             "losses": ["kd", "hard", "hidden"]}))
    pruned = prune(tuned, tmp_path / "pruned", from_dict(PruneConfig, {"task": "sst2", "data_dir": str(glue), "remove_heads": 2}))
    assert st.heads_per_layer(load_model(pruned)) != [4, 4] and load_model(student).config.model_type == family


def test_mpnet_layers_that_lose_different_heads_read_their_own_position_bias_columns(tmp_path):
    """MPNet's one relative_attention_bias table (buckets x heads) serves every layer: a layer that lost heads must
    add its kept heads' columns only. Pruned twice (current ids the second time), it equals the unpruned model with
    the same original heads masked, and reloads exactly."""
    tok = mpnet_tokenizer(tmp_path / "tok")
    model = make_model("mpnet", layers=3)
    table = st.base_model(model).encoder.relative_attention_bias.weight
    with torch.no_grad():  # a bias that differs per head, so a wrong column changes the scores
        table.copy_(torch.randn(table.shape, generator=torch.Generator().manual_seed(3)) * 2)
    x = inputs_for(model, tok)
    assert x["input_ids"][-1, -1] == 1 and "token_type_ids" not in x  # padded with id 1, no segments
    keep = [[True, False, True, True], [False, True, True, False], [True] * 4]
    with masked_heads(model, [[True, False, True, False], keep[1], keep[2]]):
        masked = logits(model, x)
    st.prune_heads(model, {0: [1], 1: [0, 3]})
    st.prune_heads(model, {0: [2]})  # current ids of layer 0 are now [0, 2, 3]: current 2 is original 3
    assert st.heads_per_layer(model) == [2, 2, 4] and st.removed_heads(model) == {0: [1, 3], 1: [0, 3]}
    assert table.shape == (32, 4)  # the shared table keeps every column: other layers still read them
    pruned = logits(model, x)
    assert torch.allclose(pruned, masked, atol=1e-5), (pruned, masked)
    out = save_tiny(model, tok, tmp_path / "pruned")
    loaded = load_model(out)
    assert st.heads_per_layer(loaded) == [2, 2, 4] and torch.equal(logits(loaded, x), pruned)
    # The stock loader refuses the narrower weights rather than adding the full bias to two heads.
    with pytest.raises(Exception, match="(?i)mismatch"):
        transformers.AutoModelForSequenceClassification.from_pretrained(out)


def test_mpnet_positions_count_from_its_padding_id(tmp_path):
    """The same sentence alone and padded in a batch gives the same logits: positions skip the padding id 1."""
    tok = mpnet_tokenizer(tmp_path / "tok")
    model = make_model("mpnet")
    alone = st.model_inputs(model, dict(tok(TEXTS[:1], return_tensors="pt")))
    batch = inputs_for(model, tok)
    assert torch.allclose(logits(model, alone)[0], logits(model, batch)[0], atol=1e-5)
    assert st.base_model(model).embeddings.LayerNorm.eps == 1e-5

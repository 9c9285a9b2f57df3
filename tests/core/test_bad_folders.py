"""Folders that lie are refused before use: weights that cannot be right, configs transformers would
reject later, lineage loops. Each case is one line naming the file and what to do, exit status 2,
never the internal-error fallback, and nothing written."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compress.cli import main
from compress.core.data import synthetic
from compress.core.errors import CompressError
from compress.core.formats.weight_checks import check_shard_names, check_tensors
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny

QUERY = "bert.encoder.layer.0.attention.self.query.weight"
WORDS = "bert.embeddings.word_embeddings.weight"


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A tiny sst2 classifier (hidden 32, 4 heads, FFN 37), its data, and a second folder to point into."""
    root = tmp_path_factory.mktemp("folders")
    tok = make_tokenizer(root / "tok")
    save_tiny(make_tiny_model(), tok, root / "good")
    save_tiny(make_tiny_model(seed=1), tok, root / "other")
    synthetic.write_sst2_layout(root / "glue", n_train=32, n_dev=16, n_test=4)
    return root


# ---------------------------------------------------------------------------- mutations of a good folder


def edit_weights(edit):
    def apply(folder: Path) -> None:
        file = folder / "model.safetensors"
        state = load_file(file)
        save_file(edit(state) or state, file, metadata={"format": "pt"})
    return apply


def edit_config(**changes):
    def apply(folder: Path) -> None:
        file = folder / "config.json"
        file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))
    return apply


def set_value(name: str, index: tuple, value: float):
    def edit(state):
        state[name] = state[name].clone()
        state[name][index] = value
    return edit


def as_dtype(dtype):
    return lambda state: {k: v.to(dtype) for k, v in state.items()}


def without_classifier(state):
    return {k: v for k, v in state.items() if not k.startswith("classifier.")}


def sharded_into(target: str):
    """Weights moved into an index whose one shard is ``target`` (relative names are joined to the folder)."""
    def apply(folder: Path) -> None:
        state = load_file(folder / "model.safetensors")
        (folder / "model.safetensors").unlink()
        target_path = str(folder.parent / target) if target.startswith("other/") else target
        index = {"metadata": {}, "weight_map": {k: target_path for k in state}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return apply


def nested_json(folder: Path) -> None:
    (folder / "config.json").write_text("[" * 200_000 + "]" * 200_000)


def own_parent(folder: Path) -> None:
    record = json.loads((folder / "compression.json").read_text())
    record["parent"] = {"path": str(folder.resolve()), "hash": "sha256:0"}
    (folder / "compression.json").write_text(json.dumps(record))


def parent_as_text(folder: Path) -> None:
    record = json.loads((folder / "compression.json").read_text())
    record["parent"] = "../good"
    (folder / "compression.json").write_text(json.dumps(record))


def small_embeddings(folder: Path) -> None:
    """A model whose embedding matrix has 20 rows beside a tokenizer of ~150 tokens."""
    shutil.rmtree(folder)
    save_tiny(make_tiny_model(vocab_size=20), make_tokenizer(folder.parent / f"{folder.name}-tok"), folder)


BAD_FOLDERS = {
    # weights that cannot be right
    "int64 tensors": (edit_weights(as_dtype(torch.int64)), r"model\.safetensors: tensor \S+ is stored as int64, but weights here must be floating point"),
    "bool tensors": (edit_weights(as_dtype(torch.bool)), r"is stored as bool"),
    "NaN query": (edit_weights(set_value(QUERY, (slice(None),), float("nan"))),
                  rf"tensor {QUERY} holds 1,024 non-finite values of 1,024 \(1,024 NaN, 0 infinite\).*earlier checkpoint"),
    "inf embedding": (edit_weights(set_value(WORDS, (3, 0), float("inf"))), rf"tensor {WORDS} holds 1 non-finite values .*\(0 NaN, 1 infinite\)"),
    "missing classifier": (edit_weights(without_classifier),
                           r"config.json says the model is a fine-tuned BertForSequenceClassification, but its weights lack 2 of "
                           r"its tensors \(e.g. classifier\.\w+\).*remove \"architectures\""),
    "index into another folder": (sharded_into("other/model.safetensors"), r"maps tensors to '/.*other/model\.safetensors', which is not a file in"),
    "index with ..": (sharded_into("../other/model.safetensors"), r"maps tensors to '\.\./other/model\.safetensors', which is not a file in"),
    "index of a missing shard": (sharded_into("model-00001-of-00002.safetensors"), r"names the shard model-00001-of-00002\.safetensors, which is missing"),
    # configs transformers would reject later (or run into garbage)
    "heads do not divide hidden": (edit_config(num_attention_heads=3), r"num_attention_heads 3 does not divide hidden_size 32"),
    "unknown activation": (edit_config(hidden_act="gelu_fancy"), r"hidden_act 'gelu_fancy' is not an activation transformers knows; valid: .*gelu"),
    "dropout 5.0": (edit_config(hidden_dropout_prob=5.0), r"hidden_dropout_prob is 5\.0; a dropout probability must be a number from 0 to 1"),
    "dropout as text": (edit_config(attention_probs_dropout_prob="0.1"), r"attention_probs_dropout_prob is '0\.1'; a dropout probability"),
    "negative epsilon": (edit_config(layer_norm_eps=-1e-12), r"layer_norm_eps is -1e-12; it must be a small positive number"),
    "zero heads": (edit_config(num_attention_heads=0), r"num_attention_heads is 0; it must be a whole number from 1"),
    "JSON nested 200,000 deep": (nested_json, r"config\.json nests its JSON deeper than Python can read"),
    # lineage
    "its own parent": (own_parent, r"compression\.json names its own folder as its parent: a model cannot be its own ancestor"),
    "parent as text": (parent_as_text, r"names its parent as '\.\./good', not as \{\"path\": DIR"),
    # the tokenizer and the embedding matrix
    "tokenizer beyond the embeddings": (small_embeddings, r"the tokenizer in \S+ gives ids up to \d+, but the model's embedding matrix has 20 rows"),
}


def bad_copy(ws: Path, tmp_path: Path, case: str) -> tuple[Path, str]:
    """A copy of the good folder with the case's mutation applied, and the pattern its refusal must match."""
    mutate, pattern = BAD_FOLDERS[case]
    folder = tmp_path / "bad"
    shutil.copytree(ws / "good", folder)
    mutate(folder)
    return folder, pattern


def run(args: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()  # what building the case printed is not the command's
    code = main(args)
    return code, capsys.readouterr().err.strip()


def assert_refused(code: int, err: str, pattern: str) -> None:
    """One line, exit status 2, the expected words, and not the fallback for bugs."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "internal error" not in err and "Traceback" not in err
    assert re.search(pattern, lines[0]), lines[0]


@pytest.mark.parametrize("case", list(BAD_FOLDERS))
def test_eval_refuses_a_folder_that_lies(case, ws, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder, pattern = bad_copy(ws, tmp_path, case)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    code, err = run(["eval", "--model", str(folder), "--task", "sst2", "--data-dir", str(ws / "glue")], capsys)
    assert_refused(code, err, pattern)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before  # no metrics appended


@pytest.mark.parametrize("case", ["NaN query", "missing classifier", "index into another folder", "tokenizer beyond the embeddings"])
@pytest.mark.parametrize("command", ["quantize", "export"])
def test_writing_stages_refuse_and_write_nothing(case, command, ws, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder, pattern = bad_copy(ws, tmp_path, case)
    out = tmp_path / "out"
    args = ["quantize", "--backend", "torch"] if command == "quantize" else ["export", "--format", "onnx"]
    code, err = run([*args, "--model", str(folder), "--out", str(out)], capsys)
    assert_refused(code, err, pattern)
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def overflowing(folder: Path) -> None:
    """Finite weights whose outputs are not: word embeddings near float32's largest value overflow LayerNorm."""
    edit_weights(lambda state: {**state, WORDS: torch.full_like(state[WORDS], 3e38)})(folder)


@pytest.mark.parametrize("command, pattern", [
    ("export", r"the source gives NaN or infinite logits on the check sentences; nothing was written"),
    ("quantize", r"the fp32 model gives NaN or infinite outputs on \d+ check examples, so its int8 cannot be checked"),
])
def test_output_checks_fail_on_non_finite_outputs(command, pattern, ws, tmp_path, capsys, monkeypatch):
    """NaN - NaN is NaN, which passes any `diff > tolerance` test: the checks look for non-finite values first."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "overflow"
    shutil.copytree(ws / "good", folder)
    overflowing(folder)
    out = tmp_path / "out"
    args = ["quantize", "--backend", "torch"] if command == "quantize" else ["export", "--format", "onnx"]
    code, err = run([*args, "--model", str(folder), "--out", str(out)], capsys)
    assert_refused(code, err, pattern)
    assert not out.exists()


# ---------------------------------------------------------------------------- the checks themselves


def test_tensor_checks_allow_index_buffers_and_the_int8_layout():
    check_tensors({"w": torch.zeros(2), "bert.embeddings.position_ids": torch.arange(4)[None]}, "f")
    check_tensors({"q.weight_int8": torch.zeros(2, dtype=torch.int8), "q.weight_zero_point": torch.zeros(2, dtype=torch.int64),
                   "q.weight_scale": torch.ones(2, dtype=torch.float64)}, "f",
                  integer={".weight_int8": (torch.int8,), ".weight_zero_point": (torch.int64,)})
    with pytest.raises(CompressError, match=r"f: tensor q.weight_int8 is stored as int32, but weights here must be int8"):
        check_tensors({"q.weight_int8": torch.zeros(2, dtype=torch.int32)}, "f", integer={".weight_int8": (torch.int8,)})
    with pytest.raises(CompressError, match=r"tensor b holds 3 non-finite values of 4 \(2 NaN, 1 infinite\)"):
        check_tensors({"a": torch.ones(3), "b": torch.tensor([float("nan"), float("nan"), -float("inf"), 0.0])}, "f")
    with pytest.raises(CompressError, match="tensor a holds 1 non-finite"):  # bf16 is checked like float32
        check_tensors({"a": torch.tensor([1.0, float("inf")], dtype=torch.bfloat16)}, "f")


def test_shard_names_stay_inside_the_folder(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"")
    assert check_shard_names(tmp_path, tmp_path / "i.json", {"x": "a.safetensors", "y": "a.safetensors"}) == ["a.safetensors"]
    for entry in ("/etc/passwd", "../a.safetensors", "sub/a.safetensors", "..\\a.safetensors", ""):
        with pytest.raises(CompressError, match="which is not a file in"):
            check_shard_names(tmp_path, tmp_path / "i.json", {"x": entry})
    with pytest.raises(CompressError, match="has no weight_map"):
        check_shard_names(tmp_path, tmp_path / "i.json", [])


def test_a_two_folder_loop_is_refused(ws, tmp_path):
    from compress.core.formats.records import lineage

    a, b = tmp_path / "a", tmp_path / "b"
    for folder, parent in ((a, b), (b, a)):
        shutil.copytree(ws / "good", folder)
        record = json.loads((folder / "compression.json").read_text())
        (folder / "compression.json").write_text(json.dumps({**record, "parent": {"path": str(parent)}}))
    with pytest.raises(CompressError, match=rf"form a loop \({a.resolve()} -> {b.resolve()} -> {a.resolve()}\)"):
        list(lineage(a))
    shutil.rmtree(b)  # a parent that is gone ends the chain, as before
    assert [p.name for p, _ in lineage(a)] == ["a", "b"]


# ---------------------------------------------------------------------------- amounts that would leave nothing


@pytest.mark.parametrize("args, pattern", [
    (["--remove-ffn", "0.99"], r"--remove-ffn 0.99 would remove all 37 FFN neurons of a layer; .* at most 0\.973"),
    (["--remove-ffn", "0.99", "--ffn-scope", "global"], r"would remove 73 of 74 FFN neurons, but each of the 2 layers keeps at least one; .* at most 0\.973"),
    (["--remove-heads", "7"], r"--remove-heads 7 would remove 7 of 8 heads, but every one of the 2 layers keeps at least one; remove at most 6"),
    (["--remove-layers", "top:2"], r"--remove-layers 'top:2': can drop 1 to 1 of 2 layers"),
    (["--remove-layers", "0,1"], r"--remove-layers would drop every layer; keep at least one"),
])
def test_prune_refuses_amounts_that_leave_nothing(args, pattern, ws, tmp_path, capsys):
    out = tmp_path / "pruned"
    code, err = run(["prune", "--model", str(ws / "good"), "--task", "sst2", "--data-dir", str(ws / "glue"), *args,
                     "--out", str(out)], capsys)
    assert_refused(code, err, pattern)
    assert not out.exists()


# ---------------------------------------------------------------------------- long fields


def test_a_40000_word_sentence_is_read_and_truncated_with_a_count(ws, tmp_path, capsys):
    """csv's default field limit is 131,072 characters; a long sentence is data, cut at --max-length and counted."""
    text = " ".join(["good"] * 40_000)  # 199,999 characters in one quoted field
    file = tmp_path / "long.csv"
    file.write_text(f'sentence,label\n"{text}",1\nfine .,0\n')
    code = main(["eval", "--model", str(ws / "good"), "--task", "sst2", "--data-file", str(file), "--max-length", "32"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert re.search(r"1 of 2 examples are longer than --max-length 32 tokens and were truncated", err), err


@pytest.mark.parametrize("name, text, args, pattern", [
    ("deep.yaml", "a: " + "[" * 100_000 + "]" * 100_000, ["--config", "{file}", "--task", "sst2"], r"deep\.yaml nests deeper than Python can read"),
    ("deep.json", "[" * 100_000 + "]" * 100_000, ["--config", "{file}", "--task", "sst2"], r"deep\.json nests its JSON deeper"),
    ("deep.jsonl", '{"sentence": ' + "[" * 100_000 + "]" * 100_000 + ', "label": 1}\n', ["--task", "sst2", "--data-file", "{file}"],
     r"deep\.jsonl:1 nests its JSON deeper"),
])
def test_deeply_nested_option_and_data_files_are_one_line(name, text, args, pattern, ws, tmp_path, capsys):
    file = tmp_path / name
    file.write_text(text)
    code, err = run(["eval", "--model", str(ws / "good"), *[a.replace("{file}", str(file)) for a in args]], capsys)
    assert_refused(code, err, pattern)

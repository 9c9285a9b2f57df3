"""Attention-head analysis: statistics on hand-made attention, and analyze_heads end to end on tiny models."""

from __future__ import annotations

import json
import math

import pytest
import torch

from compress.core.data.sources import TaskData
from compress.core.errors import CompressError
from compress.eval.heads import (
    HeadsConfig,
    analyze_heads,
    attention_to,
    entropy,
    head_js_matrix,
    is_punctuation,
    js_distance,
    js_distance_matrix,
    mean_distance,
    offset_attention,
)
from tests.conftest import make_tiny_model, save_tiny

N = 5


def next_token_head(n: int = N) -> torch.Tensor:
    """(n, n): every token attends to the next one; the last (no next token) attends to itself."""
    att = torch.zeros(n, n)
    for i in range(n - 1):
        att[i, i + 1] = 1.0
    att[n - 1, n - 1] = 1.0
    return att


def one_hot_head(column: int, n: int = N) -> torch.Tensor:
    """(n, n): every token attends only to token ``column``."""
    att = torch.zeros(n, n)
    att[:, column] = 1.0
    return att


# ---------------------------------------------------------------------------- statistics


def test_next_token_head_scores_one_on_next_and_zero_on_previous():
    att = torch.stack([next_token_head(), torch.eye(N)])[None]  # (batch 1, heads 2, seq, seq)
    assert offset_attention(att, 1).tolist() == pytest.approx([1.0, 0.0])
    assert offset_attention(att, -1).tolist() == pytest.approx([0.0, 0.0])
    # the identity head always looks at itself; the next-token head only on its last row (1 of n)
    assert offset_attention(att, 0).tolist() == pytest.approx([1.0 / N, 1.0])


def test_offset_attention_ignores_padding_rows_and_keys():
    # 3 real tokens padded to 5: the next-token pattern on the real part, garbage after it.
    att = torch.zeros(1, 1, N, N)
    att[0, 0, 0, 1] = att[0, 0, 1, 2] = att[0, 0, 2, 2] = 1.0
    att[0, 0, 3:, 0] = 1.0  # padding rows, which must not count
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    assert offset_attention(att, 1, mask).item() == pytest.approx(1.0)
    assert offset_attention(att, 7, mask).item() == 0.0  # offset beyond the sequence


def test_uniform_head_entropy_is_log_n():
    uniform = torch.full((1, N, N), 1.0 / N)  # (heads, seq, seq)
    assert entropy(uniform).item() == pytest.approx(math.log(N))
    assert entropy(torch.eye(N)[None]).item() == pytest.approx(0.0)
    # uniform over 3 real tokens of 5: log 3, padding rows left out
    padded = torch.zeros(1, 1, N, N)
    padded[..., :3] = 1.0 / 3
    assert entropy(padded, torch.tensor([[1, 1, 1, 0, 0]])).item() == pytest.approx(math.log(3))


def test_attention_to_cls_head_is_one():
    att = torch.stack([one_hot_head(0), torch.full((N, N), 1.0 / N)])  # (heads 2, seq, seq)
    cls = torch.tensor([1, 0, 0, 0, 0])
    assert attention_to(att, cls).tolist() == pytest.approx([1.0, 1.0 / N])
    sep = torch.tensor([0, 0, 0, 0, 1])
    assert attention_to(att, sep).tolist() == pytest.approx([0.0, 1.0 / N])


def test_mean_distance_identity_zero_next_token_one():
    att = torch.stack([torch.eye(N), next_token_head()])
    # over every row the last one (attending to itself) counts 0: (n - 1) / n by hand
    assert mean_distance(att).tolist() == pytest.approx([0.0, (N - 1) / N])
    # over the rows that have a next token, a next-token head is exactly 1 token away
    rows = torch.tensor([1, 1, 1, 1, 0])
    assert mean_distance(att, rows).tolist() == pytest.approx([0.0, 1.0])


def test_js_distance_identical_zero_disjoint_one_and_matches_scipy():
    from scipy.spatial.distance import jensenshannon

    a, b = one_hot_head(0), one_hot_head(1)
    assert js_distance(a, a).item() == pytest.approx(0.0, abs=1e-6)
    assert js_distance(a, b).item() == pytest.approx(1.0)
    p, q = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5]])
    assert js_distance(p, q).item() == pytest.approx(jensenshannon([1, 0], [0.5, 0.5], base=2), abs=1e-6)


def test_js_matrix_over_ragged_layers():
    layer0 = torch.stack([one_hot_head(0), one_hot_head(0), one_hot_head(1)])  # 3 heads
    layer1 = one_hot_head(1)[None]  # 1 head (a pruned layer)
    m = js_distance_matrix([[layer0, layer1], [layer0, layer1]])
    assert m.shape == (4, 4)
    assert torch.allclose(m, m.T) and torch.all(m.diagonal() == 0)
    assert m[0, 1].item() == pytest.approx(0.0, abs=1e-6) and m[0, 2].item() == pytest.approx(1.0)
    assert m[2, 3].item() == pytest.approx(0.0, abs=1e-6)
    assert torch.allclose(m, head_js_matrix([layer0, layer1]))
    # the matrix's entropy form agrees with js_distance's KL form on random attention
    torch.manual_seed(0)
    soft = torch.randn(2, 3, N, N).softmax(-1)  # 2 layers x 3 heads
    fast = head_js_matrix(list(soft))
    flat = soft.reshape(6, N, N)
    assert torch.allclose(fast[1, 4], js_distance(flat[1], flat[4]), atol=1e-5)


def test_punctuation_tokens():
    assert is_punctuation(".") and is_punctuation("?!") and is_punctuation(",")
    assert not is_punctuation("[SEP]") and not is_punctuation("##s") and not is_punctuation("")


# ---------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def sst2(tmp_path_factory):
    """A tiny SST-2 layout and a 2-layer, 4-head classifier with its vocabulary."""
    from compress.core.data import synthetic
    from compress.core.model.structure import Shape
    from compress.teacher.create import create_model

    root = tmp_path_factory.mktemp("heads")
    data = synthetic.write_sst2_layout(root / "glue", n_train=48, n_dev=24, n_test=4)
    vocab = synthetic.write_vocab(root / "vocab" / "vocab.txt")
    model = create_model(Shape(layers=2, hidden=32, heads=4, ffn=37), root / "model", tokenizer=vocab,
                         task="sst2", max_positions=64)
    text = root / "inputs.txt"
    long_line = " ".join(["the movie is very good ."] * 30)  # far beyond 64 positions: truncated
    text.write_text(f"the film was not boring .\n\nwhat a charming story !\tthe plot is dull .\n{long_line}\n",
                    encoding="utf-8")
    return {"data": data, "model": model, "text": text}


TEXT_IMAGES = {"importance.png", "entropy.png", "attention_tokens.png", "attention_offsets.png", "distance.png", "js_mds.png"}


@pytest.mark.versions
@pytest.mark.e2e
def test_analyze_heads_with_task_writes_everything(sst2, tmp_path):
    cfg = HeadsConfig(task="sst2", data=TaskData(data_dir=str(sst2["data"])), attention_examples=16, importance_examples=16,
                      curve_steps=4, attention_batch_size=8)
    out = analyze_heads(sst2["model"], tmp_path / "out", cfg)
    files = {p.name for p in out.iterdir()}
    assert TEXT_IMAGES | {"pruning_curve.png", "heads.json", "summary.md"} <= files
    result = json.loads((out / "heads.json").read_text())
    assert result["inputs"]["n"] == 16
    assert [len(row) for row in result["statistics"]["next"]] == [4, 4]
    for name in ("cls", "sep", "punctuation", "previous", "same", "next"):
        for row in result["statistics"][name]:
            assert all(0.0 <= v <= 1.0 + 1e-6 for v in row)
    # the model attends only to real tokens: its rows sum to 1, so entropy is at most that of uniform attention
    assert max(v for row in result["statistics"]["entropy"] for v in row) <= result["uniform_entropy"] + 1e-5
    assert "gate gradient" in result["importance"]["criterion"]
    points = result["curve"]["points"]
    assert [p["requested"] for p in points] == [0.0, 0.25, 0.5, 0.75]
    assert points[0]["importance"] == points[0]["random"]  # nothing masked yet
    assert points[-1]["removed"] == 6  # 75% of 8 heads, one per layer always kept
    assert len(result["js"]["matrix"]) == 8 and len(result["js"]["mds"]) == 8
    summary = (out / "summary.md").read_text()
    assert "% of attention on the next token" in summary and "| 6/8 |" in summary
    assert "![pruning curve" in summary


def test_analyze_heads_with_text_and_cli(sst2, tmp_path, capsys):
    from compress.cli import main

    out = tmp_path / "text"
    assert main(["heads", "--model", str(sst2["model"]), "--text", str(sst2["text"]), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "Most specialised heads" in printed.out and str(out) in printed.err
    assert TEXT_IMAGES | {"heads.json", "summary.md"} <= {p.name for p in out.iterdir()}
    result = json.loads((out / "heads.json").read_text())
    assert result["inputs"]["n"] == 3 and result["inputs"]["mean_tokens"] <= 64
    assert result["curve"]["points"] is None and "it needs a task (a dev metric): --task" in result["curve"]["note"]
    assert "magnitude" in result["importance"]["criterion"]
    # an existing non-empty --out is refused, with one line and status 2, and left alone
    assert main(["heads", "--model", str(sst2["model"]), "--text", str(sst2["text"]), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    with pytest.raises(CompressError, match="not empty"):
        analyze_heads(sst2["model"], out, HeadsConfig(text=str(sst2["text"])))
    assert (out / "heads.json").is_file()


@pytest.mark.e2e
def test_analyze_heads_on_a_pruned_model(tmp_path, tokenizer):
    from compress.core.model.structure import prune_heads

    model = make_tiny_model(num_hidden_layers=3)
    prune_heads(model, {0: [1], 2: [0, 3]})
    model_dir = save_tiny(model, tokenizer, tmp_path / "pruned")
    text = tmp_path / "in.txt"
    text.write_text("the cat sat on the mat .\nwho is the man ? he is a dog .\n", encoding="utf-8")
    out = analyze_heads(model_dir, tmp_path / "out", HeadsConfig(text=str(text)))
    result = json.loads((out / "heads.json").read_text())
    assert result["heads"]["ids"] == [[0, 2, 3], [0, 1, 2, 3], [1, 2]]
    assert result["heads"]["names"][2] == ["L2H1", "L2H2"]
    assert [len(row) for row in result["statistics"]["entropy"]] == [3, 4, 2]
    assert [len(row) for row in result["importance"]["scores"]] == [3, 4, 2]
    assert len(result["js"]["matrix"]) == 9
    assert (out / "attention_tokens.png").is_file()


def test_bad_inputs_are_one_line_errors(sst2, tmp_path):
    def fails(cfg: HeadsConfig, match: str, model=None):
        with pytest.raises(CompressError, match=match) as err:
            analyze_heads(model or sst2["model"], tmp_path / "o", cfg)
        assert "\n" not in str(err.value)

    fails(HeadsConfig(), "pass --task TASK")
    fails(HeadsConfig(task="sst2", text=str(sst2["text"])), "either --task or --text")
    fails(HeadsConfig(text=str(tmp_path / "missing.txt")), "does not exist")
    fails(HeadsConfig(text=str(sst2["text"]), data=TaskData(max_length=100)), "above the model's maximum of 64")
    fails(HeadsConfig(task="nope"), "unknown task")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    fails(HeadsConfig(text=str(empty)), "no non-empty lines")
    assert not (tmp_path / "o").exists()

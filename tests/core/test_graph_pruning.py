"""FFN pruning through torch-pruning's dependency graph equals the hand-written surgery."""

from __future__ import annotations

import copy

import pytest
import torch

from compress.core.model import structure as st
from compress.core.errors import CompressError
from compress.core.model.graph_pruning import example_inputs, prune_ffn_neurons
from compress.core.formats.runtime import load_model
from tests.conftest import make_tiny_model, save_tiny


def _logits(model, inputs):
    with torch.no_grad():
        return model.eval()(**inputs).logits


def test_same_kept_neurons_give_identical_logits_to_the_hand_surgery():
    torch.manual_seed(0)
    model = make_tiny_model()  # 2 layers, FFN width 37
    keep = [[0, 3, 5, 8, 20, 36], list(range(0, 37, 2))]
    by_hand, by_graph = copy.deepcopy(model), copy.deepcopy(model)
    for layer, ids in enumerate(keep):
        st.resize_ffn(by_hand, layer, ids)
    prune_ffn_neurons(by_graph, keep)
    assert st.ffn_widths(by_graph) == [6, 19]
    inputs = example_inputs(model, batch=3, length=11)
    assert torch.equal(_logits(by_hand, inputs), _logits(by_graph, inputs))
    # The weights themselves: rows of W1 (and its bias) and columns of W2, in kept order.
    layer = st.layers(by_graph)[0]
    original = st.layers(model)[0]
    assert torch.equal(layer.ffn_in.weight, original.ffn_in.weight[keep[0]])
    assert torch.equal(layer.ffn_in.bias, original.ffn_in.bias[keep[0]])
    assert torch.equal(layer.ffn_out.weight, original.ffn_out.weight[:, keep[0]])


def test_graph_pruned_model_saves_and_reloads(tmp_path, tokenizer):
    model = make_tiny_model()
    prune_ffn_neurons(model, [list(range(10)), list(range(37))])  # layer 1 untouched
    out = save_tiny(model, tokenizer, tmp_path / "ffn")
    loaded = load_model(out)
    assert st.ffn_widths(loaded) == [10, 37]
    inputs = example_inputs(model)
    assert torch.equal(_logits(model, inputs), _logits(loaded, inputs))


def test_impossible_plans_are_one_line_errors():
    model = make_tiny_model()
    with pytest.raises(CompressError, match="keep at least one"):
        prune_ffn_neurons(model, [[], [0]])
    with pytest.raises(CompressError, match="does not exist"):
        prune_ffn_neurons(model, [[0, 40], [0]])
    with pytest.raises(CompressError, match="given for 1 layers"):
        prune_ffn_neurons(model, [[0]])

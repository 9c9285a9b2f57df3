"""Static-embedding folders (model2vec): read one and run it like an encoder, so eval and latency treat it alike.

A static folder, as ``model2vec.StaticModel.save_pretrained`` writes it (``compress distill-static``
writes one, and adds the two sidecars)::

    config.json        {"model_type": "model2vec", "normalize": true, "max_length": 512, "hidden_dim": 256, ...}
    model.safetensors  "embeddings" (tokens, d); after model2vec's vocabulary quantization also
                       "mapping" (tokens,) integer rows and "weights" (tokens,) per-token scales
    tokenizer.json     no post-processor: a sentence is its own tokens, no [CLS]/[SEP]
    modules.json       [StaticEmbedding at ".", Normalize at "1_Normalize" when normalised]

model2vec encodes a sentence as the mean of its tokens' rows, the unknown token left out, then
L2-normalises it. :class:`StaticEncoder` is that table behind the Hugging Face call convention:
``last_hidden_state`` (batch, seq, d) holds each token's row, a zero row for the unknown token,
so mean pooling over the attention mask and the folder's normalisation
(``compress.core.formats.sentence.encode``) give model2vec's ``encode``. Before normalisation the two
means differ by a scale when a sentence has unknown tokens (the mask counts them, model2vec
does not); the direction, which is all a normalised folder returns, is the same.

A static model has no encoder layer; its ``config`` is a BertConfig of no layers that states
the sizes the toolkit reads (vocabulary, width, longest input), and nothing builds a BERT from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn
from transformers import BertConfig
from transformers.modeling_outputs import BaseModelOutput

from compress.core.formats.folder import ModelFolder
from compress.core.formats.layout import STATIC, WEIGHTS_FILE
from compress.core.formats.records import read_json
from compress.core.preflight import require_model_dir
from compress.core.errors import CompressError, reason
from compress.core.formats.weight_checks import check_tensors

MODEL_TYPE = "model2vec"  # config.json's model_type in a static folder
DEFAULT_MAX_LENGTH = 512  # model2vec's truncation when config.json names none
TOKENIZER_FILE = "tokenizer.json"


def static_config(path: Path | str) -> dict[str, Any]:
    """The folder's model2vec config.json; a folder of another kind is refused in one line."""
    path = require_model_dir(path)
    config = read_json(path / "config.json")
    if not isinstance(config, dict) or config.get("model_type") != MODEL_TYPE:
        raise CompressError(f"{path} is not a static (model2vec) folder: its config.json has no model_type \"model2vec\"")
    return config


def max_length_of(config: dict[str, Any]) -> int:
    """Tokens per text model2vec keeps (its ``max_length``; none: no truncation, so its ``seq_length``)."""
    if "max_length" not in config:
        return DEFAULT_MAX_LENGTH
    value = config["max_length"] if config["max_length"] is not None else config.get("seq_length", 1_000_000)
    return int(value)


def structure(tokens: int, dimension: int) -> dict[str, Any]:
    """compression.json's structure of a static model: no layers (so no matrix multiplication to count)."""
    return {"static": True, "num_layers": 0, "hidden_size": dimension, "head_size": dimension, "heads": [], "ffn": [],
            "vocabulary": tokens}


def read_table(path: Path) -> torch.Tensor:
    """One float32 row per token id, (tokens, d): model2vec's mapping and per-token weights folded in, as
    sentence-transformers' StaticEmbedding folds them."""
    file = path / WEIGHTS_FILE
    try:
        state = load_file(str(file))
    except (SafetensorError, OSError, ValueError) as err:
        raise CompressError(f"{file} is missing or corrupt ({reason(err)}); re-create the static folder") from None
    # model2vec stores its vocabulary-quantization rows as integers, and int8 vectors when quantized to int8.
    check_tensors(state, file, integer={"mapping": (torch.int64, torch.int32), "embeddings": (torch.int8,)})
    name = next((k for k in ("embeddings", "embedding.weight") if k in state), None)
    if name is None:
        raise CompressError(f"{file} holds no \"embeddings\" tensor; it was not written by model2vec's save_pretrained")
    table = state[name].float()
    if "mapping" in state:
        table = table[state["mapping"].long()]
    if "weights" in state:
        table = table * state["weights"].float()[:, None]
    return table.contiguous()


def unknown_id(path: Path, rows: int) -> int | None:
    """The unknown token's id in tokenizer.json (None without one); the tokenizer must fit the table."""
    tokenizer = read_json(path / TOKENIZER_FILE)
    model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...], the unknown one by index
        size, unk = len(vocab), model.get("unk_id")
    elif isinstance(vocab, dict):  # WordPiece, BPE, WordLevel: piece -> id
        size, unk = max(vocab.values(), default=-1) + 1, vocab.get(model.get("unk_token"))
    else:
        raise CompressError(f"{path / TOKENIZER_FILE} has no vocabulary; copy the tokenizer.json model2vec wrote")
    added = [t.get("id") for t in tokenizer.get("added_tokens") or [] if isinstance(t.get("id"), int)]
    if max([size - 1, *added]) >= rows:
        raise CompressError(f"the tokenizer in {path} gives ids up to {max([size - 1, *added])}, but {WEIGHTS_FILE} has "
                            f"{rows} rows; the tokenizer belongs to another model")
    return unk if isinstance(unk, int) else None


class StaticEncoder(nn.Module):
    """A token-vector table behind the Hugging Face call convention (see the module docstring)."""

    def __init__(self, table: torch.Tensor, unk_id: int | None, max_length: int):
        super().__init__()
        self.embedding = nn.Embedding.from_pretrained(table, freeze=True)  # (tokens, d)
        self.unk_id = unk_id
        tokens, width = table.shape
        self.config = BertConfig(vocab_size=tokens, hidden_size=width, num_hidden_layers=0, num_attention_heads=1,
                                 intermediate_size=0, max_position_embeddings=max_length)
        self.compress_format = STATIC

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **unused) -> BaseModelOutput:
        """(batch, seq) ids -> ``last_hidden_state`` (batch, seq, d): each token's row, zero for the unknown token."""
        hidden = self.embedding(input_ids)
        if self.unk_id is not None:
            hidden = hidden.masked_fill((input_ids == self.unk_id).unsqueeze(-1), 0.0)
        return BaseModelOutput(last_hidden_state=hidden)


def load_static(folder: ModelFolder, options: dict[str, Any]):
    """``runtime.load_model`` of a static folder: a :class:`StaticEncoder` (with ``with_info``: and its info)."""
    path = folder.path
    config = static_config(path)
    head, num_labels = options.get("head"), options.get("num_labels")
    if head not in (None, "base") or num_labels is not None:
        raise CompressError(f"{path} is a static (model2vec) folder: token vectors with no task head; score its sentence "
                            "embeddings (compress eval --embedding) or fine-tune a transformer instead")
    table = read_table(path)
    model = StaticEncoder(table, unknown_id(path, len(table)), max_length_of(config)).eval()
    if options.get("device") is not None:
        model.to(options["device"])
    if options.get("with_info"):
        return model, {"new_weights": [], "saved_head": "base", "structure": structure(*table.shape), "format": STATIC}
    return model

"""Shared fixtures: tiny BERTs built from config and a WordPiece vocab written to tmp_path.

Everything here runs offline in well under a second per model.
"""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
import torch

from compress.core.compat import wordpiece_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# Tiny models gain nothing from a second thread, and two test processes (or a benchmark
# running beside the suite) oversubscribing 2 cores slow OpenMP down many times over.
torch.set_num_threads(1)

# `make test` hands whole files to two processes (pytest-xdist --dist loadfile) in collection
# order: the files that take minutes go first, so neither process is left with one at the end.
LONGEST_FILES = (
    "test_squad_training.py", "test_auto_engine.py", "test_auto.py", "test_latency.py", "test_quantize.py",
    "test_openvino.py", "test_families.py", "test_distributed.py", "test_layering.py", "test_own_tasks.py",
    "test_distill.py", "test_cli.py", "test_crash.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: other files keep their order


@pytest.fixture(autouse=True)
def _no_default_augmentation(monkeypatch):
    """Distillation augments small training sets by default, and every test set is small:
    tests about other things train on their rows alone (tests of the default set it back)."""
    monkeypatch.setattr("compress.distill.config.AUTO_MAX_EXAMPLES", 0)


WORDS = (
    "the a an of and to in is was it that this good bad great awful movie film plot actor "
    "acting story fun boring not very really love hate man woman dog cat sat on mat did "
    "he she they we you i what who where when why how paris france capital city river "
    "yes no . , ! ? ' - 1 2 3"
).split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIAL + list(dict.fromkeys(WORDS + list(string.ascii_lowercase))) + ["##s", "##ed", "##ing", "##ly"]

DATA_ROOT = Path(os.environ.get("COMPRESS_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def write_vocab(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return path


def make_tokenizer(directory: Path):

    vocab = write_vocab(directory)
    return wordpiece_tokenizer(vocab, do_lower_case=True, model_max_length=64)


def tiny_config(**overrides):
    from transformers import BertConfig

    params = dict(
        vocab_size=len(VOCAB),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        type_vocab_size=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
    )
    params.update(overrides)
    return BertConfig(**params)


def make_tiny_model(head: str = "sequence-classification", seed: int = 0, **overrides):
    import torch
    import transformers

    from compress.core.model.families import get_family

    torch.manual_seed(seed)
    config = tiny_config(**overrides)
    model = getattr(transformers, get_family("bert").head_class(head))(config)
    model.eval()
    return model


def save_tiny(model, tokenizer, out: Path, **record_kw) -> Path:
    from compress.core.formats.artifacts import save_model_dir
    from compress.core.formats.records import compression_record

    record = compression_record(stage=record_kw.pop("stage", "test"), method=record_kw.pop("method", "tiny"), **record_kw)
    return save_model_dir(model, out, tokenizer=tokenizer, record=record)


@pytest.fixture
def tokenizer(tmp_path):
    return make_tokenizer(tmp_path / "tok")


@pytest.fixture
def tiny_model_dir(tmp_path, tokenizer) -> Path:
    """A saved 2-layer classifier (2 labels) with its tokenizer."""
    return save_tiny(make_tiny_model(), tokenizer, tmp_path / "tiny")


@pytest.fixture
def data_root() -> Path:
    if not (DATA_ROOT / "glue").is_dir():
        pytest.skip(f"real data not found at {DATA_ROOT} (set COMPRESS_DATA)")
    return DATA_ROOT

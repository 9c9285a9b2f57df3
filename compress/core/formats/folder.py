"""A model folder opened once per stage: the :class:`ModelFolder` record and :func:`open_folder`.

Opening checks the folder as every stage's first look does (:func:`compress.core.preflight.require_model_dir`) and
reads its two small files, ``config.json`` (as bytes) and ``compression.json`` (:attr:`ModelFolder.record`); every
other part is made the first time it is asked for and kept, so a stage that passes the record on reads each file
once: config.json's JSON and the family's config object, the format, the head the weights were saved with, the
tokenizer and the content hash. The path-taking helpers of
:mod:`compress.core.formats.artifacts` (``load_config``, ``load_tokenizer``, ``saved_head``, ...) are
``open_folder(path)`` and the record's part; the model itself is loaded from the record by
:func:`compress.core.formats.runtime.load_folder_model`, and the task it was made for is
:func:`compress.core.data.resolve.task_of_folder`.

The record is frozen (its path and the files read at opening never change); the other parts are
``functools.cached_property`` values, which live in the instance's ``__dict__`` beside the frozen fields. The config object is shared by everyone holding the record:
a caller that changes it (a loader setting labels) takes :meth:`ModelFolder.fresh_config`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import transformers
from transformers import AutoTokenizer, BertTokenizerFast, PreTrainedTokenizerFast
from transformers.activations import ACT2FN

from compress.core.errors import CompressError, reason
from compress.core.formats.layout import (
    COMPRESSION_FILE, INT8_FORMATS, ONNX_FILE, OPENVINO, OPENVINO_FILE, SENTENCE_MODULES_FILE, STATIC, TORCH, WEIGHTS_FILE,
)
from compress.core.formats.records import compression_in, dir_hash, parent_path, parse_json, read_json
from compress.core.model.families import Family, get_family, head_of_class
from compress.core.preflight import require_model_dir

CONFIG_FILE = "config.json"
MODEL2VEC = "model2vec"  # config.json's model_type in a static folder
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")  # a folder with either holds a tokenizer of its own


def open_folder(path: Path | str) -> ModelFolder:
    """The record of the model folder at ``path``, refused in one line when it is none (missing, a file, no config.json).

    Its two small files are read now: config.json's bytes (parsed when first asked for) and compression.json (read
    and checked as ``records.read_compression`` does).
    """
    path = require_model_dir(path)
    config, compression = path / CONFIG_FILE, path / COMPRESSION_FILE
    try:
        data = config.read_bytes()
    except FileNotFoundError:  # removed since the check
        raise CompressError(f"{config} does not exist") from None
    record = compression_in(read_json(compression), compression) if compression.exists() else {}
    return ModelFolder(path, data, record)


@dataclass(frozen=True)
class ModelFolder:
    """One model folder as a stage reads it (see the module's docstring); made by :func:`open_folder`."""

    path: Path
    config_bytes: bytes = field(repr=False, compare=False)  # config.json as stored: parsed for config_json, hashed as is
    record: dict[str, Any] = field(repr=False, compare=False)  # compression.json ({} for a plain Hugging Face folder)

    def __str__(self) -> str:  # messages name a folder by its path
        return str(self.path)

    @cached_property
    def config_json(self) -> Any:
        """config.json's JSON (any value: the readers say what is wrong with one that is no object)."""
        return parse_json(self.config_bytes, self.path / CONFIG_FILE)

    @cached_property
    def format(self) -> str:
        """compression.json's ``format``, else what the files say (:func:`files_format`)."""
        return self.record.get("format") or self.files_format

    @cached_property
    def files_format(self) -> str:
        """The format the files say, compression.json unread (:func:`files_format`)."""
        return files_format(self.path, self.model_type)

    @cached_property
    def model_type(self) -> str | None:
        """config.json's ``model_type``; None without a readable one (the loaders say what is wrong with it)."""
        try:
            raw = self.config_json
        except (OSError, ValueError, CompressError):
            return None
        return raw.get("model_type") if isinstance(raw, dict) else None

    @cached_property
    def family(self) -> Family:
        """The encoder family config.json's ``model_type`` names; another model type is refused in one line."""
        raw = self.config_json
        try:
            return get_family(raw.get("model_type") if isinstance(raw, dict) else None)
        except CompressError as err:
            raise CompressError(f"{self.path}/{CONFIG_FILE}: {err}") from None

    @cached_property
    def config(self):
        """The folder's config, read by its encoder family's config class (shared: see :meth:`fresh_config`)."""
        family = self.family
        check_config_values(self.config_json, f"{self.path}/{CONFIG_FILE}")
        try:
            return getattr(transformers, family.config_class).from_pretrained(self.path, local_files_only=True)
        except Exception as err:
            raise CompressError(f"cannot read {self.path}/{CONFIG_FILE}: {err}") from None

    def fresh_config(self):
        """A copy of :attr:`config` for a caller that changes it (labels, attention implementation, head)."""
        return copy.deepcopy(self.config)

    @cached_property
    def head(self) -> str:
        """The head the weights were saved with (``base`` for a bare encoder and for a sentence-transformers folder)."""
        if (self.path / SENTENCE_MODULES_FILE).is_file():
            # SentenceTransformer reads the root transformer with AutoModel whatever config.json's architectures say
            # (all-mpnet-base-v2 names MPNetForMaskedLM beside encoder weights only), and so does every stage.
            return "base"
        archs = self.config.architectures or [self.family.classes["base"]]
        return head_of_class(archs[0]) or "base"

    @cached_property
    def quantized(self) -> bool:
        """True for an int8 folder (any backend)."""
        return is_int8(self.record)

    @cached_property
    def tokenizer(self):
        """The folder's fast tokenizer (vocab.txt or tokenizer.json), loaded on first use and checked."""
        return _load_tokenizer(self)

    @property
    def has_tokenizer(self) -> bool:
        """Whether the folder holds tokenizer files of its own (tokenizer.json or vocab.txt)."""
        return any((self.path / name).is_file() for name in TOKENIZER_FILES)

    @cached_property
    def hash(self) -> str:
        """SHA-256 over the config and weight files (``records.dir_hash``; config.json's bytes as read here)."""
        return dir_hash(self.path, known={CONFIG_FILE: self.config_bytes})

    def check_torch(self, stage: str) -> ModelFolder:
        """This folder, refused when it holds no PyTorch fp32 weights (int8, ONNX): ``stage`` trains or edits them."""
        if self.format != TORCH:
            parent = parent_path(self.record)
            hint = f" (it was made from {parent})" if parent else ""
            raise CompressError(
                f"{self.path} is a {self.format} model; {stage} needs PyTorch fp32 weights: use the model it was "
                f"quantized or exported from{hint}"
            )
        return self


def is_int8(record: dict[str, Any]) -> bool:
    """Whether a compression.json record is an int8 folder's (any backend)."""
    return record.get("precision") == "int8" or record.get("format") in INT8_FORMATS


def files_format(path: Path, model_type: str | None) -> str:
    """``torch`` (safetensors / .bin weights), ``onnx`` (model.onnx), ``openvino`` (openvino_model.xml) or ``static``
    (a model2vec folder, written elsewhere), from the files present and config.json's ``model_type``."""
    if model_type == MODEL2VEC:
        return STATIC
    if (path / ONNX_FILE).is_file() and not (path / WEIGHTS_FILE).is_file():
        return "onnx"
    if (path / OPENVINO_FILE).is_file() and not (path / WEIGHTS_FILE).is_file():
        return OPENVINO
    return TORCH


# ---------------------------------------------------------------------------- the tokenizer


def _load_tokenizer(folder: ModelFolder):
    """The folder's fast tokenizer: AutoTokenizer's (a BERT WordPiece one when that fails), checked against the model."""
    path = folder.path
    if not folder.has_tokenizer:
        raise CompressError(f"{path} has no tokenizer (tokenizer.json or vocab.txt); copy the parent model's tokenizer files into it")
    try:
        if folder.files_format == STATIC:  # AutoTokenizer would read model2vec's config.json as a transformers config
            tok = _static_tokenizer(path)
        else:
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False, use_fast=True)
    except Exception as err:
        try:
            tok = BertTokenizerFast.from_pretrained(path, local_files_only=True)
        except Exception:
            raise CompressError(f"cannot load the tokenizer in {path}: {reason(err)}") from None
    if not getattr(tok, "is_fast", False):
        raise CompressError(f"the tokenizer in {path} is not a fast tokenizer; save it with tokenizers' tokenizer.json")
    _check_ids_fit(tok, folder)
    return check_tokenizer(tok, str(path))


def _static_tokenizer(path: Path):
    """A model2vec folder's tokenizer.json as a fast tokenizer; one saved without padding pads with its id 0 (padded
    positions are masked out, so any token does)."""
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    if tok.pad_token is None:
        tok.pad_token = tok.convert_ids_to_tokens(0)
    return tok


def _check_ids_fit(tok, folder: ModelFolder) -> None:
    """Refuse a tokenizer whose ids run past the folder's embedding matrix (an index error deep in the forward)."""
    raw = folder.config_json
    rows = raw.get("vocab_size") if isinstance(raw, dict) else None
    top = max(tok.get_vocab().values(), default=-1)
    if isinstance(rows, int) and top >= rows:
        raise CompressError(f"the tokenizer in {folder.path} gives ids up to {top}, but the model's embedding matrix has "
                            f"{rows} rows (config.json vocab_size); the tokenizer belongs to another model, copy the "
                            "tokenizer files of the model these weights came from")


def check_tokenizer(tok, where: str):
    """Refuse a tokenizer that cannot encode arbitrary text: a WordPiece vocabulary without its unknown token
    (any unseen character would fail), or one with no ordinary token at all (e.g. made from an empty vocab file)."""
    vocab = tok.get_vocab()
    special = set(tok.all_special_tokens)
    if not any(token not in special for token in vocab):
        raise CompressError(f"the tokenizer from {where} has no ordinary tokens (an empty vocabulary?); "
                            "pass a vocab.txt with one token per line or a trained tokenizer")
    try:  # the failure itself: a word-piece model without its unknown token cannot encode an unseen character
        tok("\u2603 qzxjvk")
        encodes = True
    except Exception:  # tokenizers raises a bare Exception ("WordPiece error: Missing [UNK] token ...")
        encodes = False
    if not encodes:
        raise CompressError(f"the tokenizer from {where} has no unknown token ({tok.unk_token or '[UNK]'}) in its vocabulary, "
                            "so text with an unseen word cannot be encoded; add it to the vocabulary")
    return tok


# ---------------------------------------------------------------------------- config.json's values

# Sizes a config may hold, with a ceiling far above any real encoder's (XLM-R's 250k vocabulary, 8k positions):
# a value beyond it is a corrupt or hostile file, refused before a tensor of that size is allocated.
CONFIG_SIZES = {
    "vocab_size": 4_000_000, "hidden_size": 32_768, "num_hidden_layers": 512, "num_attention_heads": 1024,
    "intermediate_size": 262_144, "max_position_embeddings": 1_048_576, "type_vocab_size": 1024, "num_labels": 100_000,
    "dim": 32_768, "n_layers": 512, "n_heads": 1024, "hidden_dim": 262_144, "embedding_size": 32_768,
}
CONFIG_MIN = {"type_vocab_size": 0, "num_labels": 1}
EMBEDDING_BYTES = 64e9  # vocabulary x width x 4 bytes above this cannot be a model to compress here
ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation")  # BERT/ELECTRA, ModernBERT, DistilBERT
EPSILON_KEYS = ("layer_norm_eps", "norm_eps")


def check_config_values(raw: dict, where: str) -> None:
    """Refuse a config whose sizes are not whole numbers in range (a string, a float, two billion rows), naming the key."""
    for key, ceiling in CONFIG_SIZES.items():
        if key not in raw:
            continue
        value, floor = raw[key], CONFIG_MIN.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or not floor <= value <= ceiling:
            raise CompressError(f"{where}: {key} is {value!r}; it must be a whole number from {floor} to {ceiling:,}. "
                                "Fix or re-create the file")
    width = raw.get("hidden_size", raw.get("dim", raw.get("embedding_size")))
    if isinstance(raw.get("vocab_size"), int) and isinstance(width, int) and raw["vocab_size"] * width * 4 > EMBEDDING_BYTES:
        raise CompressError(f"{where}: vocab_size {raw['vocab_size']:,} x width {width:,} would need "
                            f"{raw['vocab_size'] * width * 4 / 1e9:.0f} GB of embeddings; fix or re-create the file")
    for hidden, heads in (("hidden_size", "num_attention_heads"), ("dim", "n_heads")):
        if isinstance(raw.get(hidden), int) and isinstance(raw.get(heads), int) and raw[hidden] % raw[heads]:
            raise CompressError(f"{where}: {heads} {raw[heads]} does not divide {hidden} {raw[hidden]}; every head must have "
                                f"the same width, so {heads} must be a divisor of {raw[hidden]}. Fix or re-create the file")
    for key in ACTIVATION_KEYS:
        value = raw.get(key)
        if isinstance(value, str) and value not in ACT2FN:
            raise CompressError(f"{where}: {key} {value!r} is not an activation transformers knows; valid: "
                                f"{', '.join(sorted(ACT2FN))}. Fix or re-create the file")
    for key, value in raw.items():
        if "dropout" in key and value is not None and not (_is_number(value) and 0 <= value <= 1):
            raise CompressError(f"{where}: {key} is {value!r}; a dropout probability must be a number from 0 to 1 "
                                "(or null where the default applies). Fix or re-create the file")
        if key in EPSILON_KEYS and not (_is_number(value) and 0 < value < 1):
            raise CompressError(f"{where}: {key} is {value!r}; it must be a small positive number (BERT's is 1e-12). "
                                "Fix or re-create the file")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

"""Frozen configs: files, flags, type checks, unknown keys, safe YAML."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Literal

import pytest

from compress.core.config import add_arguments, coerce, from_args, from_dict, load_file, option, replace
from compress.core.errors import CompressError
from compress.core.registry import Registry


@dataclass(frozen=True)
class Demo:
    lr: float = option(5e-5, "learning rate")
    epochs: int = option(3, "passes over the data")
    batch: tuple[int, ...] = option((1,), "batch sizes")
    name: str | None = option(None, "a name")
    fp16: bool = option(False, "half precision")
    mode: Literal["a", "b"] = option("a", "a mode")


def test_defaults_and_frozen():
    cfg = from_dict(Demo, {})
    assert cfg == Demo()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0


def test_type_checks_and_coercion():
    cfg = from_dict(Demo, {"lr": 3, "batch": "1, 8", "epochs": "2", "fp16": "yes", "name": "x"})
    assert cfg.lr == 3.0 and isinstance(cfg.lr, float)
    assert cfg.batch == (1, 8) and cfg.epochs == 2 and cfg.fp16 is True and cfg.name == "x"
    assert from_dict(Demo, {"batch": [2, 4]}).batch == (2, 4)
    with pytest.raises(CompressError, match="epochs: expected an integer, got 'three'"):
        from_dict(Demo, {"epochs": "three"})
    with pytest.raises(CompressError, match="expected an integer, got True"):
        from_dict(Demo, {"epochs": True})
    with pytest.raises(CompressError, match="'c' is not one of 'a', 'b'"):
        from_dict(Demo, {"mode": "c"})
    assert coerce("none", int | None, "x") is None


def test_unknown_key_suggests_and_lists():
    with pytest.raises(CompressError) as err:
        from_dict(Demo, {"epoch": 2})
    assert "did you mean 'epochs'" in str(err.value) and "valid: lr, epochs" in str(err.value)


def test_dashes_are_underscores():
    @dataclass(frozen=True)
    class D:
        max_length: int = option(128, "tokens")

    assert from_dict(D, {"max-length": 64}).max_length == 64


def test_yaml_file_is_safe_loaded(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("lr: 0.001\nepochs: 4\n")
    assert from_dict(Demo, load_file(path)).epochs == 4
    evil = tmp_path / "evil.yaml"
    evil.write_text("lr: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(CompressError, match="not valid YAML"):
        load_file(evil)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(CompressError, match="must contain a mapping"):
        load_file(tmp_path / "list.yaml")
    with pytest.raises(CompressError, match="does not exist"):
        load_file(tmp_path / "missing.yaml")


def test_flags_override_file(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"lr": 0.001, "epochs": 4}')
    parser = argparse.ArgumentParser()
    add_arguments(parser, Demo)
    args = parser.parse_args(["--epochs", "2", "--batch", "1,32", "--fp16"])
    cfg = from_args(Demo, args, str(path))
    assert (cfg.lr, cfg.epochs, cfg.batch, cfg.fp16) == (0.001, 2, (1, 32), True)
    bad = parser.parse_args(["--epochs", "x"])
    with pytest.raises(CompressError, match="epochs: expected an integer"):
        from_args(Demo, bad)


def test_help_text_comes_from_the_field(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser, Demo)
    help_text = parser.format_help()
    assert "--lr X" in help_text and "learning rate (default: 5e-05)" in help_text
    assert "--fp16, --no-fp16" in help_text


def test_replace_is_type_checked():
    cfg = replace(Demo(), epochs=5)
    assert cfg.epochs == 5
    with pytest.raises(CompressError):
        replace(Demo(), epochs="many")


def test_registry_rejects_duplicates_and_lists_names():
    reg: Registry[int] = Registry("backend")
    reg.register("torch", 1)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("torch", 2)
    with pytest.raises(CompressError, match="unknown backend 'troch' \\(did you mean 'torch'\\?\\); valid: torch"):
        reg.get("troch")

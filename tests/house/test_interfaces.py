"""One meaning per flag across commands, fixed sets shown as choices, configs built by keyword, one size unit.

The command line is generated from the config dataclasses (compress.core.config) and the stage
registry (compress.stages); these tests walk both, so a new stage or field is checked too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import types
import typing
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest

from compress.cli import build_parser, main
from compress.core.config import choices_of, field_names, from_dict
from compress.stages import COMMANDS, Stage

STAGE_NAMES = [name for name, entry in COMMANDS.items() if isinstance(entry, Stage)]
GENERIC = {"-h", "--help"}


def subparsers(selected: str | None = None) -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by command name ("teacher finetune" included); with ``selected``, only that
    command's has its options."""
    parser = build_parser(selected)
    found = {}

    def walk(p, prefix):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for word, sub in action.choices.items():
                    name = f"{prefix} {word}".strip()
                    if name in COMMANDS:
                        found[name] = sub
                    walk(sub, name)

    walk(parser, "")
    return found


def config_fields(cls: type) -> dict[str, tuple[str, dataclasses.Field, type]]:
    """Flag -> (declaring class, field, annotation) of a config and the configs it nests."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name]):
            out.update(config_fields(hints[f.name]))
        else:
            out[f.metadata.get("flag") or "--" + f.name.replace("_", "-")] = (cls.__name__, f, hints[f.name])
    return out


def base_type(tp) -> str:
    """The kind of value a flag takes: Optional and lists of X are X, a Literal of strings is str."""
    if get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in get_args(tp) if a is not type(None))
    if get_origin(tp) is tuple:
        tp = get_args(tp)[0]
    if get_origin(tp) is Literal:
        tp = type(get_args(tp)[0])
    return tp.__name__


# ---------------------------------------------------------------------------- one meaning per flag


def test_the_same_flag_is_the_same_config_field_everywhere():
    parsers = subparsers()
    dests: dict[str, set[str]] = {}
    for name, parser in parsers.items():
        for action in parser._actions:
            for flag in set(action.option_strings) - GENERIC:
                # an input that takes several directories is the plural of the same name (latency: --model A B)
                dests.setdefault(flag.replace("--no-", "--"), set()).add(action.dest.removesuffix("s") if flag == "--model" else action.dest)
    assert {f: d for f, d in dests.items() if len(d) > 1} == {}

    fields: dict[str, set[tuple[str, str]]] = {}
    for name in STAGE_NAMES:
        stage = COMMANDS.get(name)
        for flag, (_, f, tp) in config_fields(stage.config_class()).items():
            if f.name not in stage.skip:
                fields.setdefault(flag, set()).add((f.name, base_type(tp)))
    # e.g. --heads: a size (int) in pretrain/distill and once an amount removed (float) in prune
    assert {flag: kinds for flag, kinds in fields.items() if len(kinds) > 1} == {}


def test_evaluation_flags_have_one_name_in_every_command():
    parsers = subparsers()
    flags = {name: {s for a in p._actions for s in a.option_strings} for name, p in parsers.items()}
    for name in ("eval", "teacher finetune", "distill", "prune", "quantize", "heads"):
        assert {"--max-eval-examples", "--eval-batch-size"} <= flags[name], name
    assert not {"--max-examples", "--batch-size"} & flags["eval"]
    # --batch-size is the global training batch: only where a TrainConfig is, and declared by it alone
    for name in STAGE_NAMES:
        declared = config_fields(COMMANDS.get(name).config_class())
        if "--batch-size" in declared:
            assert declared["--batch-size"][0] == "TrainConfig", name
    # --max-examples means nothing anywhere now: each command names what its examples are for
    assert not any("--max-examples" in f for f in flags.values())


def test_every_command_that_writes_a_directory_takes_overwrite_and_none_takes_force():
    for name, parser in subparsers().items():
        flags = {s for a in parser._actions for s in a.option_strings}
        assert "--force" not in flags, name
        entry = COMMANDS.get(name)
        writes = entry.out_help is not None if isinstance(entry, Stage) else name in ("init", "demo", "run")
        assert ("--overwrite" in flags) == writes, name


def test_sizes_and_amounts_removed_are_named_apart():
    parsers = subparsers()
    for name, parser in parsers.items():
        actions = {s: a for a in parser._actions for s in a.option_strings}
        for flag in ("--heads", "--layers", "--hidden", "--ffn"):  # a size of the model the command builds
            if flag in actions:
                assert "size" in actions[flag].help, (name, flag)
                assert name in ("teacher pretrain", "distill", "distill-general", "distill-embedding"), (name, flag)
    for name in ("prune", "prune-embedding"):
        flags = {s for a in parsers[name]._actions for s in a.option_strings}
        assert {"--remove-heads", "--remove-layers", "--remove-ffn"} <= flags
        assert not {"--heads", "--layers", "--ffn"} & flags
    args = parsers["prune"].parse_args(["--model", "m", "--out", "o", "--remove-heads", "0.5", "--remove-layers", "top:2"])
    assert (args.remove_heads, args.remove_layers) == ("0.5", "top:2")


def test_every_option_has_help():
    for name, parser in subparsers().items():
        for action in parser._actions:
            if action.option_strings and action.help is not argparse.SUPPRESS:
                assert action.help and action.help.strip(), (name, action.option_strings)


# ---------------------------------------------------------------------------- choices


def _choice_set(help_text: str, flag: str) -> set[str]:
    match = re.search(re.escape(flag) + r" \{([^}]*)\}", help_text)
    assert match, f"{flag} shows no choices"
    return set(match.group(1).split(","))


def test_fixed_sets_are_shown_as_choices_from_their_registries(capsys):
    from compress.core.data.tasks import TASKS, USER_KINDS
    from compress.eval.latency.backends import BACKENDS as LATENCY_BACKENDS
    from compress.quantize.config import BACKENDS, PRESETS, SCHEMES
    from compress.core.model.shapes import STUDENT_SHAPES

    def help_of(*command):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        return capsys.readouterr().out

    text = help_of("quantize")
    assert _choice_set(text, "--backend") == set(BACKENDS.names())
    assert _choice_set(text, "--scheme") == set(SCHEMES) and _choice_set(text, "--preset") == set(PRESETS)
    assert _choice_set(text, "--task") == set(TASKS) | set(USER_KINDS)  # a user's kinds of task, then the presets
    assert _choice_set(help_of("latency"), "--backend") == set(LATENCY_BACKENDS.names())
    for command in ("distill", "distill-general", "distill-embedding"):
        assert _choice_set(help_of(command), "--student") == set(STUDENT_SHAPES.names())  # open: or LAYERSL-HIDDEN
    for command in ("eval", "prune", "heads", "teacher finetune"):
        assert _choice_set(help_of(*command.split()), "--task") == set(TASKS) | set(USER_KINDS)


def test_a_value_outside_the_choices_is_refused_in_one_line_and_aliases_pass(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")  # a model folder, as the early check of --model wants
    with pytest.raises(SystemExit) as exit_info:
        main(["quantize", "--model", str(tmp_path), "--out", str(tmp_path / "o"), "--backend", "tensorrt"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2
    assert len(err.splitlines()) == 1 and "invalid choice: 'tensorrt'" in err and "onnxruntime" in err
    parser = subparsers("eval")["eval"]
    assert parser.parse_args(["--model", "m", "--task", "SST-2"]).task == "SST-2"  # get_task's alias
    distill = subparsers("distill")["distill"]
    assert distill.parse_args(["--teacher", "t", "--out", "o", "--student", "5L-256"]).student == "5L-256"


# ---------------------------------------------------------------------------- keyword construction


def _value(f: dataclasses.Field, tp, default):
    """A valid value of the field's type that differs from its default."""
    choices = choices_of(f)
    if get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in get_args(tp) if a is not type(None))
    if get_origin(tp) is Literal or choices:
        options = list(choices or get_args(tp))
        return next((c for c in reversed(options) if c != default), options[0])
    if get_origin(tp) is tuple:
        return (1, 2) if get_args(tp)[0] is int else ("a", "b")
    if tp is bool:
        return not default
    if tp is int:
        return (default or 0) + 3
    if tp is float:
        return (default or 0.0) + 0.25
    return f"x-{f.name}"


def _lookup(cfg, name):
    """A flat option's value in a config, looking into its nested configs."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == name:
            return value
        if dataclasses.is_dataclass(value) and name in field_names(type(value)):
            return _lookup(value, name)
    raise KeyError(name)


@pytest.mark.parametrize("name", STAGE_NAMES)
def test_every_stage_config_is_built_by_keyword_with_its_flat_option_names(name):
    cls = COMMANDS.get(name).config_class()
    kwargs = {}
    for _, f, tp in config_fields(cls).values():
        kwargs[f.name] = _value(f, tp, f.default if f.default is not dataclasses.MISSING else None)
    cfg = cls(**kwargs)
    for key, value in kwargs.items():
        assert _lookup(cfg, key) == value, key
    assert cfg == from_dict(cls, kwargs, validate=False)  # the same config as a recipe or the flags build
    assert dataclasses.replace(cfg, **{k: kwargs[k] for k in list(kwargs)[:1]}) == cfg
    with pytest.raises(TypeError, match="no_such_option"):
        cls(no_such_option=1)


def test_keyword_construction_routes_into_nested_configs_from_their_own_defaults():
    from compress.distill.task import DistillConfig
    from compress.prune import PruneConfig

    cfg = DistillConfig(task="sst2", data_dir="glue/", epochs=2, alpha=0.9)
    assert (cfg.task, cfg.data.data_dir, cfg.train.epochs, cfg.loss.alpha) == ("sst2", "glue/", 2, 0.9)
    assert cfg.train.lr == DistillConfig().train.lr == 1e-4  # the stage's own default, not TrainConfig's 2e-5
    pruned = PruneConfig(task="sst2", remove_heads=0.5, lr=3e-5)
    assert pruned.train.lr == 3e-5 and pruned.train.epochs == PruneConfig().train.epochs
    assert dataclasses.replace(pruned, lr=1e-3).train.lr == 1e-3


# ---------------------------------------------------------------------------- one size unit


BYTES = 3_000_000  # 3.0 MB (decimal); 2.9 MiB: a MiB printed as "MB" would show here


def _weights(folder: Path, name: str = "model.safetensors", size: int = BYTES) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(b"\0" * size)
    return folder


def test_quantize_latency_and_leaderboard_print_sizes_in_one_unit(tmp_path):
    from compress.eval.latency.rows import build_rows
    from compress.eval.latency.report import format_markdown as latency_markdown
    from compress.eval.leaderboard import LeaderboardConfig, build_table, collect
    from compress.eval.leaderboard_render import format_markdown as leaderboard_markdown
    from compress.quantize.config import QuantizeConfig
    from compress.quantize.run import summarize

    fp32 = _weights(tmp_path / "fp32")
    int8 = _weights(tmp_path / "int8", "model.onnx", 1_500_000)
    (int8 / "compression.json").write_text(json.dumps({"stage": "quantize", "backend": "onnxruntime", "scheme": "dynamic"}))
    text, _ = summarize(int8, QuantizeConfig(), {"model": str(fp32)})
    assert "weights 3.0 MB -> 1.5 MB" in text

    result = {"points": [{"batch": 1, "seq": 8, "seconds": [0.01] * 5}], "flops": {"8": 1e9}, "params": 1000, "backend": "torch"}
    rows = build_rows([fp32], ["fp32"], [[result]], __import__("compress.eval.latency.config", fromlist=["LatencyConfig"]).LatencyConfig(), None)
    assert rows[0].size_mb == pytest.approx(3.0)
    report = {"backend": "torch", "rows": rows, "hardware": {"flags": []}, "packages": {}, "threads": 1, "when": "now"}
    row = next(line for line in latency_markdown(report).splitlines() if line.startswith("| fp32 |"))
    assert row.split(" | ")[8] == "3.0" and "| size (MB) |" in latency_markdown(report)

    config = {"model_type": "bert", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2}
    (fp32 / "config.json").write_text(json.dumps(config))
    record = {"kind": "eval", "task": "sst2", "split": "dev", "metrics": {"accuracy": 80.0}, "n": 5, "when": "2024-01-01"}
    (fp32 / "metrics.json").write_text(json.dumps({"results": [record]}))
    table = build_table(collect([fp32]), LeaderboardConfig(published=False))
    assert table["models"][0]["size_mb"] == pytest.approx(3.0)
    line = next(line for line in leaderboard_markdown(table).splitlines() if line.startswith("| fp32 |"))
    assert line.split(" | ")[3] == "3.0" and "| size (MB) |" in leaderboard_markdown(table)

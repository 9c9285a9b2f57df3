"""The stage registry is the one description of every stage: CLI subcommands and recipe stages come from it."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from compress.cli import build_parser
from compress.core.config import flag_name
from compress.stages import COMMANDS, RECIPE_STAGES, Stage, load, register

ROOT = Path(__file__).resolve().parents[1]
STAGE_NAMES = [name for name, entry in COMMANDS.items() if isinstance(entry, Stage)]


def subcommand(name: str) -> argparse.ArgumentParser:
    """The parser of ``compress NAME`` ("teacher finetune" is two levels deep)."""
    parser = build_parser(name)
    for word in name.split():
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[word]
    return parser


def config_flags(cls: type, skip: tuple[str, ...]) -> set[str]:
    """The flags of a config class: one per field (``--x``/``--no-x`` for a bool), nested configs flattened."""
    hints = typing.get_type_hints(cls)
    flags = set()
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            flags |= config_flags(hints[f.name], skip)
        else:
            flags.add(flag_name(f))
            if hints[f.name] is bool:
                flags.add("--no-" + flag_name(f)[2:])
    return flags


def test_the_registry_holds_every_stage():
    assert set(STAGE_NAMES) == {"eval", "latency", "teacher pretrain", "teacher finetune", "distill",
                                "distill-general", "distill-embedding", "distill-static", "prune", "prune-embedding", "heads", "quantize",
                                "export", "leaderboard", "auto"}
    assert set(COMMANDS.names()) == {*STAGE_NAMES, "tasks", "init", "run", "demo"}


@pytest.mark.parametrize("name", STAGE_NAMES)
def test_every_stage_is_a_subcommand_with_its_configs_flags(name):
    stage = COMMANDS.get(name)
    parser = subcommand(name)
    flags = {s for a in parser._actions for s in a.option_strings} - {"-h", "--help"}
    expected = config_flags(stage.config_class(), stage.skip) | {i.flag for i in stage.inputs}
    expected |= {s.flag for s in stage.switches} | {"--config", "-q", "--quiet", "--log-level", "--debug"}
    expected |= {"--out", "--overwrite"} if stage.out_help else set()
    assert flags == expected
    assert parser.description.lower().startswith(stage.summary.lower()) and stage.examples in parser.epilog
    required = {s for a in parser._actions if a.required for s in a.option_strings}
    assert required == {i.flag for i in stage.inputs} | ({"--out"} if stage.out_help else set())


@pytest.mark.parametrize("name", STAGE_NAMES)
def test_every_stage_is_a_recipe_stage_whose_names_resolve(name):
    stage = COMMANDS.get(name)
    assert RECIPE_STAGES.get(stage.recipe) is stage
    assert dataclasses.is_dataclass(stage.config_class())
    for path in (stage.entry, stage.recipe_entry, stage.report, *(s.entry for s in stage.switches)):
        assert path is None or callable(load(path)), path
    assert set(RECIPE_STAGES.names()) == {COMMANDS.get(n).recipe for n in STAGE_NAMES}


def test_a_name_registered_twice_is_refused_and_leaves_the_registries_alone():
    prune = COMMANDS.get("prune")
    before = (COMMANDS.names(), RECIPE_STAGES.names())
    with pytest.raises(ValueError, match="command 'prune' is registered twice"):
        register(prune)
    with pytest.raises(ValueError, match="recipe stage 'prune' is registered twice"):
        register(dataclasses.replace(prune, command="prune-again"))
    with pytest.raises(ValueError, match="command 'tasks' is registered twice"):
        register(dataclasses.replace(prune, command="tasks", recipe="new-kind"))
    assert (COMMANDS.names(), RECIPE_STAGES.names()) == before


def test_help_imports_no_torch_and_a_closed_stdout_ends_quietly():
    code = "import sys\nfrom compress.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "COMMAND" in run.stdout and run.stdout.splitlines()[-1] == "False", run.stderr
    # `compress tasks | head -0`: the reader is gone before the first line is written.
    proc = subprocess.Popen([sys.executable, "-m", "compress.cli", "tasks"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and err == ""


def test_run_help_names_every_recipe_stage():
    summary = COMMANDS.get("run").summary
    listed = summary[summary.index("(") + 1 : summary.index(")")].split(", ")
    assert sorted(listed) == sorted(RECIPE_STAGES.names())

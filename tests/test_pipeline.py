"""Recipes: validation with clear errors, stage outputs, skipping unchanged stages, re-running changed ones."""

from __future__ import annotations

import json
import re

import pytest

from compress.core.data import synthetic
from compress.core.errors import CompressError
from compress.core.formats.runtime import load_model
from compress.pipeline import load_recipe, run_recipe


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from compress.core.model.shapes import resolve_shape
    from compress.teacher.create import create_model

    root = tmp_path_factory.mktemp("pipe")
    data = synthetic.write_sst2_layout(root / "data", n_train=256, n_dev=64, n_test=8)
    vocab = synthetic.write_vocab(root / "vocab.txt")
    init = create_model(resolve_shape("2L-32-64-4H"), root / "init", tokenizer=vocab, task="sst2", max_positions=64)
    return data, init


def _recipe(data, init, epochs=1, **extra):
    return {
        "name": "t",
        "report": False,
        "defaults": {"task": "sst2", "data_dir": str(data), "max_length": 32},
        "stages": [
            {"name": "teacher", "run": "finetune", "model": str(init), "config": {"epochs": epochs, "lr": 1e-3}},
            {"name": "student", "run": "distill", "teacher": "${teacher}",
             "config": {"student": "1L-32-64-4H", "epochs": 1, "lr": 1e-3, "cache": False, **extra}},
            {"name": "speed", "run": "latency", "models": ["${teacher}", "${student}"],
             "config": {"batch": [1], "seq": [16], "repeats": 2, "warmup": 1, "peak": False}},
        ],
    }


@pytest.mark.slow
def test_run_skip_and_rerun(inputs, tmp_path):
    data, init = inputs
    run = tmp_path / "run"
    said: list[str] = []
    run_recipe(_recipe(data, init), run, say=said.append)
    assert load_model(run / "student").config.num_hidden_layers == 1
    assert (run / "speed" / "latency.md").is_file()
    manifest = json.loads((run / "manifest.json").read_text())["stages"]
    assert [manifest[s]["status"] for s in ("teacher", "student", "speed")] == ["done"] * 3
    first_hashes = {k: v["hash"] for k, v in manifest.items()}

    said.clear()
    run_recipe(_recipe(data, init), run, say=said.append)
    assert said == ["[teacher] unchanged, skipped", "[student] unchanged, skipped", "[speed] unchanged, skipped"]

    # A change to the teacher's config re-runs it and everything after it.
    said.clear()
    run_recipe(_recipe(data, init, epochs=2), run, say=said.append)
    assert said == ["[teacher] running finetune", "[student] running distill", "[speed] running latency"]
    manifest = json.loads((run / "manifest.json").read_text())["stages"]
    assert all(manifest[k]["hash"] != first_hashes[k] for k in first_hashes)

    # A change to the student only leaves the teacher alone.
    said.clear()
    run_recipe(_recipe(data, init, epochs=2, alpha=0.9), run, say=said.append)
    assert said[0] == "[teacher] unchanged, skipped" and said[1] == "[student] running distill"


def _as_if_run_before(run, recipe, drops: dict[str, list[tuple[str, ...]]]) -> None:
    """Rewrite the manifest as a toolkit without the options in ``drops`` (stage -> key paths) would have left it:
    those stages with another hash and no such keys, every later stage with the inputs it saw then."""
    from compress.core.checkpoints import fingerprint
    from compress.pipeline import _input_digest, stage_hash

    path = run / "manifest.json"
    manifest = json.loads(path.read_text())
    stages = manifest["stages"]
    for stage in recipe.stages:  # in order: a stage recorded its upstream hashes as they were then
        entry = stages[stage.name]
        digest = {k: _input_digest(v, run, stages) for k, v in {**stage.inputs, **stage.config_refs}.items()}
        entry["inputs"], entry["hash"] = fingerprint(digest), stage_hash(stage, digest)
        for keys in drops.get(stage.name, []):
            config = entry["config"]
            for key in keys[:-1]:
                config = config[key]
            del config[keys[-1]]
            entry["hash"] = fingerprint("an older toolkit", entry["config"], digest)
    path.write_text(json.dumps(manifest))


@pytest.mark.slow
def test_an_option_added_since_a_stage_ran_reruns_nothing_at_its_default(inputs, tmp_path):
    data, init = inputs
    run = tmp_path / "run"
    said: list[str] = []
    run_recipe(_recipe(data, init), run, say=said.append)
    student = (run / "student" / "model.safetensors").stat().st_mtime_ns
    older = {"teacher": [("train", "grad_accum")], "student": [("init_from",)]}  # nested and top level
    _as_if_run_before(run, load_recipe(_recipe(data, init)), older)
    said.clear()
    run_recipe(_recipe(data, init), run, say=said.append)
    assert said == ["[teacher] unchanged, skipped", "[student] unchanged, skipped", "[speed] unchanged, skipped"]
    assert (run / "student" / "model.safetensors").stat().st_mtime_ns == student

    # the same option set to another value than its default is a change
    _as_if_run_before(run, load_recipe(_recipe(data, init)), {"student": [("two_stage",)]})
    said.clear()
    run_recipe(_recipe(data, init, two_stage=True, losses=["kd", "hard", "hidden"]), run, say=said.append)
    assert said == ["[teacher] unchanged, skipped", "[student] running distill", "[speed] running latency"]


def test_a_stage_stands_only_for_its_own_inputs_and_values():
    from compress.distill.task import DistillConfig
    from compress.pipeline import Stage, _config_record, stands

    stage = Stage(name="s", kind="distill", inputs={}, config=DistillConfig(task="sst2", student="3L-384"))
    record = _config_record(stage.config)
    done = {"kind": "distill", "status": "done", "hash": "old", "inputs": "in", "config": record}
    assert stands(done, stage, "old", "other")  # the same hash: nothing else is looked at
    assert stands(done, stage, "new", "in")
    assert not stands(done, stage, "new", "other")  # other inputs
    assert not stands({**done, "status": "running"}, stage, "old", "in")
    assert not stands({**done, "kind": "prune"}, stage, "old", "in")
    assert not stands({k: v for k, v in done.items() if k != "config"}, stage, "new", "in")  # an older manifest
    assert not stands({**done, "config": {**record, "student": "4L-312"}}, stage, "new", "in")  # another value
    assert not stands({**done, "config": {**record, "gone": 1}}, stage, "new", "in")  # an option since removed
    changed = {**record, "train": {**record["train"], "lr": 1.0}}
    assert not stands({**done, "config": changed}, stage, "new", "in")  # a nested value


def test_validation_errors_name_the_stage(inputs, tmp_path):
    data, init = inputs
    bad = _recipe(data, init)
    bad["stages"][1]["config"]["studnet"] = "x"
    with pytest.raises(CompressError, match="stage 'student': unknown option 'studnet' \\(did you mean 'student'\\?\\)"):
        load_recipe(bad)
    bad = _recipe(data, init)
    bad["stages"][0]["config"]["epochs"] = "many"
    with pytest.raises(CompressError, match="stage 'teacher': epochs: expected an integer"):
        load_recipe(bad)
    bad = _recipe(data, init)
    bad["stages"][1]["teacher"] = "${nope}"
    with pytest.raises(CompressError, match="stage 'student': 'teacher' refers to \\$\\{nope\\}, which is not an earlier stage"):
        load_recipe(bad)
    bad = _recipe(data, init)
    bad["stages"][0]["run"] = "finetun"
    with pytest.raises(CompressError, match="unknown recipe stage 'finetun' \\(did you mean 'finetune'\\?\\)"):
        load_recipe(bad)
    bad = _recipe(data, init)
    del bad["stages"][1]["teacher"]
    with pytest.raises(CompressError, match="stage 'student': missing input 'teacher'"):
        load_recipe(bad)
    bad = _recipe(data, init)
    bad["stages"][0]["model"] = str(tmp_path / "missing-model")
    with pytest.raises(CompressError, match="input 'model' .*missing-model does not exist"):
        run_recipe(bad, tmp_path / "run")
    with pytest.raises(CompressError, match="unknown variable \\{\\{glue\\}\\}; pass --var glue=VALUE"):
        load_recipe({"stages": [{"name": "a", "run": "eval", "models": ["x"], "config": {"task": "sst2", "data_dir": "{{glue}}"}}]})


def test_committed_recipes_validate(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "recipes"
    demo = load_recipe(root / "demo-pretrain.yaml", variables={"run_dir": str(tmp_path), "data_dir": str(tmp_path),
                                                               "train_examples": "100", "vocab_size": "200", "threads": "1"})
    assert [s.kind for s in demo.stages][:3] == ["pretrain", "finetune", "distill"]
    study = load_recipe(root / "bert-base-sst2.yaml", variables={"glue": str(tmp_path)})
    assert study.stages[0].inputs["model"] == "bert-base"
    tinybert = load_recipe(root / "tinybert.yaml", variables={k: str(tmp_path) for k in ("encoder", "teacher", "corpus", "glue")}
                           | {"task": "mrpc"})
    assert [s.kind for s in tinybert.stages] == ["distill-general", "distill", "quantize"]
    assert tinybert.stages[1].config_refs == {"init": "${general}"} and tinybert.stages[1].config.two_stage


@pytest.mark.e2e
def test_general_then_task_distillation_on_augmented_data_in_one_recipe(inputs, tmp_path):
    """The two-stage path: general distillation -> intermediate terms -> prediction layer on augmented rows."""
    from compress.core.formats.records import read_compression, read_metrics

    data, init = inputs
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("the film was good . the plot was bad . it was fine ." for _ in range(30)), encoding="utf-8")
    recipe = _recipe(data, init)
    recipe["stages"][1:] = [
        {"name": "general", "run": "distill-general", "teacher": "${teacher}",
         "config": {"corpus": [str(corpus)], "student": "1L-32-64-4H", "losses": ["minilm"], "max_steps": 4, "batch_size": 8,
                    "max_length": 32, "relation_heads": 4}},
        {"name": "student", "run": "distill", "teacher": "${teacher}",
         "config": {"init": "${general}", "losses": ["kd", "hard", "hidden", "attention"], "two_stage": True, "augment": 1,
                    "epochs": 1, "lr": 1e-3, "cache_dir": str(tmp_path / "cache")}},
    ]
    run = tmp_path / "run"
    run_recipe(recipe, run)
    record = read_compression(run / "student")
    assert record["init"]["pretrained"] == str(run / "general")
    assert record["extra_data"]["augment"]["rows"] == 256
    training = next(r for r in read_metrics(run / "student") if r["kind"] == "training")
    stages = {h["stage"] for h in training["history"]}
    assert stages == {"intermediate", "prediction"}
    with pytest.raises(CompressError, match="not an earlier stage"):
        recipe["stages"][2]["config"]["init"] = "${later}"
        load_recipe(recipe)


@pytest.mark.slow
def test_report_lands_at_the_top_of_the_run(inputs, tmp_path):
    data, init = inputs
    run = run_recipe({**_recipe(data, init), "report": True}, tmp_path / "run", say=lambda _: None)
    report = (run / "report.md").read_text()
    assert (run / "report.html").is_file() and (run / "report" / "report.md").is_file()
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    assert any(r.startswith("| teacher | finetune") for r in rows) and any(r.startswith("| student | distill") for r in rows)
    # the latency column is read at the recipe's own latency point, and the image links resolve from the run's top
    assert "latency at batch 1, seq 16" in report
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert images and all((run / link).is_file() for link in images)
    # titled with the recipe, and its stages listed with what this run did
    assert report.startswith("# Recipe t\n")
    stages = report.split("## Stages\n")[1]
    assert "| teacher | finetune | model: `" in stages and "| student | distill | teacher: `${teacher}` | ran (" in stages
    assert "| speed | latency | models: `${teacher}`, `${student}` | ran (" in stages

    # run again: every stage is unchanged; with overwrite, every stage runs again
    said: list[str] = []
    run_recipe({**_recipe(data, init), "report": True}, run, say=said.append)
    assert said == ["[teacher] unchanged, skipped", "[student] unchanged, skipped", "[speed] unchanged, skipped"]
    assert "| student | distill | teacher: `${teacher}` | unchanged, skipped |" in (run / "report.md").read_text()
    said.clear()
    run_recipe({**_recipe(data, init), "report": True}, run, overwrite=True, say=said.append)
    assert said == ["[teacher] running finetune", "[student] running distill", "[speed] running latency"]


@pytest.mark.parametrize("stage", [
    {"name": "int8", "run": "quantize", "config": {"backend": "torch"}},
    {"name": "onnx", "run": "export"},
])
def test_one_stage_recipe_reports_what_was_not_evaluated(stage, inputs, tmp_path, capsys):
    """A recipe that measured nothing still gets its report: the model listed as "not evaluated", the stage listed."""
    from compress.cli import main

    _, init = inputs
    recipe = tmp_path / "one.json"
    recipe.write_text(json.dumps({"name": "one", "stages": [{**stage, "model": str(init)}]}))
    assert main(["run", str(recipe), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"report: {tmp_path / 'run' / 'report.md'}" in err
    report = (tmp_path / "run" / "report.md").read_text()
    assert report.startswith("# Recipe one\n")
    name, kind = stage["name"], stage["run"]
    row = next(line for line in report.splitlines() if line.startswith(f"| {name} | {kind} /"))
    assert "| not evaluated |" in row
    assert f"not evaluated: no dev evaluation in the metrics.json of {name}" in report
    assert f"| {name} | {kind} | model: `{init}` | ran (" in report.split("## Stages\n")[1]
    assert (tmp_path / "run" / "report.html").is_file()
    table = json.loads((tmp_path / "run" / "report" / "leaderboard.json").read_text())
    assert [m["name"] for m in table["models"]] == [name] and table["models"][0]["scores"] == {}

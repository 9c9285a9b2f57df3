"""The stages that read models rather than train them, on a user's own task: ``compress tasks``, the
leaderboard (its own tasks, the test split, published test results), latency on a user's data file,
head analysis without --task, recipes, and the committed own-data recipe.

Leaderboard tests fabricate metrics.json / compression.json (no models); the others use tiny teachers
fine-tuned once per module on generated data of two kinds (tests/own_data.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compress.core.formats.records import read_compression, read_metrics
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.data.tasks import user_task
from compress.eval.leaderboard import LeaderboardConfig, build_table, collect
from compress.eval.leaderboard_render import format_markdown
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny
from tests.own_data import own_task_files

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
WHEN = "2024-01-01T00:00:00+00:00"
LATER = "2024-02-01T00:00:00+00:00"


# ---------------------------------------------------------------------------- compress tasks


def test_tasks_lists_the_kinds_of_your_own_data_first_then_the_benchmark_tasks(capsys):
    from compress.cli import main

    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    kinds = [out.index(k) for k in ("text-classification  ", "multi-label ", "regression ", "token-classification ")]
    assert kinds == sorted(kinds) and max(kinds) < out.index("Benchmark tasks") < out.index("squad_v2")
    row = next(line for line in out.splitlines() if line.startswith("token-classification"))
    assert "tokens (word list), tags; or CoNLL" in row and "O, B-TYPE, I-TYPE" in row and row.rstrip().endswith("entity_f1")
    multi = next(line for line in out.splitlines() if line.startswith("multi-label"))
    assert "text, label" in multi and "--label-sep" in multi and "micro_f1, macro_f1, subset_accuracy" in multi
    assert "entailment, neutral, contradiction" in out and "--label-column" in out  # the presets as before; the flags
    with pytest.raises(SystemExit):
        main(["tasks", "--help"])
    assert "kinds of your own task" in capsys.readouterr().out


# ---------------------------------------------------------------------------- leaderboard (fabricated sidecars)


def _record(task: str, metric: str, value: float, split: str = "dev", when: str = WHEN) -> dict:
    return {"kind": "eval", "task": task, "split": split, "metrics": {metric: value, "other": 1.0}, "n": 50, "when": when}


def _model(root: Path, name: str, records: list[dict], task=None, parent: Path | None = None) -> Path:
    """A model folder written by hand: config.json, metrics.json, and compression.json recording ``task``
    (a user's Task as its task_spec, a preset by name)."""
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 100, "hidden_size": 32,
                                                  "num_hidden_layers": 2, "num_attention_heads": 4}))
    (path / "metrics.json").write_text(json.dumps({"results": records}))
    compression = {"stage": "finetune", "method": "finetune",
                   "parent": {"path": str(parent.resolve()), "hash": None} if parent else None}
    if isinstance(task, str):
        compression["task"] = task
    elif task is not None:
        compression.update(task=task.name, task_spec=task.to_record())
    (path / "compression.json").write_text(json.dumps(compression))
    return path


def _table(dirs, **cfg) -> dict:
    config = from_dict(LeaderboardConfig, cfg)
    return build_table(collect(dirs, batch=config.batch, seq=config.seq, split=config.split), config)


NER = user_task("token-classification", "wnut17", ("O", "B-person", "I-person"))
INTENTS = user_task("text-classification", "banking77", ("card_arrival", "lost_card"))


@pytest.fixture
def mixed(tmp_path) -> Path:
    """A GLUE model (SST-2, MRPC), an NER teacher and its student (dev and test entity F1), an intent classifier."""
    root = tmp_path / "runs"
    _model(root, "a-glue", [_record("sst2", "accuracy", 90.0), _record("mrpc", "f1", 80.0)], task="sst2")
    ner = _model(root, "b-ner", [_record("wnut17", "entity_f1", 50.0), _record("wnut17", "entity_f1", 44.0, "test")],
                 task=NER)
    _model(root, "c-ner-student", [_record("wnut17", "entity_f1", 40.0), _record("wnut17", "entity_f1", 33.0, "test")],
           task=NER, parent=ner)
    _model(root, "d-intents", [_record("banking77", "accuracy", 91.0), _record("banking77", "accuracy", 92.5, "test"),
                               _record("banking77", "accuracy", 10.0, "test", when="2023-01-01T00:00:00+00:00")],
           task=INTENTS)
    return root


def test_user_tasks_show_their_primary_metric_after_the_presets_and_stay_out_of_the_glue_average(mixed):
    table = _table([mixed])
    assert table["tasks"] == ["sst2", "mrpc", "wnut17", "banking77"]  # presets in registry order, then first seen
    assert table["task_metrics"]["wnut17"] == "entity_f1" and table["task_names"]["banking77"] == "banking77"
    assert table["average_tasks"] == ["sst2", "mrpc"] and table["own_tasks"] == ["wnut17", "banking77"]
    models = {m["name"]: m for m in table["models"]}
    assert models["b-ner"]["scores"] == {"wnut17": 50.0} and models["b-ner"]["glue_avg"] is None
    assert models["c-ner-student"]["retention"] == pytest.approx({"wnut17": 80.0})  # vs its teacher, dev split
    assert models["a-glue"]["glue_avg"] == pytest.approx(85.0)
    text = format_markdown(table)
    assert "| wnut17 (entity F1) | banking77 (acc) |" in text and "Your own tasks (wnut17, banking77)" in text
    # Dev table: the Banking77/WNUT-17 test results are not shown, GLUE dev ones are.
    published = {p["model"] for p in table["published"]}
    assert "BERT-base-uncased" in published and not any("banking77" in p["scores"] or "wnut17" in p["scores"]
                                                        for p in table["published"])
    assert _table([mixed], tasks="wnut17")["tasks"] == ["wnut17"]  # a user's task named in --tasks


def test_the_test_split_shows_test_scores_and_the_published_test_results_of_those_datasets(mixed):
    table = _table([mixed], split="test")
    assert table["split"] == "test" and table["tasks"] == ["wnut17", "banking77"]  # no GLUE test scores here
    models = {m["name"]: m for m in table["models"]}
    assert models["d-intents"]["scores"] == {"banking77": 92.5}  # the latest test record, not the older one
    assert models["c-ner-student"]["retention"] == pytest.approx({"wnut17": 100 * 33.0 / 44.0})
    assert "a-glue" not in models  # no test evaluation and no latency: left out, and said so
    rows = {p["model"]: p for p in table["published"]}
    assert rows["BERT-base"]["scores"] == {"banking77": 93.02} and "DialoGLUE" in rows["BERT-base"]["source"]
    assert rows["BERT-Large, fine-tuned ('BERT-Tuned')"]["scores"] == {"banking77": 93.66}
    assert rows["bert-large-cased"]["scores"] == {"wnut17": 47.44}
    assert "token-classification/README.md" in rows["bert-large-cased"]["source"]
    assert all(p["split"] == "test" for p in table["published"]) and "BERT-base-uncased" not in rows  # dev rows: not here
    text = format_markdown(table)
    assert "## Measured here (test sets;" in text and "latest test evaluation" in text and "MNLI" not in text
    assert "Not shown (no test evaluation or latency in metrics.json): a-glue." in text
    assert "| bert-large-cased | 340 | 47.4 | — | — | test |" in text.split("## Published")[1]


def test_a_published_score_stands_only_beside_a_local_task_of_the_same_metric(tmp_path):
    # A classifier named like the NER dataset, and a user's task named like SST-2: neither borrows their rows.
    other = user_task("text-classification", "wnut17", ("a", "b"))
    mine = user_task("text-classification", "sst2", ("a", "b", "c"))
    _model(tmp_path, "clf", [_record("wnut17", "accuracy", 70.0, "test")], task=other)
    _model(tmp_path, "own-sst2", [_record("sst2", "accuracy", 60.0), _record("sst2", "accuracy", 61.0, "test")], task=mine)
    assert _table([tmp_path / "clf"], split="test")["published"] == []
    table = _table([tmp_path / "own-sst2"])
    assert table["own_tasks"] == ["sst2"] and table["average_tasks"] == [] and table["published"] == []
    assert table["models"][0]["scores"] == {"sst2": 60.0}


def test_unknown_names_in_tasks_list_the_models_own_tasks(mixed):
    with pytest.raises(CompressError, match="--tasks nope: .*valid: wnut17, banking77, cola"):
        _table([mixed], tasks="nope")


# ---------------------------------------------------------------------------- tiny teachers of two kinds


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """Generated files of every kind, and tiny teachers fine-tuned on text classification and token classification."""
    from compress.teacher.finetune import FinetuneConfig, finetune

    root = tmp_path_factory.mktemp("own")
    files = own_task_files(root / "data")
    tokenizer = make_tokenizer(root / "tok")
    base = save_tiny(make_tiny_model(head="base"), tokenizer, root / "base")
    teachers = {}
    for kind, name, extra in (("text-classification", "intents", {"label_column": "category"}),
                              ("token-classification", "ner", {})):
        f = files[kind]
        cfg = from_dict(FinetuneConfig, {"task": kind, "task_name": name, "train_file": str(f["train"]),
                                         "dev_file": str(f["dev"]), "epochs": 3, "lr": 1e-3, "max_length": 32, **extra})
        teachers[kind] = finetune(base, root / name, cfg)
    return {"root": root, "files": files, "teachers": teachers, "tokenizer": tokenizer, "base": base}


# ---------------------------------------------------------------------------- latency on a user's data file


def workers_in_process(monkeypatch) -> list[dict]:
    """Latency jobs run by the worker's own entry in this process (no process start: seconds each on 2 busy cores);
    the jobs, as the parent sent them, are collected in the list returned."""
    from compress.core.data.tasks import task_from_record
    from compress.eval.latency import runs as latency
    from compress.eval.latency.worker import time_model

    jobs: list[dict] = []

    def in_process(job, threads, label, bar=None):
        jobs.append(job)
        reads = task_from_record(job["lengths_task"]) if job.get("lengths_task") else None
        return time_model(Path(job["model"]), {**job["config"], "threads": 1}, lambda message: None, reads)

    monkeypatch.setattr(latency, "run_worker", in_process)
    return jobs



def test_lengths_reads_a_data_file_through_the_models_own_task(own, tmp_path):
    from compress.core.data.features import encode_examples
    from compress.core.data.sources import DataSource, load_split
    from compress.eval.latency.lengths import lengths_task, real_inputs

    tok, ner, intents = own["tokenizer"], own["teachers"]["token-classification"], own["teachers"]["text-classification"]
    conll, csv = own["files"]["token-classification"]["test"], own["files"]["text-classification"]["test"]
    bare = save_tiny(make_tiny_model(head="base"), tok, tmp_path / "bare")  # e.g. a random BERT-base reference: no task
    # The first folder with a user's task reads the file for every model of the run.
    task = lengths_task([bare, ner, intents], str(conll))
    assert task.name == "ner" and task.kind == "token-classification"
    assert lengths_task([bare], str(conll)) is None and lengths_task([ner], "sst2") is None
    inputs = real_inputs(str(conll), tok, task=task, max_length=32)
    # Each sentence as its words: the pieces the tagger reads, [CLS] and [SEP] included.
    sentences = load_split(task, "test", DataSource(data_file=str(conll)))
    expected = encode_examples(task, tok, sentences, 32)["input_ids"]
    assert inputs.n == 48 and [ids.tolist() for ids in inputs.ids] == expected
    words = list(sentences[0]["tokens"])
    assert inputs.ids[0].tolist() == tok(words, is_split_into_words=True)["input_ids"]
    assert "ner" in inputs.source and str(conll) in inputs.source
    assert real_inputs(str(conll), tok, task=task, limit=5).n == 5
    # A csv of a text classifier: its text column (labels unused), the csv's own quoting.
    text = real_inputs(str(csv), tok, task=lengths_task([intents], str(csv)))
    first = csv.read_text().splitlines()[1].rsplit(",", 1)[0]
    assert text.n == 48 and text.ids[0].tolist() == tok(first)["input_ids"]
    # Without a user's task: the old readers (a .csv is refused, saying what a data file needs).
    with pytest.raises(CompressError, match="unsupported extension '.csv'.*your own task"):
        real_inputs(str(csv), tok)
    lines = tmp_path / "texts.txt"
    lines.write_text("the dog sat\nparis\n")
    assert real_inputs(str(lines), tok, task=task).lengths.tolist() == [5, 3]  # .txt: one text per line, always


@pytest.mark.e2e
def test_latency_times_every_model_on_the_user_task_file(own, monkeypatch, tmp_path):
    """The parent resolves the file's task once and sends it with every job; a worker reads the file through it."""
    from compress.eval.latency.config import LatencyConfig
    from compress.eval.latency.runs import measure_latency

    ner = own["teachers"]["token-classification"]
    conll = own["files"]["token-classification"]["test"]
    jobs = workers_in_process(monkeypatch)
    cfg = LatencyConfig(batch=(1,), seq=(16,), repeats=2, warmup=1, peak=False, record=False, lengths=str(conll),
                        lengths_passes=1, lengths_batch=8)
    report = measure_latency([ner], cfg)
    assert jobs[0]["lengths_task"]["name"] == "ner" and jobs[0]["lengths_task"]["kind"] == "token-classification"
    assert report["real_inputs"]["n"] == 48 and "ner" in report["real_inputs"]["source"]
    bad = tmp_path / "bad.conll"
    bad.write_text("the\tO\ndog\n")
    jobs.clear()
    with pytest.raises(CompressError, match=r"bad\.conll:\d+"):  # a broken file is said before any timing
        measure_latency([ner], LatencyConfig(batch=(1,), seq=(16,), repeats=2, peak=False, record=False, lengths=str(bad)))
    assert jobs == []


# ---------------------------------------------------------------------------- heads without --task


@pytest.mark.e2e
def test_heads_of_a_models_own_task_from_its_files(own, tmp_path):
    from compress.eval.heads import HeadsConfig, analyze_heads

    ner = own["teachers"]["token-classification"]
    f = own["files"]["token-classification"]
    cfg = from_dict(HeadsConfig, {"train_file": str(f["train"]), "dev_file": str(f["dev"]), "importance_examples": 32,
                                  "attention_examples": 12, "js_examples": 4, "curve_steps": 2, "max_length": 32})
    out = analyze_heads(ner, tmp_path / "heads", cfg)
    result = json.loads((out / "heads.json").read_text())
    assert result["task"] == "ner" and result["importance"]["method"] == "gradient"
    assert "ner training examples" in result["importance"]["criterion"]
    assert result["curve"]["metric"] == "entity_f1" and len(result["curve"]["points"]) == 2
    assert result["inputs"]["n"] == 12 and result["inputs"]["source"].startswith("ner dev")
    with pytest.raises(CompressError, match="nothing to analyse: pass --task TASK .*--train-file"):
        from_dict(HeadsConfig, {})


# ---------------------------------------------------------------------------- recipes


def _own_recipe(files, base, **student) -> dict:
    return {
        "name": "own",
        "defaults": {"task": "text-classification", "train_file": str(files["train"]), "dev_file": str(files["dev"]),
                     "label_column": "category", "max_length": 32},
        "stages": [
            {"name": "teacher", "run": "finetune", "model": str(base),
             "config": {"epochs": 2, "lr": 1e-3, "task_name": "intents"}},
            {"name": "student", "run": "distill", "teacher": "${teacher}",
             "config": {"student": "1L-32-37-4H", "epochs": 1, "lr": 1e-3, **student}},
            {"name": "int8", "run": "quantize", "model": "${student}", "config": {"backend": "torch"}},
            {"name": "eval", "run": "eval", "models": ["${teacher}", "${student}", "${int8}"],
             "config": {"split": "test", "data_file": str(files["test"])}},
            {"name": "latency", "run": "latency", "models": ["${teacher}", "${int8}"],
             "config": {"batch": [1], "seq": [16], "repeats": 2, "warmup": 1, "peak": False, "lengths": str(files["test"]),
                        "lengths_passes": 1, "lengths_batch": 1}},
            {"name": "board", "run": "leaderboard", "runs": ["${teacher}", "${student}", "${int8}"],
             "config": {"split": "test", "seq": 16}},
        ],
    }


@pytest.mark.versions
@pytest.mark.e2e
def test_a_recipe_on_your_own_data_runs_every_stage_and_skips_them_when_unchanged(own, tmp_path, monkeypatch):
    from compress.pipeline import run_recipe

    jobs = workers_in_process(monkeypatch)
    files = own["files"]["text-classification"]
    run = tmp_path / "run"
    said: list[str] = []
    run_recipe(_own_recipe(files, own["base"]), run, say=said.append)
    assert said == [f"[{s}] running {k}" for s, k in (("teacher", "finetune"), ("student", "distill"), ("int8", "quantize"),
                                                       ("eval", "eval"), ("latency", "latency"), ("board", "leaderboard"))]
    for stage in ("teacher", "student", "int8"):  # every model knows the task, its labels and columns
        spec = read_compression(run / stage)["task_spec"]
        assert spec["name"] == "intents" and spec["labels"] == ["films", "people", "pets", "travel"]
        tests = [r for r in read_metrics(run / stage) if r["kind"] == "eval" and r["split"] == "test"]
        assert tests and tests[-1]["task"] == "intents" and "accuracy" in tests[-1]["metrics"]
    timed = json.loads((run / "latency" / "latency.json").read_text())
    assert timed["real_inputs"]["n"] == 48 and "intents" in timed["real_inputs"]["source"]
    assert [j["lengths_task"]["name"] for j in jobs] == ["intents", "intents"]  # the test csv, read through the task
    board = json.loads((run / "board" / "leaderboard.json").read_text())
    assert board["split"] == "test" and board["tasks"] == ["intents"] and len(board["models"]) == 3
    top = json.loads((run / "report" / "leaderboard.json").read_text())  # the run's report: the board stage's split
    assert top["split"] == "test" and top["title"] == "Recipe own" and top["point"] == {"batch": 1, "seq": 16}

    said.clear()
    run_recipe(_own_recipe(files, own["base"]), run, say=said.append)
    assert all(line.endswith("unchanged, skipped") for line in said) and len(said) == 6
    # A changed student re-runs it and what depends on it, not the teacher.
    said.clear()
    run_recipe(_own_recipe(files, own["base"], epochs=2), run, say=said.append)
    assert said[:2] == ["[teacher] unchanged, skipped", "[student] running distill"]
    assert said[2:] == [f"[{s}] running {k}" for s, k in (("int8", "quantize"), ("eval", "eval"), ("latency", "latency"),
                                                          ("board", "leaderboard"))]


def test_the_own_data_recipe_validates_with_its_variables(tmp_path):
    from compress.pipeline import load_recipe

    variables = {k: str(tmp_path / k) for k in ("encoder", "train", "dev", "test", "run_dir")} | {"label_column": "category"}
    recipe = load_recipe(RECIPES / "own-data.yaml", variables=variables)
    stages = {s.name: s for s in recipe.stages}
    assert [s.kind for s in recipe.stages] == ["finetune", "distill", "quantize", "quantize", "export", "eval", "latency",
                                               "leaderboard"]
    teacher = stages["teacher"].config
    assert teacher.task == "text-classification" and teacher.data.train_file == variables["train"]
    assert teacher.data.own.label_column == "category" and teacher.data.test_file == variables["test"]
    assert stages["student"].config.shape.student == "3L-384"
    assert (stages["student-ov-int8"].config.backend, stages["student-ov-int8"].config.scheme) == ("openvino", "static")
    assert stages["student-ort-int8"].config.backend == "onnxruntime"
    assert stages["teacher-openvino"].config.format == "openvino"
    ev = stages["eval"].config
    assert (ev.split, ev.data_file, ev.own.label_column) == ("test", variables["test"], "category")
    assert stages["latency"].config.lengths == variables["test"] and stages["leaderboard"].config.split == "test"
    assert len(stages["eval"].inputs["models"]) == len(stages["latency"].inputs["models"]) == 5
    with pytest.raises(CompressError, match="unknown variable {{label_column}}"):
        load_recipe(RECIPES / "own-data.yaml", variables={k: v for k, v in variables.items() if k != "label_column"})

"""Records, folders and foreign messages a hostile user controls: a record of the wrong shape is one line naming the
file, the field, what it should be and what was found; a path a record names never leads outside its folder; a
runtime's own error reaches the user whole. Every case: one line, exit status 2 where a command runs, nothing
written."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from compress.auto.state import SearchState
from compress.cli import internal_error, main
from compress.core.checkpoints import work_dir_for
from compress.core.data import synthetic
from compress.core.errors import CompressError, foreign
from compress.core.formats.onnx import export_onnx
from compress.core.formats.openvino import export_openvino
from compress.core.formats.records import read_compression, read_metrics
from compress.core.formats.runtime import load_model
from compress.core.formats.schemas import At, inside
from compress.core.formats.sentence import SentenceSpec, read_spec, write_sentence_files
from tests.conftest import make_tiny_model, make_tokenizer, save_tiny

COMPRESSION_FIX = "restore the file, or re-create the folder with the stage that made it"
METRICS_FIX = "restore the file, or fix or remove that entry (a folder without metrics.json has no results)"
SENTENCE_FIX = "restore the sentence-transformers files or save the model again with SentenceTransformer.save"
OUTSIDE = "a folder's records may only name files inside it"


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A tiny sst2 classifier with one dev result, its data, a sentence-transformers folder, and its ONNX / OpenVINO
    exports."""
    root = tmp_path_factory.mktemp("hostile")
    tok = make_tokenizer(root / "tok")
    good = save_tiny(make_tiny_model(), tok, root / "good")
    result = {"kind": "eval", "task": "sst2", "split": "dev", "n": 16, "metrics": {"accuracy": 50.0}, "when": "2026-01-01"}
    (good / "metrics.json").write_text(json.dumps({"results": [result]}))
    synthetic.write_sst2_layout(root / "glue", n_train=32, n_dev=16, n_test=4)
    st = save_tiny(make_tiny_model("base"), tok, root / "st")
    write_sentence_files(st, SentenceSpec(pooling="cls", normalize=True, max_seq_length=48), 32)
    export_onnx(good, root / "onnx")
    export_openvino(good, root / "openvino")
    return root


def copy(ws: Path, tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(ws / name, folder)
    return folder


def edit(file: Path, change) -> None:
    data = json.loads(file.read_text())
    change(data)
    file.write_text(json.dumps(data))


def run(args: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()  # what building the case printed is not the command's
    code = main(args)
    return code, capsys.readouterr().err.strip()


def one_line(code: int, err: str) -> str:
    """The command's one error line, exit status 2, not the fallback for bugs."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert "internal error" not in err and "Traceback" not in err
    return lines[0]


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


# ---------------------------------------------------------------------------- records are checked, not believed


def eval_args(ws: Path, folder: Path) -> list[str]:
    return ["eval", "--model", str(folder), "--task", "sst2", "--data-dir", str(ws / "glue")]


def test_a_label_list_given_as_a_string_is_named(ws, tmp_path, capsys, monkeypatch):
    """Read as a list, "negative,positive" gave "label(s) e, i, t, v given twice"."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = copy(ws, tmp_path, "good")
    spec = {"name": "mine", "kind": "text-classification", "text_fields": ["text"], "labels": "negative,positive"}
    edit(folder / "compression.json", lambda r: r.update(task="mine", task_spec=spec))
    before = files_of(folder)
    code, err = run(["eval", "--model", str(folder), "--data-file", str(ws / "glue" / "SST-2" / "dev.tsv")], capsys)
    assert one_line(code, err) == (f"compress eval: error: {folder}/compression.json: task_spec.labels should be a list of "
                                   f"strings or null, found the string \"negative,positive\"; {COMPRESSION_FIX}")
    assert files_of(folder) == before


def test_head_counts_given_as_strings_are_named(ws, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = copy(ws, tmp_path, "good")
    edit(folder / "compression.json", lambda r: r["structure"].update(heads=[4, "4"]))
    before = files_of(folder)
    code, err = run(eval_args(ws, folder), capsys)
    assert one_line(code, err) == (f"compress eval: error: {folder}/compression.json: structure.heads[1] should be a whole "
                                   f"number of at least 0, found the string \"4\"; {COMPRESSION_FIX}")
    assert files_of(folder) == before


@pytest.mark.parametrize("change, field, found", [
    (lambda m: m["results"][0]["metrics"].update(accuracy="high"), "results[0].metrics.accuracy should be a number or null",
     'the string "high"'),
    (lambda m: m.update(results="all good"), "results should be a list of objects", 'the string "all good"'),
    (lambda m: m["results"][0].update(n="16"), "results[0].n should be a whole number of at least 0 or null",
     'the string "16"'),
], ids=["a metric high", "results a string", "a count a string"])
def test_metrics_of_the_wrong_type_are_named(change, field, found, ws, tmp_path, capsys):
    """The leaderboard read "high" as float("high") (ValueError) and a string's results as records (AttributeError)."""
    folder = copy(ws, tmp_path, "good")
    edit(folder / "metrics.json", change)
    out = tmp_path / "board"
    code, err = run(["leaderboard", "--runs", str(folder), "--out", str(out)], capsys)
    assert one_line(code, err) == f"compress leaderboard: error: {folder}/metrics.json: {field}, found {found}; {METRICS_FIX}"
    assert not out.exists()


@pytest.mark.parametrize("value, shown", [("big", "'big'"), (3.5, "3.5"), (-1, "-1")])
def test_a_config_size_of_the_wrong_type_is_named_by_the_leaderboard_as_by_every_stage(value, shown, ws, tmp_path,
                                                                                          capsys):
    """The leaderboard's parameter estimate added "big" to an int (TypeError, an internal error)."""
    folder = copy(ws, tmp_path, "good")
    edit(folder / "compression.json", lambda r: r.pop("params", None))
    edit(folder / "config.json", lambda c: c.update(vocab_size=value))
    expected = (f"{folder}/config.json: vocab_size is {shown}; it must be a whole number from 1 to 4,000,000. "
                "Fix or re-create the file")
    out = tmp_path / "board"
    code, err = run(["leaderboard", "--runs", str(folder), "--out", str(out)], capsys)
    assert one_line(code, err) == f"compress leaderboard: error: {expected}"
    assert not out.exists()
    code, err = run(["latency", "--model", str(folder)], capsys)
    assert one_line(code, err) == f"compress latency: error: {expected}"


def test_a_manifest_of_the_wrong_shape_is_named(ws, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"name": "one", "report": False, "stages": [
        {"name": "score", "run": "eval", "models": [str(ws / "good")], "config": {"task": "sst2", "data_dir": str(ws / "glue")}}]}))
    manifest = tmp_path / "run" / "manifest.json"
    manifest.parent.mkdir()
    manifest.write_text(json.dumps({"recipe": "one", "stages": {"score": {"kind": "eval", "status": 1}}}))
    code, err = run(["run", str(recipe), "--out", str(tmp_path / "run")], capsys)
    assert one_line(code, err) == (f"compress run: error: {manifest}: stages.score.status should be a string or null, found "
                                   "the number 1; remove it and run the recipe again with --overwrite")
    assert sorted(p.name for p in manifest.parent.iterdir()) == ["manifest.json"]  # no stage ran


def test_a_search_state_of_the_wrong_shape_is_named_on_resume(tmp_path):
    work = work_dir_for(tmp_path / "out")
    work.mkdir()
    sample = {"variant": "torch-fp32", "shape": {"layers": 2, "hidden": 32, "heads": 4, "ffn": 64}, "held_out": False,
              "batch": 1, "seq": 32, "ms": "fast", "size_bytes": 1000}
    probe = {"samples": [sample], "error": None, "teacher": {"1,32": 2.0}}
    (work / "state.json").write_text(json.dumps({"key": "k", "probe": probe, "trained": {}}))
    with pytest.raises(CompressError) as err:
        SearchState.open(work, True, "k", "p", "t")
    assert str(err.value) == (f"{work}/state.json: probe.samples[0].ms should be a number, found the string \"fast\"; "
                              "drop --resume to start the search afresh")


@pytest.mark.parametrize("file, content, message", [
    ("sentence_bert_config.json", {"max_seq_length": "256"},
     "sentence_bert_config.json: max_seq_length should be a whole number of at least 1 or null, found the string \"256\""),
    ("1_Pooling/config.json", {"word_embedding_dimension": 32, "pooling_mode_cls_token": "yes"},
     "1_Pooling/config.json: pooling_mode_cls_token should be true or false, found the string \"yes\""),
    ("modules.json", [{"path": "", "type": "sentence_transformers.models.Transformer"}, {"path": "1_Pooling", "type": 7}],
     "modules.json: [1].type should be a string, found the number 7"),
    ("modules.json", {"0": "Transformer"}, "modules.json should hold a list of objects, found an object"),
], ids=["length a string", "a switch a string", "a type a number", "modules an object"])
def test_sentence_transformers_files_of_the_wrong_shape_are_named(file, content, message, ws, tmp_path):
    folder = copy(ws, tmp_path, "st")
    (folder / file).write_text(json.dumps(content))
    with pytest.raises(CompressError) as err:
        read_spec(folder)
    assert str(err.value) == f"{folder}/{message}; {SENTENCE_FIX}"


# ---------------------------------------------------------------------------- a folder never reads outside itself


@pytest.mark.parametrize("module, path", [
    (1, "../.."), (1, "/etc"), (1, "../elsewhere/1_Pooling"), (1, "1_Pooling/../../elsewhere/1_Pooling"),
    (2, "../elsewhere/2_Normalize"), (3, "/etc"),
])
def test_a_module_path_outside_the_folder_is_refused_and_never_read(module, path, ws, tmp_path):
    """A max pooling beside the folder would otherwise replace the folder's own cls pooling."""
    folder = copy(ws, tmp_path, "st")
    (tmp_path / "elsewhere" / "1_Pooling").mkdir(parents=True)
    (tmp_path / "elsewhere" / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    modules = json.loads((folder / "modules.json").read_text())
    if module == 3:  # a Dense after them: refused for where it points before for what it is
        modules.append({"idx": 3, "name": "3", "path": path, "type": "sentence_transformers.models.Dense"})
    else:
        modules[module]["path"] = path
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CompressError) as err:
        read_spec(folder)
    assert str(err.value) == (f"{folder}/modules.json: [{module}].path names {json.dumps(path)}, which is not a path "
                              f"inside {folder}: {OUTSIDE}; {SENTENCE_FIX}")


def test_paths_inside_the_folder_and_its_own_links_still_read(ws, tmp_path):
    """A path that wanders and comes back is inside; a file linked out of the folder is the folder's own (a Hugging
    Face cache snapshot links every file to blobs/ beside it)."""
    folder = copy(ws, tmp_path, "st")
    modules = json.loads((folder / "modules.json").read_text())
    modules[1]["path"] = "2_Normalize/../1_Pooling"
    (folder / "modules.json").write_text(json.dumps(modules))
    assert read_spec(folder).pooling == "cls"
    blob = tmp_path / "blobs" / "pooling"
    blob.parent.mkdir()
    blob.write_text(json.dumps({"word_embedding_dimension": 32, "pooling_mode_max_tokens": True}))
    (folder / "1_Pooling" / "config.json").unlink()
    (folder / "1_Pooling" / "config.json").symlink_to(blob)
    assert read_spec(folder).pooling == "max"
    at = At(folder / "state.json", "trained.a.dir", "fix")
    assert inside(folder, str(folder / "candidates" / "a"), at) == folder / "candidates" / "a"  # absolute, inside
    assert inside(folder, ".", at) == folder


def test_a_candidate_folder_outside_the_search_is_refused(tmp_path):
    work = work_dir_for(tmp_path / "out")
    work.mkdir()
    entry = {"label": "2L-32", "round": 0, "epochs": 1, "score": 80.0, "dir": str(tmp_path / "elsewhere"), "seconds": 1.0}
    (work / "state.json").write_text(json.dumps({"key": "k", "trained": {"2L-32/0": entry}}))
    with pytest.raises(CompressError) as err:
        SearchState.open(work, True, "k", "p", "t")
    assert str(err.value) == (f"{work}/state.json: trained[\"2L-32/0\"].dir names \"{tmp_path / 'elsewhere'}\", which is "
                              f"not a path inside {work}: {OUTSIDE}; drop --resume to start the search afresh")


# ---------------------------------------------------------------------------- a runtime's own message, whole


OPENVINO_FIX = "; restore the folder's openvino_model.xml and .bin, or export it again"


def test_openvino_s_message_for_a_missing_bin_is_passed_on_whole(ws, tmp_path, capsys, monkeypatch):
    """OpenVINO's first line is where its C++ code rethrew ("Exception from src/inference/src/cpp/core.cpp:132:"); the
    line that says what is wrong comes last. --debug changes nothing: the error is the folder's, not a bug."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = copy(ws, tmp_path, "openvino")
    (folder / "openvino_model.bin").unlink()
    code, err = run([*eval_args(ws, folder), "--debug"], capsys)
    line = one_line(code, err)
    assert re.fullmatch(rf"compress eval: error: OpenVINO cannot compile {re.escape(str(folder))}/openvino_model\.xml: "
                        rf"Check .* failed at \S+: Empty weights data in bin file or bin file cannot be found!"
                        rf"{re.escape(OPENVINO_FIX)}", line), line
    assert "Exception from" not in line


def test_openvino_s_message_for_a_truncated_xml_is_passed_on_whole(ws, tmp_path):
    folder = copy(ws, tmp_path, "openvino")
    xml = folder / "openvino_model.xml"
    xml.write_bytes(xml.read_bytes()[:3000])
    with pytest.raises(CompressError) as err:
        load_model(folder)
    assert re.fullmatch(rf"OpenVINO cannot compile {re.escape(str(xml))}: Check .* failed at \S+: "
                        rf"Start-end tags mismatch at offset 2999{re.escape(OPENVINO_FIX)}", str(err.value)), str(err.value)


def test_onnx_runtime_s_message_for_a_truncated_graph_is_passed_on_whole(ws, tmp_path):
    folder = copy(ws, tmp_path, "onnx")
    graph = folder / "model.onnx"
    graph.write_bytes(graph.read_bytes()[:1000])
    with pytest.raises(CompressError) as err:
        load_model(folder)
    assert str(err.value) == (f"ONNX Runtime cannot load {graph}: [ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model "
                              f"from {graph} failed:Protobuf parsing failed.; restore the folder's model.onnx, or export it again")


def test_an_unexpected_multi_line_error_keeps_every_line_that_says_something():
    err = RuntimeError("Exception from src/inference/src/cpp/core.cpp:132:\nException from src/inference/src/dev/"
                       "plugin.cpp:59:\nCheck 'x' failed at src/a.cpp:7:\nthe reason\n\n")
    assert foreign(err) == "Check 'x' failed at src/a.cpp:7: the reason"
    assert internal_error("compress eval", err) == ("compress eval: error: RuntimeError: Check 'x' failed at src/a.cpp:7: "
                                                    "the reason (an internal error; rerun with --debug for the traceback)")
    assert foreign(RuntimeError("Exception from src/a.cpp:1:")) == "Exception from src/a.cpp:1:"  # nothing else to say
    assert foreign(RuntimeError("x" * 5000)) == "x" * 2000 + " ..."


def test_good_records_read_as_written(ws):
    """The schemas let every field the toolkit writes through."""
    record = read_compression(ws / "good")
    assert record["structure"]["heads"] == [4, 4] and record["stage"] == "test"
    assert read_metrics(ws / "good")[0]["metrics"] == {"accuracy": 50.0}
    assert read_spec(ws / "st") == SentenceSpec(pooling="cls", normalize=True, max_seq_length=48, dimension=32,
                                               sentence_transformers=True)

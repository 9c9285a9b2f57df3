"""Published comparison rows: which wanted GLUE rows exist (and with what paper, table and split), and the rule that a
test-set row stands in its own block, never averaged or ranked with dev rows, in the toolkit leaderboard (Markdown,
HTML, JSON) and on the GLUE benchmark page (bench/glue). Every expected number is written out by hand."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.glue import report as glue_report
from bench.glue.run import render_only
from compress.core.config import from_dict
from compress.eval.leaderboard import LeaderboardConfig, build_table, collect
from compress.eval.leaderboard_render import format_markdown
from compress.eval.references import (ALL, GLUE_DEV, GLUE_TEST, WANTED_GLUE, Published, missing_wanted,
                                      wanted_rows)
from compress.eval.report import markdown_to_html, write_report
from tests.eval.test_leaderboard import eval_record, latency_record, make_model

WHEN = "2024-01-01T00:00:00+00:00"
HF_DISTIL = "huggingface/transformers examples/research_projects/distillation/README.md"
MINILM = "microsoft/unilm minilm/README.md"
TINYBERT = "quoted in henrform/DLNLP_25W_Group4 README.md"

# What REFERENCES.md gives for each wanted name: (model, paper, table, split, source). None: REFERENCES.md names no
# paper or table for that row. Asked for but not there: DistilBERT's figures come from the Hugging Face README (not
# "DistilBERT paper, Table 1"), MiniLM-L6's from the unilm README (not its paper), and TinyBERT's quoted figures
# name no table; they are the TinyBERT paper's GLUE test figures, so their split is test.
EXPECTED = {
    "BERT-base": [("BERT-base-uncased", None, None, "dev", HF_DISTIL),
                  ("BERT-base (MiniLM authors' run)", None, None, "dev", MINILM),
                  ("BERT-base (Devlin et al.)", "BERT paper", "Table 1", "test",
                   "yoshitomo-matsubara/torchdistill configs README")],
    "DistilBERT": [("DistilBERT-base-uncased (6L-768)", None, None, "dev", HF_DISTIL)],
    "MiniLM-L6": [("MiniLM-L6-H384", None, None, "dev", MINILM)],
    "TinyBERT-4": [("TinyBERT-4L-312", "TinyBERT paper", None, "test", TINYBERT)],
    "TinyBERT-6": [("TinyBERT-6L-768", "TinyBERT paper", None, "test", TINYBERT)],
    "BERT-of-Theseus": [("BERT-of-Theseus (6L)", None, None, "dev", "JetRunner/BERT-of-Theseus README.md")],
}
KNOWN_MISSING: tuple[str, ...] = ()  # wanted names REFERENCES.md has no figures for (a named gap when not empty)


# ---------------------------------------------------------------------------- which rows exist


def test_the_wanted_rows_exist_with_their_paper_table_and_split():
    found = {name: [(r.model, r.paper, r.table, r.split, r.source) for r in rows] for name, rows in wanted_rows().items()}
    assert list(found) == list(WANTED_GLUE)
    assert found == {name: EXPECTED.get(name, []) for name in WANTED_GLUE}
    assert missing_wanted() == KNOWN_MISSING
    # Rows REFERENCES.md names no paper table for: a known gap, listed so that a new one (or a filled one) shows.
    no_table = sorted(r.model for rows in wanted_rows().values() for r in rows if r.table is None)
    assert no_table == ["BERT-base (MiniLM authors' run)", "BERT-base-uncased", "BERT-of-Theseus (6L)",
                        "DistilBERT-base-uncased (6L-768)", "MiniLM-L6-H384", "TinyBERT-4L-312", "TinyBERT-6L-768"]


def test_the_figures_are_the_ones_references_md_prints():
    rows = {r.model: r for r in GLUE_DEV + GLUE_TEST}
    assert rows["DistilBERT-base-uncased (6L-768)"].scores == {
        "cola": 51.3, "sst2": 91.3, "mrpc": 87.5, "stsb": 86.9, "qqp": 88.5, "mnli": 82.1, "qnli": 89.2, "rte": 59.9,
        "wnli": 56.3}
    assert rows["MiniLM-L6-H384"].scores == {"cola": 47.5, "sst2": 91.5, "mrpc": 88.9, "qqp": 90.6, "mnli": 83.3,
                                             "qnli": 90.5, "rte": 68.8}
    assert rows["TinyBERT-4L-312"].scores == {"cola": 44.1, "sst2": 92.6, "mrpc": 86.4, "rte": 66.6}
    assert rows["TinyBERT-6L-768"].scores == {"cola": 51.1, "sst2": 93.1, "mrpc": 87.3, "rte": 70.0}
    assert rows["BERT-of-Theseus (6L)"].scores == {"sst2": 91.8, "mrpc": 87.5, "stsb": 87.8, "qqp": 88.8, "mnli": 82.1,
                                                   "qnli": 88.8, "rte": 70.1}
    bert = rows["BERT-base (Devlin et al.)"]
    assert bert.scores["cola"] == 52.1 and bert.extra == {"mnli-mm": 83.4, "score": 79.6}


def test_a_row_is_a_frozen_record_that_cites_itself():
    row = next(r for r in ALL if r.model == "BERT-base (Devlin et al.)")
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.split = "dev"  # type: ignore[misc]
    assert row.cite == "BERT paper, Table 1 (via yoshitomo-matsubara/torchdistill configs README); test set"
    tiny = next(r for r in ALL if r.model == "TinyBERT-4L-312")
    assert tiny.cite == f"TinyBERT paper, table not named (via {TINYBERT}); test set"
    distil = next(r for r in ALL if r.model.startswith("DistilBERT-base"))
    assert distil.cite == f"{HF_DISTIL} (no paper table cited); dev set"
    assert all(r.split in ("dev", "test") for r in ALL) and not any(r.split == "dev" for r in GLUE_TEST)


# ---------------------------------------------------------------------------- the toolkit leaderboard

ORACLE = Published("Oracle (test)", 1, {"sst2": 100.0, "mrpc": 100.0, "stsb": 100.0}, "made up for this test",
                   split="test", paper="no paper", table="Table 9")


@pytest.fixture
def three_tasks(tmp_path) -> Path:
    """A teacher (SST-2 90, MRPC 80, STS-B 70) and its student (88, 78, 60), timed in one run."""
    root = tmp_path / "runs"
    teacher = make_model(root, "teacher", [eval_record("sst2", 90.0, WHEN), eval_record("mrpc", 80.0, WHEN),
                                           eval_record("stsb", 70.0, WHEN), latency_record(40.0)])
    make_model(root, "student", [eval_record("sst2", 88.0, WHEN), eval_record("mrpc", 78.0, WHEN),
                                 eval_record("stsb", 60.0, WHEN), latency_record(10.0)],
               parent=teacher, stage="distill", method="kd")
    return root


def _table(root: Path, references) -> dict:
    return build_table(collect([root]), from_dict(LeaderboardConfig, {}), references=references)


def test_a_test_row_with_a_very_high_score_changes_neither_the_dev_ranking_nor_the_dev_average(three_tasks, tmp_path):
    plain, fed = _table(three_tasks, GLUE_DEV + GLUE_TEST), _table(three_tasks, GLUE_DEV + GLUE_TEST + (ORACLE,))
    assert fed["ranking"] == plain["ranking"]
    assert [r["name"] for r in fed["ranking"]] == ["BERT-base-uncased", "BERT-of-Theseus (6L)",
                                                   "DistilBERT-base-uncased (6L-768)", "teacher", "student"]
    assert [r["rank"] for r in fed["ranking"]] == [1, 2, 3, 4, 5]
    assert fed["average_tasks"] == plain["average_tasks"] == ["sst2", "mrpc", "stsb"]
    assert [m["glue_avg"] for m in fed["models"]] == pytest.approx([80.0, 75.33333333])  # (90+80+70)/3, (88+78+60)/3
    assert [(m["glue_avg"], m["rank"]) for m in fed["models"]] == [(m["glue_avg"], m["rank"]) for m in plain["models"]]
    assert fed["published"] == plain["published"] and all(p["split"] == "dev" for p in fed["published"])
    oracle = next(p for p in fed["published_other_split"] if p["model"] == "Oracle (test)")
    assert oracle["glue_avg"] is None and oracle["rank"] is None and oracle["scores"]["sst2"] == 100.0
    # Markdown: the test row only in its own block, after every dev table and the ranking.
    text = format_markdown(fed)
    dev_part, test_part = text.split("## Published on the test sets")
    assert "Oracle" not in dev_part and "| Oracle (test) | 1 | 100.0 | 100.0 | 100.0 | test | no paper, Table 9 (via made " \
                                       "up for this test) |" in test_part
    assert "### Ranking by GLUE avg (dev rows only" in dev_part
    # HTML (rendered from that Markdown) and JSON (write_report's leaderboard.json): the same blocks.
    html = markdown_to_html(text, tmp_path, "t")
    html_dev, html_test = html.split("<h2>Published on the test sets")
    assert "Oracle" not in html_dev and "<td>Oracle (test)</td>" in html_test
    out = write_report(fed, tmp_path / "report", title="t")
    saved = json.loads((out / "leaderboard.json").read_text())
    assert [p["model"] for p in saved["published_other_split"]][-1] == "Oracle (test)"
    assert "Oracle (test)" not in {p["model"] for p in saved["published"]} | {r["name"] for r in saved["ranking"]}
    assert "Oracle" in (out / "report.html").read_text().split("<h2>Published on the test sets")[1]


def test_every_published_row_shows_its_source_and_a_missing_average_names_its_tasks(three_tasks):
    table = _table(three_tasks, None)  # the toolkit's own published rows
    text = format_markdown(table)
    for p in table["published"] + table["published_other_split"]:
        line = next(line for line in text.splitlines() if line.startswith(f"| {p['model']} |"))
        assert p["origin"] in line and f"| {p['split']} |" in line, p["model"]
    minilm = next(p for p in table["published"] if p["model"] == "MiniLM-L6-H384")
    assert minilm["glue_avg"] is None and minilm["avg_missing"] == ["stsb"]
    assert "| MiniLM-L6-H384 | 22 | 91.5 | 88.9 | — | — (no STS-B) | dev |" in text
    base = next(p for p in table["published"] if p["model"] == "BERT-base-uncased")
    assert base["glue_avg"] == pytest.approx((92.7 + 88.6 + 89.0) / 3) and base["avg_missing"] == []
    # TinyBERT publishes no STS-B either, but it is a test row: no average and nothing said missing from one.
    tiny = next(p for p in table["published_other_split"] if p["model"] == "TinyBERT-4L-312")
    assert tiny["glue_avg"] is None and tiny["avg_missing"] == [] and tiny["rank"] is None


def test_a_model_without_every_task_narrows_the_average_and_with_one_task_left_nothing_is_ranked(three_tasks):
    make_model(three_tasks, "partial", [eval_record("sst2", 99.0, WHEN), latency_record(5.0)])
    table = _table(three_tasks, GLUE_DEV)
    # The average is over the tasks every model with GLUE results has: SST-2 only, so no average and no ranking.
    assert table["average_tasks"] == ["sst2"] and table["ranking"] == []
    assert all(m["glue_avg"] is None and m["glue_avg_missing"] == [] and m["rank"] is None for m in table["models"])
    assert "### Ranking" not in format_markdown(table)


def test_a_model_with_no_glue_score_says_which_tasks_its_average_lacks(three_tasks):
    make_model(three_tasks, "timed-only", [latency_record(20.0)])
    table = _table(three_tasks, GLUE_DEV)
    timed = next(m for m in table["models"] if m["name"] == "timed-only")
    assert timed["glue_avg"] is None and timed["glue_avg_missing"] == ["sst2", "mrpc", "stsb"] and timed["rank"] is None
    line = next(line for line in format_markdown(table).splitlines() if line.startswith("| timed-only |"))
    assert "| n/a (no SST-2, MRPC, STS-B) |" in line


# ---------------------------------------------------------------------------- the GLUE benchmark page


def glue_state(tmp_path: Path) -> dict:
    """A bench/glue run's state: teacher and 3L-384 student on CoLA, SST-2, RTE (hand-made scores, no model folders)."""
    scores = {"teacher": {"cola": 30.0, "sst2": 90.0, "rte": 60.0}, "3L-384": {"cola": 20.0, "sst2": 88.0, "rte": 54.0}}
    rows = {f"{t}/{role}": {"task": t, "role": role, "model_dir": str(tmp_path / t / role), "value": v, "n_train": 10,
                            "n_dev": 5, "epochs": 3, "seconds": 60.0, "drop": None}
            for role, by_task in scores.items() for t, v in by_task.items()}
    tasks = ["cola", "sst2", "rte"]
    return {"header": {"date": "d", "cpu": "cpu", "cores": 2, "threads": 2, "packages": {"torch": "x"}, "command": "c"},
            "settings": {"tasks": tasks, "max_train_examples": None, "epochs_scale": 1.0, "budget_hours": None},
            "available": tasks, "sizes": {t: 10 for t in tasks},
            "estimate": {"hours": 1.0, "teacher_hours": {}, "student_hours": {}, "int8_hours": 0.1},
            "estimate_full": {"hours": 2.0}, "work": str(tmp_path), "rows": rows, "recipes": {}}


def test_the_glue_page_keeps_a_very_high_test_row_out_of_the_dev_ranking_and_average(tmp_path):
    state = glue_state(tmp_path)
    oracle = Published("Oracle (test)", 1, {"cola": 100.0, "sst2": 100.0, "rte": 100.0}, "made up", split="test")
    plain = glue_report.build(state, references=GLUE_DEV + GLUE_TEST)
    fed = glue_report.build(state, references=GLUE_DEV + GLUE_TEST + (oracle,))
    assert fed["ranking"] == plain["ranking"]
    # Over CoLA, SST-2, RTE: MiniLM-L12 (58.5+93.0+73.3)/3 = 74.93, BERT-base MiniLM run (58.9+93.2+68.6)/3 = 73.57,
    # BERT-base-uncased (56.3+92.7+69.3)/3 = 72.77, MiniLM-L6 (47.5+91.5+68.8)/3 = 69.27, DistilBERT
    # (51.3+91.3+59.9)/3 = 67.5, teacher 60.0, student 54.0; BERT-of-Theseus publishes no CoLA: unranked.
    assert [(r["name"], r["rank"]) for r in fed["ranking"]] == [
        ("MiniLM-L12-H384", 1), ("BERT-base (MiniLM authors' run)", 2), ("BERT-base-uncased", 3), ("MiniLM-L6-H384", 4),
        ("DistilBERT-base-uncased (6L-768)", 5), ("teacher MiniLM-L6 (fp32)", 6), ("student 3L-384 (fp32)", 7)]
    assert [r["glue_avg"] for r in fed["ranking"]] == pytest.approx([74.93333, 73.56667, 72.76667, 69.26667, 67.5,
                                                                     60.0, 54.0])
    assert [m["glue_avg"] for m in fed["models"]] == pytest.approx([60.0, 54.0])
    assert fed["bert_base_avg"] == plain["bert_base_avg"] == pytest.approx((56.3 + 92.7 + 69.3) / 3)
    assert [m["vs_bert_avg"] for m in fed["models"]] == [m["vs_bert_avg"] for m in plain["models"]]
    assert fed["published"] == plain["published"] and all(p["split"] == "dev" for p in fed["published"])
    assert [p["model"] for p in fed["published_test"]] == ["BERT-base (Devlin et al.)", "BERT-large (Devlin et al.)",
                                                           "TinyBERT-4L-312", "TinyBERT-6L-768", "Oracle (test)"]
    assert all(p["glue_avg"] is None and p["rank"] is None for p in fed["published_test"])
    md = glue_report.render(state, fed)
    dev_part, test_part = md.split("## Published GLUE test-set results")
    assert "Oracle" not in dev_part and "TinyBERT" not in dev_part.split("## Per task")[0]
    oracle_line = "| Oracle (test) (published, test) | 1 | 100.0 | 100.0 | 100.0 | made up (no paper table cited); test set |"
    assert oracle_line in test_part
    assert "| TinyBERT-4L-312 (published, test) | 14.5 | 44.1 | 92.6 | 66.6 | TinyBERT paper, table not named" in test_part


def test_the_glue_page_shows_each_published_rows_source_and_what_its_average_lacks(tmp_path):
    report = glue_report.build(glue_state(tmp_path))
    md = glue_report.render(glue_state(tmp_path), report)
    table = md.split("## Leaderboard (dev)")[1].split("\n\n")[1].splitlines()
    theseus = next(line for line in table if line.startswith("| BERT-of-Theseus (6L) (published) |"))
    assert "| — (no CoLA) |" in theseus and theseus.endswith("| — | JetRunner/BERT-of-Theseus README.md (no paper table "
                                                               "cited); dev set |")
    base = next(line for line in table if line.startswith("| BERT-base-uncased (published) |"))
    assert f"| 72.77 | 100.0 | — | — | — | — | 3 | {HF_DISTIL} (no paper table cited); dev set |" in base
    teacher = next(line for line in table if line.startswith("| teacher MiniLM-L6 (fp32) |"))
    assert teacher.endswith("| 6 | measured here (dev) |")
    for p in report["published"] + report["published_test"]:
        assert p["cite"] in md, p["model"]


def test_render_only_rebuilds_the_page_from_its_json_keeping_recorded_params_and_speed(tmp_path):
    state = glue_state(tmp_path / "gone")  # no model folder is here
    stored = glue_report.build(state)
    stored["models"][0]["params"] = 22_713_986
    stored["speed"] = {"teacher": {"p50_ms": 15.0, "backend": "openvino", "x_floor": None, "vs_base": 7.5,
                                   "base_backend": "openvino", "vs_teacher": 1.0, "teacher_backend": "openvino"}}
    stored["latency"] = {"when": "w", "cpu": "cpu", "threads": 2, "repeat_runs": 3}
    stored["published"] = []  # an old page: its published rows are rebuilt from compress.eval.references
    out = tmp_path / "out"
    out.mkdir()
    (out / "glue.json").write_text(json.dumps({**state, "report": stored}))
    render_only(out)
    saved = json.loads((out / "glue.json").read_text())
    assert {k: v for k, v in saved.items() if k != "report"} == state
    report = saved["report"]
    assert report["models"][0]["params"] == 22_713_986 and report["speed"] == stored["speed"]
    assert report["latency"] == stored["latency"] and [p["model"] for p in report["published"]][0] == "BERT-base-uncased"
    md = (out / "glue.md").read_text()
    assert "| teacher MiniLM-L6 (fp32) | 22.7 |" in md and "15.00 (openvino)" in md
    assert "## Published GLUE test-set results" in md

"""Leaderboard and report on fabricated metrics.json / compression.json files (no models needed).

Every expected average, retention and speed-up is computed by hand in the test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.eval.leaderboard import LeaderboardConfig, build_table, collect, expand_runs
from compress.eval.leaderboard_render import CROSS_RUN, format_markdown, pareto_figure, pareto_front
from compress.eval.report import leaderboard

RUN_A = "2024-03-01T10:00:00+00:00"  # one `compress latency` run timing several models
RUN_B = "2024-03-02T10:00:00+00:00"
STRUCTURE = {"num_layers": 2, "hidden_size": 32, "head_size": 8, "heads": [4, 4], "pruned_heads": {},
             "ffn": [37, 37], "kept_layers": [0, 1]}


def eval_record(task: str, value: float, when: str, split: str = "dev", metric: str | None = None) -> dict:
    """A metrics.json eval record with the task's primary metric (and a distracting second metric)."""
    from compress.core.data.tasks import get_task

    metric = metric or get_task(task).primary_metric
    return {"kind": "eval", "task": task, "split": split, "metrics": {metric: value, "other": 1.0}, "n": 100, "when": when}


def latency_record(p50: float, when: str = RUN_A, first: str = "teacher", *, batch: int = 1, seq: int = 128,
                   params: int = 4_000_000, backend: str = "torch") -> dict:
    """A metrics.json latency record as compress.eval.latency.rows.record_metrics writes it (one row)."""
    row = {"backend": backend, "batch": batch, "seq": seq, "p50_ms": p50, "p90_ms": p50 * 1.1, "p99_ms": p50 * 1.2,
           "params": params, "size_mb": params * 4 / 1e6, "speedup": 1.0}
    return {"kind": "latency", "backend": backend, "threads": 2, "rows": [row], "speedup_vs": first, "when": when}


def make_model(root: Path, name: str, records: list[dict], *, parent: Path | None = None,
               stage: str = "finetune", method: str = "finetune") -> Path:
    """A model directory with config.json, metrics.json and compression.json written by hand."""
    path = root / name
    path.mkdir(parents=True)
    config = {"model_type": "bert", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 37, "max_position_embeddings": 64, "type_vocab_size": 2}
    (path / "config.json").write_text(json.dumps(config))
    (path / "metrics.json").write_text(json.dumps({"results": records}))
    compression = {"stage": stage, "method": method, "structure": STRUCTURE,
                   "parent": {"path": str(parent.resolve()), "hash": None} if parent else None}
    (path / "compression.json").write_text(json.dumps(compression))
    return path


@pytest.fixture
def runs(tmp_path) -> Path:
    """teacher (SST-2 90.0, MRPC 80.0, 40 ms) and its distilled student (88.2, 78.4, 10 ms) in one latency run."""
    root = tmp_path / "runs"
    teacher = make_model(root, "teacher", [
        eval_record("sst2", 90.0, "2024-01-01T00:00:00+00:00"),
        eval_record("mrpc", 80.0, "2024-01-01T00:00:00+00:00"),
        latency_record(40.0, params=110_000_000),
    ])
    make_model(root, "student", [
        eval_record("sst2", 88.2, "2024-02-01T00:00:00+00:00"),
        eval_record("mrpc", 78.4, "2024-02-01T00:00:00+00:00"),
        latency_record(10.0, params=14_500_000),
    ], parent=teacher, stage="distill", method="kd+hard")
    return root


def table_for(dirs, **cfg) -> dict:
    config = from_dict(LeaderboardConfig, cfg)
    return build_table(collect(dirs, batch=config.batch, seq=config.seq), config)


def by_name(table: dict) -> dict[str, dict]:
    return {m["name"]: m for m in table["models"]}


# ---------------------------------------------------------------------------- numbers


def test_average_retention_and_speedup_match_hand_computation(runs):
    table = table_for([runs])
    # The folder lists student before teacher; ancestors move up, so the teacher leads.
    assert [m["name"] for m in table["models"]] == ["teacher", "student"]
    teacher, student = by_name(table)["teacher"], by_name(table)["student"]
    assert teacher["glue_avg"] == pytest.approx((90.0 + 80.0) / 2)  # 85.0
    assert student["glue_avg"] == pytest.approx((88.2 + 78.4) / 2)  # 83.3
    assert student["teacher"] == "teacher"
    assert student["retention"] == pytest.approx({"sst2": 100 * 88.2 / 90.0, "mrpc": 100 * 78.4 / 80.0})  # 98.0 each
    assert student["retention_avg"] == pytest.approx(100 * 83.3 / 85.0)  # 98.0
    assert student["speedup_teacher"] == pytest.approx(40.0 / 10.0) and student["speedup_teacher_same_run"]
    assert student["p50_ms"] == 10.0 and student["backend"] == "torch"
    assert student["params"] == 14_500_000 and student["params_source"] == "latency"
    # The teacher has no ancestor among the runs: compared with the first run, itself.
    assert teacher["retention_avg"] == pytest.approx(100.0) and teacher["speedup_teacher"] == pytest.approx(1.0)


def test_markdown_shows_the_hand_computed_values(runs):
    text = format_markdown(table_for([runs]))
    student = next(line for line in text.splitlines() if line.startswith("| student |"))
    assert student == ("| student | distill / kd+hard | 14.50 | 58.0 | 88.20 | 78.40 | 83.30 | 98.0% | teacher "
                       "| 10.00 | torch | 4.00x |")
    assert "| SST-2 (acc) | MRPC (F1) | GLUE avg | retention (GLUE avg) |" in text
    assert f"marked {CROSS_RUN}" not in text  # one latency run: nothing to flag


def test_latest_eval_record_wins(tmp_path):
    model = make_model(tmp_path, "m", [
        eval_record("sst2", 70.0, "2024-01-01T00:00:00+00:00"),
        eval_record("sst2", 80.0, "2024-02-01T00:00:00+00:00"),
        eval_record("rte", 66.0, "2024-03-01T00:00:00+00:00"),
        eval_record("rte", 60.0, "2024-02-01T00:00:00+00:00"),  # appended later, but measured earlier
        eval_record("sst2", 99.0, "2024-05-01T00:00:00+00:00", split="test"),  # not a dev split
    ])
    [row] = collect([model])
    assert row.scores == {"sst2": 80.0, "rte": 66.0}


def test_mnli_reports_matched(tmp_path):
    model = make_model(tmp_path, "m", [
        eval_record("mnli", 84.0, "2024-01-01T00:00:00+00:00", split="dev_matched"),
        eval_record("mnli", 83.0, "2024-01-01T00:00:01+00:00", split="dev_mismatched"),
    ])
    table = table_for([model])
    [entry] = table["models"]
    assert entry["scores"] == {"mnli": 84.0}
    assert entry["evals"]["mnli"]["split"] == "dev_matched" and entry["evals"]["mnli"]["mismatched"] == 83.0
    assert "MNLI-m (acc)" in format_markdown(table)


def test_glue_average_only_over_tasks_every_model_has(runs):
    # A third model also has RTE, another only latency: the average stays over SST-2 and MRPC.
    make_model(runs, "wide", [eval_record("sst2", 91.0, RUN_A), eval_record("mrpc", 81.0, RUN_A),
                              eval_record("rte", 70.0, RUN_A)])
    make_model(runs, "timed-only", [latency_record(20.0)])
    table = table_for([runs])
    assert table["tasks"] == ["sst2", "mrpc", "rte"]
    assert table["average_tasks"] == ["sst2", "mrpc"]
    models = by_name(table)
    assert models["wide"]["glue_avg"] == pytest.approx((91.0 + 81.0) / 2)
    assert models["timed-only"]["glue_avg"] is None
    assert "unweighted mean over SST-2 (accuracy), MRPC (F1)" in format_markdown(table)


def test_published_rows_are_flagged_and_averaged_over_the_same_tasks(runs):
    table = table_for([runs])
    published = {p["model"]: p for p in table["published"]}
    assert all(p["published"] for p in table["published"]) and not any(m["published"] for m in table["models"])
    base = published["BERT-base-uncased"]
    assert base["scores"] == {"sst2": 92.7, "mrpc": 88.6} and base["params_m"] == 110
    assert base["glue_avg"] == pytest.approx((92.7 + 88.6) / 2)
    assert published["MiniLM-L6-H384"]["glue_avg"] == pytest.approx((91.5 + 88.9) / 2)
    assert "MobileBERT" not in published  # SQuAD only: nothing on these tasks
    # TinyBERT's figures are GLUE test ones: in the other split's block, without an average or a rank.
    other = {p["model"]: p for p in table["published_other_split"]}
    assert "TinyBERT-4L-312" not in published and other["TinyBERT-4L-312"]["split"] == "test"
    assert other["TinyBERT-4L-312"]["glue_avg"] is None and other["TinyBERT-4L-312"]["rank"] is None
    text = format_markdown(table)
    published_part = text.split("## Published (not measured here)")[1]
    assert "| BERT-base-uncased | 110 | 92.7 | 88.6 | 90.65 | dev |" in published_part
    assert "huggingface/transformers" in published_part
    assert table_for([runs], published=False)["published"] == []


# ---------------------------------------------------------------------------- speed-ups across runs


def test_speedup_prefers_a_shared_latency_run_and_marks_cross_run_ratios(tmp_path):
    teacher = make_model(tmp_path, "teacher", [latency_record(40.0, RUN_A), eval_record("sst2", 90.0, RUN_A)])
    # Timed with the teacher in run A (10 ms), later alone in run B (8 ms).
    make_model(tmp_path, "student", [latency_record(10.0, RUN_A), latency_record(8.0, RUN_B, first="student"),
                                     eval_record("sst2", 88.0, RUN_A)], parent=teacher)
    # Only ever timed alone: the ratio crosses runs.
    make_model(tmp_path, "alone", [latency_record(5.0, RUN_B, first="alone"), eval_record("sst2", 85.0, RUN_A)],
               parent=teacher)
    table = table_for([tmp_path])
    models = by_name(table)
    assert models["student"]["p50_ms"] == 8.0  # the latest run is shown...
    assert models["student"]["speedup_teacher"] == pytest.approx(40.0 / 10.0)  # ...the shared run gives the ratio
    assert models["student"]["speedup_teacher_same_run"]
    assert models["alone"]["speedup_teacher"] == pytest.approx(40.0 / 5.0)
    assert not models["alone"]["speedup_teacher_same_run"]
    text = format_markdown(table)
    assert "| 8.00x* |" in text and "| 4.00x |" in text
    assert f"- Speed-ups marked {CROSS_RUN}: the two p50s come from different latency runs" in text


def test_the_cross_run_mark_appears_only_for_ratios_across_latency_runs(runs):
    # One `compress latency` run timed the fp32 teacher and student and an ONNX Runtime int8 model (each row
    # names its own backend); another run timed a second int8 model alone.
    student = runs / "student"
    make_model(runs, "student-int8", [eval_record("sst2", 87.3, RUN_A), latency_record(5.0, backend="onnxruntime-int8")],
               parent=student, stage="quantize", method="onnxruntime-dynamic")
    make_model(runs, "later-int8", [eval_record("sst2", 87.0, RUN_B),
                                    latency_record(4.0, RUN_B, first="later-int8", backend="onnxruntime-int8")],
               parent=student, stage="quantize", method="onnxruntime-static")
    models = by_name(table_for([runs], tasks="sst2"))
    assert models["student-int8"]["speedup_teacher"] == pytest.approx(40.0 / 5.0)
    assert models["student-int8"]["speedup_teacher_same_run"]  # same run, different backend: comparable
    assert models["later-int8"]["speedup_teacher"] == pytest.approx(40.0 / 4.0)
    assert not models["later-int8"]["speedup_teacher_same_run"]
    lines = format_markdown(table_for([runs], tasks="sst2")).splitlines()
    cell = {line.split(" | ")[0][2:]: line.rstrip(" |").rsplit(" | ", 1)[1] for line in lines if line.startswith("| ")}
    assert cell["student-int8"] == "8.00x" and cell["later-int8"] == "10.00x" + CROSS_RUN
    assert cell["teacher"] == "1.00x" and cell["student"] == "4.00x"
    # Every model timed in one run (int8 included): no mark and no footnote anywhere.
    (runs / "later-int8" / "metrics.json").write_text(json.dumps({"results": [
        eval_record("sst2", 87.0, RUN_B), latency_record(4.0, backend="onnxruntime-int8")]}))
    text = format_markdown(table_for([runs], tasks="sst2"))
    assert CROSS_RUN not in text.split("## Published")[0]


def test_speed_reference_and_explicit_baseline(runs, tmp_path):
    base = make_model(tmp_path / "ref", "bert-base", [latency_record(80.0)])
    table = table_for([base, runs], speed_reference=str(base), baseline=str(runs / "student"))
    models = by_name(table)
    assert table["speed_reference"] == "bert-base"
    assert models["student"]["speedup_reference"] == pytest.approx(80.0 / 10.0)
    assert models["teacher"]["speedup_reference"] == pytest.approx(80.0 / 40.0)
    # Everything is compared with --baseline: the teacher retains 90/88.2 of the student.
    assert models["teacher"]["teacher"] == "student"
    assert models["teacher"]["retention"]["sst2"] == pytest.approx(100 * 90.0 / 88.2)
    assert models["teacher"]["speedup_teacher"] == pytest.approx(10.0 / 40.0)
    text = format_markdown(table)
    assert "speed-up vs bert-base" in text and "| speed-up vs baseline |" in text


def test_vs_teacher_is_the_teacher_of_the_chain_unless_the_parent_is_asked_for(runs):
    # teacher (SST-2 90.0, MRPC 80.0, 40 ms) -> student (88.2, 78.4, 10 ms) -> student-int8 (87.3, 77.6, 5 ms),
    # all three timed in one latency run.
    make_model(runs / "quantized", "student-int8",
               [eval_record("sst2", 87.3, RUN_B), eval_record("mrpc", 77.6, RUN_B), latency_record(5.0)],
               parent=runs / "student", stage="quantize", method="onnxruntime-dynamic")
    table = table_for([runs])
    int8 = by_name(table)["student-int8"]
    assert int8["teacher"] == "teacher"  # the chain's root, not the nearest parent
    assert int8["retention"] == pytest.approx({"sst2": 100 * 87.3 / 90.0, "mrpc": 100 * 77.6 / 80.0})  # 97.0 each
    assert int8["retention_avg"] == pytest.approx(100 * ((87.3 + 77.6) / 2) / ((90.0 + 80.0) / 2))  # 82.45 / 85 = 97.0
    assert int8["speedup_teacher"] == pytest.approx(40.0 / 5.0) and int8["speedup_teacher_same_run"]
    row = next(line for line in format_markdown(table).splitlines() if line.startswith("| student-int8 |"))
    assert "| 97.0% | teacher |" in row and row.endswith("| 8.00x |")

    parent = by_name(table_for([runs], compare_with="parent"))["student-int8"]
    assert parent["teacher"] == "student"
    assert parent["retention"]["sst2"] == pytest.approx(100 * 87.3 / 88.2)
    assert parent["speedup_teacher"] == pytest.approx(10.0 / 5.0)
    assert "| speed-up vs parent |" in format_markdown(table_for([runs], compare_with="parent"))


def test_missing_latency_point_lists_the_measured_ones(runs):
    table = table_for([runs], seq=64)
    assert all(m["p50_ms"] is None for m in table["models"])
    assert "measured: batch 1 seq 128" in format_markdown(table)


def test_params_without_latency_are_estimated_from_the_structure(tmp_path):
    from transformers import BertConfig, BertModel

    from compress.core.model.structure import count_parameters

    model = make_model(tmp_path, "m", [eval_record("sst2", 80.0, RUN_A)])
    [row] = collect([model])
    config = json.loads((model / "config.json").read_text())
    # BertModel = embeddings + encoder + pooler, the part the estimate covers (no task head).
    assert row.params_source == "estimate"
    assert row.params == count_parameters(BertModel(BertConfig(**config)))


# ---------------------------------------------------------------------------- pareto


def test_pareto_front_on_a_hand_made_set():
    points = [
        (10.0, 80.0),  # 0: front (fastest)
        (20.0, 85.0),  # 1: front
        (25.0, 84.0),  # 2: dominated by 1 (slower and worse)
        (40.0, 90.0),  # 3: front (best)
        (40.0, 89.0),  # 4: dominated by 3 (same latency, worse)
        (15.0, 80.0),  # 5: dominated by 0 (same metric, slower)
        (20.0, 85.0),  # 6: identical to 1: neither dominates the other
    ]
    assert pareto_front(points) == [0, 1, 6, 3]
    assert pareto_front([]) == []


def _circles(ax):
    """Display centres and radii (pixels) of the scatter markers."""
    import numpy as np

    collection = ax.collections[0]
    centres = ax.transData.transform(collection.get_offsets())
    radii = np.sqrt(collection.get_sizes()) / 2 * ax.figure.dpi / 72  # marker area is in points^2
    return list(zip(map(tuple, centres), radii))


def _touches(box, centre, radius) -> bool:
    dx = max(box.x0 - centre[0], 0.0, centre[0] - box.x1)
    dy = max(box.y0 - centre[1], 0.0, centre[1] - box.y1)
    return dx * dx + dy * dy <= radius * radius


@pytest.mark.e2e
def test_pareto_plot_labels_published_lines_inside_the_axes_and_its_legend_covers_no_point(runs):
    # A slow, weak model sits in the lower right corner, where a fixed legend would cover it.
    make_model(runs, "slow-weak", [eval_record("sst2", 70.0, RUN_A), latency_record(35.0, params=50_000_000)])
    make_model(runs, "fast", [eval_record("sst2", 80.0, RUN_A), latency_record(4.0, params=4_000_000)])
    table = table_for([runs], tasks="sst2")
    fig = pareto_figure(table, "sst2")
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    published = [(p["model"], p["scores"]["sst2"]) for p in table["published"] if "sst2" in p["scores"]]
    assert len(published) >= 5
    for model, score in published:
        [label] = [t for t in ax.texts if t.get_text().startswith(model + " ")]
        box = label.get_window_extent(renderer)
        line_y = ax.transData.transform((1.0, score))[1]
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, model
        assert box.y0 <= line_y <= box.y1, model  # across its own line
    assert not [t for t in fig.texts if "published" in t.get_text()]  # nothing stacked outside the axes
    legend = ax.get_legend()
    box = legend.get_window_extent(renderer)
    circles = _circles(ax)
    assert len(circles) == 4 and not any(_touches(box, c, r) for c, r in circles)
    # The check can fail: the corner the legend used to take does cover a point.
    legend.set_loc("lower right")
    fig.canvas.draw()
    assert any(_touches(legend.get_window_extent(renderer), c, r) for c, r in circles)


# ---------------------------------------------------------------------------- run discovery and errors


def test_runs_folder_expands_one_level_down_sorted(runs):
    make_model(runs / "quantized", "b-int8", [latency_record(5.0)])
    make_model(runs / "quantized", "a-int8", [latency_record(6.0)])
    found = [p.name for p in expand_runs([runs, runs / "student"])]
    assert found == ["a-int8", "b-int8", "student", "teacher"]  # student named twice, shown once


def test_clear_errors_for_runs_without_models_or_metrics(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(CompressError, match="holds no model directories"):
        collect([tmp_path / "empty"])
    with pytest.raises(CompressError, match="does not exist"):
        collect([tmp_path / "missing"])
    make_model(tmp_path / "bare", "m", [{"kind": "training", "stage": "finetune", "when": RUN_A}])
    with pytest.raises(CompressError, match="no dev evaluation or latency result"):
        collect([tmp_path / "bare"])


def test_config_is_validated(runs):
    # Task names are checked against the models' own tasks and the presets, once the models are read.
    with pytest.raises(CompressError, match="--tasks nope: no model was scored on a task of that name.*valid: cola"):
        table_for([runs], tasks="sst2,nope")
    with pytest.raises(CompressError, match="--batch must be at least 1"):
        from_dict(LeaderboardConfig, {"batch": 0})
    with pytest.raises(CompressError, match="split"):
        from_dict(LeaderboardConfig, {"split": "train"})
    assert from_dict(LeaderboardConfig, {"tasks": "SST-2"}).tasks == ("SST-2",)
    assert table_for([runs], tasks="SST-2")["tasks"] == ["sst2"]


# ---------------------------------------------------------------------------- report files


@pytest.mark.e2e
def test_report_markdown_html_and_json(runs, tmp_path):
    out = leaderboard([runs], tmp_path / "report", LeaderboardConfig())
    md = (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    data = json.loads((out / "leaderboard.json").read_text())
    assert (out / "pareto-sst2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![SST-2: metric vs p50 latency](pareto-sst2.png)" in md
    assert "| student | distill / kd+hard |" in md and "## Published (not measured here)" in md
    assert page.count("data:image/png;base64,iVBORw0KGgo") == 2  # both plots embedded (PNG signature)
    assert "<table>" in page and "<td class=\"r\">4.00x</td>" in page and "Published (not measured here)" in page
    assert "<script" not in page and "<link" not in page  # self-contained
    assert by_name(data)["student"]["speedup_teacher"] == pytest.approx(4.0)
    assert data["figures"] == {"sst2": "pareto-sst2.png", "mrpc": "pareto-mrpc.png"}


def test_report_refuses_a_non_empty_out(runs, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(CompressError, match="not empty"):
        leaderboard([runs], out, LeaderboardConfig())
    assert (out / "keep.txt").read_text() == "mine"
    leaderboard([runs], out, LeaderboardConfig(), overwrite=True)
    assert (out / "report.md").is_file() and not (out / "keep.txt").exists()


def test_extra_sections_reach_both_files(runs, tmp_path):
    from compress.eval.report import write_report

    table = table_for([runs])
    out = write_report(table, tmp_path / "r", title="Study", extra_sections={"Recipe": "Ran `demo.yaml` **twice**."})
    assert "## Recipe\n\nRan `demo.yaml` **twice**." in (out / "report.md").read_text()
    assert "<h2>Recipe</h2>\n<p>Ran <code>demo.yaml</code> <strong>twice</strong>.</p>" in (out / "report.html").read_text()


@pytest.mark.e2e
def test_report_flags_a_model_made_from_a_teacher_at_chance(runs, tmp_path):
    student = runs / "student"
    record = json.loads((student / "compression.json").read_text())
    record["teacher_check"] = {"task": "sst2", "at_chance": True, "problems": ["its dev accuracy 50.92 is at chance (accuracy <= 50.9 + 3.4)"]}
    (student / "compression.json").write_text(json.dumps(record))
    out = leaderboard([runs], tmp_path / "report", LeaderboardConfig())
    md = (out / "report.md").read_text()
    warning = ("- **student** was made from a model AT CHANCE (its dev accuracy 50.92 is at chance (accuracy <= 50.9 + 3.4)): "
               "its scores and retention mean nothing.")
    assert f"## Warnings\n\n{warning}\n" in md and md.index("## Warnings") < md.index("| student |")
    assert json.loads((out / "leaderboard.json").read_text())["warnings"] == [warning[2:]]
    assert "<h2>Warnings</h2>" in (out / "report.html").read_text()
    clean = leaderboard([runs / "teacher"], tmp_path / "clean", LeaderboardConfig())  # the teacher itself: no warning
    assert "Warnings" not in (clean / "report.md").read_text()

"""Latency engine: report shape, FLOP and size accounting, worker errors, config checks.

Timings themselves are machine noise: only their ordering and sign are asserted.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from compress.core.formats.records import read_metrics
from compress.core.config import from_dict
from compress.core.errors import CompressError
from compress.core.model.structure import flops_per_sequence
from compress.eval.latency.config import LatencyConfig
from compress.eval.latency.report import format_markdown, write_report
from compress.eval.latency.row import Row
from compress.eval.latency.rows import size_on_disk
from compress.eval.latency.runs import measure_latency
from tests.conftest import make_tiny_model, save_tiny

ROW_KEYS = {
    "model", "name", "backend", "batch", "seq", "p50_ms", "p90_ms", "p99_ms", "mean_ms",
    "throughput", "params", "size_mb", "gflops_per_seq", "achieved_gflops", "pct_peak", "speedup",
    "runs_p50_ms", "spread_pct", "speedup_min", "precision", "floor_ms", "x_floor", "slowest_run", "kernels",
}


def fast(**changes) -> LatencyConfig:
    """A config that times tiny models in about a second per worker."""
    base = {"warmup": 1, "repeats": 3, "seq": (16,), "threads": 1, "peak": False}
    return from_dict(LatencyConfig, {**base, **changes})


@pytest.fixture
def two_models(tmp_path, tokenizer) -> list[Path]:
    """The tiny classifier and a one-layer variant (a faster 'student')."""
    big = save_tiny(make_tiny_model(), tokenizer, tmp_path / "teacher")
    small = save_tiny(make_tiny_model(num_hidden_layers=1), tokenizer, tmp_path / "student")
    return [big, small]


@pytest.fixture(scope="module")
def grid_report(tmp_path_factory):
    """One real run over 2 models x 2 batch sizes, with a (small) GEMM peak, shared by tests."""
    from tests.conftest import make_tokenizer

    root = tmp_path_factory.mktemp("lat")
    tok = make_tokenizer(root / "tok")
    dirs = [
        save_tiny(make_tiny_model(), tok, root / "teacher"),
        save_tiny(make_tiny_model(num_hidden_layers=1), tok, root / "student"),
    ]
    import compress.eval.latency.runs as latency

    mp = pytest.MonkeyPatch()
    mp.setattr(latency, "PEAK_SIZES", (128, 256))  # the peak's mechanics, not its value
    try:
        report = measure_latency(dirs, fast(batch=(1, 2), peak=True, out=str(root / "out")))
    finally:
        mp.undo()
    return dirs, report, root / "out"


@pytest.mark.e2e
def test_one_row_per_model_and_grid_point(grid_report):
    dirs, report, _ = grid_report
    assert report["kind"] == "latency" and report["backend"] == "torch" and report["threads"] == 1
    rows = report["rows"]
    assert [(r.name, r.batch, r.seq) for r in rows] == [
        ("teacher", 1, 16), ("teacher", 2, 16), ("student", 1, 16), ("student", 2, 16),
    ]
    for row in rows:
        assert set(row.to_dict()) == ROW_KEYS
        assert 0 < row.p50_ms <= row.p90_ms <= row.p99_ms
        assert row.mean_ms > 0 and row.throughput > 0 and row.achieved_gflops > 0
        assert row.throughput == pytest.approx(row.batch / (row.p50_ms / 1e3))
    assert report["peak_gflops"] > 0
    assert all(r.pct_peak == pytest.approx(100 * r.achieved_gflops / report["peak_gflops"]) for r in rows)
    # torch fp32 rows: against the fp32 peak of the best engine, whose figure is the report's fp32 peak
    peaks = report["peaks"]
    assert peaks["fp32"]["gflops"] == report["peak_gflops"] == peaks["fp32"]["engines"][peaks["fp32"]["best"]]["gflops"]
    assert all(r.precision == "fp32" for r in rows)
    for r in rows:
        floor = r.gflops_per_seq * 1e9 * r.batch / (report["peak_gflops"] * 1e9) * 1e3  # ms at the peak
        assert r.floor_ms == pytest.approx(floor) and r.x_floor == pytest.approx(r.p50_ms / floor)
    assert set(report["theoretical_peaks"]) >= {"fp32", "int8", "basis", "microarchitecture"}
    # what each model's GEMMs ran on, probed in its own worker (compress.eval.latency.kernels)
    assert all(r.kernels["runtime"] == "torch" and "ATen " in r.kernels["summary"] for r in rows)
    assert report["hardware"]["microarchitecture"]


def test_speedup_is_against_the_first_model(grid_report):
    _, report, _ = grid_report
    first = {(r.batch, r.seq): r.p50_ms for r in report["rows"] if r.name == "teacher"}
    for row in report["rows"]:
        expected = 1.0 if row.name == "teacher" else first[(row.batch, row.seq)] / row.p50_ms
        assert row.speedup == pytest.approx(expected)


def test_flops_params_and_size_match_hand_counts(grid_report):
    dirs, report, _ = grid_report
    teacher = [r for r in report["rows"] if r.name == "teacher"][0]
    # Tiny config, per layer with s=16, h=32, a=4 heads*8=32, f=37 (multiply-adds):
    #   4*s*h*a = 4*16*32*32 = 65536   (Q, K, V, output projections)
    #   2*s*s*a = 2*16*16*32 = 16384   (QK^T scores and attention-weighted V)
    #   2*s*h*f = 2*16*32*37 = 37888   (the two FFN matmuls)
    # 119808 per layer, x 2 layers = 239616 MACs, x 2 FLOPs per MAC = 479232 FLOPs.
    assert teacher.gflops_per_seq == pytest.approx(479232 / 1e9, rel=1e-12)
    student = [r for r in report["rows"] if r.name == "student"][0]
    assert student.gflops_per_seq == pytest.approx(479232 / 2 / 1e9, rel=1e-12)

    from compress.core.formats.runtime import load_model

    params = sum(p.numel() for p in load_model(dirs[0]).parameters())  # no tied weights here
    assert teacher.params == params
    weights = dirs[0] / "model.safetensors"
    assert size_on_disk(dirs[0]) == weights.stat().st_size
    assert teacher.size_mb == pytest.approx(weights.stat().st_size / 1e6)


def test_bert_base_flops_at_128_tokens():
    structure = {"num_layers": 12, "hidden_size": 768, "head_size": 64, "heads": [12] * 12, "ffn": [3072] * 12}
    assert flops_per_sequence(structure, 128) / 1e9 == pytest.approx(22.35, abs=0.01)


def test_a_last_layer_of_the_first_token_only_is_counted_for_one_query():
    # h 4, d 2, s 3. Layer 0, 2 heads (a 4), FFN 8: Q K V O 4*3*4*4 = 192, QK^T and AV 2*3*3*4 = 72, FFN 2*3*4*8 = 192.
    # Layer 1, 1 head (a 2), FFN 6, whole: 4*3*4*2 = 96, 2*3*3*2 = 36, 2*3*4*6 = 144; first token only: K and V
    # over 3 tokens 2*3*4*2 = 48, Q and O for one 2*1*4*2 = 16, one query's scores and context 2*1*3*2 = 12, FFN 2*1*4*6 = 48.
    structure = {"num_layers": 2, "hidden_size": 4, "head_size": 2, "heads": [2, 1], "ffn": [8, 6]}
    assert flops_per_sequence(structure, 3) == 2 * (456 + 276)
    assert flops_per_sequence({**structure, "first_token_last_layer": True}, 3) == 2 * (456 + 124)


def test_reports_are_written_and_metrics_appended(grid_report):
    dirs, report, out = grid_report
    assert json.loads((out / "latency.json").read_text())["rows"] == json.loads(json.dumps([r.to_dict() for r in report["rows"]]))
    assert (out / "latency.md").read_text() == format_markdown(report)
    assert not list(out.glob(".*tmp"))  # no temporary files left behind
    for path in dirs:
        record = [m for m in read_metrics(path) if m["kind"] == "latency"][-1]
        assert record["threads"] == 1 and record["backend"] == "torch"
        assert [(r["batch"], r["seq"]) for r in record["rows"]] == [(1, 16), (2, 16)]
        assert record["peak_gflops"] == report["peak_gflops"] and record["hardware"]["cpu"]


def test_markdown_has_header_and_one_row_per_result(grid_report):
    _, report, _ = grid_report
    text = format_markdown(report)
    assert report["hardware"]["cpu"] in text and "GEMM peak" in text and "speed-up vs first" in text
    # the peaks, measured beside theoretical, and one kernel line per model under the table
    assert "| precision | measured | best engine | every engine [kernels' ISA] | theoretical | measured / theoretical |" in text
    fp32 = next(line for line in text.splitlines() if line.startswith("  | fp32 |"))
    ratio = report["peaks"]["fp32"]["gflops"] / report["theoretical_peaks"]["fp32"]["gflops"]
    assert fp32.endswith(f" | {ratio:.0%} |")
    for row in report["rows"]:
        assert f"- {row.name} (torch): {row.kernels['summary']}" in text
    table = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| model")]
    assert len(table) == len(report["rows"])
    for line, row in zip(table, report["rows"]):
        assert line.startswith(f"| {row.name} | {row.batch} | {row.seq} |")


def fake_worker(seconds_by_model: dict[str, list[float]], calls: list[dict]):
    """A stand-in for run_worker: canned timings, so the parent's arithmetic is checked exactly."""
    def run(job, threads, label, bar=None):
        calls.append(job)
        seconds = seconds_by_model[Path(job["model"]).name]
        points = [{"batch": b, "seq": s, "seconds": seconds} for b in job["config"]["batch"] for s in job["config"]["seq"]]
        return {"points": points, "params": 1000, "flops": {"16": 2_000_000}}

    return run


def test_parent_arithmetic_without_peak_or_recording(monkeypatch, two_models):
    import compress.eval.latency.runs as latency

    calls: list[dict] = []
    # teacher p50 = 20 ms, student p50 = 5 ms: the student is 4x faster.
    monkeypatch.setattr(latency, "run_worker", fake_worker({"teacher": [0.01, 0.02, 0.03], "student": [0.005] * 3}, calls))
    before = [read_metrics(d) for d in two_models]
    report = measure_latency(two_models, fast(batch=(1, 4), peak=False, record=False, threads=2))

    assert [job["mode"] for job in calls] == ["model", "model"]  # no peak worker
    assert all(job["config"]["threads"] == 2 for job in calls)
    teacher, student = report["rows"][0], report["rows"][2]
    assert teacher.p50_ms == pytest.approx(20.0) and teacher.mean_ms == pytest.approx(20.0)
    assert teacher.p90_ms == pytest.approx(28.0)  # numpy's linear interpolation
    assert teacher.throughput == pytest.approx(50.0)
    assert teacher.achieved_gflops == pytest.approx(2e6 / 0.02 / 1e9)
    assert report["rows"][1].achieved_gflops == pytest.approx(4 * 2e6 / 0.02 / 1e9)  # batch 4
    assert teacher.speedup == 1.0 and student.speedup == pytest.approx(4.0)
    assert report["peak_gflops"] is None and teacher.pct_peak is None
    assert "n/a" in format_markdown(report) and "4.00x" in format_markdown(report)
    assert [read_metrics(d) for d in two_models] == before


def test_repeated_runs_report_the_median_the_spread_and_the_worst_speedup(monkeypatch, two_models):
    import compress.eval.latency.runs as latency

    # Per call, in order: run 1 (teacher, student, teacher on openvino), run 2, run 3; the teacher's own job is its
    # torch reference (a PyTorch folder runs on torch: not timed twice).
    # p50s (ms): teacher 20, 30, 22; student 5, 10, 4; teacher-openvino 10, 12, 11.
    p50s = iter([20, 5, 10, 30, 10, 12, 22, 4, 11])
    calls: list[dict] = []

    def run(job, threads, label, bar=None):
        calls.append(job)
        seconds = [next(p50s) / 1e3] * 3
        flops = 1_500_000 if job.get("reference") == "openvino" else 2_000_000  # an exported graph may do less work
        return {"points": [{"batch": 1, "seq": 16, "seconds": seconds}], "params": 1000, "flops": {"16": flops},
                "backend": job["config"]["backend"]}

    monkeypatch.setattr(latency, "run_worker", run)
    report = measure_latency(two_models, fast(peak=False, record=False, repeat_runs=3, reference_backends=("torch", "openvino")))
    assert [(Path(j["model"]).name, j.get("reference")) for j in calls] == [
        ("teacher", None), ("student", None), ("teacher", "openvino")] * 3  # interleaved runs
    teacher, student = report["rows"]
    assert list(teacher.runs_p50_ms) == pytest.approx([20, 30, 22]) and teacher.p50_ms == pytest.approx(22.0)
    assert teacher.slowest_run.p50_ms == pytest.approx(30.0) and teacher.slowest_run.p99_ms == pytest.approx(30.0)
    assert student.p50_ms == pytest.approx(5.0) and student.spread_pct == pytest.approx(100 * (10 - 4) / 5)
    assert student.speedup == pytest.approx(22 / 5)
    assert student.speedup_min == pytest.approx(min(20 / 5, 30 / 10, 22 / 4))  # run 2: only 3x
    # the fastest fp32 reference is openvino (median 11 ms); torch eager's is the teacher's own median, 22 ms
    assert student.best_fp32_backend == "openvino" and student.speedup_vs_best_fp32 == pytest.approx(11 / 5)
    assert student.speedup_vs_best_fp32_min == pytest.approx(min(10 / 5, 12 / 10, 11 / 4))
    assert student.speedup_vs_torch == pytest.approx(22 / 5)
    assert report["reference"]["p50_ms"] == {"torch": {"b1,s16": 22.0}, "openvino": {"b1,s16": 11.0}}
    assert report["reference"]["gflops_per_seq"] == {"torch": {"16": 0.002}, "openvino": {"16": 0.0015}}


def test_same_directory_names_are_told_apart(monkeypatch, tmp_path, tokenizer):
    import compress.eval.latency.runs as latency

    dirs = [save_tiny(make_tiny_model(), tokenizer, tmp_path / run / "model") for run in ("a", "b")]
    monkeypatch.setattr(latency, "run_worker", fake_worker({"model": [0.001]}, []))
    report = measure_latency(dirs, fast(record=False))
    assert [r.name for r in report["rows"]] == ["a/model", "b/model"]


def test_sequence_longer_than_positions_is_refused(tiny_model_dir):
    with pytest.raises(CompressError) as err:
        measure_latency([tiny_model_dir], fast(seq=(65,)))  # tiny models have 64 positions
    message = str(err.value)
    assert "\n" not in message and "max_position_embeddings (64)" in message and "--seq 64" in message


def test_missing_model_dir_is_refused(tmp_path, tiny_model_dir):
    with pytest.raises(CompressError, match="does not exist"):
        measure_latency([tiny_model_dir, tmp_path / "nope"], fast())


def test_worker_reports_a_compress_error_as_json(tmp_path, tiny_model_dir):
    import io

    from compress.eval.latency.runs import worker_config
    from compress.eval.latency.worker import worker_main

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_model_dir / "config.json").read_text())  # no weights
    job = {"mode": "model", "model": str(broken), "threads": 1, "config": worker_config(fast(), 1)}
    out = io.StringIO()
    assert worker_main(io.StringIO(json.dumps(job)), out) == 2
    message = json.loads(out.getvalue())["error"]
    assert "has no weights" in message and "\n" not in message


@pytest.mark.e2e
@pytest.mark.parametrize(
    "job, match",
    [
        # A CompressError inside the worker comes back as its own one-line message.
        ({"mode": "model", "model": "x", "config": {"repeats": 0}}, r"^--repeats must be at least 1"),
        # A crash (here a malformed job) becomes a CompressError naming the last stderr line.
        ({"mode": "model"}, r"worker for tiny failed \(exit status 1\): KeyError: 'model'$"),
    ],
)
def test_worker_failures_become_one_line_errors(job, match):
    from compress.eval.latency.runs import run_worker

    with pytest.raises(CompressError, match=match) as err:
        run_worker(job, threads=1, label="tiny")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"batch": (0,)}, "--batch"),
        ({"seq": (0, 128)}, "--seq"),
        ({"seq": ()}, "--seq"),
        ({"repeats": 0}, "--repeats"),
        ({"warmup": -1}, "--warmup"),
        ({"threads": 0}, "--threads"),
        ({"min_seconds": -1.0}, "--min-seconds"),
        ({"max_seconds": -1.0}, "--max-seconds must be 0"),
        ({"min_seconds": 2.0, "max_seconds": 1.0}, r"at least --min-seconds \(2\)"),
        ({"backend": "tensorrt"}, "valid: torch"),
        ({"repeat_runs": 0}, "--repeat-runs"),
        ({"bursts": 0}, "--bursts"),
        ({"bursts": 31}, "--bursts must be between 1 and --repeats"),
        ({"reference_backends": ("torch-int8",)}, "fp32 backends"),
        ({"openvino_shapes": "fixed"}, "--openvino-shapes is static or dynamic"),
    ],
)
def test_config_validation(changes, match):
    with pytest.raises(CompressError, match=match):
        from_dict(LatencyConfig, changes)


class FakeClock:
    """``time.perf_counter`` for :func:`time_calls`: each call of the timed function costs ``cost`` seconds."""

    def __init__(self, cost: float):
        self.now, self.cost, self.calls = 0.0, cost, 0

    def __call__(self) -> float:
        return self.now

    def call(self) -> None:
        self.now += self.cost
        self.calls += 1


@pytest.mark.parametrize(
    "cost, repeats, min_seconds, max_seconds, timed",
    [
        (0.5, 20, 2.0, 0.0, 20),  # no cap: every one of --repeats
        (4.0, 20, 2.0, 20.0, 5),  # 4 s calls: 5 add up to 20 s
        (30.0, 20, 2.0, 20.0, 3),  # never fewer than 3, however slow
        (0.5, 20, 2.0, 20.0, 20),  # under the cap: unchanged
        (0.0625, 20, 2.0, 20.0, 32),  # min_seconds still asks for more passes of a fast model (32 x 1/16 s = 2 s)
    ],
)
def test_max_seconds_caps_the_passes_of_a_slow_point_but_keeps_three(monkeypatch, cost, repeats, min_seconds, max_seconds,
                                                                        timed):
    from compress.eval.latency import worker as latency_worker

    clock = FakeClock(cost)
    monkeypatch.setattr(latency_worker.time, "perf_counter", clock)
    cfg = LatencyConfig(repeats=repeats, min_seconds=min_seconds, max_seconds=max_seconds, warmup=2)
    times = latency_worker.time_calls(clock.call, cfg)
    assert len(times) == timed and clock.calls == timed + 2  # the warm-up calls are not timed
    assert times == pytest.approx([cost] * timed)


def test_config_from_command_line_strings():
    cfg = from_dict(LatencyConfig, {"batch": "1,8", "seq": "128", "threads": "2"})
    assert cfg.grid() == [(1, 128), (8, 128)] and cfg.threads == 2


def test_write_report_refuses_a_file_as_out(tmp_path, grid_report):
    _, report, _ = grid_report
    (tmp_path / "file").write_text("x")
    with pytest.raises(CompressError, match="not a directory"):
        write_report(report, tmp_path / "file")


def test_markdown_flags_rows_above_the_peak(grid_report):
    _, report, _ = grid_report
    assert "exceed the measured GEMM peak" not in format_markdown({**report, "rows": [replace(r, pct_peak=50.0) for r in report["rows"]]})
    above = {**report, "rows": [replace(r, pct_peak=150.0) for r in report["rows"]]}
    assert "exceed the measured GEMM peak" in format_markdown(above)
    # At the peak is possible (the BERT-base shape runs at 100% on OpenVINO): flagged only beyond 1 / 0.95 of it.
    near = {**report, "rows": [replace(r, pct_peak=104.0) for r in report["rows"]]}
    assert "exceed the measured GEMM peak" not in format_markdown(near)
    assert "exceed the measured GEMM peak" in format_markdown({**report, "rows": [replace(r, pct_peak=106.0) for r in report["rows"]]})


@pytest.mark.slow
def test_real_lengths_time_every_sentence_at_its_own_length(two_models, tmp_path):
    texts = ["the movie was good .", "bad", "the plot was not very fun and the actor was awful .", "great film", "a dog sat"]
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    report = measure_latency(two_models, fast(record=False, repeat_runs=2, lengths=str(source), lengths_batch=2,
                                              lengths_passes=1, reference_backends=("torch",)))
    info = report["real_inputs"]
    assert info["n"] == 5 and info["source"] == str(source)
    rows = report["real_rows"]
    assert [(r.name, r.batch) for r in rows] == [("teacher", 1), ("teacher", 2), ("student", 1), ("student", 2)]
    for r in rows:
        assert len(r.runs_sentences_per_s) == 2 and r.sentences_per_s > 0 and r.p99_ms >= r.p50_ms > 0
        assert r.speedup_min <= max(r.speedup, r.speedup_min) and r.best_fp32_backend == "torch"
    # batch 2, sorted: lengths (each + [CLS]/[SEP]) padded per pair; batch 1 computes on the real tokens alone
    assert rows[1].padded_tokens >= rows[0].padded_tokens == info["mean_tokens"] * 5
    assert rows[0].speedup == 1.0
    text = format_markdown(report)
    assert "## Real inputs" in text and "5 sentences" in text and "worst-run speed-up" in text and "vs best fp32" in text


def test_a_wrong_lengths_source_is_refused_before_any_timing(two_models, tmp_path, monkeypatch):
    import compress.eval.latency.runs as latency

    monkeypatch.setattr(latency, "run_worker", lambda *a, **k: pytest.fail("a worker ran"))
    with pytest.raises(CompressError, match="missing.txt"):
        measure_latency(two_models, fast(record=False, lengths=str(tmp_path / "missing.txt")))


def test_the_first_model_in_pytorch_eager_is_the_torch_reference(monkeypatch, two_models):
    import compress.eval.latency.runs as latency

    p50s = {("teacher", None): 40, ("student", None): 8, ("teacher", "openvino"): 10}

    def run(job, threads, label, bar=None):
        ms = p50s[Path(job["model"]).name, job.get("reference")]
        return {"points": [{"batch": 1, "seq": 16, "seconds": [ms / 1e3] * 3}], "params": 1000, "flops": {"16": 2_000_000},
                "backend": job.get("reference") or "torch"}

    monkeypatch.setattr(latency, "run_worker", run)
    report = measure_latency(two_models, fast(peak=False, record=False, reference_backends=("openvino",)))
    student = report["rows"][1]
    assert student.best_fp32_backend == "openvino" and student.speedup_vs_best_fp32 == pytest.approx(10 / 8)
    assert student.speedup_vs_torch == pytest.approx(40 / 8)  # the teacher's own PyTorch eager timing
    header = next(line for line in format_markdown(report).splitlines() if line.startswith("| model |"))
    assert header.endswith("| x floor | vs best fp32 (worst run) | vs PyTorch eager |") and "||" not in header


def test_bursts_take_turns_and_pool_passes(monkeypatch, two_models):
    """--bursts: every worker loads first, then per point each times its share in turn, round after round."""
    import compress.eval.latency.runs as latency

    events = []

    class FakeServed:
        def __init__(self, job, threads, label):
            self.name, self.seconds = Path(job["model"]).name, []
            events.append(("start", self.name, job["mode"]))

        def wait_ready(self):
            events.append(("ready", self.name))

        def ask(self, request, key):
            if "burst" in request:
                batch, seq, passes, _ = request["burst"]
                events.append(("burst", self.name, batch, passes))
                times = [(1.0 if self.name == "teacher" else 0.5) / 1e3] * passes
                self.seconds += times
                return times
            events.append(("finish", self.name))
            return {"points": [{"batch": 1, "seq": 16, "seconds": self.seconds[:10]},
                               {"batch": 2, "seq": 16, "seconds": self.seconds[10:]}],
                    "params": 1000, "flops": {"16": 2_000_000}, "backend": "torch"}

        def close(self):
            events.append(("close", self.name))

    monkeypatch.setattr(latency, "_Served", FakeServed)
    monkeypatch.setattr(latency, "BURST_PAUSE_S", 0.0)
    report = measure_latency(two_models, fast(batch=(1, 2), repeats=10, bursts=4, record=False))
    assert events[:4] == [("start", "teacher", "serve"), ("start", "student", "serve"), ("ready", "teacher"), ("ready", "student")]
    bursts = [e[1:] for e in events if e[0] == "burst"]
    # 10 passes in 4 bursts: 3, 3, 2, 2; the two models alternate within each point
    assert bursts == [(m, b, n) for b in (1, 2) for n in (3, 3, 2, 2) for m in ("teacher", "student")]
    assert events[-4:] == [("finish", "teacher"), ("finish", "student"), ("close", "teacher"), ("close", "student")]
    teacher, student = [r for r in report["rows"] if r.batch == 1]
    assert teacher.p50_ms == pytest.approx(1.0) and student.speedup == pytest.approx(2.0)
    assert "in 4 bursts, the models taking turns" in format_markdown(report)


def test_bursts_take_turns_on_the_real_inputs_until_the_last_model_is_done(monkeypatch, two_models, tmp_path):
    """--bursts with --lengths: after the grid, round after round every worker times the real inputs for a slice; a
    model whose passes are done keeps its turns for extra passes until the last model is done; then every worker
    finishes."""
    import compress.eval.latency.runs as latency

    source = tmp_path / "texts.txt"
    source.write_text("a good film\nbad\n", encoding="utf-8")
    slices_needed = {"teacher": 3, "student": 1}  # per batch size: the slow model needs more turns
    events = []

    class FakeServed:
        def __init__(self, job, threads, label):
            self.name, self.slices = Path(job["model"]).name, {}

        def wait_ready(self):
            pass

        def ask(self, request, key):
            if "burst" in request:
                return [1e-3] * request["burst"][2]
            if "real" in request:
                batch, seconds, extra = request["real"]
                assert key == "more" and seconds == latency.REAL_SLICE_S
                events.append((self.name, batch, extra))
                self.slices[batch] = self.slices.get(batch, 0) + 1
                return self.slices[batch] < slices_needed[self.name]  # extra slices count on: they say no more
            events.append((self.name, "finish"))
            return {"points": [{"batch": 1, "seq": 16, "seconds": [1e-3] * 3}], "params": 1000,
                    "flops": {"16": 2_000_000}, "backend": "torch"}

        def close(self):
            pass

    monkeypatch.setattr(latency, "_Served", FakeServed)
    monkeypatch.setattr(latency, "BURST_PAUSE_S", 0.0)
    jobs = [(p.name, {"mode": "model", "model": str(p)}) for p in two_models]
    latency.run_interleaved(jobs, fast(repeats=4, bursts=2, lengths=str(source), lengths_batch=8), 1)
    # Round 1: both time their passes, the student's are done; round 2: the student times extra ones; round 3: the
    # teacher's last slice ends the rounds, before the student's turn.
    turns = [("teacher", False), ("student", False), ("teacher", False), ("student", True), ("teacher", False)]
    assert events == ([(name, 1, extra) for name, extra in turns] + [(name, 8, extra) for name, extra in turns]
                      + [("teacher", "finish"), ("student", "finish")])


@pytest.mark.slow
def test_bursts_real_workers_time_the_real_inputs_as_one_shot_workers_do(two_models, tmp_path):
    """Served worker processes taking turns on the real inputs: every pass over every sentence, as one-shot workers
    (the model done last times its passes; the other, extra ones while it waited)."""
    import compress.eval.latency.runs as latency

    source = tmp_path / "texts.txt"
    source.write_text("the movie was good .\nbad\nthe plot was not very fun and the actor was awful .\n", encoding="utf-8")
    cfg = fast(record=False, lengths=str(source), lengths_batch=2, lengths_passes=3, repeats=4, bursts=2)
    jobs = [(p.name, {"mode": "model", "model": str(p), "config": latency.worker_config(cfg, 1)}) for p in two_models]
    turns = latency.run_interleaved(jobs, cfg, 1)
    one_shot = [latency.run_worker(job, 1, name) for name, job in jobs]
    key = lambda real: {b: (r["n_sentences"], r["n_batches"], r["padded_tokens"]) for b, r in real["batches"].items()}
    assert [key(d["real"]) for d in turns] == [key(d["real"]) for d in one_shot]
    # 3 sentences: batch 1 computes on the real tokens alone, batch 2 is two padded batches
    batch1, batch2 = key(turns[0]["real"])["1"], key(turns[0]["real"])["2"]
    assert batch1 == (3, 3, turns[0]["real"]["inputs"]["mean_tokens"] * 3) and batch2[:2] == (3, 2)
    for b in ("1", "2"):  # 3 passes for the one-shot workers and the model done last; never fewer
        passes = [d["real"]["batches"][b]["passes"] for d in turns]
        assert [d["real"]["batches"][b]["passes"] for d in one_shot] == [3, 3] and min(passes) == 3
    assert all(r["sentences_per_s"] > 0 for d in turns for r in d["real"]["batches"].values())
    report = measure_latency(two_models, cfg)
    assert [(r.name, r.batch) for r in report["real_rows"]] == [("teacher", 1), ("teacher", 2), ("student", 1), ("student", 2)]
    assert all(len(r.runs_passes) == 1 and r.runs_passes[0] >= 3 for r in report["real_rows"])
    assert "turns of 0.5 s" in format_markdown(report)
    assert "turns of" not in format_markdown(measure_latency(two_models, fast(record=False, lengths=str(source))))


def test_bursts_close_every_worker_when_one_fails(monkeypatch, two_models):
    import compress.eval.latency.runs as latency

    closed = []

    class FailingServed:
        def __init__(self, job, threads, label):
            self.name = Path(job["model"]).name

        def wait_ready(self):
            if self.name == "student":
                raise CompressError("the latency worker for student failed (exit status 1): boom")

        def ask(self, request, key):  # pragma: no cover - never reached
            raise AssertionError("no burst after a failed load")

        def close(self):
            closed.append(self.name)

    monkeypatch.setattr(latency, "_Served", FailingServed)
    with pytest.raises(CompressError, match="worker for student failed"):
        measure_latency(two_models, fast(repeats=4, bursts=2, record=False))
    assert closed == ["teacher", "student"]


@pytest.mark.slow
def test_bursts_real_workers_time_every_pass(two_models):
    """Two served worker processes: each model's passes of a point pooled, the same report as one-shot workers."""
    report = measure_latency(two_models, fast(repeats=6, bursts=3, record=False, repeat_runs=2))
    assert [r.name for r in report["rows"]] == ["teacher", "student"]
    assert all(len(r.runs_p50_ms) == 2 and r.p50_ms > 0 for r in report["rows"])
    assert report["config"]["bursts"] == 3
    import compress.eval.latency.runs as latency

    cfg = fast(repeats=7, bursts=3, record=False, batch=(1, 2))
    jobs = [(p.name, {"mode": "model", "model": str(p), "config": latency.worker_config(cfg, 1)}) for p in two_models]
    done = latency.run_interleaved(jobs, cfg, 1)
    assert [[(pt["batch"], len(pt["seconds"])) for pt in d["points"]] for d in done] == [[(1, 7), (2, 7)]] * 2


@pytest.mark.e2e
def test_bursts_real_worker_error_is_one_line(tmp_path, two_models):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in two_models[1].iterdir():
        if f.is_file():
            (broken / f.name).write_bytes(f.read_bytes())
    weights = next(broken.glob("*.safetensors"))
    weights.write_bytes(b"not a safetensors file")
    with pytest.raises(CompressError) as err:
        measure_latency([two_models[0], broken], fast(repeats=4, bursts=2, record=False))
    assert "broken" in str(err.value) and "\n" not in str(err.value)


def test_each_grid_point_runs_a_forward_compiled_for_its_shape(monkeypatch, tiny_model_dir):
    from compress.eval.latency.backends import BACKENDS
    from compress.eval.latency.worker import Timing

    calls = []
    real = BACKENDS.get("torch")

    def shaped_backend(model_dir, cfg):  # torch, plus "compiled" forwards that record their shape and their input's
        session = real(model_dir, cfg)
        session.compile_for = lambda shape: (lambda inputs: calls.append((shape, tuple(inputs["input_ids"].shape))))
        return session

    monkeypatch.setitem(BACKENDS._items, "torch", shaped_backend)
    timing = Timing(Path(tiny_model_dir), {"backend": "torch", "batch": (1, 2), "seq": (16,), "warmup": 2,
                                           "repeats": 3, "threads": 1, "peak": False})
    timing.burst(1, 16, 3)
    assert len(calls) == 1 + 2 + 3 and set(calls) == {((1, 16), (1, 16))}  # the untimed first call, warm-up, timed passes
    timing.burst(2, 16, 3)
    timing.burst(2, 16, 2)  # a later burst of the same point: no warm-up, the same compiled forward
    assert calls[6:] == [((2, 16), (2, 16))] * (1 + 2 + 3 + 2)
    assert sorted(timing.shaped) == [(2, 16)]  # one compiled model kept at a time: the last point's
    timing.burst(1, 16, 1)  # back to an earlier point: compiled again, not run on the wrong shape
    assert calls[-1] == ((1, 16), (1, 16)) and sorted(timing.shaped) == [(1, 16)]


def test_onnxruntime_rows_time_the_runtime_call_on_feeds_built_beforehand(tiny_model_dir):
    """The timed forward is the session's own call: numpy in, numpy out, the same logits as the model's forward."""
    import numpy as np
    import torch

    from compress.core.formats.runtime import load_model
    from compress.eval.latency.backends import onnxruntime_session

    session = onnxruntime_session(Path(tiny_model_dir), fast(backend="onnxruntime"))
    batch = {"input_ids": np.array([[2, 7, 9, 4, 3], [2, 5, 3, 0, 0]]), "attention_mask": np.array([[1] * 5, [1, 1, 1, 0, 0]]),
             "token_type_ids": np.zeros((2, 5), dtype=np.int32)}  # int32 types: the feeds cast them to the graph's int64
    feeds = session.prepare(batch)
    assert all(isinstance(v, np.ndarray) and v.dtype == np.int64 for v in feeds.values())
    (logits,) = session.forward(feeds)
    assert isinstance(logits, np.ndarray) and logits.shape == (2, 2)
    with torch.no_grad():
        expected = load_model(tiny_model_dir)(**{k: torch.from_numpy(v).long() for k, v in batch.items()}).logits
    np.testing.assert_allclose(logits, expected.numpy(), atol=1e-5)


def test_the_cpu_generation_is_read_from_cpuinfo_and_shown_in_the_header(grid_report):
    from compress.core.hardware import parse_cpuinfo

    text = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
            "stepping\t: 1\nphysical id\t: 0\ncore id\t\t: 0\nflags\t\t: fpu avx512f avx512_vnni\n\n"
            "processor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\nstepping\t: 1\n"
            "physical id\t: 0\ncore id\t\t: 1\nflags\t\t: fpu avx512f avx512_vnni\n")
    parsed = parse_cpuinfo(text)
    assert parsed["name"] == "AMD EPYC" and parsed["generation"] == "family 26 model 2 stepping 1"
    assert parsed["physical"] == {("0", "0"), ("0", "1")} and {"avx512f", "avx512_vnni"} <= parsed["flags"]
    assert parse_cpuinfo("processor\t: 0\nFeatures\t: asimd\n")["generation"] is None  # an ARM cpuinfo has no family
    _, measured, _ = grid_report
    report = {**measured, "hardware": {**measured["hardware"], "cpu": "AMD EPYC", "arch": "x86_64",
                                       "generation": "family 26 model 2 stepping 1", "core": "AMD Zen 5"}}
    assert "- CPU: AMD EPYC (x86_64, family 26 model 2 stepping 1, AMD Zen 5), " in format_markdown(report)


def test_kernel_lines_name_each_model_and_reference_backend_once():
    from compress.eval.latency.report import kernel_lines

    torch_k = {"summary": "MKL SGEMM x12; ATen AVX2", "isa": None, "reported": True, "note": None}
    ort_k = {"summary": "MLAS SGEMM FMA3 (by cpuid; inferred: ONNX Runtime reports no kernels)", "isa": "avx2",
             "reported": False, "note": None}
    ov_k = {"summary": "FullyConnected brgemm_avx512_amx_bf16 (bf16) x36; inference precision bf16", "isa": "amx",
            "reported": True, "note": None}
    rows = [Row(name="teacher", backend="torch", batch=1, seq=128, p50_ms=1.0, kernels=torch_k),
            Row(name="teacher", backend="torch", batch=32, seq=128, p50_ms=9.0, kernels=torch_k),
            Row(name="int8", backend="onnxruntime-int8", batch=1, seq=128, p50_ms=0.5)]
    # The torch reference is the first model's own run: listed once.
    lines = kernel_lines(rows, {"model": "teacher", "kernels": {"torch": torch_k, "onnxruntime": ort_k, "openvino": ov_k}})
    assert len(lines) == 6
    assert lines[-3:] == [
        "- teacher (torch): MKL SGEMM x12; ATen AVX2 [ISA not reported]",
        "- teacher (reference onnxruntime): MLAS SGEMM FMA3 (by cpuid; inferred: ONNX Runtime reports no kernels) "
        "[avx2, inferred]",
        "- teacher (reference openvino): FullyConnected brgemm_avx512_amx_bf16 (bf16) x36; inference precision bf16 [amx]",
    ]
    assert kernel_lines([Row(name="m", backend="torch", batch=1, seq=128, p50_ms=1.0)]) == []  # an old record: no section

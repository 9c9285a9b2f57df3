"""Real-length latency: reading tasks and files, dynamic-padding batches, and the timing arithmetic.

Timings run on a fake model and a fake clock: one forward call costs A + C * (b * s) seconds
for a (b, s) batch, so every reported number is checked against a hand computation.
"""

from __future__ import annotations

import numpy as np
import pytest

from compress.core.errors import CompressError
from compress.eval.latency.lengths import RealInputs, RealTimer, batches, real_inputs, time_real

A, C = 1e-3, 1e-4  # seconds per call, seconds per (padded) token: 1 ms + 0.1 ms per token


class FakeModel:
    """A forward that advances a fake clock by A + C * b * s (plus ``extra[call]``), and records its calls."""

    def __init__(self, extra: dict[int, float] | None = None):
        self.now, self.calls, self.extra = 0.0, [], extra or {}

    def clock(self) -> float:
        return self.now

    def forward(self, feed: dict[str, np.ndarray]) -> None:
        b, s = feed["input_ids"].shape
        self.now += A + C * b * s + self.extra.get(len(self.calls), 0.0)
        self.calls.append(feed)


def known(lengths) -> RealInputs:
    """Sentence i is ``lengths[i]`` copies of the id 10 + i, segment 0 then 1 for its second half."""
    ids = tuple(np.full(n, 10 + i, dtype=np.int64) for i, n in enumerate(lengths))
    types = tuple(np.array([0] * (n // 2) + [1] * (n - n // 2), dtype=np.int64) for n in lengths)
    return RealInputs(ids, types, "hand-made")


def sentences_in(feeds) -> list[int]:
    """Which sentence each unpadded row is (by its id), in batch order; asserts each row is one sentence."""
    found = []
    for feed in feeds:
        for ids, mask in zip(feed["input_ids"], feed["attention_mask"]):
            real = ids[mask == 1]
            assert len(set(real.tolist())) == 1 and len(real) > 0
            found.append(int(real[0]) - 10)
    return found


LENGTHS = (5, 3, 7, 4, 6)


# ---------------------------------------------------------------------------- RealInputs


def test_length_figures_of_a_known_set():
    inputs = known(LENGTHS)
    assert inputs.n == 5 and inputs.lengths.tolist() == [5, 3, 7, 4, 6]
    assert (inputs.mean_tokens, inputs.median_tokens, inputs.max_tokens, inputs.total_tokens) == (5.0, 5.0, 7, 25)
    assert inputs.stats()["n_truncated"] == 0
    with pytest.raises(ValueError):
        inputs.ids[0][0] = 1  # frozen all the way down


# ---------------------------------------------------------------------------- batches


def test_batch_1_keeps_order_and_each_own_length():
    feeds = batches(known(LENGTHS), 1)
    assert [f["input_ids"].shape for f in feeds] == [(1, 5), (1, 3), (1, 7), (1, 4), (1, 6)]
    assert sentences_in(feeds) == [0, 1, 2, 3, 4]
    assert all(f["attention_mask"].all() for f in feeds)  # nothing padded
    assert all(f[k].dtype == np.int64 for f in feeds for k in ("input_ids", "attention_mask", "token_type_ids"))


def test_larger_batches_sort_stably_pad_to_each_chunks_longest_and_hold_every_sentence_once():
    lengths = (5, 3, 7, 3, 6, 4)  # a tie at 3: sentence 1 before sentence 3
    feeds = batches(known(lengths), 3, pad_id=99)
    assert [f["input_ids"].shape for f in feeds] == [(3, 4), (3, 7)]
    assert sentences_in(feeds) == [1, 3, 5, 0, 4, 2]
    assert sorted(sentences_in(batches(known(lengths), 4))) == list(range(6))  # a short last chunk too
    first = feeds[0]
    # Sentence 1 (3 tokens) in a chunk of 4: one pad position, masked, pad id, segment 0.
    assert first["input_ids"][0].tolist() == [11, 11, 11, 99]
    assert first["attention_mask"][0].tolist() == [1, 1, 1, 0]
    assert first["token_type_ids"][0].tolist() == [0, 1, 1, 0]
    for feed in feeds:
        pad = feed["attention_mask"] == 0
        assert (feed["input_ids"][pad] == 99).all() and (feed["token_type_ids"][pad] == 0).all()
        assert (feed["input_ids"][~pad] != 99).all()


def test_batch_below_1_is_refused():
    with pytest.raises(CompressError, match="at least 1"):
        batches(known(LENGTHS), 0)


def test_a_padding_multiple_rounds_each_length_up_but_never_past_the_limit():
    inputs = RealInputs(known((5, 3, 7, 4, 6)).ids, known((5, 3, 7, 4, 6)).type_ids, "hand-made", max_length=6 + 1)
    assert [f["input_ids"].shape for f in batches(inputs, 1, multiple=4)] == [(1, 7), (1, 4), (1, 7), (1, 4), (1, 7)]
    # 5 -> 8 and 6 -> 8 would pass the limit of 7: cut to 7; 7 stays 7
    feeds = batches(inputs, 2, multiple=3)  # sorted 3 4 | 5 6 | 7 -> 6, 6, 7 (9 is past the limit)
    assert [f["input_ids"].shape for f in feeds] == [(2, 6), (2, 6), (1, 7)]
    assert sentences_in(feeds) == [1, 3, 0, 4, 2] and int(feeds[0]["attention_mask"].sum()) == 3 + 4
    with pytest.raises(CompressError, match="padding multiple must be at least 1"):
        batches(inputs, 1, multiple=0)


def test_a_forward_is_made_once_per_padded_shape_before_timing_and_each_batch_runs_its_own():
    model = FakeModel()
    made, ran = [], []

    def forward_for(shape):
        made.append((shape, len(model.calls)))  # when: before any call of the model

        def run(feed):
            ran.append(shape)
            assert feed["input_ids"].shape == shape
            model.forward(feed)
        return run

    result = time_real(lambda feed: pytest.fail("the any-shape forward ran"), known(LENGTHS), 1, warmup=2, passes=2,
                       multiple=4, forward_for=forward_for, clock=model.clock)
    # lengths 5 3 7 4 6 -> padded 8 4 8 4 8: two shapes, each made once, before the first call
    assert made == [((1, 8), 0), ((1, 4), 0)]
    assert ran == [(1, 8), (1, 4)] + [(1, 8), (1, 4), (1, 8), (1, 4), (1, 8)] * 2  # warm-up, then 2 passes
    assert result["padded_tokens"] == 3 * 8 + 2 * 4 and result["real_tokens"] == 25
    assert result["shapes"] == 2 and result["multiple"] == 4
    assert result["p50_ms"] == pytest.approx(1.8)  # 1 ms + 0.1 ms x 8 padded tokens for 3 of 5 sentences


# ---------------------------------------------------------------------------- timing, by hand


def test_batch_1_numbers_by_hand():
    model = FakeModel()
    result = time_real(model.forward, known(LENGTHS), 1, warmup=0, clock=model.clock)
    # Per sentence 1 + 0.1 * len ms: 1.5, 1.3, 1.7, 1.4, 1.6; sorted 1.3 1.4 1.5 1.6 1.7.
    assert result["p50_ms"] == pytest.approx(1.5)
    assert result["p99_ms"] == pytest.approx(1.6 + 0.96 * 0.1)  # numpy's linear rank 0.99 * 4 = 3.96
    assert result["total_s"] == pytest.approx(7.5e-3)
    assert result["sentences_per_s"] == pytest.approx(5 / 7.5e-3)
    assert (result["batch"], result["n_sentences"], result["n_batches"]) == (1, 5, 5)
    assert result["padded_tokens"] == result["real_tokens"] == 25 and result["mean_tokens"] == 5.0


def test_batch_2_numbers_by_hand_show_sorting_and_dynamic_padding():
    model = FakeModel()
    result = time_real(model.forward, known(LENGTHS), 2, warmup=0, clock=model.clock)
    # Sorted 3 4 5 6 7 -> chunks (3, 4) (5, 6) (7): 2x4 + 2x6 + 1x7 = 27 padded tokens
    # (in the set's order it would be 2x5 + 2x7 + 1x6 = 30). Times 1.8, 2.2, 1.7 ms.
    assert result["padded_tokens"] == 27 and result["real_tokens"] == 25
    assert result["n_batches"] == 3
    assert result["p50_ms"] == pytest.approx(1.8)
    assert result["p99_ms"] == pytest.approx(1.8 + 0.98 * 0.4)  # rank 0.99 * 2 = 1.98
    assert result["total_s"] == pytest.approx(5.7e-3)
    assert result["sentences_per_s"] == pytest.approx(5 / 5.7e-3)


def test_batch_3_numbers_by_hand():
    model = FakeModel()
    result = time_real(model.forward, known((5, 3, 7, 3, 6, 4)), 3, warmup=0, clock=model.clock)
    # Sorted 3 3 4 | 5 6 7: 3x4 + 3x7 = 33 padded tokens (unsorted: 3x7 + 3x6 = 39). Times 2.2, 3.1 ms.
    assert result["padded_tokens"] == 33
    assert result["p50_ms"] == pytest.approx(2.65)
    assert result["p99_ms"] == pytest.approx(2.2 + 0.99 * 0.9)
    assert result["sentences_per_s"] == pytest.approx(6 / 5.3e-3)


def test_warm_up_calls_are_untimed_and_go_to_the_first_batches():
    # Warm-up calls cost 1 s each: none of it may show in the numbers.
    model = FakeModel(extra={i: 1.0 for i in range(4)})
    result = time_real(model.forward, known(LENGTHS), 2, warmup=4, passes=2, clock=model.clock)
    assert len(model.calls) == 4 + 2 * 3
    shapes = [c["input_ids"].shape for c in model.calls]
    assert shapes[:4] == [(2, 4), (2, 6), (1, 7), (2, 4)]  # cycling over the 3 batches
    assert result["p50_ms"] == pytest.approx(1.8) and result["total_s"] == pytest.approx(5.7e-3)


def test_a_slow_call_in_one_pass_is_outvoted_by_the_median():
    # Pass 2 of 3, sentence 3: +100 ms. Per-batch medians and the median pass ignore it.
    model = FakeModel(extra={5 + 2: 0.1})
    result = time_real(model.forward, known(LENGTHS), 1, warmup=0, passes=3, clock=model.clock)
    assert len(model.calls) == 15
    assert result["p50_ms"] == pytest.approx(1.5) and result["p99_ms"] == pytest.approx(1.696)
    assert result["sentences_per_s"] == pytest.approx(5 / 7.5e-3)


def test_max_seconds_stops_the_passes_once_they_add_up_to_it():
    # A pass over the 5 sentences at batch 1 costs 7.5 ms: after 2 passes (15 ms) the 3rd, 4th and 5th are not run.
    model = FakeModel()
    result = time_real(model.forward, known(LENGTHS), 1, warmup=0, passes=5, max_seconds=0.012, clock=model.clock)
    assert len(model.calls) == 2 * 5 and result["passes"] == 2
    assert result["p50_ms"] == pytest.approx(1.5) and result["total_s"] == pytest.approx(7.5e-3)
    # One pass always runs, however slow; without a cap every pass does.
    model = FakeModel()
    assert time_real(model.forward, known(LENGTHS), 1, warmup=0, passes=3, max_seconds=1e-6, clock=model.clock)["passes"] == 1
    assert len(model.calls) == 5
    model = FakeModel()
    assert time_real(model.forward, known(LENGTHS), 1, warmup=0, passes=3, clock=model.clock)["passes"] == 3


def test_min_seconds_adds_passes_until_they_add_up_to_it():
    # A pass costs 7.5 ms: 2 asked, but 4 passes make 30 ms < 35, so a 5th runs (37.5 ms).
    model = FakeModel()
    result = time_real(model.forward, known(LENGTHS), 1, warmup=0, passes=2, min_seconds=0.035, clock=model.clock)
    assert result["passes"] == 5 and len(model.calls) == 25 and result["total_s"] == pytest.approx(7.5e-3)
    # max_seconds wins over min_seconds: no pass starts past it (20 ms: after the 3rd, 22.5 ms).
    model = FakeModel()
    result = time_real(model.forward, known(LENGTHS), 1, warmup=0, passes=2, min_seconds=0.035, max_seconds=0.02,
                       clock=model.clock)
    assert result["passes"] == 3


def test_a_timer_advanced_in_slices_times_the_same_calls_as_one_go_and_gives_the_same_figures():
    # Batch 1, 5 sentences of 1.5 1.3 1.7 1.4 1.6 ms, 2 passes: slices of 3 ms stop once their calls reach 3 ms.
    model = FakeModel()
    whole = time_real(model.forward, known(LENGTHS), 1, warmup=1, passes=2, clock=model.clock)
    model = FakeModel()
    timer = RealTimer(model.forward, known(LENGTHS), 1, warmup=1, passes=2, clock=model.clock)
    assert len(model.calls) == 1  # the warm-up, at once; nothing timed yet
    calls_per_slice = []
    while True:
        before = len(model.calls)
        more = timer.advance(3e-3)
        calls_per_slice.append(len(model.calls) - before)
        if not more:
            break
    # 1.5 + 1.3 + 1.7 = 4.5 ms | 1.4 + 1.6 (pass 1 ends) = 3.0 | 1.5 + 1.3 + 1.7 | 1.4 + 1.6 (pass 2 ends, no 3rd)
    assert calls_per_slice == [3, 2, 3, 2]
    assert [int(c["input_ids"][0, 0]) - 10 for c in model.calls[1:]] == [0, 1, 2, 3, 4] * 2  # each pass in order
    result = timer.result()
    assert result["passes"] == 2 and result["total_s"] == pytest.approx(7.5e-3) and result["p50_ms"] == pytest.approx(1.5)
    assert result == pytest.approx(whole)
    assert timer.advance(1.0) is False and len(model.calls) == 11  # finished: nothing more is timed


def test_a_slice_always_times_one_call_and_the_result_waits_for_the_last_pass():
    model = FakeModel()
    timer = RealTimer(model.forward, known(LENGTHS), 1, warmup=0, passes=1, clock=model.clock)
    assert timer.advance(0.0) is True and len(model.calls) == 1  # a zero-second slice still moves on by one batch
    with pytest.raises(CompressError, match="not finished"):
        timer.result()
    # min_seconds and max_seconds decide at pass boundaries, as in one go: 7.5 ms a pass, 20 ms asked -> 3 passes.
    model = FakeModel()
    timer = RealTimer(model.forward, known(LENGTHS), 1, warmup=0, passes=1, min_seconds=0.02, clock=model.clock)
    while timer.advance(1e-3):
        pass
    assert timer.result()["passes"] == 3 and len(model.calls) == 15


def test_extra_passes_go_on_past_the_last_one_and_only_whole_passes_count():
    # Batch 1, 5 sentences of 1.5 1.3 1.7 1.4 1.6 ms (7.5 ms a pass); a slow spell doubles pass 1 (15 ms).
    model = FakeModel(extra={i: 1.5e-3 for i in range(5)})
    timer = RealTimer(model.forward, known(LENGTHS), 1, warmup=0, passes=1, clock=model.clock)
    assert timer.advance(1.0) is False and timer.result()["total_s"] == pytest.approx(15e-3)
    assert timer.advance(1.0) is False and len(model.calls) == 5  # without extra, nothing more
    # An 11 ms extra slice: pass 2 whole (7.5 ms), then 1.5 + 1.3 + 1.7 of pass 3 (12.0 ms >= 11): cut short.
    assert timer.advance(11e-3, extra=True) is False and len(model.calls) == 13
    result = timer.result()
    assert result["passes"] == 2 and result["total_s"] == pytest.approx((15e-3 + 7.5e-3) / 2)
    # The next slice finishes pass 3 (1.4 + 1.6 = 3.0 ms), times pass 4 (10.5 ms) and stops 1.5 ms into pass 5.
    timer.advance(11e-3, extra=True)
    assert len(model.calls) == 21
    result = timer.result()  # passes of 15, 7.5, 7.5, 7.5 ms: the slow spell's no longer the median
    assert result["passes"] == 4 and result["total_s"] == pytest.approx(7.5e-3)
    assert result["sentences_per_s"] == pytest.approx(5 / 7.5e-3) and result["p50_ms"] == pytest.approx(1.5)
    assert [int(c["input_ids"][0, 0]) - 10 for c in model.calls] == [0, 1, 2, 3, 4] * 4 + [0]
    with pytest.raises(CompressError, match="slice"):
        timer.advance(extra=True)  # without a slice's end it would never stop


def test_bad_counts_are_refused():
    model = FakeModel()
    with pytest.raises(CompressError, match="passes"):
        time_real(model.forward, known(LENGTHS), 1, passes=0, clock=model.clock)
    with pytest.raises(CompressError, match="warm-up"):
        time_real(model.forward, known(LENGTHS), 1, warmup=-1, clock=model.clock)


# ---------------------------------------------------------------------------- sources


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_single_sentence_task_from_a_glue_folder(tmp_path, tokenizer):
    _write(tmp_path / "glue" / "SST-2" / "dev.tsv",
           "sentence\tlabel\ngood film .\t1\nbad\t0\nthe movie was not very good\t1\n")
    inputs = real_inputs("sst2", tokenizer, data_dir=str(tmp_path / "glue"))
    assert inputs.lengths.tolist() == [3 + 2, 1 + 2, 6 + 2]  # words + [CLS] + [SEP]
    assert inputs.ids[1].tolist() == [tokenizer.cls_token_id, tokenizer.convert_tokens_to_ids("bad"), tokenizer.sep_token_id]
    assert all(t.tolist() == [0] * len(t) for t in inputs.type_ids)
    assert "SST-2 dev" in inputs.source
    assert real_inputs("SST-2", tokenizer, data_dir=str(tmp_path / "glue"), limit=2).n == 2
    cut = real_inputs("sst2", tokenizer, data_dir=str(tmp_path / "glue"), max_length=8)
    assert cut.max_tokens == 8 and cut.n_truncated == 1


def test_a_pair_task_is_encoded_as_pairs(tmp_path, tokenizer):
    _write(tmp_path / "MRPC" / "dev.tsv",
           "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tthe cat sat .\ta cat sat\n0\t3\t4\tyes\tno no\n")
    inputs = real_inputs("mrpc", tokenizer, data_dir=str(tmp_path))
    # [CLS] the cat sat . [SEP] a cat sat [SEP]: segment 1 from the second text through its [SEP].
    assert inputs.lengths.tolist() == [10, 6]
    assert inputs.type_ids[0].tolist() == [0] * 6 + [1] * 4
    assert inputs.type_ids[1].tolist() == [0, 0, 0, 1, 1, 1]
    feeds = batches(inputs, 2)
    assert (feeds[0]["token_type_ids"] == 1).sum() == 4 + 3


def test_a_task_with_two_dev_splits_takes_the_first(tmp_path, tokenizer):
    header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"
    _write(tmp_path / "MNLI" / "dev_matched.tsv", header + "0\t1\t1\tfic\tyes\tno\tneutral\tneutral\n")
    _write(tmp_path / "MNLI" / "dev_mismatched.tsv", header + "0\t1\t1\tfic\tyes yes yes\tno\tneutral\tneutral\n")
    inputs = real_inputs("mnli", tokenizer, data_dir=str(tmp_path))
    assert inputs.lengths.tolist() == [5] and "dev_matched" in inputs.source


def test_a_txt_file_one_text_per_line_blank_lines_skipped(tmp_path, tokenizer):
    path = _write(tmp_path / "texts.txt", "good film\n\n   \nthe cat sat on the mat\n")
    inputs = real_inputs(str(path), tokenizer)
    assert inputs.lengths.tolist() == [4, 8] and inputs.source == str(path)
    assert real_inputs(str(path), tokenizer, limit=1).n == 1


def test_tsv_and_jsonl_files_single_and_pair(tmp_path, tokenizer):
    single = _write(tmp_path / "s.tsv", 'id\tsentence\n1\the said "no\n2\tgood\n')  # a bare quote is text
    assert real_inputs(str(single), tokenizer).lengths.tolist() == [4 + 2, 1 + 2]  # he said " no: the quote is a token
    pair = _write(tmp_path / "p.tsv", "sentence1\tsentence2\nyes\tno no\n")
    inputs = real_inputs(str(pair), tokenizer)
    assert inputs.type_ids[0].tolist() == [0, 0, 0, 1, 1, 1]
    lines = _write(tmp_path / "p.jsonl", '{"sentence1": "yes", "sentence2": "no no"}\n\n{"sentence1": "a", "sentence2": "b"}\n')
    inputs = real_inputs(str(lines), tokenizer)
    assert inputs.lengths.tolist() == [6, 5] and inputs.type_ids[0].tolist() == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("make, source, message", [
    (None, "missing.txt", "does not exist"),
    (None, "sst3", "unknown input source 'sst3'"),
    ("empty.txt", None, "has no texts"),
    ("header-only.tsv", None, "has no texts"),
    ("columns.tsv", None, "no 'sentence' column"),
])
def test_error_lines(tmp_path, tokenizer, make, source, message):
    contents = {"empty.txt": "\n  \n", "header-only.tsv": "sentence\tlabel\n", "columns.tsv": "text\tlabel\ngood\t1\n"}
    if make:
        source = str(_write(tmp_path / make, contents[make]))
    with pytest.raises(CompressError, match=message) as err:
        real_inputs(source, tokenizer)
    assert "\n" not in str(err.value) and "pass" in str(err.value)  # one line that says what to pass

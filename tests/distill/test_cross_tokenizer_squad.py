"""SQuAD distillation across tokenizers: the teacher's start/end logits met with the student's tokens through characters.

The mapping is checked by hand on a short context and two hand-written tokenisations; the runs use the tokenizers of
test_cross_tokenizer (no id in common; MPNet's vocabulary spells "movie" in letter pieces, so some of the student's
boundaries have no teacher token) with windows short enough (``--max-length 24``, ``--doc-stride 6``) that the two
tokenizers cut the contexts into different windows. Models are tiny and random; the runs are marked e2e.
"""

from __future__ import annotations

import math

import pytest
import torch

from compress.core.config import from_dict
from compress.core.data import synthetic
from compress.core.data.sources import load_train_split
from compress.core.data.tasks import get_task
from compress.core.errors import CompressError
from compress.core.formats.folder import open_folder
from compress.core.formats.records import read_metrics
from compress.core.formats.runtime import load_model
from compress.distill import losses as L
from compress.distill import steps
from compress.distill import task as task_stage
from compress.distill.cross_tokenizer import SpanMeeting, Window, best_window, boundary_positions, span_logits_at
from compress.distill.task import DistillConfig, distill
from tests.conftest import save_tiny
from tests.distill.test_cross_tokenizer import bert_tokenizer, mpnet_tokenizer, tiny

INF = float("inf")
MAX_LENGTH, STRIDE = 24, 6  # every context takes several windows, cut in different places by the two tokenizers


# ---------------------------------------------------------------------------- the mapping, by hand

# "the movie is good ." — characters: the 0-3, movie 4-9, is 10-12, good 13-17, . 18-19.
# The student splits "good" (go 13-15, ##od 15-17); the teacher splits "movie" (m 4-5, ##ovie 5-9) and its window
# ends before ".". Question and special tokens have no context offsets (None).
STUDENT = [None, None, None, None, (0, 3), (4, 9), (10, 12), (13, 15), (15, 17), (18, 19), None]
#          [CLS] which ?   [SEP]  the     movie   is        go        ##od      .         [SEP]
TEACHER = [None, None, None, None, None, (0, 3), (4, 5), (5, 9), (10, 12), (13, 17), None]
#          <s>   which ?    </s>  </s>   the     m       ##ovie  is        good      </s>
TEACHER_START = [10.0, 11.0, 12.0, 13.0, 14.0, 1.0, 2.0, 3.0, 4.0, 5.0, 15.0]
TEACHER_END = [20.0, 21.0, 22.0, 23.0, 24.0, -1.0, -2.0, -3.0, -4.0, -5.0, 25.0]


def test_the_teachers_span_logits_meet_the_students_tokens_at_shared_boundaries_by_hand():
    starts, ends = boundary_positions(STUDENT, TEACHER)
    # the -> the, movie -> m (both start at 4), is -> is, go -> good (13); ##od starts inside "good", "." is beyond the
    # teacher's window
    assert starts == [-1, -1, -1, -1, 5, 6, 8, 9, -1, -1, -1]
    # the -> the, movie -> ##ovie (both end at 9), is -> is, ##od -> good (17); go ends inside "good"
    assert ends == [-1, -1, -1, -1, 5, 7, 8, -1, 9, -1, -1]
    start, end = span_logits_at(torch.tensor([TEACHER_START]), torch.tensor([TEACHER_END]),
                                torch.tensor([starts]), torch.tensor([ends]))
    assert start.tolist() == [[-INF, -INF, -INF, -INF, 1.0, 2.0, 4.0, 5.0, -INF, -INF, -INF]]
    assert end.tolist() == [[-INF, -INF, -INF, -INF, -1.0, -3.0, -4.0, -INF, -5.0, -INF, -INF]]
    # a boundary counts once on each side: the first token starting at a character, the last one ending there
    assert boundary_positions([(0, 2), (0, 2)], [(0, 2), (0, 2)]) == ([0, -1], [-1, 1])
    assert boundary_positions([(0, 0), None], [(0, 0)]) == ([-1, -1], [-1, -1])  # zero-width tokens bound nothing


def test_a_student_window_meets_the_teacher_window_of_its_example_that_saw_most_of_its_context():
    student = [None, (10, 14), (15, 40)]  # characters 10-40
    assert best_window(student, [[(0, 20)], [(15, 30), (31, 45)], [(30, 60)]]) == 1  # 10, 25 and 10 in common
    assert best_window(student, [[(0, 20)], [(30, 50)]]) == 0  # a tie: the first
    assert best_window(student, [[(40, 50)], [None]]) == -1  # none shares a character
    teacher = [Window(0, (1,), ((5, 19),)), Window(1, (1,), ((0, 10),)), Window(1, (1, 2), ((5, 9), (9, 19)))]
    own = [Window(1, (7, 7, 7), (None, (6, 9), (9, 19))), Window(2, (7,), ((0, 4),))]
    meeting = SpanMeeting.of(own, teacher)
    # example 1 meets its own second window (13 characters in common), not example 0's (as many, another text);
    # example 2 has no teacher window: it takes the hard loss alone
    assert meeting.rows == [2, -1]
    assert meeting.starts == [[-1, -1, 1], [-1]] and meeting.ends == [[-1, 0, 1], [-1]]


def test_partial_span_kd_runs_over_the_positions_the_teacher_scores_by_hand():
    t = 2.0
    student = torch.tensor([[0.0, 1.0, 2.0], [3.0, 1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[0.0, -INF, 2 * math.log(3.0)], [-INF, -INF, -INF]], dtype=torch.float64,
                           requires_grad=True)  # row 1: no boundary met
    loss = L.partial_span_kd(student, student, teacher, teacher, temperature=t)
    # row 0 alone, over positions 0 and 2 at T = 2: teacher (1/4, 3/4); student softmax(0, 1) = (1, e) / (1 + e)
    q = (1 / (1 + math.e), math.e / (1 + math.e))
    kl = 0.25 * math.log(0.25 / q[0]) + 0.75 * math.log(0.75 / q[1])
    assert float(loss.detach()) == pytest.approx(t**2 * kl, rel=1e-12)  # start and end alike: their mean is either
    loss.backward()
    assert bool(torch.isfinite(student.grad).all()) and teacher.grad is None  # the teacher is a fixed target
    assert bool((student.grad[0, [0, 2]] != 0).all())
    assert student.grad[0, 1] == 0 and bool((student.grad[1] == 0).all())  # what the teacher cannot say is not taught
    # padding leaves both softmaxes as in span_kd, which it equals when the teacher scores every position
    torch.manual_seed(0)
    s_start, s_end, t_start, t_end = torch.randn(4, 3, 6).unbind(0)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    torch.testing.assert_close(L.partial_span_kd(s_start, s_end, t_start, t_end, mask, temperature=t),
                               L.span_kd(s_start, s_end, t_start, t_end, mask, temperature=t))


# ---------------------------------------------------------------------------- runs on tiny models

TOKENIZERS = {"bert": bert_tokenizer, "mpnet": mpnet_tokenizer}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Tokenizers, generated SQuAD files, SQuAD teachers and bare pretrained students of both families."""
    root = tmp_path_factory.mktemp("cross-squad")
    tok = {name: make(root / f"tok-{name}") for name, make in TOKENIZERS.items()}
    files = {"train": synthetic.write_squad(root / "train-v1.1.json", 24, seed=1),
             "dev": synthetic.write_squad(root / "dev-v1.1.json", 8, seed=2)}
    teachers = {name: save_tiny(tiny(name, "question-answering", 5), tok[name], root / f"{name}-qa", extra={"task": "squad"})
                for name in TOKENIZERS}
    students = {name: save_tiny(tiny(name, "base", 2), tok[name], root / f"{name}-base") for name in TOKENIZERS}
    return {"root": root, "tok": tok, "files": files, "teachers": teachers, "students": students}


def cfg(env, **options) -> DistillConfig:
    # one batch holds every training window (under 64 of them): each step scores the same rows
    base = {"task": "squad", "epochs": 2, "batch_size": 64, "log_every": 1, "lr": 3e-3, "seed": 3,
            "max_length": MAX_LENGTH, "doc_stride": STRIDE, "train_file": str(env["files"]["train"]),
            "dev_file": str(env["files"]["dev"]), "cache_dir": str(env["root"] / "cache")}
    return from_dict(DistillConfig, {**base, **options})


@pytest.fixture
def seen(monkeypatch):
    """Every loss step (the student's batch, the teacher's outputs met with it)."""
    record = []

    class Recorded(steps.Step):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            record.append(self)

    monkeypatch.setattr(steps, "Step", Recorded)
    return record


def losses_of(out) -> list[dict]:
    training = next(r for r in read_metrics(out) if r["kind"] == "training")
    return [h for h in training["history"] if "loss" in h]


def windows(tokenizer, examples) -> list[tuple[int, dict, list]]:
    """(example, model inputs, context offsets or None) of every window of ``examples``, as the SQuAD features cut
    them."""
    found = []
    for e, ex in enumerate(examples):
        enc = tokenizer(ex["question"], ex["context"], truncation="only_second", max_length=MAX_LENGTH, stride=STRIDE,
                        return_overflowing_tokens=True, return_offsets_mapping=True)
        for w, ids in enumerate(enc["input_ids"]):
            sequence = enc.sequence_ids(w)
            inputs = {k: torch.tensor([enc[k][w]]) for k in ("input_ids", "token_type_ids") if k in enc}
            found.append((e, inputs, [o if sequence[k] == 1 else None for k, o in enumerate(enc["offset_mapping"][w])]))
    return found


def check_span_targets(step, examples, own, theirs, teacher_model) -> int:
    """Every finite target of the step is the teacher's logit, on one of its own windows of the same example, at the
    token that starts (ends) at the student token's character; nothing off the context is a target. Returns how many
    context positions of the student have no target."""
    by_ids = {tuple(inputs["input_ids"][0].tolist()): (e, offsets) for e, inputs, offsets in windows(own, examples)}
    teacher_windows = windows(theirs, examples)
    unmet = 0
    for row, (ids, real) in enumerate(zip(step.batch["input_ids"], step.batch["attention_mask"])):
        example, offsets = by_ids[tuple(ids[real.bool()].tolist())]  # a KeyError: not the student's own window
        candidates = []  # the teacher's windows of this example: (start logits, end logits, offsets)
        for e, inputs, t_offsets in teacher_windows:
            if e == example:
                with torch.no_grad():
                    out = teacher_model(**inputs)
                candidates.append((out.start_logits[0], out.end_logits[0], t_offsets))
        consistent = set(range(len(candidates)))  # the windows every target of the row could come from
        for side, name in ((0, "start_logits"), (1, "end_logits")):
            targets = step.teacher.logits[name][row]
            for position, value in enumerate(targets.tolist()):
                span = offsets[position] if position < len(offsets) else None
                if not math.isfinite(value):
                    unmet += span is not None and side == 0
                    continue
                assert span is not None  # question, special and padded positions are never targets
                consistent &= {k for k, (start, end, t_offsets) in enumerate(candidates)
                               if any(o is not None and o[side] == span[side] and
                                      abs(float((start, end)[side][j]) - value) < 1e-4 for j, o in enumerate(t_offsets))}
        assert consistent  # one teacher window holds every target of the row
    return unmet


@pytest.mark.e2e
@pytest.mark.parametrize("teacher, student", [("mpnet", "bert"), ("bert", "mpnet")])
def test_a_student_with_its_own_tokenizer_learns_the_teachers_span_logits_where_their_boundaries_meet(
        env, seen, tmp_path, teacher, student):
    out = distill(env["teachers"][teacher], tmp_path / "student", cfg(env, init=str(env["students"][student]), losses=["kd"]))
    own, theirs = env["tok"][student], env["tok"][teacher]
    assert open_folder(out).tokenizer.get_vocab() == own.get_vocab()
    examples = load_train_split(get_task("squad"), cfg(env).data)
    first = seen[0]
    unmet = check_span_targets(first, examples, own, theirs, load_model(env["teachers"][teacher]))
    assert unmet > 0  # pieces without a shared boundary, and context one window saw and the other did not
    assert torch.isfinite(first.teacher.logits["start_logits"]).sum() > 0
    history = losses_of(out)
    kd = [h["loss_kd"] for h in history]
    assert len(kd) == 2 and all(math.isfinite(v) and v > 0 for v in kd)
    assert kd[-1] < kd[0]  # the same rows every step: the student moved toward the teacher where they meet
    # the first step's kd is partial_span_kd of what the step held
    student_logits, teacher_logits = first.student.logits, first.teacher.logits
    expected = L.partial_span_kd(student_logits["start_logits"], student_logits["end_logits"],
                                 teacher_logits["start_logits"], teacher_logits["end_logits"], first.mask, temperature=2.0)
    assert kd[0] == pytest.approx(float(expected.detach()), rel=1e-5)


@pytest.mark.e2e
def test_the_squad_teacher_cache_is_keyed_on_the_teachers_windows_and_read_as_online(env, tmp_path):
    teacher, student = env["teachers"]["mpnet"], str(env["students"]["bert"])
    cache = str(tmp_path / "cache")
    same = distill(teacher, tmp_path / "same", cfg(env, cache_dir=cache, epochs=1, student="1L-32", heads=4, init="random"))
    apart = distill(teacher, tmp_path / "apart", cfg(env, cache_dir=cache, epochs=1, init=student))
    online = distill(teacher, tmp_path / "online", cfg(env, cache=False, epochs=1, init=student))

    def cache_of(out):
        return next(r for r in read_metrics(out) if r["kind"] == "training")["cache"]

    first, second = cache_of(same)[0], cache_of(apart)[0]
    assert first["hit"] is False and second["hit"] is True and second["path"] == first["path"]
    assert cache_of(online) == []
    cached, uncached = losses_of(apart)[0], losses_of(online)[0]
    assert cached["loss_kd"] == pytest.approx(uncached["loss_kd"], rel=1e-5) and cached["loss_kd"] > 0
    assert cached["loss"] == pytest.approx(uncached["loss"], rel=1e-5)


def test_intermediate_terms_on_squad_across_tokenizers_are_refused_in_one_line(env, tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the student was built before the refusal")

    monkeypatch.setattr(task_stage, "build_student", never)
    with pytest.raises(CompressError) as err:
        distill(env["teachers"]["mpnet"], tmp_path / "x", cfg(env, init=str(env["students"]["bert"]), losses=["kd", "hidden"]))
    message = str(err.value)
    assert message.startswith("--losses hidden: the student has a tokenizer of its own") and "\n" not in message
    assert not (tmp_path / "x").exists()

"""Layer maps as data: which teacher layer each student layer learns from or starts as.

Two kinds of index live here, and each function says which it uses:

* **Hidden-state indices** (distillation maps): 0 is the embedding output and ``i``
  (1..L) the output of layer ``i``, exactly as Hugging Face's ``hidden_states`` tuple is
  indexed. A map is a list of ``(student_index, teacher_index)`` pairs.
* **Layer indices** (initialisation): 0-based positions of encoder layers
  (``encoder.layer[i]``), as :func:`every_kth` and :func:`parse_layers` return.
"""

from __future__ import annotations

from compress.core.errors import CompressError

LayerMap = list[tuple[int, int]]


def _check_depths(n_student: int, n_teacher: int) -> None:
    if n_student < 1 or n_teacher < 1:
        raise CompressError(f"layer counts must be at least 1 (student {n_student}, teacher {n_teacher})")
    if n_student > n_teacher:
        raise CompressError(
            f"a {n_student}-layer student has more layers than its {n_teacher}-layer teacher; "
            "map layers explicitly, e.g. --layer-map 1:1,2:1,3:2"
        )


def _with_embeddings(pairs: LayerMap, embeddings: bool) -> LayerMap:
    return ([(0, 0)] if embeddings else []) + pairs


def uniform_map(n_student: int, n_teacher: int, embeddings: bool = True) -> LayerMap:
    """TinyBERT's uniform strategy (Jiao et al. 2020): student layer m learns teacher layer g(m) = m·N/M.

    Hidden-state indices, m = 1..M (plus 0 -> 0 when ``embeddings``). When N is not a
    multiple of M the index is floored, ``m * N // M``; the last student layer still maps
    to the last teacher layer N.
    """
    _check_depths(n_student, n_teacher)
    pairs = [(m, m * n_teacher // n_student) for m in range(1, n_student + 1)]
    return _with_embeddings(pairs, embeddings)


def last_map(n_student: int, n_teacher: int, embeddings: bool = True) -> LayerMap:
    """The "last layers" strategy (Sun et al. 2019, PKD-Last): student layer m <-> teacher layer N - M + m.

    Hidden-state indices, m = 1..M (plus 0 -> 0 when ``embeddings``).
    """
    _check_depths(n_student, n_teacher)
    pairs = [(m, n_teacher - n_student + m) for m in range(1, n_student + 1)]
    return _with_embeddings(pairs, embeddings)


def explicit_map(teacher_layers: list[int], embeddings: bool = True) -> LayerMap:
    """A map from one teacher hidden-state index per student layer 1..M (plus 0 -> 0).

    ``teacher_layers[m - 1]`` is the teacher hidden-state index for student layer m.
    Ranges are checked by :func:`parse_layer_map`, which knows the teacher's depth.
    """
    pairs = [(m, int(t)) for m, t in enumerate(teacher_layers, start=1)]
    return _with_embeddings(pairs, embeddings)


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CompressError(f"cannot read {what} {text!r}; write comma-separated integers, e.g. 2,4,6") from None


def _parse_pairs(spec: str) -> LayerMap:
    pairs = []
    for item in spec.split(","):
        s, sep, t = item.partition(":")
        try:
            pairs.append((int(s), int(t)))
        except ValueError:
            raise CompressError(
                f"cannot read layer-map pair {item.strip()!r} in {spec!r}; write STUDENT:TEACHER pairs, e.g. 1:2,2:4"
            ) from None
    return pairs


def _check_map(pairs: LayerMap, n_student: int, n_teacher: int, spec: str) -> None:
    if not pairs:
        raise CompressError(f"layer map {spec!r} maps no layers")
    for s, t in pairs:
        if not 0 <= s <= n_student:
            raise CompressError(
                f"layer map {spec!r}: student index {s} is out of range; valid: 0 (embeddings) to {n_student}"
            )
        if not 0 <= t <= n_teacher:
            raise CompressError(
                f"layer map {spec!r}: teacher index {t} is out of range; valid: 0 (embeddings) to {n_teacher}"
            )
    students = [s for s, _ in pairs]
    if len(set(students)) != len(students):
        raise CompressError(f"layer map {spec!r} lists a student index twice; each student layer learns from one teacher layer")


def parse_layer_map(spec: str, n_student: int, n_teacher: int, embeddings: bool = True) -> LayerMap:
    """Read a layer map from text: ``uniform``, ``last``, ``2,4,6`` or ``1:2,2:4,3:6``.

    Hidden-state indices. ``2,4,6`` names one teacher index per student layer 1..M (and
    0 -> 0 is added when ``embeddings``); ``S:T`` pairs are taken literally (write ``0:0``
    to include the embeddings).
    """
    text = (spec or "").strip().lower()
    named = {"uniform": uniform_map, "last": last_map}
    if text in named:
        return named[text](n_student, n_teacher, embeddings)
    if not text or not any(ch.isdigit() for ch in text):
        raise CompressError(
            f"unknown layer map {spec!r}; valid: uniform, last, one teacher layer per student layer "
            "(e.g. 2,4,6), or STUDENT:TEACHER pairs (e.g. 1:2,2:4,3:6)"
        )
    if ":" in text:
        pairs = _parse_pairs(text)
    else:
        teacher = _ints(text, "layer map")
        if len(teacher) != n_student:
            raise CompressError(
                f"layer map {spec!r} names {len(teacher)} teacher layers for a {n_student}-layer student; "
                f"give exactly {n_student}, each from 1 to {n_teacher}"
            )
        if any(t == 0 for t in teacher):
            raise CompressError(
                f"layer map {spec!r}: teacher layers are 1 to {n_teacher} here (0, the embeddings, is mapped to 0 automatically)"
            )
        pairs = explicit_map(teacher, embeddings)
    _check_map(pairs, n_student, n_teacher, spec)
    return pairs


def every_kth(n_teacher: int, n_student: int) -> list[int]:
    """Evenly spaced teacher layers ending at the last one, to initialise a student (DistilBERT-style).

    0-based layer indices ``round((i + 1) * N / M) - 1`` for i in range(M), with halves
    rounded up (not Python's round-half-to-even): 6 -> 3 gives [1, 3, 5],
    12 -> 6 gives [1, 3, 5, 7, 9, 11], 6 -> 4 gives [1, 2, 4, 5].
    """
    _check_depths(n_student, n_teacher)
    # floor(x + 1/2) in integers: floor((2(i+1)N + M) / 2M).
    return [(2 * (i + 1) * n_teacher + n_student) // (2 * n_student) - 1 for i in range(n_student)]


def parse_layers(text: str) -> list[int]:
    """0-based teacher layer indices from text such as DistilBERT's ``"0,2,4,7,9,11"``.

    Only the syntax is checked here; ranges and order are checked against the teacher by
    ``compress.students.init``.
    """
    layers = _ints(text, "layer list")
    if not layers:
        raise CompressError(f"layer list {text!r} is empty; write teacher layers, e.g. 0,2,4,7,9,11")
    return layers

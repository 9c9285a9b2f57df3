"""bench.own_data's own logic: the Banking77 repair, the goals' verdicts and the header's commands."""

from __future__ import annotations

from bench import own_data


def test_a_text_broken_over_lines_is_joined_with_its_label(tmp_path):
    source = tmp_path / "train.csv"
    # Rows 3-5 are one text broken by unquoted line breaks (and a blank line); its label is on the last piece's row.
    source.write_text("text,category\r\nhow do I top up,top_up\r\nmy card\r\n\r\nwas declined,card_declined\r\n"
                      "where is my card,card_arrival\r\n", encoding="utf-8")
    rows, joined = own_data.repair_broken_rows(source)
    assert rows == [["how do I top up", "top_up"], ["my card was declined", "card_declined"],
                    ["where is my card", "card_arrival"]]
    assert joined == [{"lines": [3, 5], "text": "my card was declined", "label": "card_declined"}]


def _row(model, score, retention, speedup, int8_cost=None, metric="accuracy"):
    return {"model": model, "score": score, "retention": retention, "speedup": speedup, "speedup_worst": speedup * 0.9,
            "int8_cost": int8_cost, "metric": metric}


def test_the_goals_are_met_or_not_on_the_students_fastest_backend():
    rows = [_row("teacher", 92.0, 1.0, 1.0),
            _row("student-3L-384", 91.0, 91.0 / 92.0, 2.0),
            _row("student-3L-384-ov-int8", 90.5, 90.5 / 92.0, 3.5, int8_cost=0.5),
            _row("student-2L-384", 88.0, 88.0 / 92.0, 4.0),
            _row("student-2L-384-ort-int8", 86.5, 86.5 / 92.0, 6.0, int8_cost=1.5)]
    three, two, int8 = own_data.goals("banking77", rows)
    # 3L: its fastest row (OpenVINO int8, 3.5x) keeps 90.5 / 92 = 98.4% >= 98% at >= 3x
    assert three.startswith("- 3L-384 keeps >= 98%") and ": met — student-3L-384-ov-int8 keeps 98.4% (90.50) at 3.50x" in three
    # 2L: its fastest row keeps 86.5 / 92 = 94.0%
    assert ": not met — student-2L-384-ort-int8 keeps 94.0% (86.50) at 6.00x" in two
    assert int8.startswith("- int8 costs <= 1 point: not met — the largest cost is 1.50 (student-2L-384-ort-int8)")


def test_the_header_keeps_every_command_that_wrote_the_state_once():
    first = own_data.header(["--stages", "teachers"], {})
    second = own_data.header(["--stages", "latency"], first)
    again = own_data.header(["--stages", "teachers"], second)
    assert second["commands"] == ["python -m bench.own_data --stages teachers", "python -m bench.own_data --stages latency"]
    assert again["commands"] == ["python -m bench.own_data --stages latency", "python -m bench.own_data --stages teachers"]
    assert again["command"] == "python -m bench.own_data --stages teachers"

"""bench.ov_spells: feeds per input port, chunk medians and the timeline on a faked clock (no model compiled)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bench.ov_spells as spells


class Port:
    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype

    def get_any_name(self):
        return self.name

    def get_element_type(self):
        return self

    def to_dtype(self):
        return self.dtype


class Clock:
    """Time advances only when an inference runs (``cost`` seconds each, in turn) or the clock is read (``tick``)."""

    def __init__(self, costs, tick=0.0):
        self.now, self.costs, self.tick, self.calls = 0.0, list(costs), tick, 0

    def __call__(self):
        self.now += self.tick
        return self.now

    def infer(self):
        self.now += self.costs[self.calls % len(self.costs)]
        self.calls += 1


def test_feeds_follow_each_ports_name_and_type_and_the_seed():
    ports = [Port("input_ids", np.int64), Port("attention_mask", np.int64), Port("token_type_ids", np.int32)]
    feeds = spells.random_feeds(ports)
    assert {k: (v.shape, v.dtype) for k, v in feeds.items()} == {
        "input_ids": ((1, 128), np.int64), "attention_mask": ((1, 128), np.int64), "token_type_ids": ((1, 128), np.int32)}
    assert feeds["attention_mask"].min() == 1 and feeds["token_type_ids"].max() == 0
    ids = feeds["input_ids"]
    assert 1 <= ids.min() and ids.max() < 30000
    assert np.array_equal(ids, np.random.default_rng(0).integers(1, 30000, (1, 128)))  # as the committed runs drew them
    assert np.array_equal(spells.random_feeds(ports[::-1])["input_ids"], ids)


def test_each_chunk_gives_the_median_of_its_passes_in_order():
    clock = Clock([0.001, 0.003, 0.002, 0.010])  # a slow fourth pass does not move a chunk's median
    assert spells.chunks(clock.infer, 2, 4, clock) == [2.5, 2.5]
    clock = Clock([0.0012] * 3 + [0.0020] * 3)  # a slow spell from the second chunk on
    assert spells.chunks(clock.infer, 2, 3, clock) == [1.2, 2.0] and clock.calls == 6


def test_the_timeline_runs_chunks_until_the_seconds_are_up_and_times_the_loop_after_each():
    clock = Clock([0.01])
    loops = []

    def loop(c):
        loops.append(c())
        return 0.0006

    out = spells.timeline(clock.infer, seconds=0.25, passes=10, clock=clock, loop=loop)
    assert [t for t, _, _ in out] == [0.1, 0.2, 0.3]  # a chunk starts while under 0.25 s, and is finished
    assert all(ms == 10.0 and spin == 0.6 for _, ms, spin in out) and len(loops) == 3
    assert spells.spin(Clock([], tick=0.5)) == pytest.approx(0.5)


def test_the_command_refuses_a_missing_ir_and_imports_neither_torch_nor_the_toolkit(tmp_path):
    with pytest.raises(SystemExit):
        spells.main(["chunks", str(tmp_path / "openvino_model.xml"), "--variant", "nommap"])
    with pytest.raises(SystemExit):
        spells.main(["chunks", str(tmp_path / "openvino_model.xml"), "--variant", "other"])
    # With torch imported first, OpenVINO's default CPU pinning differed: the module keeps both out of the process.
    code = "import sys, bench.ov_spells; print('torch' in sys.modules, 'compress' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert done.stdout.split() == ["False", "False"]

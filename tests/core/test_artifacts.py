"""Model directories: round trips (identical logits), pruned shapes, sidecars, refusing overwrites."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from compress.core.model import structure as st
from compress.core.formats.artifacts import load_tokenizer, output_dir, save_model_dir
from compress.core.formats.layout import COMPRESSION_FILE, METRICS_FILE
from compress.core.formats.records import append_metrics, compression_record, dir_hash, read_compression, read_metrics
from compress.core.formats.writes import atomic_path, build_lock, write_json_atomic, write_text_atomic
from compress.core.preflight import check_output
from compress.core.compat import STOCK_PRUNED_HEADS
from compress.core.errors import CompressError
from compress.core.formats.runtime import load_model
from tests.conftest import VOCAB, make_tiny_model, save_tiny

# Depends on the installed transformers version: the transformers 4.57 set runs it too (make test-transformers4).
pytestmark = pytest.mark.versions


def _inputs(seed=0, batch=3, seq=11):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, len(VOCAB), (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # one padded row exercises the attention mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


def test_round_trip_identical_logits(tmp_path, tokenizer):
    model = make_tiny_model()
    out = save_tiny(model, tokenizer, tmp_path / "m")
    loaded = load_model(out)
    x = _inputs()
    assert torch.equal(_logits(model, x), _logits(loaded, x))
    assert type(loaded).__name__ == "BertForSequenceClassification"
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.bin"))


def test_sidecars_record_structure_and_provenance(tmp_path, tokenizer):
    out = save_tiny(make_tiny_model(), tokenizer, tmp_path / "m", stage="test", method="tiny", seed=7)
    record = read_compression(out)
    assert record["stage"] == "test" and record["method"] == "tiny"
    assert record["structure"]["heads"] == [4, 4] and record["structure"]["ffn"] == [37, 37]
    prov = record["provenance"]
    assert prov["seed"] == 7 and "torch" in prov["packages"] and prov["hardware"]["logical_cores"] >= 1
    assert prov["threads"] == torch.get_num_threads()
    assert prov["date"].endswith("+00:00")
    assert json.loads((out / METRICS_FILE).read_text()) == {"results": []}


def test_parent_hash_changes_with_weights(tmp_path, tokenizer):
    a = save_tiny(make_tiny_model(seed=0), tokenizer, tmp_path / "a")
    b = save_tiny(make_tiny_model(seed=1), tokenizer, tmp_path / "b")
    assert dir_hash(a) != dir_hash(b)
    assert dir_hash(a) == dir_hash(a)
    child = compression_record(stage="prune", method="x", parent=a)
    assert child["parent"]["hash"] == dir_hash(a) and child["parent"]["stage"] == "test"


def test_non_uniform_ffn_and_pruned_heads_round_trip(tmp_path, tokenizer):
    model = make_tiny_model()
    st.resize_ffn(model, 0, range(0, 37, 2))  # 19 neurons kept in layer 0, 37 in layer 1
    st.prune_heads(model, {0: [1], 1: [0, 3]})
    assert st.ffn_widths(model) == [19, 37]
    assert st.heads_per_layer(model) == [3, 2]
    out = save_tiny(model, tokenizer, tmp_path / "pruned")
    loaded = load_model(out)
    assert st.ffn_widths(loaded) == [19, 37] and st.heads_per_layer(loaded) == [3, 2]
    x = _inputs(1)
    assert torch.allclose(_logits(model, x), _logits(loaded, x), atol=0, rtol=0)
    assert read_compression(out)["structure"]["pruned_heads"] == {"0": [1], "1": [0, 3]}


def test_uniform_pruned_model_loads_with_stock_from_pretrained(tmp_path, tokenizer):
    from transformers import AutoModelForSequenceClassification

    model = make_tiny_model()
    for layer in range(2):
        st.resize_ffn(model, layer, range(20))  # uniform width 20
    st.prune_heads(model, {0: [2]})
    out = save_tiny(model, tokenizer, tmp_path / "uniform")
    if not STOCK_PRUNED_HEADS:
        # transformers 5.x: a BertConfig cannot express narrower heads; the stock loader
        # must refuse the checkpoint, never fill the attention with random weights.
        with pytest.raises(RuntimeError, match="mismatch"):
            AutoModelForSequenceClassification.from_pretrained(out)
        return
    stock = AutoModelForSequenceClassification.from_pretrained(out)
    x = _inputs(2)
    assert torch.allclose(_logits(model, x), _logits(stock, x), atol=1e-6)


def test_dropped_layers_round_trip(tmp_path, tokenizer):
    model = make_tiny_model(num_hidden_layers=3)
    st.prune_heads(model, {2: [0]})
    st.drop_layers(model, [0, 2])
    assert st.heads_per_layer(model) == [4, 3]
    assert model.config.pruned_heads == {1: [0]}
    out = save_tiny(model, tokenizer, tmp_path / "dropped")
    loaded = load_model(out)
    x = _inputs(3)
    assert torch.equal(_logits(model, x), _logits(loaded, x))
    assert read_compression(out)["structure"]["kept_layers"] == [0, 2]


def test_head_change_keeps_encoder_and_reports_new_weights(tmp_path, tokenizer):
    base = make_tiny_model(head="base")
    out = save_tiny(base, tokenizer, tmp_path / "enc")
    clf, info = load_model(out, head="sequence-classification", num_labels=3, with_info=True)
    assert clf.config.num_labels == 3
    assert all(k.startswith("classifier.") for k in info["new_weights"])
    assert torch.equal(clf.bert.embeddings.word_embeddings.weight, base.embeddings.word_embeddings.weight)
    # and back: a classifier's encoder loads as a bare encoder
    back = load_model(save_tiny(clf, tokenizer, tmp_path / "clf"), head="base")
    assert torch.equal(back.encoder.layer[1].output.dense.weight, base.encoder.layer[1].output.dense.weight)


@pytest.mark.e2e
def test_a_new_head_is_drawn_from_the_seed_in_any_process(tmp_path, tokenizer):
    # torch seeds its generator at random when a process starts, so a head drawn from it differs run to run
    out = save_tiny(make_tiny_model(head="base"), tokenizer, tmp_path / "enc")

    def head(seed: int, noise: int) -> torch.Tensor:
        torch.manual_seed(noise)  # whatever the caller's generator holds must not matter
        return load_model(out, head="sequence-classification", num_labels=2, seed=seed).classifier.weight.detach()

    a, b, c = head(3, 10), head(3, 20), head(4, 10)
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    load_model(out, head="sequence-classification", num_labels=2, seed=3)
    assert torch.equal(torch.rand(1), expected)  # the caller's generator is left as it was
    code = ("import json\n"
            "from compress.core.formats.runtime import load_model\n"
            f"m = load_model({str(out)!r}, head='sequence-classification', num_labels=2, seed=3)\n"
            "print(json.dumps(m.classifier.weight.flatten().tolist()))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert torch.equal(torch.tensor(json.loads(proc.stdout.splitlines()[-1])), a.flatten())


def test_tied_mlm_head_round_trip(tmp_path, tokenizer):
    model = make_tiny_model(head="masked-lm")
    out = save_tiny(model, tokenizer, tmp_path / "mlm")
    loaded = load_model(out)
    assert loaded.cls.predictions.decoder.weight.data_ptr() == loaded.bert.embeddings.word_embeddings.weight.data_ptr()
    x = _inputs(4)
    assert torch.equal(_logits(model, x), _logits(loaded, x))


def test_tokenizer_round_trip(tiny_model_dir, tokenizer):
    loaded = load_tokenizer(tiny_model_dir)
    assert loaded("the cat sat")["input_ids"] == tokenizer("the cat sat")["input_ids"]


# ---------------------------------------------------------------------------- errors


def test_not_a_model_dir(tmp_path):
    with pytest.raises(CompressError, match="does not exist"):
        load_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompressError, match="is not a model directory \\(no config.json\\)"):
        load_model(tmp_path / "empty")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CompressError, match="is a file, not a model directory"):
        load_model(tmp_path / "file")


def test_corrupt_safetensors(tiny_model_dir):
    weights = tiny_model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(CompressError, match="model.safetensors is corrupt or truncated"):
        load_model(tiny_model_dir)


def test_missing_weights(tiny_model_dir):
    (tiny_model_dir / "model.safetensors").unlink()
    with pytest.raises(CompressError, match="has no weights"):
        load_model(tiny_model_dir)


def test_other_architecture_is_refused(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config["model_type"] = "gpt2"
    (tiny_model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CompressError, match="model_type 'gpt2' is not supported; known encoder families: bert, "):
        load_model(tiny_model_dir)


def test_inconsistent_shapes_are_reported(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    config["hidden_size"] = 64
    (tiny_model_dir / "config.json").write_text(json.dumps(config))
    (tiny_model_dir / COMPRESSION_FILE).unlink()
    with pytest.raises(CompressError, match="do not match its config.json"):
        load_model(tiny_model_dir)


def test_legacy_bin_is_read_with_weights_only(tmp_path, tokenizer, monkeypatch):
    model = make_tiny_model()
    out = save_tiny(model, tokenizer, tmp_path / "legacy")
    from safetensors.torch import load_file

    torch.save(load_file(out / "model.safetensors"), out / "pytorch_model.bin")
    (out / "model.safetensors").unlink()
    seen = {}
    real_load = torch.load

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    loaded = load_model(out)
    assert seen.get("weights_only") is True
    x = _inputs()
    assert torch.equal(_logits(model, x), _logits(loaded, x))


def test_pickled_code_in_bin_is_refused(tmp_path, tokenizer):
    out = save_tiny(make_tiny_model(), tokenizer, tmp_path / "evil")
    (out / "model.safetensors").unlink()

    class Payload:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"x": Payload()}, out / "pytorch_model.bin")
    with pytest.raises(CompressError, match="cannot read .*pytorch_model.bin safely"):
        load_model(out)


# ---------------------------------------------------------------------------- outputs


def test_existing_output_is_refused_without_overwrite(tmp_path, tokenizer):
    out = save_tiny(make_tiny_model(seed=0), tokenizer, tmp_path / "m")
    before = (out / "model.safetensors").read_bytes()
    with pytest.raises(CompressError, match="not empty; pass --overwrite"):
        save_tiny(make_tiny_model(seed=1), tokenizer, out)
    assert (out / "model.safetensors").read_bytes() == before
    record = compression_record(stage="t", method="m")
    save_model_dir(make_tiny_model(seed=1), out, tokenizer=tokenizer, record=record, overwrite=True)
    assert (out / "model.safetensors").read_bytes() != before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary leftovers


def test_failed_stage_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with output_dir(out) as tmp:
            (tmp / "partial.bin").write_text("half")
            raise RuntimeError("crash in the middle")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_check_output_accepts_empty_dir_and_refuses_file(tmp_path):
    (tmp_path / "empty").mkdir()
    assert check_output(tmp_path / "empty") == tmp_path / "empty"
    (tmp_path / "f").write_text("x")
    with pytest.raises(CompressError, match="not a directory"):
        check_output(tmp_path / "f")


def test_metrics_are_appended(tiny_model_dir):
    append_metrics(tiny_model_dir, {"kind": "eval", "task": "sst2", "metrics": {"accuracy": 50.0}})
    append_metrics(tiny_model_dir, {"kind": "eval", "task": "mrpc", "metrics": {"f1": 70.0}})
    results = read_metrics(tiny_model_dir)
    assert [r["task"] for r in results] == ["sst2", "mrpc"]
    assert all("when" in r for r in results)


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o027
    os.umask(old)


def test_outputs_follow_the_users_umask(tmp_path, tokenizer, umask_027):
    # safetensors writes 0600 and mkdtemp makes 0700: the published directory must not keep them.
    out = save_tiny(make_tiny_model(), tokenizer, tmp_path / "m")
    append_metrics(out, {"kind": "eval", "task": "sst2", "metrics": {"accuracy": 1.0}})
    assert stat.S_IMODE(out.stat().st_mode) == 0o750
    names = sorted(p.name for p in out.iterdir())
    assert {"model.safetensors", "config.json", METRICS_FILE, COMPRESSION_FILE, "tokenizer.json"} <= set(names)
    for name in names:
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o640, name


def test_atomic_writes_keep_the_old_file_on_failure_and_leave_no_temporary(tmp_path):
    target = tmp_path / "sub" / "result.json"
    write_json_atomic(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half a fi")
        raise RuntimeError("crash while writing")
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(p.name for p in target.parent.iterdir()) == ["result.json"]
    write_text_atomic(target, "line\n")
    assert target.read_bytes() == b"line\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_current_umask()


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_no_module_writes_files_with_a_private_writer():
    # One atomic writer (compress.core.formats.writes.atomic_path): no module makes its own temporary files.
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for folder in ("compress", "teacher", "students", "eval"):
        for path in (root / folder).rglob("*.py"):
            if path.name == "writes.py":
                continue
            text = path.read_text(encoding="utf-8")
            offenders += [f"{path.relative_to(root)}: {word}" for word in ("mkstemp", "NamedTemporaryFile") if word in text]
    assert offenders == []


@pytest.mark.e2e
def test_build_lock_makes_another_process_wait_until_the_entry_is_made(tmp_path, caplog):
    entry, ready = tmp_path / "cache" / "entry.npy", tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time, pathlib\n"
        "from compress.core.formats.writes import build_lock\n"
        f"entry, ready = pathlib.Path({str(entry)!r}), pathlib.Path({str(ready)!r})\n"
        "with build_lock(entry, 'x'):\n"
        "    ready.touch()\n"
        "    time.sleep(1.0)\n"
        "    entry.write_text('made')\n")])
    deadline = time.monotonic() + 60
    while not ready.exists() and holder.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists(), "the holder never took the lock"
    with caplog.at_level(logging.INFO, logger="compress.core.formats.writes"), build_lock(entry, "the test entry"):
        assert entry.read_text() == "made"  # this process waited for the holder's build
    assert holder.wait(60) == 0
    assert [r.getMessage() for r in caplog.records] == [f"waiting for another process building the test entry in {entry}"]
    assert sorted(p.name for p in entry.parent.iterdir()) == ["entry.npy"]  # the lock file went with the build


def test_build_lock_after_a_failed_build_stays_and_is_free(tmp_path):
    entry = tmp_path / "entry"
    with pytest.raises(RuntimeError), build_lock(entry, "x"):
        raise RuntimeError("the build failed")
    assert (tmp_path / ".entry.lock").is_file()  # the next builder queues on the same file
    with build_lock(entry, "x"):  # released: taken at once
        entry.write_text("made")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]

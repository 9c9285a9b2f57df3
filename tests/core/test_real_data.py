"""Every real task folder under ../shared/data parses with the published row counts.

Marked ``data``: skipped when the data is not next to the repository (set COMPRESS_DATA).
"""

from __future__ import annotations

import pytest

from compress.core.data.sources import DataSource, load_split
from compress.core.data.tasks import get_task

pytestmark = pytest.mark.data

# Row counts from ../shared/data/README.md (which checked them against the published sizes).
EXPECTED = {
    ("sst2", "train"): 67349,
    ("sst2", "dev"): 872,
    ("sst2", "test"): 1821,
    ("mrpc", "train"): 3668,
    ("mrpc", "dev"): 408,
    ("mrpc", "test"): 1725,
    ("stsb", "train"): 5749,
    ("stsb", "dev"): 1500,
    ("stsb", "test"): 1379,
    ("cola", "train"): 8551,
    ("cola", "dev"): 1043,
    ("rte", "train"): 2490,
    ("rte", "dev"): 277,
    ("rte", "test"): 3000,
    ("wnli", "train"): 635,
    ("wnli", "dev"): 71,
    ("ax", "test"): 1104,
}


@pytest.mark.parametrize("task,split", sorted(EXPECTED))
def test_glue_tsv_row_counts(data_root, task, split):
    ds = load_split(get_task(task), split, DataSource(data_dir=str(data_root / "glue")))
    assert len(ds) == EXPECTED[(task, split)]
    labels = ds["label"]
    if split == "test" and task != "ax":
        assert set(labels) == {-1}
    elif get_task(task).kind == "regression":
        assert 0.0 <= min(labels) and max(labels) <= 5.0
    else:
        assert set(labels) <= set(range(get_task(task).num_labels)) and len(set(labels)) > 1


@pytest.mark.parametrize(
    "task,folder,split,count",
    [
        ("cola", "CoLA/hf_parquet", "train", 8551),
        ("cola", "CoLA/hf_parquet", "dev", 1043),
        ("rte", "RTE/hf_parquet", "train", 2490),
        ("rte", "RTE/hf_parquet", "dev", 277),
        ("rte", "RTE/hf_parquet", "test", 3000),
        ("ax", "AX/hf_parquet", "test", 1104),
    ],
)
def test_parquet_layout_row_counts(data_root, task, folder, split, count):
    ds = load_split(get_task(task), split, DataSource(data_dir=str(data_root / "glue" / folder)))
    assert len(ds) == count


def test_tsv_and_parquet_agree_row_by_row(data_root):
    glue = data_root / "glue"
    for task, split in (("rte", "dev"), ("cola", "dev"), ("rte", "train")):
        folder = {"rte": "RTE", "cola": "CoLA"}[task]
        tsv = load_split(get_task(task), split, DataSource(data_dir=str(glue)))
        pq = load_split(get_task(task), split, DataSource(data_dir=str(glue / folder / "hf_parquet")))
        assert tsv["label"] == pq["label"]
        for field in get_task(task).text_fields:
            assert tsv[field] == pq[field]


def test_squad_dev_v11(data_root):
    ds = load_split(get_task("squad"), "dev", DataSource(data_dir=str(data_root / "squad")))
    assert len(ds) == 10570
    assert len(set(ds["title"])) == 48
    assert all(len(a["text"]) >= 1 for a in ds["answers"])


def test_demo_data_dir_prepares_real_sst2(data_root, tmp_path):
    """`compress demo --data-dir`: the recipe points at the real task and pretrains on its training sentences."""
    from compress.demo import prepare_data
    from compress.teacher.corpus import read_documents

    _, variables = prepare_data(tmp_path, data_root / "glue", seed=0)
    assert variables["data_dir"] == str((data_root / "glue").absolute())
    assert variables["train_examples"] == "4000" and variables["vocab_size"] == "4000"
    docs = read_documents(tmp_path / "data" / "corpus.txt")
    assert len(docs) == 2500  # the first 20,000 SST-2 training sentences, 8 per document
    first = load_split(get_task("sst2"), "train", DataSource(data_dir=str(data_root / "glue")))["sentence"][0]
    assert docs[0][0].startswith(first.strip()[:20])

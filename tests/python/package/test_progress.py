"""Progress of long work in the Python package (spec/python.md §1.1): INFO records of the
``safetensors_spark.progress`` logger, with counts, from ``compact``, ``vacuum`` and
``open_dataset`` (its header reads, ``verify_checksums``); none while logging is as a library
finds it (INFO not enabled). Hand-made datasets (handmade.py), real files."""

import logging
import json
import os
import shutil
import sys

import pytest

import handmade
import safetensors_spark
from safetensors_spark import _native, _progress, open_dataset

LOGGER = "safetensors_spark.progress"


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def progress_log():
    """A handler on the progress logger, whose level is left as it is (NOTSET: the root's)."""
    logger = logging.getLogger(LOGGER)
    handler = Records()
    logger.addHandler(handler)
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


def small_shards(path, n=3):
    """A batch dataset of ``n`` one-row shards (batch size ``n``), committed as version 1 of its
    log: one compaction output, after which a vacuum deletes the ``n`` shards it replaced and
    version 1's log entry. Returns the shards' bytes."""
    handmade.write_batch_dataset(path, [1] * n, batch_size=n)
    os.makedirs(os.path.join(path, "_manifest_log"))
    shutil.copy(os.path.join(path, "dataset_manifest.json"),
                os.path.join(path, "_manifest_log", _native.manifest_log_file_name(1)))
    return sum(s["bytes"] for s in handmade.read_manifest(path)["shards"])


def finished(records, task):
    """The one ``finish`` record of ``task`` (a prefix of ``progress_task``) and all its records."""
    mine = [r for r in records if r.progress_task.startswith(task)]
    ends = [r for r in mine if r.progress_event == "finish"]
    assert len(ends) == 1, [r.getMessage() for r in mine]
    assert mine[0].progress_event == "start" and mine[-1] is ends[0]
    return ends[0], mine


def test_nothing_is_logged_by_default(tmp_path, progress_log):
    logger, handler = progress_log
    assert not logger.isEnabledFor(logging.INFO), "the test runs with logging as a library finds it"
    # not only filtered out: the extension is given no callback, so it never takes the GIL back
    assert _progress.native_callback("vacuum x", "files deleted") is None
    ds = tmp_path / "ds"
    small_shards(ds)
    safetensors_spark.compact(ds)
    safetensors_spark.vacuum(ds, retention="0", allow_shorter_retention=True)
    open_dataset(ds, verify_checksums=True)
    assert handler.records == []


def test_info_records_count_shards_files_and_bytes(tmp_path, progress_log):
    logger, handler = progress_log
    logger.setLevel(logging.INFO)
    ds = tmp_path / "ds"
    small = small_shards(ds)

    out = safetensors_spark.compact(ds)
    end, mine = finished(handler.records, "compact")
    assert all(r.levelno == logging.INFO for r in mine)
    outputs = len(out[0]["plan"]["outputs"])
    assert outputs == 1
    # the new shard written, from the three small shards read whole
    assert (end.progress_done, end.progress_total) == (1, 1)
    assert (end.progress_bytes, end.progress_total_bytes) == (small, small)
    assert f"compact {ds}: 1/1 shards written" in end.getMessage()

    handler.records.clear()
    safetensors_spark.vacuum(ds, retention="0", allow_shorter_retention=True)
    end, _ = finished(handler.records, "vacuum")
    # the three replaced shards and version 1's log entry deleted; bytes: the shards'
    assert (end.progress_done, end.progress_total) == (4, 4)
    assert (end.progress_bytes, end.progress_total_bytes) == (small, small)
    assert "4/4 files deleted" in end.getMessage()

    handler.records.clear()
    safetensors_spark.vacuum(ds, retention="0", allow_shorter_retention=True, dry_run=True)
    assert handler.records == [], "a dry run deletes nothing and reports nothing"

    handler.records.clear()
    merged = handmade.read_manifest(ds)["shards"]
    assert all(s.get("crc32c") for s in merged)
    open_dataset(ds, verify_checksums=True)
    # this connector's dataset opens from its manifest alone (spec/python.md §2.1): no header is
    # read at open, so nothing is reported for it
    assert not [r for r in handler.records if r.getMessage().startswith("open_dataset")]
    end, _ = finished(handler.records, "verify_checksums")
    size = sum(s["bytes"] for s in merged)
    assert (end.progress_done, end.progress_total, end.progress_bytes) == (len(merged), len(merged), size)


def test_the_native_callback_sees_start_and_finish_with_exact_counts(tmp_path):
    """The extension's side of the sink: ``(event, done, total, done_bytes, total_bytes)``, the
    first a start at zero, the last a finish with every file counted."""
    ds = tmp_path / "ds"
    small = small_shards(ds, n=4)
    calls = []
    _native.compact(os.fspath(ds), progress=lambda *a: calls.append(a))
    assert calls[0] == ("start", 0, 1, 0, small)
    assert calls[-1] == ("finish", 1, 1, small, small)
    assert all(c[0] == "advance" for c in calls[1:-1])


def test_a_raising_callback_does_not_stop_the_work(tmp_path, monkeypatch):
    """A progress callable that raises is reported as unraisable; the vacuum still deletes and
    commits (stopping it halfway would leave more to clean up)."""
    ds = tmp_path / "ds"
    small_shards(ds)
    safetensors_spark.compact(ds)
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))

    def broken(*_):
        raise RuntimeError("the log handler broke")

    out = json.loads(_native.vacuum(os.fspath(ds), "0", False, True, broken))
    assert out["version"] == 3 and len(out["plan"]["shards"]) == 3
    assert seen and all(isinstance(e, RuntimeError) for e in seen)
    assert not any(os.path.exists(ds / s["name"]) for s in out["plan"]["shards"])


def test_a_remote_open_counts_every_header_and_checksum(tmp_path, progress_log):
    """An fsspec URL (``memory://``) opens from its manifest alone (no header read, nothing
    reported: headers are checked when a shard is first used), and ``verify_checksums`` counts
    each shard read whole."""
    import fsspec

    logger, handler = progress_log
    logger.setLevel(logging.INFO)
    local = tmp_path / "d"
    handmade.write_batch_dataset(local, [2] * 5, batch_size=2)
    m = handmade.read_manifest(local)
    for s in m["shards"]:
        s["crc32c"] = _native.file_crc32c(local / s["shard_path"])
    handmade.write_manifest(local, m)
    url = f"memory://progress-{handmade.random_name()}"
    fs, root = fsspec.core.url_to_fs(url)
    for name in os.listdir(local):
        fs.pipe_file(f"{root}/{name}", (local / name).read_bytes())
    ds = open_dataset(url, max_in_flight=3, verify_checksums=True)
    assert len(ds) == 10
    assert not [r for r in handler.records if r.getMessage().startswith("open_dataset")]
    end, _ = finished(handler.records, "verify_checksums")
    size = sum(s["bytes"] for s in m["shards"])
    assert (end.progress_done, end.progress_total, end.progress_bytes, end.progress_total_bytes) == (5, 5, size, size)
    assert f"verify_checksums {url}: 5/5 shards verified" in end.getMessage()

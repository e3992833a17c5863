"""Following a dataset's new versions from PyTorch (spec/python.md §3.6): after its epoch a
``SafetensorsIterableDataset(follow=...)`` reads the shards that newer versions add, version by
version, never a row twice across a compaction, failing on (or passing over) a delete; the
same batches in the same order with any number of workers; exact resume that records the version
reached."""

import threading

import pytest
import torch

import safetensors_spark
from safetensors_spark import ManifestError, StateError
from safetensors_spark.torch import Follow, SafetensorsIterableDataset, loader

from handmade import append_shard, read_manifest, start_log, write_batch_dataset, write_manifest


def dataset(tmp_path, sizes=(4, 4, 3)):
    path = str(tmp_path / "ds")
    ids = write_batch_dataset(path, list(sizes), batch_size=4)
    start_log(path)
    return path, ids


def ids_of(batches):
    return [int(i) for b in batches for i in b["y"]]


def test_after_its_epoch_it_reads_each_new_version_once_passing_over_a_compaction(tmp_path):
    path, ids = dataset(tmp_path)
    ds = SafetensorsIterableDataset(path, batch_size=2, follow=Follow(poll_interval=0.01, until_version=5))
    seen, new = [], []
    for j, batch in enumerate(ds):
        seen.append(batch)
        if j == 0:
            # committed while the epoch is read: picked up after it, in version order
            new += append_shard(path, 3)  # version 2
            new += append_shard(path, 2)  # version 3
        if j == 6:  # past the epoch and version 2: a compaction rewrites what was read
            safetensors_spark.compact(path, batch_size=4)  # version 4: nothing new
            new += append_shard(path, 1)  # version 5
    assert ids_of(seen) == ids + new
    assert [r["operation"] for r in safetensors_spark.history(path)][-2:] == ["compaction", "append"]


def test_a_delete_stops_the_follow_naming_the_version_unless_change_versions_are_skipped(tmp_path):
    path, ids = dataset(tmp_path, (4, 4))
    append_shard(path, 2)  # version 2
    shard = read_manifest(path)["shards"][0]["shard_path"]
    safetensors_spark.delete_rows(path, [(shard, 0)])  # version 3 removes a row of the epoch
    later = append_shard(path, 3)  # version 4
    with pytest.raises(ManifestError, match=r"version 3 is a version of operation delete that removes 1 shard\(s\)"
                                            r".*skip_change_commits=true"):
        list(SafetensorsIterableDataset(path, batch_size=4, version=1, follow=Follow(poll_interval=0.01,
                                                                                    until_version=4)))
    ds = SafetensorsIterableDataset(path, batch_size=4, version=1,
                                    follow=Follow(poll_interval=0.01, until_version=4, skip_change_commits=True))
    assert ids_of(ds) == ids + [8, 9] + later


def test_an_overwrite_that_empties_the_dataset_is_skipped_and_the_rows_after_it_are_read(tmp_path):
    from handmade import _commit_full_entry

    path, ids = dataset(tmp_path, (4, 4))
    m = read_manifest(path)
    schema = m["schema"]
    # version 2: an overwrite that leaves nothing (no shard, so no columns: schema {})
    m.update(shards=[], schema={}, total_samples=0, total_bytes=0, manifest_version=2, operation="overwrite")
    _commit_full_entry(path, m)
    write_manifest(path, dict(m, schema=schema))  # (so append_shard writes version 3 with columns)
    later = append_shard(path, 3)  # version 3
    ds = SafetensorsIterableDataset(path, batch_size=4, version=1,
                                    follow=Follow(poll_interval=0.01, until_version=3, skip_change_commits=True))
    assert ids_of(ds) == ids + later
    # a follower opened on the empty version itself reads the rows after it
    ds = SafetensorsIterableDataset(path, batch_size=4, version=2, follow=Follow(poll_interval=0.01, until_version=3))
    assert ids_of(ds) == later


def test_workers_and_handoff_yield_the_batches_of_one_process_in_its_order(tmp_path):
    path, ids = dataset(tmp_path, (4, 4, 4))
    for n in (3, 1, 4, 2):  # segments of odd batch counts: the round robin goes on across them
        append_shard(path, n)
    def run(**kw):
        ds = SafetensorsIterableDataset(path, batch_size=1, shuffle=True, seed=3, version=1,
                                        follow=Follow(poll_interval=0.01, until_version=5))
        return ids_of(loader(ds, **kw)) if kw else ids_of(ds)
    alone = run()
    assert sorted(alone) == list(range(22))
    # the epoch of version 1, then each version's rows
    assert sorted(alone[:12]) == list(range(12)) and sorted(alone[12:15]) == [12, 13, 14]
    assert run(num_workers=2, handoff_batches=1) == alone
    assert run(num_workers=3, handoff_batches=2) == alone
    assert run(num_workers=2) == alone


def test_segments_share_the_workers_block_pool_so_a_held_batch_is_never_overwritten(tmp_path):
    # a batch lives in a pooled shared-memory block until the loop drops it; a segment with a
    # pool of its own would hand out slot 0 again, released by the epoch's batch there, while
    # the loop still holds the segment's first batch in it
    path, ids = dataset(tmp_path, (4, 4))
    new = append_shard(path, 4) + append_shard(path, 4)
    ds = SafetensorsIterableDataset(path, batch_size=2, version=1, follow=Follow(poll_interval=0.01,
                                                                                until_version=3))
    held, copies = [], []
    for j, batch in enumerate(loader(ds, num_workers=1, handoff_batches=1)):
        if j < 4:
            copies.append({k: v.clone() for k, v in batch.items()})  # the epoch's: dropped
        else:
            held.append(batch)  # the new versions': kept in their blocks
        del batch
    assert ids_of(copies) == ids and ids_of(held) == new


def test_a_resume_state_records_the_version_reached_and_resumes_exactly(tmp_path):
    path, ids = dataset(tmp_path, (4, 4))
    for n in (3, 4, 2):
        append_shard(path, n)  # versions 2..4

    def make():
        return SafetensorsIterableDataset(path, batch_size=2, shuffle=True, seed=1, version=1,
                                          follow=Follow(poll_interval=0.01, until_version=4))
    whole = ids_of(make())
    for workers, taken in ((0, 3), (0, 5), (2, 6), (2, 7), (0, 9)):
        ds = make()
        it = iter(loader(ds, num_workers=workers, handoff_batches=1) if workers else ds)
        got = ids_of([next(it) for _ in range(taken)])
        state = ds.state_dict()
        del it
        again = make()
        again.load_state_dict(state)
        rest = ids_of(loader(again, num_workers=workers, handoff_batches=1) if workers else again)
        assert got + rest == whole, (workers, taken, state)
    assert state["follow"]["version"] == 4
    # the state says where: the version being read and the position in it
    ds = make()
    it = iter(ds)
    [next(it) for _ in range(5)]  # 4 batches of the epoch, then the first of version 2
    assert (ds.state_dict()["follow"], ds.state_dict()["position"]) == ({"version": 2}, 2)


def test_ranks_read_the_same_versions_each_its_share(tmp_path):
    path, _ = dataset(tmp_path, (4, 3))
    append_shard(path, 3)
    append_shard(path, 1)
    per_rank = []
    for rank in (0, 1):
        ds = SafetensorsIterableDataset(path, batch_size=1, rank=rank, world_size=2, version=1,
                                        follow=Follow(poll_interval=0.01, until_version=3))
        per_rank.append(ids_of(ds))
    assert len(per_rank[0]) == len(per_rank[1])
    # every sample read; each segment padded to whole rounds with samples of its own start
    assert set(per_rank[0]) | set(per_rank[1]) == set(range(11))


def test_it_waits_for_new_versions_and_stops_after_idle_timeout(tmp_path):
    path, ids = dataset(tmp_path, (4,))
    ds = SafetensorsIterableDataset(path, batch_size=4, follow=Follow(poll_interval=0.02, idle_timeout=2.0))
    appended = []
    timer = threading.Timer(0.3, lambda: appended.extend(append_shard(path, 2)))
    timer.start()
    got = ids_of(ds)  # waits for the version appended 0.3 s in, then 2 s idle
    timer.join()
    assert got == ids + appended == [0, 1, 2, 3, 4, 5]
    quick = SafetensorsIterableDataset(path, batch_size=4, follow=Follow(poll_interval=0.02, idle_timeout=0))
    assert ids_of(quick) == [0, 1, 2, 3, 4, 5]


def test_bad_follow_settings_and_states_are_refused(tmp_path):
    path, _ = dataset(tmp_path, (4,))
    for bad, what in ((dict(poll_interval=0), "poll_interval"), (dict(until_version=0), "until_version"),
                      (dict(idle_timeout=-1), "idle_timeout"), (dict(skip_change_commits="yes"), "skip_change")):
        with pytest.raises(ValueError, match=what):
            Follow(**bad)
    with pytest.raises(ValueError, match="follow must be True, False, None or a safetensors_spark.torch.Follow"):
        SafetensorsIterableDataset(path, follow="always")
    follower = SafetensorsIterableDataset(path, batch_size=2, follow=True)
    with pytest.raises(TypeError, match="no length"):
        len(follower)
    plain = SafetensorsIterableDataset(path, batch_size=2)
    with pytest.raises(StateError, match="this dataset follows new versions"):
        follower.load_state_dict(plain.state_dict())
    with pytest.raises(StateError, match="taken of a following dataset"):
        plain.load_state_dict({**follower.state_dict()})
    with pytest.raises(StateError, match="follow version 7, which is no version this dataset follows"):
        follower.load_state_dict({**follower.state_dict(), "follow": {"version": 7}})
    # a version that changes the columns cannot be followed
    m = read_manifest(path)
    m["schema"]["y"]["dtype"] = "I32"
    m.update(manifest_version=2, operation="append")
    from handmade import _commit_full_entry
    _commit_full_entry(path, m)
    with pytest.raises(ManifestError, match="version 2 is a version of operation append that changes the dataset's "
                                            "columns"):
        list(SafetensorsIterableDataset(path, batch_size=2, version=1,
                                        follow=Follow(poll_interval=0.01, until_version=2)))
    write_manifest(path, m)

"""Mixtures of datasets and load-time filters (spec/python.md §3.4, §3.5): the orders against
brute-force references written from the spec in plain Python (numpy only for its generators),
per (seed, epoch, rank, world size); resume with another worker count and world size; per-source
counts; the errors. Hand-made datasets (handmade.py)."""

import numpy as np
import pytest

import handmade
from safetensors_spark import ColumnNotFoundError, StateError
from safetensors_spark.torch import Filter, SafetensorsIterableDataset, SafetensorsMixture, Source, loader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

A_SIZES, B_SIZES, C_SIZES = [7, 5, 9, 3, 6], [4, 6], [5]


def write(path, sizes, base, names=("x", "y"), extra=False):
    """Sample ``i`` has id ``base + i``: column y (I64) = id, x (F32 [2]) = [id, -id]; with
    ``extra`` also keep (BOOL, id % 3 != 1) and lang (I32, id % 4)."""
    ids = np.arange(sum(sizes)) + base
    cols = {names[0]: ("fixed", "F32", np.stack([ids, -ids], 1)), names[1]: ("fixed", "I64", ids)}
    if extra:
        cols["keep"] = ("fixed", "BOOL", ids % 3 != 1)
        cols["lang"] = ("fixed", "I32", (ids % 4).astype(np.int32))
    handmade.write_ragged_dataset(path, sizes, cols)
    return path


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("mix")
    return (write(str(d / "a"), A_SIZES, 0, extra=True), write(str(d / "b"), B_SIZES, 1000),
            write(str(d / "c"), C_SIZES, 2000, names=("feat", "id")))


# -- brute-force references (spec/python.md §3, §3.4, §3.5) ----------------------------------


def kept_per_shard(sizes, base, keep):
    out, start = [], base
    for n in sizes:
        out.append([i for i in range(start, start + n) if keep(i)])
        start += n
    return out


def ref_order(shards, shuffle, seed, epoch, block=None):
    """The §3 global order over the (kept) ids of each shard: shards permuted by
    default_rng([seed, epoch]), laid end to end, blocks permuted by default_rng([seed, epoch, 1, k])."""
    block = block or 4 * max(len(s) for s in shards)
    perm = np.random.default_rng([seed, epoch]).permutation(len(shards)).tolist() if shuffle else range(len(shards))
    laid = [i for s in perm for i in shards[s]]
    if not shuffle:
        return laid
    out = []
    for k in range(0, len(laid), block):
        chunk = laid[k: k + block]
        out += [chunk[i] for i in np.random.default_rng([seed, epoch, 1, k // block]).permutation(len(chunk))]
    return out


def ref_rank(order, world, rank, b, drop_last, start=0):
    """Rank ``rank``'s batches from ``start`` (§3: padding repeats the order's start; rounds of
    world × b; a short last round split evenly)."""
    n = len(order)
    left = n - start
    left = left // (world * b) * (world * b) if drop_last else -(-left // world) * world
    pos = [order[p % n] for p in range(start, start + left)]
    out, rnd = [], world * b
    full, rem = divmod(left, rnd)
    for k in range(full):
        out.append(pos[k * rnd + rank * b: k * rnd + rank * b + b])
    if rem:
        each = rem // world
        out.append(pos[full * rnd + rank * each: full * rnd + rank * each + each])
    return out


def ref_mixture(sources, counts, shuffle, seed, epoch):
    """§3.5: labels (permuted by default_rng([seed, epoch, 2]), or in key order (j + ½)/count);
    draw j of source i = position j mod n of its order with seed SeedSequence([seed, i, j div n])."""
    labels = [i for i, c in enumerate(counts) for _ in range(c)]
    if shuffle:
        labels = np.random.default_rng([seed, epoch, 2]).permutation(labels).tolist()
    else:
        labels = [i for _, i in sorted(((j + 0.5) / c, i) for i, c in enumerate(counts) for j in range(c))]
    seen, out, orders = [0] * len(counts), [], {}
    for i in labels:
        n = sum(len(s) for s in sources[i])
        rnd, q = divmod(seen[i], n)
        seen[i] += 1
        if (i, rnd) not in orders:
            s = int(np.random.SeedSequence([seed, i, rnd]).generate_state(1, np.uint64)[0]) >> 1
            orders[(i, rnd)] = ref_order(sources[i], shuffle, s, epoch)
        out.append(orders[(i, rnd)][q])
    return out


def ref_quotas(weights, total):
    s = sum(weights)
    exact = [total * (w / s) for w in weights]
    base = [int(e // 1) for e in exact]
    for i in sorted(range(len(weights)), key=lambda i: (-(exact[i] - base[i]), i))[: total - sum(base)]:
        base[i] += 1
    return base


def ids(batches):
    return [[int(v) for v in b["y"].reshape(-1).tolist()] for b in batches]


def flat(batches):
    return [i for b in batches for i in b]


# -- filters ---------------------------------------------------------------------------------


FILTERS = [(Filter.mask("keep"), lambda i: i % 3 != 1),
           (Filter.where("y", ">=", 12), lambda i: i >= 12),  # shards 0 and 1 drop out whole
           (Filter.where("lang", "in", [0, 3]), lambda i: i % 4 in (0, 3)),
           (Filter.where("lang", lambda v: v != 2), lambda i: i % 4 != 2)]


@pytest.mark.parametrize("f", range(len(FILTERS)))
def test_filtered_order_equals_the_brute_force_reference(paths, f):
    flt, keep = FILTERS[f]
    shards = kept_per_shard(A_SIZES, 0, keep)
    for shuffle, seed, epoch in ((False, 0, 0), (True, 3, 0), (True, 3, 1)):
        order = ref_order(shards, shuffle, seed, epoch)
        assert sorted(order) == [i for i in range(30) if keep(i)]
        for world, b, drop_last in ((1, 4, False), (2, 3, False), (3, 2, True), (4, 3, False)):
            got = []
            for r in range(world):
                ds = SafetensorsIterableDataset(paths[0], batch_size=b, shuffle=shuffle, seed=seed, rank=r,
                                                world_size=world, drop_last=drop_last, filter=flt)
                ds.set_epoch(epoch)
                assert len(ds) == len(ref_rank(order, world, r, b, drop_last))
                got.append(ids(ds))
                assert got[r] == ref_rank(order, world, r, b, drop_last), (flt, shuffle, epoch, world, r)
            assert len({len(flat(g)) for g in got}) == 1 and len({len(g) for g in got}) == 1


def test_filtered_resume_with_other_workers_and_world_size(paths):
    flt, keep = FILTERS[0]
    kw = dict(batch_size=2, shuffle=True, seed=5, filter=flt)
    order = ref_order(kept_per_shard(A_SIZES, 0, keep), True, 5, 0)
    ds = SafetensorsIterableDataset(paths[0], rank=0, world_size=2, **kw)
    head = []
    for batch in loader(ds, num_workers=2):  # real worker processes
        head.append(batch)
        if len(head) == 2:
            break
    assert ids(head) == ref_rank(order, 2, 0, 2, False)[:2]
    state = ds.state_dict()
    assert state["position"] == 8 and state["filter"]["kept"] == len(order)
    for r in range(3):
        again = SafetensorsIterableDataset(paths[0], rank=r, world_size=3, **kw)
        again.load_state_dict(state)
        assert ids(loader(again, num_workers=0)) == ref_rank(order, 3, r, 2, False, start=8)
    other = SafetensorsIterableDataset(paths[0], **dict(kw, filter=FILTERS[1][0]))
    with pytest.raises(StateError, match="filter.*the filter keeps other samples"):
        other.load_state_dict(state)
    with pytest.raises(StateError, match="filter"):
        SafetensorsIterableDataset(paths[0], batch_size=2, shuffle=True, seed=5).load_state_dict(state)


def test_a_filtered_dataset_pickles_without_its_function(paths):
    import pickle

    ds = SafetensorsIterableDataset(paths[0], batch_size=4, shuffle=True, seed=1, filter=FILTERS[3][0])
    assert ids(pickle.loads(pickle.dumps(ds))) == ids(ds)  # what spawn workers get: the kept bits


def test_filter_errors_name_the_column_and_what_is_wrong(paths, tmp_path):
    a = paths[0]
    with pytest.raises(ColumnNotFoundError, match=r"filter: column 'nope' is not in dataset .*its columns are"):
        SafetensorsIterableDataset(a, filter=Filter.mask("nope"))
    with pytest.raises(ValueError, match=r"column 'x' .* per-sample shape \[2\]; a filter reads a scalar column"):
        SafetensorsIterableDataset(a, filter=Filter.where("x", ">", 1))
    with pytest.raises(ValueError, match="mask column 'lang' .* has dtype I32; a mask must be BOOL"):
        SafetensorsIterableDataset(a, filter=Filter.mask("lang"))
    with pytest.raises(ValueError, match="op must be one of"):
        Filter.where("lang", "~", 1)
    with pytest.raises(ValueError, match="compares with numbers or booleans, got 'en'"):
        Filter.where("lang", "==", "en")
    with pytest.raises(ValueError, match="takes a list of values"):
        Filter.where("lang", "in", 3)
    with pytest.raises(TypeError, match=r"column 'lang': the function must return a bool array of shape \[7\]"):
        SafetensorsIterableDataset(a, filter=Filter.where("lang", lambda v: v[:2] > 0))
    with pytest.raises(ValueError, match="filter must be a safetensors_spark.Filter"):
        SafetensorsIterableDataset(a, filter=lambda sample: True)
    rag = str(tmp_path / "rag")
    handmade.write_ragged_dataset(rag, [2], {"t": ("ragged", "I32", [np.arange(3), np.arange(1)], "array")})
    with pytest.raises(ValueError, match="column 't' .* is ragged"):
        SafetensorsIterableDataset(rag, filter=Filter.where("t", ">", 0))


# -- mixtures --------------------------------------------------------------------------------


def sources(paths, filtered=True):
    return [Source(paths[0], columns=["x", "y"], filter=Filter.mask("keep") if filtered else None), paths[1],
            Source(paths[2], columns={"x": "feat", "y": "id"})]


def ref_sources(filtered=True):
    return [kept_per_shard(A_SIZES, 0, (lambda i: i % 3 != 1) if filtered else (lambda i: True)),
            kept_per_shard(B_SIZES, 1000, lambda i: True), kept_per_shard(C_SIZES, 2000, lambda i: True)]


MIXES = [dict(mode="sample", weights=[1, 3, 0.5], num_samples=50),
         dict(mode="sample", weights=[2, 0, 1]),
         dict(mode="exhaust")]


@pytest.mark.parametrize("m", range(len(MIXES)))
def test_mixture_order_equals_the_brute_force_reference(paths, m):
    kw = MIXES[m]
    refs = ref_sources()
    lengths = [sum(len(s) for s in r) for r in refs]
    if kw["mode"] == "exhaust":
        counts = lengths
    else:
        counts = ref_quotas(kw["weights"], kw.get("num_samples", sum(lengths)))
    for shuffle, seed, epoch in ((False, 0, 0), (True, 7, 0), (True, 7, 1)):
        order = ref_mixture(refs, counts, shuffle, seed, epoch)
        for world, b, drop_last in ((1, 5, False), (2, 3, False), (3, 4, True)):
            got = []
            for r in range(world):
                ds = SafetensorsMixture(sources(paths), batch_size=b, shuffle=shuffle, seed=seed, rank=r,
                                        world_size=world, drop_last=drop_last, source_column="source", **kw)
                ds.set_epoch(epoch)
                assert ds.source_counts == counts
                batches = list(ds)
                got.append(ids(batches))
                assert got[r] == ref_rank(order, world, r, b, drop_last), (kw, shuffle, epoch, world, r)
                for batch in batches:  # the values follow the ids; source_column names each sample's source
                    assert batch["x"][:, 0].tolist() == batch["y"].tolist() == (-batch["x"][:, 1]).tolist()
                    assert (batch["y"] // 1000).tolist() == batch["source"].tolist()
            assert len({len(flat(g)) for g in got}) == 1 and len({len(g) for g in got}) == 1
    # per-source counts of an epoch: exactly the quotas
    assert [sum(1 for i in order if i // 1000 == s) for s in range(3)] == counts


def test_mixture_resume_with_other_workers_world_size_and_counts(paths):
    kw = dict(weights=[1, 3, 0.5], num_samples=50, batch_size=3, shuffle=True, seed=4)
    order = ref_mixture(ref_sources(), ref_quotas([1, 3, 0.5], 50), True, 4, 0)
    ds = SafetensorsMixture(sources(paths), rank=0, world_size=2, **kw)
    head = []
    for batch in loader(ds, num_workers=2, handoff_batches=2):  # real worker processes
        head.append(batch)
        if len(head) == 3:
            break
    assert ids(head) == ref_rank(order, 2, 0, 3, False)[:3]
    state = ds.state_dict()
    assert state["position"] == 18
    assert state["consumed_per_source"] == [sum(1 for i in order[:18] if i // 1000 == s) for s in range(3)]
    for r in range(3):
        again = SafetensorsMixture(sources(paths), rank=r, world_size=3, **kw)
        again.load_state_dict(state)
        assert ids(loader(again)) == ref_rank(order, 3, r, 3, False, start=18), r
    with pytest.raises(StateError, match="weights"):
        SafetensorsMixture(sources(paths), **dict(kw, weights=[1, 3, 1])).load_state_dict(state)
    with pytest.raises(StateError, match="sources"):
        SafetensorsMixture(sources(paths, filtered=False), **kw).load_state_dict(state)
    with pytest.raises(StateError, match="not a SafetensorsMixture state"):
        SafetensorsMixture(sources(paths), **kw).load_state_dict(
            SafetensorsIterableDataset(paths[1], batch_size=3).state_dict())


def test_mixture_schemas_must_agree_unless_mapped(paths):
    with pytest.raises(ValueError, match=r"mixture source 2 \(.*c\) has columns \['feat', 'id'\] but mixture source 0 "
                                         r"\(.*a\) has \['x', 'y'\] \(missing \['x', 'y'\], extra \['feat', 'id'\]\); "
                                         r"map every source to one schema"):
        SafetensorsMixture([Source(paths[0], columns=["x", "y"]), paths[1], paths[2]])
    with pytest.raises(ValueError, match=r"mixture source 1 .* has columns \['x', 'y'\] but mixture source 0 .* "
                                         r"has \['keep', 'lang', 'x', 'y'\]"):
        SafetensorsMixture([paths[0], paths[1]])
    with pytest.raises(ValueError, match=r"mixture column 'y' is I64 \[\] in mixture source 0 .* but I32 \[\] in "
                                         r"mixture source 1 .*\(column 'lang'\)"):
        SafetensorsMixture([Source(paths[0], columns=["x", "y"]), Source(paths[0], columns={"x": "x", "y": "lang"})])
    with pytest.raises(ColumnNotFoundError, match=r"mixture source 1 .*: column 'nope' is not in the dataset"):
        SafetensorsMixture([paths[1], Source(paths[2], columns={"x": "feat", "y": "nope"})])
    mixed = SafetensorsMixture([paths[1], Source(paths[2], columns={"x": "feat", "y": "id"})], batch_size=20,
                               mode="exhaust")
    (batch,) = list(mixed)
    assert sorted(batch["y"].tolist()) == list(range(1000, 1010)) + list(range(2000, 2005))
    assert list(batch) == ["x", "y"]
    # through worker processes, one batch and several per message; single samples without batch_size
    kw = dict(weights=[1, 1], num_samples=16, batch_size=3, seed=2)
    srcs = [paths[1], Source(paths[2], columns={"x": "feat", "y": "id"})]
    want = ids(SafetensorsMixture(srcs, **kw))
    for handoff in (1, None):
        assert ids(loader(SafetensorsMixture(srcs, **kw), num_workers=2, handoff_batches=handoff)) == want
    singles = list(SafetensorsMixture(srcs, **dict(kw, batch_size=None)))
    assert [int(s["y"]) for s in singles] == flat(want) and singles[0]["x"].shape == (2,)


def test_mixture_weights_and_modes_are_checked(paths):
    srcs = sources(paths)
    for weights, what in (([1, -1, 1], "weight 1 is -1; a weight must be a finite number >= 0"),
                          ([0, 0, 0], r"weights \[0, 0, 0\] sum to 0"),
                          ([1, 1], "weights has 2 entries for 3 sources"),
                          ([1, float("nan"), 1], "weight 1 is nan"),
                          ([1, True, 1], "weight 1 is True"),
                          ("1,2,3", "weights must be a list of 3 numbers")):
        with pytest.raises(ValueError, match=what):
            SafetensorsMixture(srcs, weights=weights)
    with pytest.raises(ValueError, match="mode='exhaust' takes every sample .* weights and num_samples are for"):
        SafetensorsMixture(srcs, weights=[1, 1, 1], mode="exhaust")
    with pytest.raises(ValueError, match="mode must be one of"):
        SafetensorsMixture(srcs, mode="cycle")
    with pytest.raises(ValueError, match="num_samples must be an integer >= 0"):
        SafetensorsMixture(srcs, num_samples=-3)
    empty = Source(paths[0], columns=["x", "y"], filter=Filter.where("y", ">", 99))
    with pytest.raises(ValueError, match=r"mixture source 0 .* has weight 1.0 but no samples its filter keeps"):
        SafetensorsMixture([empty, paths[1]], weights=[1, 1])
    assert SafetensorsMixture([empty, paths[1]], weights=[0, 1]).source_counts == [0, 10]
    with pytest.raises(ValueError, match="source_column must be a name that is not a column"):
        SafetensorsMixture(srcs, source_column="y")


def test_weights_whose_sum_overflows_keep_their_ratios(paths):
    """Issue #39 item 8: weights [1e308, 1e308, 0] sum to inf; the epoch still has num_samples
    positions, split as [1, 1, 0] would split them (it had 2 instead of 37, silently)."""
    srcs = sources(paths)
    huge = SafetensorsMixture(srcs, weights=[1e308, 1e308, 0], num_samples=37, shuffle=False)
    plain = SafetensorsMixture(srcs, weights=[1, 1, 0], num_samples=37, shuffle=False)
    assert len(huge) == 37 and huge.source_counts == plain.source_counts == [19, 18, 0]
    tiny = SafetensorsMixture(srcs, weights=[5e-324, 5e-324, 0], num_samples=37, shuffle=False)
    assert tiny.source_counts == [19, 18, 0]


def test_two_process_torch_distributed_mixture(paths, tmp_path):
    """A real 2-rank gloo job on loopback, 2 DataLoader workers a rank: each rank gets its share of
    the reference order, the same count, and the state after the epoch counts every source's quota;
    the README's StatefulDataLoader + DCP pattern (saved mid-epoch, restored) gives the same ids."""
    import json
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    worker = Path(__file__).resolve().parent / "dist_mixture_worker.py"
    procs = [subprocess.Popen([sys.executable, str(worker), *paths, str(tmp_path / f"rank{r}.json")],
                              env=dict(env, RANK=str(r))) for r in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    counts = ref_quotas([1, 3, 0.5], 50)
    order = ref_mixture(ref_sources(), counts, True, 4, 0)
    for r in range(2):
        assert got[r]["ids"] == got[r]["resumed"] == flat(ref_rank(order, 2, r, 3, False)), r
        assert got[r]["consumed_per_source"] == counts


def test_mixture_under_stateful_dataloader_and_persistent_workers(paths):
    """A mixture resumes under torchdata's StatefulDataLoader (its own per-worker states, and the
    whole state loaded by the mixture for another worker count), and persistent workers follow
    set_epoch: every epoch is the reference's."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    kw = dict(weights=[1, 3, 0.5], num_samples=50, batch_size=3, shuffle=True, seed=4)
    order = ref_mixture(ref_sources(), ref_quotas([1, 3, 0.5], 50), True, 4, 0)
    head, state, same = handmade.stateful_resumed(lambda: SafetensorsMixture(sources(paths), **kw), 5, num_workers=2,
                                                  snapshot_every=2)
    assert flat(ids(head) + ids(same)) == order
    other = SafetensorsMixture(sources(paths), **kw)
    other.load_state_dict(state)
    assert other.state_dict()["position"] == 15
    assert flat(ids(head) + ids(StatefulDataLoader(other, batch_size=None, num_workers=1))) == order
    live = SafetensorsMixture(sources(paths), **kw)
    dl = loader(live, num_workers=2, persistent_workers=True)
    for epoch in (0, 1):
        live.set_epoch(epoch)
        assert flat(ids(dl)) == ref_mixture(ref_sources(), ref_quotas([1, 3, 0.5], 50), True, 4, epoch)

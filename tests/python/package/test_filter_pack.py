"""Filters with packing, mixtures of packed sources, and the map-style dataset's filter
(spec/python.md §3.3, §3.4, §3.5): against brute-force references written from the spec in plain
Python (numpy only for its generators). Hand-made datasets (handmade.py)."""

import numpy as np
import pytest
import torch

import handmade
from safetensors_spark import ColumnNotFoundError, StateError
from safetensors_spark.torch import Filter, Packing, SafetensorsIterableDataset, loader
from test_mixture_filter import kept_per_shard, ref_order, ref_rank

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

SIZES = [7, 5, 9, 3, 6]
N = sum(SIZES)


def _tokens(seed, n):
    rng = np.random.default_rng(seed)
    # lengths 0..9 (empty documents included); token ids encode (document, position)
    return [1000 * i + np.arange(rng.integers(0, 10)) for i in range(n)]


TOKENS = _tokens(0, N)
KEEP = [i % 3 != 1 for i in range(N)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """tokens (ragged I32), y (I64 id), keep (BOOL mask), lang (I32 = id % 4)."""
    path = str(tmp_path_factory.mktemp("filterpack") / "ds")
    ids = np.arange(N)
    handmade.write_ragged_dataset(path, SIZES, {
        "tokens": ("ragged", "I32", TOKENS, "array"),
        "y": ("fixed", "I64", ids),
        "keep": ("fixed", "BOOL", np.array(KEEP)),
        "lang": ("fixed", "I32", (ids % 4).astype(np.int32)),
    }, padded=[1, 0, 2, 0, 0])
    return path


FILTERS = [(Filter.mask("keep"), lambda i: KEEP[i]),
           (Filter.where("y", ">=", 12), lambda i: i >= 12),  # shards 0 and 1 drop out whole
           (Filter.where("lang", lambda v: v != 2), lambda i: i % 4 != 2),
           (Filter.length("tokens", ">=", 4), lambda i: len(TOKENS[i]) >= 4)]  # from the offsets only


def ref_stream(keep, seq_len, eos, shuffle, seed, epoch, tokens=TOKENS, sizes=SIZES):
    """Brute force (§3.3 over §3.4): the kept documents in the filtered order, each followed by
    eos, one stream cut into blocks; per block the pieces walked token by token. Returns the
    blocks and the dropped token count."""
    order = ref_order(kept_per_shard(sizes, 0, keep), shuffle, seed, epoch)
    return handmade.pack_reference(((d, tokens[d].tolist()) for d in order), seq_len, eos)


def ref_packed_rank(blocks, world, rank, b, drop_last, start=0):
    """§3.3 ranks: the blocks from ``start`` cut to a multiple of world_size, then dealt as §3."""
    n = start + (len(blocks) - start) // world * world
    return ref_rank(blocks[:n], world, rank, b, drop_last, start)


# -- filter + pack ---------------------------------------------------------------------------


@pytest.mark.parametrize("f", range(len(FILTERS)))
@pytest.mark.parametrize("seq_len,eos,shuffle", [(6, -1, True), (4, None, False)])
def test_filtered_packed_blocks_equal_the_brute_force_reference(data, f, seq_len, eos, shuffle):
    flt, keep = FILTERS[f]
    pack = Packing("tokens", seq_len=seq_len, eos=eos)
    for epoch in (0, 1):
        want, dropped = ref_stream(keep, seq_len, eos, shuffle, 3, epoch)
        assert {d for blk in want for d in blk["document_ids"]} <= {i for i in range(N) if keep(i)}
        for world, b, drop_last in ((1, 3, False), (2, 2, False), (3, 2, True)):
            per_rank = []
            for r in range(world):
                ds = SafetensorsIterableDataset(data, batch_size=b, shuffle=shuffle, seed=3, rank=r, world_size=world,
                                                drop_last=drop_last, filter=flt, pack=pack)
                ds.set_epoch(epoch)
                assert ds.num_blocks == len(want) and ds.dropped_tokens == dropped
                ref = ref_packed_rank(want, world, r, b, drop_last)
                assert len(ds) == len(ref)
                per_rank.append(handmade.as_blocks(list(ds), seq_len))
                assert per_rank[r] == [blk for batch in ref for blk in batch], (f, epoch, world, r)
            assert len({len(p) for p in per_rank}) == 1  # every rank the same number of blocks


def test_filtered_packing_through_worker_processes_and_single_blocks(data):
    flt, keep = FILTERS[0]
    want, _ = ref_stream(keep, 5, 0, True, 9, 0)
    kw = dict(shuffle=True, seed=9, filter=flt, pack=Packing("tokens", seq_len=5, eos=0))
    for handoff in (1, 3):
        got = handmade.as_blocks(loader(SafetensorsIterableDataset(data, batch_size=2, **kw), num_workers=2,
                               handoff_batches=handoff), 5)
        assert got == want, handoff
    single = list(SafetensorsIterableDataset(data, **kw))
    assert [s["tokens"].tolist() for s in single] == [w["tokens"] for w in want]
    assert [s["cu_seqlens"].tolist() for s in single] == [w["cu_seqlens"] for w in want]


def test_filtered_packing_resumes_mid_epoch_with_other_workers_and_world_size(data):
    flt, keep = FILTERS[2]
    pack = Packing("tokens", seq_len=4, eos=-1)
    kw = dict(batch_size=2, shuffle=True, seed=5, filter=flt, pack=pack)
    want, _ = ref_stream(keep, 4, -1, True, 5, 1)
    ds = SafetensorsIterableDataset(data, rank=1, world_size=2, **kw)
    ds.set_epoch(1)
    head = []
    for batch in loader(ds, num_workers=2):  # real worker processes
        head.append(batch)
        if len(head) == 3:
            break
    assert handmade.as_blocks(head, 4) == [b for batch in ref_packed_rank(want, 2, 1, 2, False)[:3] for b in batch]
    state = ds.state_dict()
    assert state["epoch"] == 1 and state["position"] == 12 and state["blocks"] == len(want)
    assert state["filter"]["kept"] == sum(keep(i) for i in range(N)) and state["pack"]["seq_len"] == 4
    for world, workers in ((3, 0), (1, 2)):
        rest = []
        for r in range(world):
            again = SafetensorsIterableDataset(data, rank=r, world_size=world, **kw)
            again.load_state_dict(state)
            rest.append(handmade.as_blocks(loader(again, num_workers=workers), 4))
            ref = ref_packed_rank(want, world, r, 2, False, start=12)
            assert rest[r] == [b for batch in ref for b in batch], (world, r)
        assert len({len(p) for p in rest}) == 1
    # the state names its filter and its packing: another of either, or none, is refused
    for other, what in ((dict(kw, filter=FILTERS[0][0]), "filter.*the filter keeps other samples"),
                        ({k: v for k, v in kw.items() if k != "filter"}, "filter"),
                        (dict(kw, pack=Packing("tokens", seq_len=5, eos=-1)), "pack")):
        with pytest.raises(StateError, match=what):
            SafetensorsIterableDataset(data, **other).load_state_dict(state)
    with pytest.raises(StateError, match="filter"):  # an unfiltered packed state cannot resume a filtered one
        SafetensorsIterableDataset(data, **kw).load_state_dict(
            SafetensorsIterableDataset(data, batch_size=2, shuffle=True, seed=5, pack=pack).state_dict())
    with pytest.raises(StateError, match=rf"position={len(want) + 1}, beyond the epoch's {len(want)} blocks"):
        SafetensorsIterableDataset(data, **kw).load_state_dict(dict(state, position=len(want) + 1))


def test_filtered_packing_errors(data):
    pack = Packing("tokens", seq_len=4)
    with pytest.raises(ValueError, match=r"column 'tokens' .* is ragged.*filter its row lengths with "
                                         r"Filter.length\('tokens', op, value\)"):
        SafetensorsIterableDataset(data, filter=Filter.where("tokens", ">", 0), pack=pack)
    with pytest.raises(ValueError, match=r"Filter.length reads the row lengths of a ragged column; column 'lang' .* "
                                         r"is not ragged \(its ragged columns: \['tokens'\]\)"):
        SafetensorsIterableDataset(data, filter=Filter.length("lang", ">", 0), pack=pack)
    with pytest.raises(ValueError, match="Filter.length: op must be one of"):
        Filter.length("tokens", "~", 3)
    with pytest.raises(TypeError, match=r"column 'tokens': the function must return a bool array of shape \[7\]"):
        SafetensorsIterableDataset(data, filter=Filter.length("tokens", lambda n: n[:2] > 0), pack=pack)
    with pytest.raises(ValueError, match="mask column 'lang' .* has dtype I32; a mask must be BOOL"):
        SafetensorsIterableDataset(data, filter=Filter.mask("lang"), pack=pack)
    # a filter that keeps no document: no blocks, no batches (and no error)
    none = SafetensorsIterableDataset(data, batch_size=2, filter=Filter.where("y", "<", 0), pack=pack)
    assert (none.num_blocks, none.dropped_tokens, len(none), list(none)) == (0, 0, 0, [])


# -- mixtures of packed sources --------------------------------------------------------------

B_SIZES = [6, 8]
B_TOKENS = [-(1000 * i + np.arange(n)) - 1 for i, n in enumerate(np.random.default_rng(5).integers(0, 12, 14))]


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """A second token dataset: its token column is named ids (I32, negative ids), plus x (F32)."""
    path = str(tmp_path_factory.mktemp("filterpack") / "b")
    handmade.write_ragged_dataset(path, B_SIZES, {"ids": ("ragged", "I32", B_TOKENS, "array"),
                                                  "x": ("fixed", "F32", np.zeros(sum(B_SIZES)))})
    return path


def ref_packed_mixture(srcs, counts, seq_len, eos, shuffle, seed, epoch):
    """§3.5 over blocks: labels as for samples (default_rng([seed, epoch, 2]) or the key
    interleave); draw d of source i is block d mod L_i of pass d div L_i of source i's own packed
    stream (ref_stream with seed SeedSequence([seed, i, pass]), its filter's kept documents).
    ``srcs``: (keep, tokens, sizes) per source. Returns (block, source) per position."""
    labels = [i for i, c in enumerate(counts) for _ in range(c)]
    if shuffle:
        labels = np.random.default_rng([seed, epoch, 2]).permutation(labels).tolist()
    else:
        labels = [i for _, i in sorted(((j + 0.5) / c, i) for i, c in enumerate(counts) for j in range(c))]
    seen, out, streams = [0] * len(counts), [], {}

    def stream(i, rnd):
        if (i, rnd) not in streams:
            s = int(np.random.SeedSequence([seed, i, rnd]).generate_state(1, np.uint64)[0]) >> 1
            keep, tokens, sizes = srcs[i]
            streams[(i, rnd)] = ref_stream(keep, seq_len, eos, shuffle, s, epoch, tokens=tokens, sizes=sizes)[0]
        return streams[(i, rnd)]

    for i in labels:
        rnd, q = divmod(seen[i], len(stream(i, 0)))
        seen[i] += 1
        out.append((stream(i, rnd)[q], i))
    return out


def packed_sources(data, other):
    from safetensors_spark.torch import Source
    return [Source(data, filter=Filter.mask("keep")), Source(other, columns={"tokens": "ids"})]


REF_SOURCES = [(lambda i: KEEP[i], TOKENS, SIZES), (lambda i: True, B_TOKENS, B_SIZES)]


def with_sources(batches, seq_len):
    return [(b, int(s)) for batch in batches for b, s in zip(handmade.as_blocks([batch], seq_len), batch["src"].tolist())]


@pytest.mark.parametrize("mode", [dict(weights=[1, 3], num_samples=23), dict(weights=[1, 3], num_samples=60),
                                  dict(mode="exhaust")])
def test_packed_mixture_equals_the_brute_force_reference(data, other, mode):
    from safetensors_spark.torch import SafetensorsMixture
    pack = Packing("tokens", seq_len=5, eos=0)
    lengths = [len(ref_stream(k, 5, 0, False, 0, 0, tokens=t, sizes=s)[0]) for k, t, s in REF_SOURCES]
    # 23 or 60 · (1/4, 3/4), largest remainder; 60: source 1 (17 blocks) is drawn in 3 passes, and
    # batches hold blocks of two passes
    counts = lengths if mode.get("mode") == "exhaust" else [6, 17] if mode["num_samples"] == 23 else [15, 45]
    for shuffle, seed, epoch in ((False, 0, 0), (True, 4, 0), (True, 4, 1)):
        want = ref_packed_mixture(REF_SOURCES, counts, 5, 0, shuffle, seed, epoch)
        for world, b, drop_last in ((1, 3, False), (2, 2, False), (3, 2, True)):
            per_rank = []
            for r in range(world):
                mix = SafetensorsMixture(packed_sources(data, other), batch_size=b, shuffle=shuffle, seed=seed,
                                         rank=r, world_size=world, drop_last=drop_last, pack=pack,
                                         source_column="src", **mode)
                mix.set_epoch(epoch)
                assert mix.source_counts == counts
                per_rank.append(with_sources(mix, 5))
                ref = ref_packed_rank(want, world, r, b, drop_last)
                assert len(mix) == len(ref)
                assert per_rank[r] == [x for batch in ref for x in batch], (mode, shuffle, epoch, world, r)
            assert len({len(p) for p in per_rank}) == 1


def test_packed_mixture_delivers_the_ids_its_packing_asks_for(data, other):
    """``pack=Packing(..., ids=, ids_dtype=)`` on a mixture: its batches carry the ids asked for
    in that dtype (the sources' own packings follow the mixture's), the same values as the
    default packing's."""
    from safetensors_spark.torch import SafetensorsMixture
    kw = dict(weights=[1, 3], num_samples=12, batch_size=3, shuffle=True, seed=2)
    full = list(SafetensorsMixture(packed_sources(data, other), pack=Packing("tokens", 5, eos=0), **kw))
    for ids, dtype in ((("position_ids",), torch.int32), ((), torch.int64), (("document_ids", "position_ids"), torch.int32)):
        got = list(SafetensorsMixture(packed_sources(data, other),
                                      pack=Packing("tokens", 5, eos=0, ids=ids, ids_dtype=dtype), **kw))
        assert len(got) == len(full)
        for g, f in zip(got, full):
            assert sorted(g) == sorted(("tokens", "cu_seqlens") + ids)
            assert torch.equal(g["tokens"], f["tokens"]) and torch.equal(g["cu_seqlens"], f["cu_seqlens"])
            for i in ids:
                assert g[i].dtype == dtype and torch.equal(g[i].long(), f[i])


def test_packed_mixture_resumes_with_other_workers_and_world_size(data, other):
    from safetensors_spark.torch import SafetensorsMixture
    pack = Packing("tokens", seq_len=4, eos=-1)
    kw = dict(weights=[2, 1], num_samples=30, batch_size=2, shuffle=True, seed=6, pack=pack, source_column="src")
    counts = [20, 10]
    want = ref_packed_mixture(REF_SOURCES, counts, 4, -1, True, 6, 0)
    mix = SafetensorsMixture(packed_sources(data, other), rank=0, world_size=2, **kw)
    head = []
    for batch in loader(mix, num_workers=2, handoff_batches=2):  # real worker processes
        head.append(batch)
        if len(head) == 3:
            break
    assert with_sources(head, 4) == [x for batch in ref_packed_rank(want, 2, 0, 2, False)[:3] for x in batch]
    state = mix.state_dict()
    assert state["position"] == 12 and state["pack"] == {"column": "tokens", "seq_len": 4, "eos": -1}
    assert state["consumed_per_source"] == [sum(1 for _, s in want[:12] if s == i) for i in (0, 1)]
    for r in range(3):
        again = SafetensorsMixture(packed_sources(data, other), rank=r, world_size=3, **kw)
        again.load_state_dict(state)
        assert with_sources(loader(again), 4) == \
            [x for batch in ref_packed_rank(want, 3, r, 2, False, start=12) for x in batch], r
    with pytest.raises(StateError, match="sources"):  # another packing of the same sources
        SafetensorsMixture(packed_sources(data, other), **dict(kw, pack=Packing("tokens", 5, eos=-1))).load_state_dict(
            state)
    single = list(SafetensorsMixture(packed_sources(data, other), **dict(kw, batch_size=None)))
    assert [s["tokens"].tolist() for s in single] == [b["tokens"] for b, _ in want[:30]]
    assert single[0]["tokens"].shape == (4,) and single[0]["src"].shape == ()


def test_packed_mixture_refusals_name_what_is_wrong(data, other, tmp_path):
    from safetensors_spark.torch import SafetensorsMixture, Source
    pack = Packing("tokens", seq_len=4)
    with pytest.raises(ValueError, match=r"mixture source 1 .*: a packed mixture yields blocks of mixture column "
                                         r"'tokens' only, got columns \['ids', 'x'\]"):
        SafetensorsMixture([data, Source(other, columns=["ids", "x"])], pack=pack)
    with pytest.raises(ColumnNotFoundError, match=r"mixture source 1 .*: column 'tokens' is not in the dataset"):
        SafetensorsMixture([data, other], pack=pack)  # its token column is named ids: map it
    with pytest.raises(ValueError, match=r"column 'x' of dataset .* is not ragged"):
        SafetensorsMixture([data, Source(other, columns={"tokens": "x"})], pack=pack)
    f64 = str(tmp_path / "f64")
    handmade.write_ragged_dataset(f64, [2], {"tokens": ("ragged", "I64", [np.arange(3), np.arange(5)], "array")})
    with pytest.raises(ValueError, match=r"token column 'tokens' of mixture source 1 .* is I64 but 'tokens' of "
                                         r"mixture source 0 .* is I32; the sources' tokens must have one dtype"):
        SafetensorsMixture([data, f64], pack=pack)
    none = Source(data, filter=Filter.where("y", "<", 0))
    with pytest.raises(ValueError, match=r"mixture source 0 .* has weight 1.0 but no blocks its filter keeps"):
        SafetensorsMixture([none, Source(other, columns={"tokens": "ids"})], weights=[1, 1], pack=pack)
    with pytest.raises(ValueError, match="pack must be a safetensors_spark.torch.Packing"):
        SafetensorsMixture([data], pack=("tokens", 4))
    # unpacked, a ragged column is refused with what to do instead
    with pytest.raises(ValueError, match=r"column 'tokens' is ragged; a mixture stacks fixed-shape columns only .*"
                                         r"pack=Packing"):
        SafetensorsMixture([Source(data, columns=["tokens"]), Source(other, columns={"tokens": "ids"})])


def test_mixture_of_a_kv_and_a_batch_dataset_and_kv_refusals(tmp_path):
    """KV sources mix like batch ones when their columns have one shape (each key's tensors
    stacked); a KV column of null shape (rows of different shapes) is refused, naming it."""
    from safetensors_spark.torch import SafetensorsMixture, Source
    from test_mixture_filter import ref_mixture

    kv, batch = str(tmp_path / "kv"), str(tmp_path / "b")
    handmade.write_kv_dataset(kv, [["a", "bb", "ccc"], ["dd", "e"]])  # label = 0..4, emb = [len(key), label]
    ids = np.arange(6) + 100
    handmade.write_ragged_dataset(batch, [4, 2], {"emb": ("fixed", "F32", np.stack([ids, ids], 1)),
                                                  "label": ("fixed", "I32", ids.astype(np.int32))})
    refs = [[[0, 1, 2], [3, 4]], [[100, 101, 102, 103], [104, 105]]]
    srcs = [Source(kv, filter=Filter.where("label", "!=", 3)), batch]
    refs[0][1].remove(3)
    for shuffle, seed in ((False, 0), (True, 2)):
        want = ref_mixture(refs, [7, 5], shuffle, seed, 0)
        mix = SafetensorsMixture(srcs, weights=[7, 5], num_samples=12, batch_size=4, shuffle=shuffle, seed=seed)
        got = list(mix)
        assert [int(v) for b in got for v in b["label"].tolist()] == want
        assert all(b["emb"][:, 1].tolist() == b["label"].float().tolist() for b in got)
    manifest = handmade.read_manifest(kv)
    manifest["schema"]["emb"]["shape"] = None  # as a KV write of rows of different shapes records it
    handmade.write_manifest(kv, manifest)
    with pytest.raises(ValueError, match=r"mixture source 0 .*: column 'emb' has rows of different shapes \(KV schema "
                                         r"shape null\); a mixture stacks fixed-shape columns only"):
        SafetensorsMixture([kv, batch])
    assert SafetensorsMixture([Source(kv, columns=["label"]), Source(batch, columns=["label"])]).source_counts == [5, 6]


# -- the map-style dataset's filter ----------------------------------------------------------


def test_map_style_filter_indexes_the_kept_samples(data):
    """SafetensorsDataset(filter=): len = kept samples, ds[i] = the i-th kept sample in dataset
    order (negative from the end), the same through __getitems__, torch's DataLoader and loader()
    with real worker processes; out of range and key lookups name what is wrong."""
    import torch
    from safetensors_spark.torch import SafetensorsDataset

    for flt, keep in FILTERS:
        kept = [i for i in range(N) if keep(i)]
        ds = SafetensorsDataset(data, columns=["y", "tokens"], filter=flt)
        assert len(ds) == len(kept)
        assert [int(ds[i]["y"]) for i in range(len(ds))] == kept
        assert int(ds[-1]["y"]) == kept[-1] and ds[2]["tokens"].tolist() == TOKENS[kept[2]].tolist()
        rows = ds.__getitems__([3, 0, -2])
        assert [int(r["y"]) for r in rows] == [kept[3], kept[0], kept[-2]]
        assert [r["tokens"].tolist() for r in rows] == [TOKENS[kept[k]].tolist() for k in (3, 0, -2)]
    flt, keep = FILTERS[0]
    kept = [i for i in range(N) if keep(i)]
    ds = SafetensorsDataset(data, columns=["y"], filter=flt)
    assert [int(v) for b in torch.utils.data.DataLoader(ds, batch_size=4) for v in b["y"]] == kept
    g = torch.Generator().manual_seed(3)
    want = [kept[i] for i in torch.randperm(len(kept), generator=torch.Generator().manual_seed(3)).tolist()]
    got = [int(v) for b in loader(ds, batch_size=4, shuffle=True, generator=g, num_workers=2) for v in b["y"]]
    assert got == want
    with pytest.raises(IndexError, match=rf"sample index {len(kept)} is out of range for the {len(kept)} samples "
                                         rf"filter mask keep keeps of dataset"):
        ds[len(kept)]
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, -len(kept) - 1])
    with pytest.raises(TypeError, match="sample index must be an integer"):
        ds[1.5]
    with pytest.raises(ValueError, match="mask column 'lang' .* has dtype I32"):
        SafetensorsDataset(data, filter=Filter.mask("lang"))
    empty = SafetensorsDataset(data, filter=Filter.where("y", "<", 0))
    assert len(empty) == 0 and list(torch.utils.data.DataLoader(empty, batch_size=2)) == []
    with pytest.raises(IndexError, match="out of range for the 0 samples"):
        empty[0]


def test_map_style_filter_refuses_key_lookups(tmp_path):
    from safetensors_spark.torch import SafetensorsDataset

    kv = str(tmp_path / "kv")
    handmade.write_kv_dataset(kv, [["a", "bb", "ccc"], ["dd", "e"]])
    ds = SafetensorsDataset(kv, filter=Filter.where("label", ">=", 2))
    assert [int(ds[i]["label"]) for i in range(len(ds))] == [2, 3, 4]
    with pytest.raises(ValueError, match=r"get\(key\) looks a key up in all of dataset .* filter label >= 2"):
        ds.get("a")


def test_filtered_packing_under_stateful_dataloader(data):
    """torchdata's StatefulDataLoader with worker processes: its own per-worker states resume a
    filtered packed epoch exactly, and the whole state loads into a dataset for another worker
    count (spec/python.md §5.1)."""
    flt, keep = FILTERS[3]
    kw = dict(batch_size=2, shuffle=True, seed=7, filter=flt, pack=Packing("tokens", seq_len=4, eos=-1))
    want, _ = ref_stream(keep, 4, -1, True, 7, 0)
    head, state, same = handmade.stateful_resumed(lambda: SafetensorsIterableDataset(data, **kw), 3, num_workers=2,
                                                  snapshot_every=1)
    assert handmade.as_blocks(head, 4) + handmade.as_blocks(same, 4) == want
    other = SafetensorsIterableDataset(data, **kw)
    other.load_state_dict(state)
    assert other.state_dict()["position"] == 6
    assert handmade.as_blocks(head, 4) + handmade.as_blocks(loader(other, num_workers=1), 4) == want

"""Filters with packing, mixtures of packed sources, and the map-style dataset's filter
(spec/python.md §3.3, §3.4, §3.5): against brute-force references written from the spec in plain
Python (numpy only for its generators). Hand-made datasets (handmade.py)."""

import numpy as np
import pytest

import handmade
from safetensors_spark import StateError
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
           (Filter.where("lang", lambda v: v != 2), lambda i: i % 4 != 2)]


def ref_stream(keep, seq_len, eos, shuffle, seed, epoch, tokens=TOKENS, sizes=SIZES):
    """Brute force (§3.3 over §3.4): the kept documents in the filtered order, each followed by
    eos, one stream cut into blocks; per block the pieces walked token by token. Returns the
    blocks and the dropped token count."""
    order = ref_order(kept_per_shard(sizes, 0, keep), shuffle, seed, epoch)
    stream, owner = [], []
    for d in order:
        toks = tokens[d].tolist() + ([eos] if eos is not None else [])
        stream += toks
        owner += [d] * len(toks)
    blocks = []
    for b in range(len(stream) // seq_len):
        toks, docs = stream[b * seq_len: (b + 1) * seq_len], owner[b * seq_len: (b + 1) * seq_len]
        pos, cu = [], [0]
        for i, d in enumerate(docs):
            new = i == 0 or d != docs[i - 1]
            if new and i:
                cu.append(i)
            pos.append(0 if new else pos[-1] + 1)
        blocks.append({"tokens": toks, "position_ids": pos, "document_ids": docs, "cu_seqlens": cu + [seq_len]})
    return blocks, len(stream) - len(blocks) * seq_len


def ref_packed_rank(blocks, world, rank, b, drop_last, start=0):
    """§3.3 ranks: the blocks from ``start`` cut to a multiple of world_size, then dealt as §3."""
    n = start + (len(blocks) - start) // world * world
    return ref_rank(blocks[:n], world, rank, b, drop_last, start)


def as_blocks(batches, seq_len):
    """Batches of packed blocks → per-block dicts (cu_seqlens cut back into blocks)."""
    out = []
    for b in batches:
        cu = b["cu_seqlens"].tolist()
        for i in range(len(b["tokens"])):
            lo, hi = i * seq_len, (i + 1) * seq_len
            out.append({"tokens": b["tokens"][i].tolist(), "position_ids": b["position_ids"][i].tolist(),
                        "document_ids": b["document_ids"][i].tolist(),
                        "cu_seqlens": [c - lo for c in cu if lo <= c <= hi]})
    return out


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
                per_rank.append(as_blocks(list(ds), seq_len))
                assert per_rank[r] == [blk for batch in ref for blk in batch], (f, epoch, world, r)
            assert len({len(p) for p in per_rank}) == 1  # every rank the same number of blocks


def test_filtered_packing_through_worker_processes_and_single_blocks(data):
    flt, keep = FILTERS[0]
    want, _ = ref_stream(keep, 5, 0, True, 9, 0)
    kw = dict(shuffle=True, seed=9, filter=flt, pack=Packing("tokens", seq_len=5, eos=0))
    for handoff in (1, 3):
        got = as_blocks(loader(SafetensorsIterableDataset(data, batch_size=2, **kw), num_workers=2,
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
    assert as_blocks(head, 4) == [b for batch in ref_packed_rank(want, 2, 1, 2, False)[:3] for b in batch]
    state = ds.state_dict()
    assert state["epoch"] == 1 and state["position"] == 12 and state["blocks"] == len(want)
    assert state["filter"]["kept"] == sum(keep(i) for i in range(N)) and state["pack"]["seq_len"] == 4
    for world, workers in ((3, 0), (1, 2)):
        rest = []
        for r in range(world):
            again = SafetensorsIterableDataset(data, rank=r, world_size=world, **kw)
            again.load_state_dict(state)
            rest.append(as_blocks(loader(again, num_workers=workers), 4))
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
    with pytest.raises(ValueError, match="column 'tokens' .* is ragged"):
        SafetensorsIterableDataset(data, filter=Filter.where("tokens", ">", 0), pack=pack)
    with pytest.raises(ValueError, match="mask column 'lang' .* has dtype I32; a mask must be BOOL"):
        SafetensorsIterableDataset(data, filter=Filter.mask("lang"), pack=pack)
    # a filter that keeps no document: no blocks, no batches (and no error)
    none = SafetensorsIterableDataset(data, batch_size=2, filter=Filter.where("y", "<", 0), pack=pack)
    assert (none.num_blocks, none.dropped_tokens, len(none), list(none)) == (0, 0, 0, [])

"""``open_dataset``: a dataset directory written by ``df.write.format("safetensors")``.

Format rules (manifest fields, header validity, shard names) are the Rust engine's
(``safetensors_spark._native``); this module reads bytes, checks that shards and manifest agree,
and reads numpy arrays out of the shards (positioned reads: never a memory map, spec/python.md).
"""

import bisect
import json
import os

import numpy as np

from . import _native
from ._errors import (
    ColumnNotFoundError,
    IndexFileError,
    KeyNotFoundError,
    ManifestError,
    ShardError,
)
from ._storage import HEADER_READ_AHEAD, CachedStore, open_store

MANIFEST_FILE_NAME = "dataset_manifest.json"
INDEX_NAME = "_tensor_index.parquet"
LAYOUT_METADATA_KEY = "safetensors_spark.layout"
SEPARATOR_METADATA_KEY = "safetensors_spark.kv_separator"
PADDED_METADATA_KEY = "safetensors_spark.padded_samples"
DEFAULT_KV_SEPARATOR = "__"

_NUMPY_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16),
    "I16": np.dtype(np.int16),
    "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32),
    "U64": np.dtype(np.uint64),
    "I64": np.dtype(np.int64),
    "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
}


def numpy_dtype(dtype, what):
    """The numpy dtype for a safetensors dtype name. BF16 is ``ml_dtypes.bfloat16`` when
    ml_dtypes is installed, else its raw bits as ``uint16``."""
    if dtype in _NUMPY_DTYPES:
        return _NUMPY_DTYPES[dtype]
    if dtype == "BF16":
        try:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            return np.dtype(np.uint16)
    raise ShardError(f"{what}: dtype {dtype} has no numpy equivalent in this package "
                     f"(supported: {', '.join(sorted([*_NUMPY_DTYPES, 'BF16']))})")


class Tensor:
    """One tensor of a shard header: dtype name, shape and absolute byte range."""

    __slots__ = ("name", "dtype", "shape", "start", "end")

    def __init__(self, name, dtype, shape, start, end):
        self.name, self.dtype, self.shape, self.start, self.end = name, dtype, tuple(shape), start, end

    def __getstate__(self):
        return (self.name, self.dtype, self.shape, self.start, self.end)

    def __setstate__(self, state):
        self.name, self.dtype, self.shape, self.start, self.end = state


class Shard:
    """A shard listed in the manifest; ``tensors`` is filled from its header when needed."""

    def __init__(self, index, name, samples, padded, size, offset):
        self.index = index
        self.name = name
        self.samples = samples
        self.padded = padded
        self.size = size
        self.offset = offset  # global index of its first sample
        self.metadata = None
        self.tensors = None  # name -> Tensor
        self.keys = None  # KV: sorted keys
        self.kv = None  # KV: key -> {column: Tensor}

    def __repr__(self):
        return f"Shard({self.name!r}, samples={self.samples})"


def _read_header(store, shard):
    """Reads and validates a shard's header (Rust rules) with at most two range reads."""
    url = store.url(shard.name)
    size = shard.size
    head = store.read(shard.name, 0, min(size, HEADER_READ_AHEAD))
    try:
        n = _native.check_prefix(head[:8], size)
        if 8 + n > len(head):
            head = head + store.read(shard.name, len(head), 8 + n)
        metadata, tensors = _native.parse_header(bytes(head[8 : 8 + n]), size)
    except _native.FormatError as e:
        raise ShardError(f"{url}: invalid safetensors file: {e}") from None
    return metadata, {t[0]: Tensor(*t) for t in tensors}


class Dataset:
    """A dataset directory: ``len(ds)`` samples (pad rows excluded), ``ds[i]`` → ``{column:
    array}``, ``ds.get(key)`` for KV datasets, ``ds.iter_shards()``.

    Use :func:`open_dataset` to create one."""

    def __init__(self, path, *, storage_options=None, cache_dir=None, check_headers=True):
        self.path = os.fspath(path)
        self.storage_options = storage_options
        self.cache_dir = cache_dir
        self._store = open_store(self.path, storage_options, cache_dir)
        self.manifest = self._load_manifest()
        m = self.manifest
        self.schema = m["schema"]
        self.columns = list(self.schema)
        self.total_samples = m["total_samples"]
        self.shards = []
        offset = 0
        for i, s in enumerate(m["shards"]):
            self.shards.append(Shard(i, s["shard_path"], s["samples_count"], s.get("padded_samples") or 0,
                                     s["bytes"], offset))
            offset += s["samples_count"]
        self._starts = [s.offset for s in self.shards]
        self._check_shard_files()
        self.layout = m.get("layout")
        self.kv_separator = m.get("kv_separator")
        self.batch_size = m.get("batch_size")
        if self.layout is None or check_headers:
            for shard in self.shards:
                self._header(shard)
        if self.layout is None:
            self._infer_layout()
        if self.layout == "kv" and self.kv_separator is None:
            self.kv_separator = DEFAULT_KV_SEPARATOR
        self._dtypes = {c: numpy_dtype(self.schema[c]["dtype"], f"{self.path}: column '{c}'")
                        for c in self.columns}
        if check_headers:
            for shard in self.shards:
                self._check_header(shard)
        self._index = None  # KV: key -> [(shard, column, Tensor)], from _tensor_index.parquet
        self._index_loaded = False

    # -- pickling: the store (paths), the manifest and the parsed headers; no open files -------

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_index"] = None
        state["_index_loaded"] = False
        return state

    # -- opening ---------------------------------------------------------------------------------

    def _load_manifest(self):
        url = self._store.url(MANIFEST_FILE_NAME)
        try:
            raw = self._store.read_text(MANIFEST_FILE_NAME)
        except FileNotFoundError:
            raise ManifestError(f"{url}: not found; {self.path} is not a dataset written by "
                                f"df.write.format('safetensors') (or its write has not committed)") from None
        except OSError as e:
            raise ManifestError(f"{url}: cannot be read: {e}") from None
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ManifestError(f"{url}: not UTF-8 ({e})") from None
        try:
            manifest = json.loads(_native.parse_manifest(text))
        except _native.ManifestError as e:
            raise ManifestError(f"{url}: {e}") from None
        for s in manifest["shards"]:
            try:
                _native.check_shard_path(s["shard_path"])
            except _native.ManifestError as e:
                raise ManifestError(f"{url}: shards[].shard_path {e}") from None
        return manifest

    def _check_shard_files(self):
        for shard in self.shards:
            url = self._store.url(shard.name)
            try:
                size = self._store.size(shard.name)
            except FileNotFoundError:
                raise ShardError(f"{url}: listed in {MANIFEST_FILE_NAME} but missing") from None
            if size != shard.size:
                raise ShardError(f"{url}: the file has {size} bytes but {MANIFEST_FILE_NAME} says "
                                 f"{shard.size} (shards[].bytes)")

    def _header(self, shard):
        if shard.tensors is None:
            shard.metadata, shard.tensors = _read_header(self._store, shard)
        return shard.tensors

    def _infer_layout(self):
        """A manifest with only the published fields: the layout comes from the shards (spec/python.md §2)."""
        layouts = {(s.metadata or {}).get(LAYOUT_METADATA_KEY) for s in self.shards} - {None}
        if len(layouts) > 1:
            raise ManifestError(f"{self.path}: shards disagree on {LAYOUT_METADATA_KEY}: {sorted(layouts)}")
        if layouts:
            self.layout = layouts.pop()
            if self.layout not in ("batch", "kv"):
                raise ShardError(f"{self.path}: {LAYOUT_METADATA_KEY} is '{self.layout}', expected batch or kv")
            seps = {(s.metadata or {}).get(SEPARATOR_METADATA_KEY) for s in self.shards} - {None}
            self.kv_separator = seps.pop() if len(seps) == 1 else None
        else:
            def is_batch(s):
                rows = s.samples + self._padded_from_metadata(s)
                return all(c in s.tensors and len(s.tensors[c].shape) >= 1 and s.tensors[c].shape[0] == rows
                           for c in self.columns)

            self.layout = "batch" if all(is_batch(s) for s in self.shards) else "kv"
        if self.layout == "batch":
            for s in self.shards:
                s.padded = self._padded_from_metadata(s)
            if self.batch_size is None and self.columns:
                shape = self.schema[self.columns[0]].get("shape")
                self.batch_size = shape[0] if shape else None

    @staticmethod
    def _padded_from_metadata(shard):
        value = (shard.metadata or {}).get(PADDED_METADATA_KEY, "0")
        return int(value) if value.isdigit() else 0

    def _check_header(self, shard):
        """Every fact the manifest states about a shard must hold in its header."""
        tensors = self._header(shard)
        url = self._store.url(shard.name)
        nt = self.manifest["shards"][shard.index].get("num_tensors")
        if nt is not None and nt != len(tensors):
            raise ShardError(f"{url}: the header has {len(tensors)} tensors but {MANIFEST_FILE_NAME} "
                             f"says {nt} (shards[].num_tensors)")
        if self.layout == "batch":
            rows = shard.samples + shard.padded
            for c in self.columns:
                t = tensors.get(c)
                if t is None:
                    raise ShardError(f"{url}: no tensor '{c}', a column of {MANIFEST_FILE_NAME} schema")
                self._check_dtype(url, t, c)
                want = self.schema[c].get("shape")
                if not t.shape or t.shape[0] != rows:
                    raise ShardError(f"{url}: tensor '{c}' has shape {list(t.shape)}; {MANIFEST_FILE_NAME} "
                                     f"says {shard.samples} samples + {shard.padded} padded = {rows} rows")
                if want is not None and list(t.shape[1:]) != list(want[1:]):
                    raise ShardError(f"{url}: tensor '{c}' has sample shape {list(t.shape[1:])} but "
                                     f"{MANIFEST_FILE_NAME} schema says {list(want[1:])} (schema shape {want})")
        else:
            self._kv_keys(shard, url)
            if len(shard.keys) != shard.samples:
                raise ShardError(f"{url}: the header holds {len(shard.keys)} keys but {MANIFEST_FILE_NAME} "
                                 f"says samples_count {shard.samples}")

    def _check_dtype(self, url, t, column):
        want = self.schema[column]["dtype"]
        if t.dtype != want:
            raise ShardError(f"{url}: tensor '{t.name}' has dtype {t.dtype} but {MANIFEST_FILE_NAME} "
                             f"schema says {want} for column '{column}'")

    def _kv_keys(self, shard, url=None):
        """Splits a KV shard's tensor names into key and column (the longest column that ends the
        name after the separator)."""
        if shard.kv is not None:
            return shard.kv
        url = url or self._store.url(shard.name)
        sep = self.kv_separator
        suffixes = sorted(((sep + c, c) for c in self.columns), key=lambda p: -len(p[0]))
        kv = {}
        for name, t in self._header(shard).items():
            for suffix, column in suffixes:
                if name.endswith(suffix):
                    key = name[: -len(suffix)]
                    break
            else:
                raise ShardError(f"{url}: tensor '{name}' is not <key>{sep}<column> for any column of "
                                 f"{MANIFEST_FILE_NAME} schema {self.columns}")
            self._check_dtype(url, t, column)
            want = self.schema[column].get("shape")
            if want is not None and list(t.shape) != list(want):
                raise ShardError(f"{url}: tensor '{name}' has shape {list(t.shape)} but {MANIFEST_FILE_NAME} "
                                 f"schema says {want} for column '{column}'")
            kv.setdefault(key, {})[column] = t
        for key, cols in kv.items():
            if len(cols) != len(self.columns):
                missing = [c for c in self.columns if c not in cols]
                raise ShardError(f"{url}: key '{key}' has no tensor for column(s) {missing}")
        shard.kv = kv
        shard.keys = sorted(kv)
        return kv

    # -- public API ------------------------------------------------------------------------------

    def __len__(self):
        return self.total_samples

    def __repr__(self):
        return (f"Dataset({self.path!r}, layout={self.layout}, samples={self.total_samples}, "
                f"shards={len(self.shards)}, columns={self.columns})")

    def check_columns(self, columns):
        """``columns`` (None = all) as a list, each a column of the dataset."""
        if columns is None:
            return list(self.columns)
        if isinstance(columns, str):
            columns = [columns]
        columns = list(columns)
        for c in columns:
            if c not in self.schema:
                raise ColumnNotFoundError(f"column '{c}' is not in dataset {self.path}; its columns are {self.columns}")
        if not columns:
            raise ColumnNotFoundError(f"columns is empty; choose from {self.columns}")
        return columns

    def locate(self, i):
        """``(shard, row)`` of sample ``i`` (negative counts from the end)."""
        n = self.total_samples
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise TypeError(f"sample index must be an integer, got {type(i).__name__}")
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"sample index {i} is out of range for dataset {self.path} with {n} samples")
        # the last shard starting at or before j: never an empty one, which shares its start with
        # the next shard
        k = bisect.bisect_right(self._starts, j) - 1
        return self.shards[k], j - self.shards[k].offset

    def locate_many(self, indices):
        """``(shard indices, rows)`` (int64 arrays) of samples ``indices``, checked as ``locate``."""
        n = self.total_samples
        try:
            v = np.asarray(indices)
        except Exception:  # noqa: BLE001 - a ragged or odd sequence: the per-index rule decides
            v = None
        if v is None or v.ndim != 1 or v.dtype.kind not in "iu":
            pairs = [self.locate(i) for i in indices]
            return (np.array([s.index for s, _ in pairs], dtype=np.int64),
                    np.array([r for _, r in pairs], dtype=np.int64))
        v = v.astype(np.int64)
        bad = (v < -n) | (v >= n)
        if bad.any():
            i = v[bad][0]
            raise IndexError(f"sample index {i} is out of range for dataset {self.path} with {n} samples")
        v = np.where(v < 0, v + n, v)
        # the last shard starting at or before j (never an empty one: see locate)
        k = np.searchsorted(np.asarray(self._starts, dtype=np.int64), v, side="right") - 1
        offsets = np.asarray([s.offset for s in self.shards], dtype=np.int64)
        return k, v - offsets[k]

    def tensor_array(self, shard, tensor):
        """The whole tensor as a fresh writable array (a positioned read or a range read)."""
        store = self._local(shard)
        dtype = self._dtype_of(shard, tensor)
        return store.array(shard.name, tensor.start, tensor.end, dtype, tensor.shape, size=shard.size)

    def _local(self, shard):
        """The store, with ``shard`` copied into the local cache first when there is one."""
        store = self._store
        if isinstance(store, CachedStore):
            store.fetch(shard.name, shard.size)
        return store

    def gather(self, shard, column, rows):
        """Rows ``rows`` (int array) of a batch-layout column, in that order, as a fresh array:
        local shards with one positioned read per run of adjacent rows (``_native.read_rows``);
        remote ones through the whole column."""
        t = self._header(shard)[column]
        store = self._local(shard)
        dtype = self._dtype_of(shard, t)
        rows = np.asarray(rows, dtype=np.int64)
        if not store.is_local:
            return self.tensor_array(shard, t).take(rows, axis=0)
        row_bytes = (t.end - t.start) // t.shape[0] if t.shape[0] else 0
        if len(rows) and (rows.min() < 0 or rows.max() >= t.shape[0]):
            raise IndexError(f"{store.url(shard.name)}: rows of '{column}' out of range [0, {t.shape[0]})")
        data = store.read_rows(shard.name, shard.size, t.start + rows * row_bytes, row_bytes)
        return np.frombuffer(data, dtype=dtype).reshape((len(rows), *t.shape[1:]))

    def _dtype_of(self, shard, tensor):
        return numpy_dtype(tensor.dtype, f"{self._store.url(shard.name)}: tensor '{tensor.name}'")

    def rows(self, shard, column, start, stop):
        """Rows ``[start, stop)`` of a batch-layout column: one read of exactly those rows, into
        a fresh writable array."""
        t = self._header(shard)[column]
        store = self._local(shard)
        row_bytes = (t.end - t.start) // t.shape[0] if t.shape[0] else 0
        return store.array(shard.name, t.start + start * row_bytes, t.start + stop * row_bytes,
                           self._dtype_of(shard, t), (stop - start, *t.shape[1:]), size=shard.size)

    def kv_tensor(self, shard, key, column):
        return self.tensor_array(shard, self._kv_keys(shard)[key][column])

    def sample(self, shard, row, columns):
        if self.layout == "batch":
            out = {}
            for c in columns:
                a = self.rows(shard, c, row, row + 1)
                out[c] = a.reshape(a.shape[1:])  # a 0-d array (not a numpy scalar) for scalar samples
            return out
        self._kv_keys(shard)
        key = shard.keys[row]
        return {c: self.kv_tensor(shard, key, c) for c in columns}

    def __getitem__(self, i):
        shard, row = self.locate(i)
        return self.sample(shard, row, self.columns)

    def __iter__(self):
        for i in range(self.total_samples):
            yield self[i]

    def iter_shards(self, columns=None):
        """Yields ``(shard_name, data)`` per shard in manifest order. Batch layout: ``data`` is
        ``{column: array of the shard's real rows}``; KV: ``{key: {column: array}}``."""
        columns = self.check_columns(columns)
        for shard in self.shards:
            if self.layout == "batch":
                yield shard.name, {c: self.rows(shard, c, 0, shard.samples) for c in columns}
            else:
                self._kv_keys(shard)
                yield shard.name, {k: {c: self.kv_tensor(shard, k, c) for c in columns} for k in shard.keys}

    def keys(self):
        """KV datasets: every key, in sample order."""
        self._require_kv("keys()")
        out = []
        for s in self.shards:
            self._kv_keys(s)
            out.extend(s.keys)
        return out

    def _require_kv(self, what):
        if self.layout != "kv":
            raise ManifestError(f"{what} needs a KV dataset (written with name_col); {self.path} has layout {self.layout}")

    def get(self, key, columns=None):
        """KV datasets: ``{column: array}`` of the row with this key. Looked up in
        ``_tensor_index.parquet`` when the dataset has one (no shard header is read), else in the
        shard headers."""
        self._require_kv("get(key)")
        columns = self.check_columns(columns)
        index = self._load_index()
        uncovered = self.shards
        if index is not None:
            found, covered = index
            hits = found.get(key)
            if hits is not None:
                out = {}
                for shard, column, t in hits:
                    if column in columns:
                        out[column] = self.tensor_array(shard, t)
                missing = [c for c in columns if c not in out]
                if missing:
                    raise IndexFileError(f"{self._store.url(INDEX_NAME)}: key '{key}' has no row for column(s) {missing}")
                return out
            uncovered = [s for s in self.shards if s.name not in covered]
        for shard in uncovered:
            cols = self._kv_keys(shard).get(key)
            if cols is not None:
                return {c: self.tensor_array(shard, cols[c]) for c in columns}
        raise KeyNotFoundError(f"key '{key}' not found in dataset {self.path} ({self.total_samples} keys)")

    def _load_index(self):
        """``(key -> [(shard, column, Tensor)], names of the shards it covers)`` from
        ``_tensor_index.parquet``, or None without one. The index is a directory of one part per
        shard (spec/dataset.md §6.1): only the parts of the shards the manifest lists are read; a
        listed shard without a part is not covered (``get`` reads its header instead)."""
        if self._index_loaded:
            return self._index
        self._index_loaded = True
        if not self._store.exists(INDEX_NAME) or not self._store.isdir(INDEX_NAME):
            return None
        import pyarrow.parquet as pq

        cols = ["file_name", "tensor_key", "dtype", "shape", "data_start", "data_end", "sample_key", "column"]
        found, covered = {}, set()
        for shard in self.shards:
            name = f"{INDEX_NAME}/{_native.index_part_name(shard.name)}"
            if not self._store.exists(name):
                continue
            source, fs = self._store.parquet_source(name)
            url = self._store.url(name)
            try:
                table = pq.read_table(source, filesystem=fs, columns=cols)
            except Exception as e:  # pyarrow raises several types for unreadable or foreign files
                raise IndexFileError(f"{url}: cannot be read as the tensor index ({type(e).__name__}: {e})") from None
            data = table.to_pydict()
            for file_name, tname, dtype, shape, start, end, key, column in zip(*(data[c] for c in cols)):
                try:
                    _native.check_shard_path(file_name)
                except _native.ManifestError as e:
                    raise IndexFileError(f"{url}: file_name {e}") from None
                if file_name != shard.name:
                    raise IndexFileError(f"{url}: the index part of {shard.name} has a row for tensor '{tname}' "
                                         f"of shard {file_name} (stale or misplaced index part)")
                if column not in self.schema:
                    raise IndexFileError(f"{url}: tensor '{tname}' has column '{column}', not in the schema {self.columns}")
                t = Tensor(tname, dtype, shape, start, end)
                need = int(np.prod(shape, dtype=np.int64)) * numpy_dtype(dtype, url).itemsize
                if not 0 <= start <= end <= shard.size or end - start != need:
                    raise IndexFileError(f"{url}: tensor '{tname}' of {file_name}: byte range [{start}, {end}) does "
                                         f"not fit its {dtype} shape {shape} inside the {shard.size}-byte shard")
                found.setdefault(key, []).append((shard, column, t))
            covered.add(shard.name)
        if not covered:
            return None
        self._index = (found, covered)
        return self._index


def open_dataset(path, *, storage_options=None, cache_dir=None, check_headers=True):
    """Opens a dataset directory (local path or fsspec URL such as ``s3://bucket/data``).

    Reads the manifest and, with ``check_headers`` (default), every shard's header, checking each
    against the manifest, so a broken dataset fails here rather than during training.
    ``storage_options`` go to fsspec; with ``cache_dir`` remote shards are copied there whole on
    first use and read from there."""
    return Dataset(path, storage_options=storage_options, cache_dir=cache_dir, check_headers=check_headers)

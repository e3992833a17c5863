//! `safetensors_spark._native`: the format rules of the Rust engine, called from the Python
//! package (rust-core/python/python/safetensors_spark). Python reads bytes (local files or
//! fsspec range reads); every rule about what those bytes mean is applied here, once, by the
//! same code the Spark connector runs. Every failure is a Python exception; nothing panics.

use pyo3::prelude::*;
use safetensors_spark_dataset as dataset;
use safetensors_spark_dataset::kv;
use safetensors_spark_dataset::manifest::{RaggedColumn, RaggedElement};
use safetensors_spark_dataset::ragged;
use safetensors_spark_dataset::versions;
use safetensors_spark_format::header;
use safetensors_spark_format::Dtype;

pyo3::create_exception!(
    _native,
    FormatError,
    pyo3::exceptions::PyValueError,
    "A safetensors file breaks a rule of spec/format.md."
);
pyo3::create_exception!(
    _native,
    ManifestError,
    pyo3::exceptions::PyValueError,
    "dataset_manifest.json breaks a rule of spec/dataset.md, or names an unsafe shard path."
);
pyo3::create_exception!(
    _native,
    IndexEntryError,
    pyo3::exceptions::PyValueError,
    "A row of a tensor index part disagrees with the header of the shard it names."
);

/// One tensor of a header: `(name, dtype, shape, begin, end)`, offsets absolute in the file.
type TensorRow = (String, String, Vec<u64>, u64, u64);
/// Checks the 8-byte prefix of a file of `file_len` bytes; returns N, the header length.
#[pyfunction]
fn check_prefix(prefix: &[u8], file_len: u64) -> PyResult<u64> {
    header::check_prefix(prefix, file_len).map_err(|e| FormatError::new_err(e.to_string()))
}

fn tensor_row(h: &header::Header, t: &header::TensorInfo) -> TensorRow {
    let base = h.data_start();
    (
        t.name.clone(),
        t.dtype.name().to_string(),
        t.shape.clone(),
        base + t.data_offsets[0],
        base + t.data_offsets[1],
    )
}

/// A parsed, validated shard header kept on the Rust side: a header of a million tensors costs
/// no Python object until one is asked for.
#[pyclass(frozen, module = "safetensors_spark._native", name = "Header")]
struct PyHeader {
    header: header::Header,
}

/// A KV schema column from Python: `(name, dtype, shape or None)`.
type ColumnSpec = (String, String, Option<Vec<u64>>);

fn kv_columns(columns: Vec<ColumnSpec>) -> Vec<kv::KvColumn> {
    columns
        .into_iter()
        .map(|(name, dtype, shape)| kv::KvColumn { name, dtype, shape })
        .collect()
}

#[pymethods]
impl PyHeader {
    /// Parses and validates the N header bytes of a file of `file_len` bytes (every rule of
    /// spec/format.md §3); `FormatError` names the rule.
    #[staticmethod]
    fn parse(py: Python<'_>, json: &[u8], file_len: u64) -> PyResult<PyHeader> {
        let header = py
            .detach(|| header::parse_header(json, file_len))
            .map_err(|e| FormatError::new_err(e.to_string()))?;
        Ok(PyHeader { header })
    }

    /// `__metadata__` as a dict, or None.
    #[getter]
    fn metadata(&self) -> Option<std::collections::BTreeMap<String, String>> {
        self.header.metadata.clone()
    }

    fn __len__(&self) -> usize {
        self.header.tensors.len()
    }

    /// Every tensor as `(name, dtype, shape, data_start, data_end)`, in data order, absolute
    /// offsets.
    fn tensors(&self) -> Vec<TensorRow> {
        let h = &self.header;
        h.tensors.iter().map(|t| tensor_row(h, t)).collect()
    }

    /// KV shards: `(key, column position)` of every tensor, in the order of `tensors()`, after
    /// checking each against `columns` (`[(name, dtype, shape or None)]`, the schema) and that
    /// every key has every column (`dataset::kv::split_kv_header`); `FormatError` says what breaks.
    fn split_kv(
        &self,
        py: Python<'_>,
        columns: Vec<ColumnSpec>,
        separator: &str,
    ) -> PyResult<Vec<(String, usize)>> {
        let columns = kv_columns(columns);
        let split = py
            .detach(|| kv::split_kv_header(&self.header, &columns, separator))
            .map_err(FormatError::new_err::<String>)?;
        Ok(split
            .tensors
            .into_iter()
            .map(|(k, i)| (k.to_string(), i))
            .collect())
    }

    /// The number of keys of a KV shard, checked as `split_kv` checks them, with no Python object
    /// per tensor.
    fn count_kv_keys(
        &self,
        py: Python<'_>,
        columns: Vec<ColumnSpec>,
        separator: &str,
    ) -> PyResult<usize> {
        let columns = kv_columns(columns);
        py.detach(|| kv::split_kv_header(&self.header, &columns, separator).map(|s| s.keys))
            .map_err(FormatError::new_err::<String>)
    }

    /// Batch shards: checks the values and offsets tensors of ragged column `column` (schema
    /// dtype `dtype`, inner shape `inner_shape`) in a shard of `rows` rows
    /// (`dataset::ragged::check_ragged_tensors`); returns the values' element count.
    /// `FormatError` names the tensor and what breaks.
    fn check_ragged(
        &self,
        column: &str,
        dtype: &str,
        inner_shape: Vec<u64>,
        rows: u64,
    ) -> PyResult<u64> {
        let dtype = Dtype::from_name(dtype).ok_or_else(|| {
            FormatError::new_err(format!("column '{column}': unknown dtype {dtype}"))
        })?;
        let ragged = RaggedColumn {
            inner_shape,
            element: RaggedElement::Array,
        };
        ragged::check_ragged_tensors(&self.header, column, dtype, &ragged, rows)
            .map_err(FormatError::new_err)
    }

    /// Checks an index row against this header (`dataset::kv::check_index_entry`: same name,
    /// dtype, shape and byte range; a KV row's `sample_key` and `column` make up its name) and
    /// returns the header's tensor as `(name, dtype, shape, data_start, data_end)`;
    /// `IndexEntryError` says what disagrees.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (tensor_key, dtype, shape, data_start, data_end, sample_key, column, separator))]
    fn check_index_entry(
        &self,
        tensor_key: &str,
        dtype: &str,
        shape: Vec<u64>,
        data_start: u64,
        data_end: u64,
        sample_key: Option<&str>,
        column: &str,
        separator: &str,
    ) -> PyResult<TensorRow> {
        let entry = kv::IndexEntry {
            tensor_key,
            dtype,
            shape: &shape,
            data_start,
            data_end,
            kv: sample_key.map(|k| (k, column)),
        };
        let t = kv::check_index_entry(&self.header, &entry, separator)
            .map_err(IndexEntryError::new_err::<String>)?;
        Ok(tensor_row(&self.header, t))
    }
}

/// Parses and validates `dataset_manifest.json`; returns it re-serialised as JSON text (the
/// Python side turns it into a dict), with every rule of spec/dataset.md §5 checked.
#[pyfunction]
fn parse_manifest(py: Python<'_>, text: &str) -> PyResult<String> {
    py.detach(|| {
        let manifest = dataset::parse_manifest(text).map_err(|e| e.to_string())?;
        serde_json::to_string(&manifest).map_err(|e| e.to_string())
    })
    .map_err(ManifestError::new_err)
}

/// Refuses a shard name from a manifest or an index that is not a plain shard file name of the
/// dataset directory (no separator, scheme, `..`, control character; ends in `.safetensors`).
/// Bytes the Rust engine has allocated and not freed in this process (its counted global
/// allocator), for leak soaks and monitoring.
#[pyfunction]
fn live_bytes() -> usize {
    safetensors_spark_format::alloc_stats::live_bytes()
}

/// Checks the offsets of ragged column `column` (`offsets`: the `c.offsets` tensor's bytes,
/// little-endian I64) against its values' element count `elements`
/// (`dataset::ragged::check_offsets`); `FormatError` names the column and the first bad row.
#[pyfunction]
fn check_ragged_offsets(
    py: Python<'_>,
    column: &str,
    offsets: &[u8],
    elements: u64,
) -> PyResult<()> {
    if !offsets.len().is_multiple_of(8) {
        return Err(FormatError::new_err(format!(
            "column '{column}': offsets of {} bytes are not whole I64 values",
            offsets.len()
        )));
    }
    py.detach(|| {
        let values: Vec<i64> = offsets
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        ragged::check_offsets(column, &values, elements)
    })
    .map_err(FormatError::new_err)
}

#[pyfunction]
fn check_shard_path(name: &str) -> PyResult<()> {
    dataset::check_shard_path(name).map_err(|e| ManifestError::new_err(e.to_string()))
}

/// The index part's file name of a shard (spec/dataset.md §6.1).
#[pyfunction]
fn index_part_name(shard: &str) -> PyResult<String> {
    dataset::names::shard_index_part_file_name(shard)
        .ok_or_else(|| ManifestError::new_err(format!("'{shard}' is not a shard file name")))
}

/// Vacuums the local dataset `path` (spec/dataset.md §5.8.1); returns the outcome as JSON.
/// A bad retention or a retention shorter than the dataset's without the override raises
/// `ValueError` (ManifestError) naming it.
#[pyfunction]
#[pyo3(signature = (path, retention=None, dry_run=false, allow_shorter_retention=false))]
fn vacuum(
    py: Python<'_>,
    path: &str,
    retention: Option<&str>,
    dry_run: bool,
    allow_shorter_retention: bool,
) -> PyResult<String> {
    use dataset::vacuum::{parse_retention, VacuumRequest, RETENTION_EXPECTED};
    let retention_seconds = match retention {
        None => None,
        Some(v) => Some(parse_retention(v).ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "vacuum: retention '{v}': expected {RETENTION_EXPECTED}"
            ))
        })?),
    };
    let req = VacuumRequest {
        retention_seconds,
        allow_shorter_retention,
        now_ms: dataset::local::now_ms(),
    };
    let out = py
        .detach(|| {
            dataset::local::vacuum_dir(std::path::Path::new(path), &req, dry_run, &mut |_| {})
        })
        .map_err(|e| ManifestError::new_err(format!("vacuum: {e}")))?;
    serde_json::to_string(&out).map_err(|e| ManifestError::new_err(e.to_string()))
}

/// The version to read among the listed `_manifest_log/` entries (`entries_json`: `[{"version",
/// "modified_ms", "text"?}]`, texts needed for a timestamp): `version` / `timestamp` as text,
/// exactly one (spec/dataset.md §5.8).
#[pyfunction]
#[pyo3(signature = (entries_json, version=None, timestamp=None))]
fn select_version(
    entries_json: &str,
    version: Option<&str>,
    timestamp: Option<&str>,
) -> PyResult<u64> {
    let err = |e: dataset::DatasetError| ManifestError::new_err(e.to_string());
    let spec = versions::version_spec(version, timestamp).map_err(err)?;
    let entries: Vec<versions::ListedEntry> =
        serde_json::from_str(entries_json).map_err(|e| ManifestError::new_err(e.to_string()))?;
    versions::select_listed(&entries, spec).map_err(err)
}

/// Checks the shards version `version` (manifest text `manifest`) lists against `found_json`
/// (`{shard: size}`, a missing shard absent): an error naming the version and shard.
#[pyfunction]
fn check_version_shards(manifest: &str, version: u64, found_json: &str) -> PyResult<()> {
    let err = |e: dataset::DatasetError| ManifestError::new_err(e.to_string());
    let m = dataset::parse_manifest(manifest).map_err(err)?;
    let found: std::collections::BTreeMap<String, u64> =
        serde_json::from_str(found_json).map_err(|e| ManifestError::new_err(e.to_string()))?;
    versions::check_listed_shards(&m, version, &found).map_err(err)
}

/// The history rows (JSON array text) of the listed entries (every text given).
#[pyfunction]
fn history(entries_json: &str) -> PyResult<String> {
    let err = |e: String| ManifestError::new_err(e);
    let entries: Vec<versions::ListedEntry> =
        serde_json::from_str(entries_json).map_err(|e| err(e.to_string()))?;
    let rows = versions::history_listed(&entries).map_err(|e| err(e.to_string()))?;
    serde_json::to_string(&rows).map_err(|e| err(e.to_string()))
}

/// CRC-32C of a local file as the manifest records it (8 lowercase hex digits).
#[pyfunction]
fn file_crc32c(py: Python<'_>, path: std::path::PathBuf) -> PyResult<String> {
    py.detach(|| versions::file_crc32c(&path))
        .map_err(|e| ManifestError::new_err(e.to_string()))
}

/// CRC-32C of bytes (a remote shard fetched whole), as the manifest records it.
#[pyfunction]
fn crc32c_hex(data: &[u8]) -> String {
    safetensors_spark_format::file::crc32c_hex(crc32c_of_bytes(data))
}

fn crc32c_of_bytes(data: &[u8]) -> u32 {
    safetensors_spark_format::file::crc32c_of(data).unwrap_or_default()
}

/// Every version in a local dataset's log checked (`safetensors-spark validate`): a JSON array
/// of `{"version", "shards", "verified", "error"}`.
#[pyfunction]
fn validate_dataset(py: Python<'_>, path: std::path::PathBuf) -> PyResult<String> {
    py.detach(|| {
        let checks = versions::validate_dir(&path).map_err(|e| e.to_string())?;
        serde_json::to_string(&checks).map_err(|e| e.to_string())
    })
    .map_err(ManifestError::new_err)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FormatError", m.py().get_type::<FormatError>())?;
    m.add("ManifestError", m.py().get_type::<ManifestError>())?;
    m.add("IndexEntryError", m.py().get_type::<IndexEntryError>())?;
    m.add_class::<PyHeader>()?;
    m.add("VERSION", safetensors_spark_format::VERSION)?;
    m.add_function(wrap_pyfunction!(check_prefix, m)?)?;
    m.add_function(wrap_pyfunction!(parse_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(check_shard_path, m)?)?;
    m.add_function(wrap_pyfunction!(index_part_name, m)?)?;
    m.add_function(wrap_pyfunction!(live_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(vacuum, m)?)?;
    m.add_function(wrap_pyfunction!(check_ragged_offsets, m)?)?;
    m.add_function(wrap_pyfunction!(select_version, m)?)?;
    m.add_function(wrap_pyfunction!(check_version_shards, m)?)?;
    m.add_function(wrap_pyfunction!(history, m)?)?;
    m.add_function(wrap_pyfunction!(file_crc32c, m)?)?;
    m.add_function(wrap_pyfunction!(crc32c_hex, m)?)?;
    m.add_function(wrap_pyfunction!(validate_dataset, m)?)?;
    Ok(())
}

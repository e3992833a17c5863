//! `safetensors_spark._native`: the format rules of the Rust engine, called from the Python
//! package (rust-core/python/python/safetensors_spark). Python reads bytes (local files or
//! fsspec range reads); every rule about what those bytes mean is applied here, once, by the
//! same code the Spark connector runs. Every failure is a Python exception; nothing panics.

use pyo3::prelude::*;
use safetensors_spark_dataset as dataset;
use safetensors_spark_dataset::kv;
use safetensors_spark_format::header;

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
    Ok(())
}

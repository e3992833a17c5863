//! `safetensors_spark._native`: the format rules of the Rust engine, called from the Python
//! package (rust-core/python/python/safetensors_spark). Python reads bytes (local files or
//! fsspec range reads); every rule about what those bytes mean is applied here, once, by the
//! same code the Spark connector runs. Every failure is a Python exception; nothing panics.

mod gather;
mod pack;
mod progress;
mod remote;

use pyo3::prelude::*;
use safetensors_spark_dataset as dataset;
use safetensors_spark_dataset::kv;
use safetensors_spark_dataset::manifest::{RaggedColumn, RaggedElement};
use safetensors_spark_dataset::names;
use safetensors_spark_dataset::ragged;
use safetensors_spark_dataset::versions;
use safetensors_spark_format::header;
use safetensors_spark_format::Dtype;

// The package's public exceptions (safetensors_spark/_errors.py, spec/python.md §2): the ones
// raised here, each message naming the file, dataset or index part it is about, so that the
// Python side raises what it gets and translates nothing (tests/python/package/test_errors.py).
// `_native` defines no exception class of its own.
pyo3::import_exception!(safetensors_spark._errors, ManifestError);
pyo3::import_exception!(safetensors_spark._errors, ShardError);
pyo3::import_exception!(safetensors_spark._errors, IndexFileError);

/// One tensor of a header: `(name, dtype, shape, begin, end)`, offsets absolute in the file.
type TensorRow = (String, String, Vec<u64>, u64, u64);
/// Checks the 8-byte prefix of `file` (its URL or path, named by the error), `file_len` bytes
/// long; returns N, the header length. `ShardError` names the rule.
#[pyfunction]
fn check_prefix(prefix: &[u8], file_len: u64, file: &str) -> PyResult<u64> {
    header::check_prefix(prefix, file_len).map_err(|e| invalid_file(file, e))
}

/// A file that breaks a rule of spec/format.md, as `ShardError` naming it.
fn invalid_file(file: &str, e: impl std::fmt::Display) -> PyErr {
    ShardError::new_err(format!("{file}: invalid safetensors file: {e}"))
}

/// A shard that disagrees with the dataset's rules, as `ShardError` naming it.
fn shard_error(file: &str, e: impl std::fmt::Display) -> PyErr {
    ShardError::new_err(format!("{file}: {e}"))
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
/// no Python object until one is asked for. It keeps the URL or path of its file, which every
/// error of its checks names.
#[pyclass(frozen, module = "safetensors_spark._native", name = "Header")]
struct PyHeader {
    header: header::Header,
    file: String,
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
    /// Parses and validates the N header bytes of `file` (its URL or path), `file_len` bytes
    /// long (every rule of spec/format.md §3); `ShardError` names the file and the rule.
    #[staticmethod]
    fn parse(py: Python<'_>, json: &[u8], file_len: u64, file: String) -> PyResult<PyHeader> {
        let header = py
            .detach(|| header::parse_header(json, file_len))
            .map_err(|e| invalid_file(&file, e))?;
        Ok(PyHeader { header, file })
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
    /// every key has every column (`dataset::kv::split_kv_header`); `ShardError` names the file
    /// and says what breaks.
    fn split_kv(
        &self,
        py: Python<'_>,
        columns: Vec<ColumnSpec>,
        separator: &str,
    ) -> PyResult<Vec<(String, usize)>> {
        let columns = kv_columns(columns);
        let split = py
            .detach(|| kv::split_kv_header(&self.header, &columns, separator))
            .map_err(|e| shard_error(&self.file, e))?;
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
            .map_err(|e| shard_error(&self.file, e))
    }

    /// Batch shards: checks the values and offsets tensors of ragged column `column` (schema
    /// dtype `dtype`, inner shape `inner_shape`) in a shard of `rows` rows
    /// (`dataset::ragged::check_ragged_tensors`); returns the values' element count.
    /// `ShardError` names the file, the tensor and what breaks.
    fn check_ragged(
        &self,
        column: &str,
        dtype: &str,
        inner_shape: Vec<u64>,
        rows: u64,
    ) -> PyResult<u64> {
        let dtype = Dtype::from_name(dtype).ok_or_else(|| {
            shard_error(
                &self.file,
                format!("column '{column}': unknown dtype {dtype}"),
            )
        })?;
        let ragged = RaggedColumn {
            inner_shape,
            element: RaggedElement::Array,
        };
        ragged::check_ragged_tensors(&self.header, column, dtype, &ragged, rows)
            .map_err(|e| shard_error(&self.file, e))
    }

    /// Checks an index row against this header (`dataset::kv::check_index_row`: same name,
    /// dtype, shape and byte range; a KV row's `sample_key` and `column` make up its name) and
    /// returns the header's tensor as `(name, dtype, shape, data_start, data_end)`;
    /// `IndexFileError` says what disagrees after `context` (the part, the key, the dataset).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (tensor_key, dtype, shape, data_start, data_end, sample_key, column, separator, context))]
    fn check_index_row(
        &self,
        tensor_key: &str,
        dtype: &str,
        shape: Vec<i64>,
        data_start: i64,
        data_end: i64,
        sample_key: Option<&str>,
        column: &str,
        separator: &str,
        context: &str,
    ) -> PyResult<TensorRow> {
        let disagrees = |what: String| IndexFileError::new_err(format!("{context}: {what}"));
        // the part's columns are int64: a negative value is the row's error, naming it
        let bad = |what: String| disagrees(format!("tensor '{tensor_key}': {what}"));
        let offset = |v: i64, what: &str| {
            u64::try_from(v).map_err(|_| bad(format!("{what} {v} is negative")))
        };
        let data_start = offset(data_start, "data_start")?;
        let data_end = offset(data_end, "data_end")?;
        let shape = shape
            .iter()
            .map(|d| u64::try_from(*d))
            .collect::<Result<Vec<u64>, _>>()
            .map_err(|_| bad(format!("shape {shape:?} has a negative dimension")))?;
        let entry = kv::IndexRowFields {
            tensor_key,
            dtype,
            shape: &shape,
            data_start,
            data_end,
            kv: sample_key.map(|k| (k, column)),
        };
        let t = kv::check_index_row(&self.header, &entry, separator).map_err(disagrees)?;
        Ok(tensor_row(&self.header, t))
    }
}

/// Parses and validates `dataset_manifest.json` (`file`: its URL or path, named by the error);
/// returns it re-serialised as JSON text (the Python side turns it into a dict), with every rule
/// of spec/dataset.md §5 checked, shard names included. `ManifestError` otherwise.
#[pyfunction]
fn parse_manifest(py: Python<'_>, text: &str, file: &str) -> PyResult<String> {
    py.detach(|| {
        let manifest = dataset::parse_manifest(text).map_err(|e| e.to_string())?;
        serde_json::to_string(&manifest).map_err(|e| e.to_string())
    })
    .map_err(|e| ManifestError::new_err(format!("{file}: {e}")))
}

/// Bytes the Rust engine has allocated and not freed in this process (its counted global
/// allocator), for leak soaks and monitoring.
#[pyfunction]
fn live_bytes() -> usize {
    safetensors_spark_format::alloc_stats::live_bytes()
}

/// Checks the offsets of ragged column `column` (`offsets`: the `c.offsets` tensor's bytes,
/// little-endian I64) against its values' element count `elements`
/// (`dataset::ragged::check_offsets`) of shard `file` (its URL or path); `ShardError` names the
/// file, the column and the first bad row.
#[pyfunction]
fn check_ragged_offsets(
    py: Python<'_>,
    column: &str,
    offsets: &[u8],
    elements: u64,
    file: &str,
) -> PyResult<()> {
    if !offsets.len().is_multiple_of(8) {
        return Err(shard_error(
            file,
            format!(
                "column '{column}': offsets of {} bytes are not whole I64 values",
                offsets.len()
            ),
        ));
    }
    py.detach(|| {
        let values: Vec<i64> = offsets
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        ragged::check_offsets(column, &values, elements)
    })
    .map_err(|e| shard_error(file, e))
}

/// Refuses a tensor index row's `file_name` that is not a plain shard file name of the dataset
/// directory (`dataset::check_shard_path`: no separator, scheme, `..`, control character; ends
/// in `.safetensors`); `IndexFileError` naming `part`, the index part.
#[pyfunction]
fn check_index_file_name(name: &str, part: &str) -> PyResult<()> {
    dataset::check_shard_path(name)
        .map_err(|e| IndexFileError::new_err(format!("{part}: file_name {e}")))
}

/// The index part's file name of a shard (spec/dataset.md §6.1).
#[pyfunction]
fn index_part_name(shard: &str) -> PyResult<String> {
    dataset::names::shard_index_part_file_name(shard)
        .ok_or_else(|| ManifestError::new_err(format!("'{shard}' is not a shard file name")))
}

/// Vacuums the local dataset `path` (spec/dataset.md §5.8.1); returns the outcome as JSON.
/// A bad retention or a retention shorter than the dataset's without the override raises
/// `ValueError` (ManifestError) naming it. `progress`: a callable told how far the deletions
/// are (see `progress.rs`), or None.
#[pyfunction]
#[pyo3(signature = (path, retention=None, dry_run=false, allow_shorter_retention=false, progress=None))]
fn vacuum(
    py: Python<'_>,
    path: &str,
    retention: Option<&str>,
    dry_run: bool,
    allow_shorter_retention: bool,
    progress: Option<Py<PyAny>>,
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
    let progress = progress::PyProgress::new(progress);
    let out = py
        .detach(|| {
            dataset::local::vacuum_dir(
                std::path::Path::new(path),
                &req,
                dry_run,
                &mut |_| {},
                &progress,
            )
        })
        .map_err(|e| ManifestError::new_err(format!("vacuum: {e}")))?;
    serde_json::to_string(&out).map_err(|e| ManifestError::new_err(e.to_string()))
}

/// Compacts the local dataset `path` (or its chosen `partitions`, `column=value`) by
/// spec/dataset.md §5.8.2; returns the outcomes as JSON (one per dataset directory). The
/// extension has no index writer: a dataset with `_tensor_index.parquet` parts is refused (the
/// CLI compacts it). Bad input raises `ManifestError` naming it; nothing is changed.
/// `progress`: a callable told how far the writing of new shards is (see `progress.rs`), or None.
#[pyfunction]
#[pyo3(signature = (path, batch_size=None, target_shard_size_mb=None, partitions=Vec::new(), dry_run=false, commit_message=None, progress=None))]
#[allow(clippy::too_many_arguments)]
fn compact(
    py: Python<'_>,
    path: &str,
    batch_size: Option<u64>,
    target_shard_size_mb: Option<u64>,
    partitions: Vec<String>,
    dry_run: bool,
    commit_message: Option<String>,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    use dataset::compaction::local::{compact_path, CompactionOptions};
    use dataset::compaction::CompactionRequest;
    let opts = CompactionOptions {
        request: CompactionRequest {
            batch_size,
            target_shard_size_mb,
        },
        dry_run,
        commit_message,
    };
    let progress = progress::PyProgress::new(progress);
    let out = py
        .detach(|| {
            compact_path(
                std::path::Path::new(path),
                &partitions,
                &opts,
                None,
                &mut |_| {},
                &progress,
            )
        })
        .map_err(|e| ManifestError::new_err(format!("compact: {e}")))?;
    serde_json::to_string(&out).map_err(|e| ManifestError::new_err(e.to_string()))
}

/// Deletes from the local dataset `path` (spec/dataset.md §5.11) as one `delete` version:
/// `keys` of a KV dataset, or `rows` (shard name → row indices) of a batch dataset; returns the
/// outcome as JSON. No index writer here: a dataset with `_tensor_index.parquet` parts is refused
/// (the CLI deletes from it). Bad input raises `ManifestError` naming it; nothing is changed.
#[pyfunction]
#[pyo3(signature = (path, keys=None, rows=None, dry_run=false, commit_message=None))]
fn delete(
    py: Python<'_>,
    path: &str,
    keys: Option<Vec<String>>,
    rows: Option<std::collections::BTreeMap<String, Vec<u64>>>,
    dry_run: bool,
    commit_message: Option<String>,
) -> PyResult<String> {
    use dataset::delete::local::{delete_keys_dir, delete_rows_dir, DeleteOptions};
    let opts = DeleteOptions {
        dry_run,
        commit_message,
    };
    let dir = std::path::Path::new(path);
    let out = py
        .detach(|| match (keys, rows) {
            (Some(k), None) => {
                delete_keys_dir(dir, &k.into_iter().collect(), &opts, None, &mut |_| {})
            }
            (None, Some(r)) => delete_rows_dir(
                dir,
                &r.into_iter()
                    .map(|(s, v)| (s, v.into_iter().collect()))
                    .collect(),
                &opts,
                None,
                &mut |_| {},
            ),
            _ => Err(dataset::local::LocalError::Dataset {
                path: dir.to_path_buf(),
                source: dataset::DatasetError::Delete {
                    problem: "give keys or rows, not both".into(),
                },
            }),
        })
        .map_err(|e| ManifestError::new_err(format!("delete: {e}")))?;
    serde_json::to_string(&out).map_err(|e| ManifestError::new_err(e.to_string()))
}

/// A rule of the dataset `dataset` (its path or URL) broken, as `ManifestError` naming it.
fn dataset_error(dataset: &str, e: impl std::fmt::Display) -> PyErr {
    ManifestError::new_err(format!("{dataset}: {e}"))
}

/// The version to read among the listed `_manifest_log/` entries of `dataset` (`entries_json`:
/// `[{"version", "modified_ms", "text"?}]`, texts needed for a timestamp): `version` /
/// `timestamp` as text, exactly one (spec/dataset.md §5.8). `ManifestError` naming `dataset`.
#[pyfunction]
#[pyo3(signature = (entries_json, dataset, version=None, timestamp=None))]
fn select_version(
    entries_json: &str,
    dataset: &str,
    version: Option<&str>,
    timestamp: Option<&str>,
) -> PyResult<u64> {
    let err = |e| dataset_error(dataset, e);
    let spec = versions::version_spec(version, timestamp).map_err(err)?;
    let entries: Vec<versions::ListedLogEntry> =
        serde_json::from_str(entries_json).map_err(|e| dataset_error(dataset, e))?;
    versions::select_listed(&entries, spec).map_err(err)
}

/// Checks the shards version `version` (manifest text `manifest`) of `dataset` lists against
/// `found_json` (`{shard: size}`, a missing shard absent): `ShardError` naming the dataset, the
/// version and the shard.
#[pyfunction]
fn check_version_shards(
    manifest: &str,
    version: u64,
    found_json: &str,
    dataset: &str,
) -> PyResult<()> {
    let found: std::collections::BTreeMap<String, u64> =
        serde_json::from_str(found_json).map_err(|e| shard_error(dataset, e))?;
    versions::check_entry_shards(manifest, version, &found)
        .map(drop)
        .map_err(|e| shard_error(dataset, e))
}

/// A local manifest or `_manifest_log/` entry read by the one rule of spec/dataset.md §5.9: a
/// regular file (a FIFO or a device is refused at once) within the size bound; `OSError` naming
/// the path otherwise.
#[pyfunction]
fn read_manifest_file(py: Python<'_>, path: std::path::PathBuf) -> PyResult<String> {
    py.detach(|| dataset::own::read_manifest_text(&path))
        .map_err(|e| os_error(&path, &e))
}

/// An I/O error as Python's `OSError` naming `path` (`FileNotFoundError` when it is absent).
fn os_error(path: &std::path::Path, e: &std::io::Error) -> PyErr {
    let msg = format!("{}: {e}", path.display());
    if e.kind() == std::io::ErrorKind::NotFound {
        pyo3::exceptions::PyFileNotFoundError::new_err(msg)
    } else {
        pyo3::exceptions::PyOSError::new_err(msg)
    }
}

/// Refuses a local file that is not a regular file (an index part before pyarrow opens it:
/// a FIFO would block, a device never end), by the one rule `format::file::open_regular`;
/// `OSError` naming the path (`FileNotFoundError` when absent).
#[pyfunction]
fn check_regular_file(path: std::path::PathBuf) -> PyResult<()> {
    safetensors_spark_format::file::open_regular(&path)
        .map(drop)
        .map_err(|e| os_error(&path, &e))
}

/// Parses the text of `_manifest_log/` entry `version` (read by the caller's file system) and
/// checks that it agrees with its name (spec/dataset.md §5.9); returns it as JSON text, like
/// `parse_manifest`. `ManifestError` naming `dataset` and the entry otherwise.
#[pyfunction]
fn parse_log_entry(py: Python<'_>, version: u64, text: &str, dataset: &str) -> PyResult<String> {
    py.detach(|| {
        let m = versions::parse_log_entry(version, text).map_err(|e| e.to_string())?;
        serde_json::to_string(&m).map_err(|e| e.to_string())
    })
    .map_err(|e| dataset_error(dataset, e))
}

/// One step of rebuilding version `version` of `dataset` from its `_manifest_log/`
/// (spec/dataset.md §5.10): `names` as listed, `texts` the files read so far by name. Returns
/// `("read", [names])` to read next or `("manifest", json_text)`, the version's whole manifest
/// as JSON text like `parse_manifest`. `ManifestError` naming the dataset when the version cannot
/// be rebuilt (a damaged entry, a missing one).
#[pyfunction]
fn rebuild_version(
    py: Python<'_>,
    names: Vec<String>,
    version: u64,
    texts: std::collections::BTreeMap<String, String>,
    dataset: &str,
) -> PyResult<(String, Vec<String>, Option<String>)> {
    use dataset::log::{plan_state_by_names, StatePlan};
    py.detach(|| match plan_state_by_names(&names, version, texts) {
        Ok(StatePlan::Read(need)) => Ok((
            "read".to_string(),
            need.iter().map(|f| f.name()).collect(),
            None,
        )),
        Ok(StatePlan::Done(m)) => serde_json::to_string(&*m)
            .map(|t| ("manifest".to_string(), Vec::new(), Some(t)))
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    })
    .map_err(|e| dataset_error(dataset, e))
}

/// One step of following `dataset` from version `after` to `upto` (spec/dataset.md §5.12):
/// `names` as listed, `texts` the files read so far by name. Returns `("read", [names], None)`
/// to read next or `("versions", [], json_text)`: a JSON array of `{version, operation,
/// committed_at_ms, followed, add}`. `ManifestError` naming the dataset for a version that
/// removes rows (unless `skip_changes`; the error names `skip_option`), one that changes the
/// columns, or one no longer in the log.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn follow_versions(
    py: Python<'_>,
    names: Vec<String>,
    after: u64,
    upto: u64,
    texts: std::collections::BTreeMap<String, String>,
    skip_changes: bool,
    skip_option: &str,
    dataset: &str,
) -> PyResult<(String, Vec<String>, Option<String>)> {
    use dataset::log::follow::{plan_follow_by_names, FollowPlan, OnChange};
    let on = if skip_changes {
        OnChange::Skip
    } else {
        OnChange::Fail
    };
    py.detach(
        || match plan_follow_by_names(&names, after, upto, texts, on, skip_option) {
            Ok(FollowPlan::Read(need)) => Ok((
                "read".to_string(),
                need.iter().map(|f| f.name()).collect(),
                None,
            )),
            Ok(FollowPlan::Done(v)) => serde_json::to_string(&v)
                .map(|t| ("versions".to_string(), Vec::new(), Some(t)))
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
    )
    .map_err(|e| dataset_error(dataset, e))
}

/// Whether the local dataset `root` has its own directory `name` (`_manifest_log`,
/// `_tensor_index.parquet`): False when absent; `ManifestError` naming it when it is a
/// symbolic link or not a directory (spec/dataset.md §5.9).
#[pyfunction]
fn own_dir(root: std::path::PathBuf, name: &str) -> PyResult<bool> {
    dataset::own::own_dir(&root, name)
        .map(|d| d.is_some())
        .map_err(|e| ManifestError::new_err(format!("{}: {e}", root.join(name).display())))
}

/// The version of a `_manifest_log/` file name of `dataset`, None for a name that is no entry;
/// `ManifestError` naming the dataset and a 20-digit name beyond the largest version.
#[pyfunction]
fn log_entry_version(name: &str, dataset: &str) -> PyResult<Option<u64>> {
    dataset::names::parse_manifest_log_file_name(name).map_err(|e| dataset_error(dataset, e))
}

/// The history rows (JSON array text) of the listed entries of `dataset` (every text given);
/// `ManifestError` naming the dataset.
#[pyfunction]
fn history(entries_json: &str, dataset: &str) -> PyResult<String> {
    let err = |e: String| dataset_error(dataset, e);
    let entries: Vec<versions::ListedLogEntry> =
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
        let checks = versions::validate_dir(&path, &dataset::progress::NoProgress)
            .map_err(|e| e.to_string())?;
        serde_json::to_string(&checks).map_err(|e| e.to_string())
    })
    .map_err(ManifestError::new_err)
}

/// A fixed column for `gather_rows` from Python: `(name, row bytes, (output address, output
/// bytes), [(source address, source bytes, source rows)] per shard number)`.
type GatherSpec = (String, usize, (usize, usize), Vec<(usize, usize, u64)>);

/// One gather of a batch's fixed columns across shards (`gather::gather_rows`), the GIL released.
/// `shards`, `rows`: the batch's shard numbers (positions in each column's source list) and rows
/// as native int64 bytes. Private to the package (`torch/_reader.py`): the addresses are those of
/// C-contiguous numpy arrays the caller holds for the call, outputs apart from the sources.
/// `IndexError` for a shard or row out of range, `ValueError` for the rest.
#[pyfunction]
fn gather_rows(
    py: Python<'_>,
    columns: Vec<GatherSpec>,
    shards: &[u8],
    rows: &[u8],
) -> PyResult<()> {
    let (shards, rows) = (ints(shards, "shard indices")?, ints(rows, "row indices")?);
    let mut cols = gather_columns(&columns);
    py.detach(|| gather::gather_rows(&mut cols, &shards, &rows))
        .map_err(gather_error)
}

/// Native int64 values from their bytes.
fn ints(b: &[u8], what: &str) -> PyResult<Vec<i64>> {
    if !b.len().is_multiple_of(8) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "gather: {what} of {} bytes are not whole int64 values",
            b.len()
        )));
    }
    Ok(b.chunks_exact(8)
        .map(|c| i64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

fn gather_error(e: gather::GatherError) -> PyErr {
    match e {
        gather::GatherError::Index(m) => pyo3::exceptions::PyIndexError::new_err(m),
        gather::GatherError::Invalid(m) => pyo3::exceptions::PyValueError::new_err(m),
    }
}

/// The columns of a gather over the caller's memory.
fn gather_columns(columns: &[GatherSpec]) -> Vec<gather::Column<'_>> {
    // SAFETY: the caller (torch/_reader.py) passes the data addresses and byte lengths of numpy
    // arrays it keeps alive for the call; each output array is fresh or pooled memory that no
    // source and no other output overlaps, and nothing else writes these arrays meanwhile.
    columns
        .iter()
        .map(
            |(name, row_bytes, (out, out_len), sources)| gather::Column {
                name,
                row_bytes: *row_bytes,
                out: if *out_len == 0 {
                    &mut []
                } else {
                    unsafe { std::slice::from_raw_parts_mut(*out as *mut u8, *out_len) }
                },
                sources: sources
                    .iter()
                    .map(|&(addr, len, rows)| gather::Source {
                        data: if len == 0 {
                            &[]
                        } else {
                            unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
                        },
                        rows,
                    })
                    .collect(),
            },
        )
        .collect()
}

/// One gather of a ragged column's rows across shards (`gather::gather_spans`), the GIL
/// released: per batch row its shard number, first element and element count (native int64
/// bytes), the rows written one after the other. Private to the package, as `gather_rows`.
#[pyfunction]
fn gather_ragged(
    py: Python<'_>,
    column: GatherSpec,
    shards: &[u8],
    starts: &[u8],
    lengths: &[u8],
) -> PyResult<()> {
    let (shards, starts) = (ints(shards, "shard indices")?, ints(starts, "row starts")?);
    let lengths = ints(lengths, "row lengths")?;
    let mut cols = gather_columns(std::slice::from_ref(&column));
    let Some(col) = cols.first_mut() else {
        return Ok(());
    };
    py.detach(|| gather::gather_spans(col, &shards, &starts, &lengths))
        .map_err(gather_error)
}

/// One epoch's packed token stream (spec/python.md §3.3) for `pack::build_blocks`: the
/// epoch's arrays (native int64 bytes, one entry per position of its order: stream ends,
/// document lengths, shard numbers, first elements in the shard's values, document ids),
/// copied once; each shard's values are set once (`set_values`) and kept alive here. Private to
/// the package (`_packing.py`).
/// A shard's values for the packer: (address, bytes, elements), and the array holding them.
type Values = (usize, usize, u64, Py<PyAny>);

#[pyclass(module = "safetensors_spark._native", name = "Packer")]
struct PyPacker {
    seq_len: u64,
    token_bytes: usize,
    eos: Option<Vec<u8>>,
    ends: Vec<i64>,
    lengths: Vec<i64>,
    shards: Vec<i64>,
    firsts: Vec<i64>,
    documents: Vec<i64>,
    /// Per shard number: its values, when set.
    values: Vec<Option<Values>>,
}

#[pymethods]
impl PyPacker {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        seq_len: u64,
        token_bytes: usize,
        eos: Option<Vec<u8>>,
        ends: &[u8],
        lengths: &[u8],
        shards: &[u8],
        firsts: &[u8],
        documents: &[u8],
        num_shards: usize,
    ) -> PyResult<Self> {
        let packer = PyPacker {
            seq_len,
            token_bytes,
            eos,
            ends: ints(ends, "stream ends")?,
            lengths: ints(lengths, "document lengths")?,
            shards: ints(shards, "shard numbers")?,
            firsts: ints(firsts, "first elements")?,
            documents: ints(documents, "document ids")?,
            values: (0..num_shards).map(|_| None).collect(),
        };
        packer.stream().check().map_err(gather_error)?;
        Ok(packer)
    }

    /// Sets shard number `shard`'s values: `array` (kept alive by the packer) is C-contiguous at
    /// `address`, `nbytes` long, `elements` tokens.
    fn set_values(
        &mut self,
        shard: usize,
        array: Py<PyAny>,
        address: usize,
        nbytes: usize,
        elements: u64,
    ) -> PyResult<()> {
        let n = self.values.len();
        let Some(slot) = self.values.get_mut(shard) else {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "pack: shard {shard} is out of range ({n} shards)"
            )));
        };
        if usize::try_from(elements)
            .ok()
            .and_then(|e| e.checked_mul(self.token_bytes))
            != Some(nbytes)
        {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "pack: shard {shard}: {nbytes} bytes are not {elements} tokens of {} bytes",
                self.token_bytes
            )));
        }
        *slot = Some((address, nbytes, elements, array));
        Ok(())
    }

    /// Whether shard number `shard`'s values are set.
    fn has_values(&self, shard: usize) -> bool {
        self.values.get(shard).is_some_and(Option::is_some)
    }

    /// Blocks `[b0, b1)` into the caller's outputs, each `(address, bytes)` of writable memory
    /// it holds for the call (ids: `ids_bytes` 4 or 8 each); returns the number of `cu_seqlens`
    /// entries written. The GIL is released meanwhile.
    #[allow(clippy::too_many_arguments)]
    fn build(
        &self,
        py: Python<'_>,
        b0: u64,
        b1: u64,
        tokens: (usize, usize),
        position_ids: Option<(usize, usize)>,
        document_ids: Option<(usize, usize)>,
        ids_bytes: usize,
        cu_seqlens: (usize, usize),
    ) -> PyResult<usize> {
        // SAFETY: the caller (_packing.py PackedEpoch.fill) passes address and length of
        // disjoint parts of one writable buffer it holds for the call (a numpy array or a
        // shared-memory block, the parts inside it: checked there), apart from every shard's
        // values; the values are arrays this packer keeps alive (set_values).
        let out = |(addr, len): (usize, usize)| -> &mut [u8] {
            if len == 0 {
                &mut []
            } else {
                unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
            }
        };
        let sources: Vec<Option<gather::Source<'_>>> = self
            .values
            .iter()
            .map(|v| {
                v.as_ref().map(|&(addr, len, rows, _)| gather::Source {
                    data: if len == 0 {
                        &[]
                    } else {
                        unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
                    },
                    rows,
                })
            })
            .collect();
        let mut blocks = pack::Blocks {
            tokens: out(tokens),
            position_ids: position_ids.map(out),
            document_ids: document_ids.map(out),
            ids_bytes,
            cu_seqlens: out(cu_seqlens),
        };
        let stream = self.stream();
        py.detach(|| pack::build_blocks(&stream, &sources, b0, b1, &mut blocks))
            .map_err(gather_error)
    }
}

impl PyPacker {
    fn stream(&self) -> pack::Stream<'_> {
        pack::Stream {
            seq_len: self.seq_len,
            ends: &self.ends,
            lengths: &self.lengths,
            shards: &self.shards,
            firsts: &self.firsts,
            documents: &self.documents,
            eos: self.eos.as_deref(),
            token_bytes: self.token_bytes,
        }
    }
}

/// The tensor holding ragged column `column`'s row boundaries (spec/dataset.md §2.1).
#[pyfunction]
fn ragged_offsets_name(column: &str) -> String {
    dataset::manifest::ragged_offsets_name(column)
}

/// The file name, in `_manifest_log/`, of version `version`'s log entry.
#[pyfunction]
fn manifest_log_file_name(version: u64) -> String {
    names::manifest_log_file_name(version)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // the public exceptions raised here are imported now, so that a package without them fails
    // its import with an ImportError naming them, never a call later
    let errors = m.py().import("safetensors_spark._errors")?;
    for name in ["ManifestError", "ShardError", "IndexFileError"] {
        errors.getattr(name)?;
    }
    m.add_class::<PyHeader>()?;
    remote::register(m)?;
    m.add_class::<PyPacker>()?;
    m.add("VERSION", safetensors_spark_format::VERSION)?;
    // the dataset's file names and shard metadata keys: the Rust rules' own values
    // (spec/dataset.md §1, §4), so that the package holds no copy of them
    for (name, value) in [
        ("MANIFEST_FILE_NAME", names::MANIFEST_FILE_NAME),
        ("MANIFEST_LOG_DIR", names::MANIFEST_LOG_DIR),
        ("INDEX_DIR_NAME", names::INDEX_DIR_NAME),
        ("LAYOUT_METADATA_KEY", names::LAYOUT_METADATA_KEY),
        (
            "KV_SEPARATOR_METADATA_KEY",
            names::KV_SEPARATOR_METADATA_KEY,
        ),
        ("SAMPLES_METADATA_KEY", names::SAMPLES_METADATA_KEY),
        (
            "PADDED_SAMPLES_METADATA_KEY",
            names::PADDED_SAMPLES_METADATA_KEY,
        ),
        ("RAGGED_METADATA_KEY", names::RAGGED_METADATA_KEY),
        ("DEFAULT_KV_SEPARATOR", names::DEFAULT_KV_SEPARATOR),
    ] {
        m.add(name, value)?;
    }
    m.add_function(wrap_pyfunction!(ragged_offsets_name, m)?)?;
    m.add_function(wrap_pyfunction!(manifest_log_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(check_prefix, m)?)?;
    m.add_function(wrap_pyfunction!(parse_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(check_index_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(index_part_name, m)?)?;
    m.add_function(wrap_pyfunction!(live_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(vacuum, m)?)?;
    m.add_function(wrap_pyfunction!(compact, m)?)?;
    m.add_function(wrap_pyfunction!(delete, m)?)?;
    m.add_function(wrap_pyfunction!(check_ragged_offsets, m)?)?;
    m.add_function(wrap_pyfunction!(select_version, m)?)?;
    m.add_function(wrap_pyfunction!(check_version_shards, m)?)?;
    m.add_function(wrap_pyfunction!(read_manifest_file, m)?)?;
    m.add_function(wrap_pyfunction!(parse_log_entry, m)?)?;
    m.add_function(wrap_pyfunction!(rebuild_version, m)?)?;
    m.add_function(wrap_pyfunction!(follow_versions, m)?)?;
    m.add_function(wrap_pyfunction!(check_regular_file, m)?)?;
    m.add_function(wrap_pyfunction!(own_dir, m)?)?;
    m.add_function(wrap_pyfunction!(log_entry_version, m)?)?;
    m.add_function(wrap_pyfunction!(history, m)?)?;
    m.add_function(wrap_pyfunction!(file_crc32c, m)?)?;
    m.add_function(wrap_pyfunction!(crc32c_hex, m)?)?;
    m.add_function(wrap_pyfunction!(validate_dataset, m)?)?;
    m.add_function(wrap_pyfunction!(gather_rows, m)?)?;
    m.add_function(wrap_pyfunction!(gather_ragged, m)?)?;
    Ok(())
}

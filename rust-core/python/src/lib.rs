//! `safetensors_spark._native`: the format rules of the Rust engine, called from the Python
//! package (rust-core/python/python/safetensors_spark). Python reads bytes (local files or
//! fsspec range reads); every rule about what those bytes mean is applied here, once, by the
//! same code the Spark connector runs. Every failure is a Python exception; nothing panics.

use pyo3::prelude::*;
use safetensors_spark_dataset as dataset;
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

/// One tensor of a header: `(name, dtype, shape, begin, end)`, offsets absolute in the file.
type TensorRow = (String, String, Vec<u64>, u64, u64);
/// A header's `__metadata__` (None when absent) and its tensors.
type ParsedHeader = (
    Option<std::collections::BTreeMap<String, String>>,
    Vec<TensorRow>,
);

/// Gathers rows of an open shard with positioned reads (`safetensors_spark_format::file::
/// read_rows_at`), the GIL released: for each little-endian u64 in `offsets`, `row_len` bytes
/// at that absolute offset, in order, as one new `bytearray`. `fd` is a descriptor of the file
/// the caller keeps open for the call; `path` names it in errors; `expected_len` is the length
/// its header was validated against. A file that has become shorter raises `FormatError`
/// naming it, instead of the SIGBUS a memory map would take (spec/format.md).
#[pyfunction]
fn read_rows<'py>(
    py: Python<'py>,
    fd: i32,
    path: &str,
    expected_len: u64,
    offsets: &[u8],
    row_len: usize,
) -> PyResult<Bound<'py, pyo3::types::PyByteArray>> {
    use std::os::fd::BorrowedFd;
    let offsets: Vec<u64> = offsets
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    let total = offsets.len().checked_mul(row_len).ok_or_else(|| {
        FormatError::new_err(format!(
            "{path}: {} rows of {row_len} bytes overflow",
            offsets.len()
        ))
    })?;
    // SAFETY: `fd` is an open descriptor the caller holds for the duration of this call (the
    // store's open file object); it is only duplicated here, never closed.
    let file = std::fs::File::from(
        unsafe { BorrowedFd::borrow_raw(fd) }
            .try_clone_to_owned()
            .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("{path}: {e}")))?,
    );
    let path = std::path::Path::new(path);
    let mut out = vec![0u8; total];
    py.detach(|| {
        safetensors_spark_format::file::read_rows_at(
            &file,
            path,
            expected_len,
            &offsets,
            row_len,
            &mut out,
        )
    })
    .map_err(|e| FormatError::new_err(e.to_string()))?;
    Ok(pyo3::types::PyByteArray::new(py, &out))
}

/// Checks the 8-byte prefix of a file of `file_len` bytes; returns N, the header length.
#[pyfunction]
fn check_prefix(prefix: &[u8], file_len: u64) -> PyResult<u64> {
    header::check_prefix(prefix, file_len).map_err(|e| FormatError::new_err(e.to_string()))
}

/// Parses and validates the N header bytes of a file of `file_len` bytes.
///
/// Returns `(metadata, tensors)`: `metadata` a dict or None, `tensors` a list of
/// `(name, dtype, shape, data_start, data_end)` in data order, with absolute byte offsets.
#[pyfunction]
fn parse_header(py: Python<'_>, json: &[u8], file_len: u64) -> PyResult<ParsedHeader> {
    let parsed = py
        .detach(|| header::parse_header(json, file_len))
        .map_err(|e| FormatError::new_err(e.to_string()))?;
    let base = parsed.data_start();
    let tensors = parsed
        .tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.dtype.name().to_string(),
                t.shape.clone(),
                base + t.data_offsets[0],
                base + t.data_offsets[1],
            )
        })
        .collect();
    Ok((parsed.metadata, tensors))
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

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FormatError", m.py().get_type::<FormatError>())?;
    m.add("ManifestError", m.py().get_type::<ManifestError>())?;
    m.add("VERSION", safetensors_spark_format::VERSION)?;
    m.add_function(wrap_pyfunction!(check_prefix, m)?)?;
    m.add_function(wrap_pyfunction!(parse_header, m)?)?;
    m.add_function(wrap_pyfunction!(parse_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(check_shard_path, m)?)?;
    m.add_function(wrap_pyfunction!(index_part_name, m)?)?;
    m.add_function(wrap_pyfunction!(live_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(read_rows, m)?)?;
    Ok(())
}

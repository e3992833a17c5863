//! The Spark read path's engine: decoding tensors into Arrow arrays in the three row layouts.
//!
//! Everything here is JNI-free and returns plain `arrow-array` values; the JVM connector will
//! receive the [`RecordBatch`](arrow_array::RecordBatch)es through the Arrow C Stream interface
//! (`arrow_array::ffi_stream`) and wrap their columns in Spark's `ArrowColumnVector`. So only the
//! Arrow types `ArrowColumnVector` supports appear: Boolean, Int8/16/32/64, Float32/64, Utf8,
//! Binary, List, Struct, Map (no FixedSizeList, Float16 or unsigned integers).
//!
//! * [`decode`] — the dtype → Spark element type table ([`spark_element`]) and the bulk
//!   little-endian decoders ([`decode_values`]).
//! * [`rows`] — the rows of each layout:
//!   * per sample (batch-mode datasets): [`sample_rows`] / [`sample_column`], one row per index
//!     of the leading dimension within a row range; pad rows are excluded via
//!     [`batch_samples`];
//!   * per tensor (any file): [`tensor_rows`], one row per tensor;
//!   * per file: [`file_rows`], one row per file with a Tensor Struct column per key.
//!
//!   Each layout has a schema function the driver can call at plan time, and every layout can
//!   carry the file's `__metadata__` as a `Map<Utf8, Utf8>` column (null when the file has none).
//! * [`TensorSource`] — where tensor bytes come from: a local file read with positioned reads
//!   ([`SafetensorsFile`]), a whole file held in memory ([`FileBytes`]), or (later) ranged reads
//!   from a Hadoop file system, which only need to implement [`TensorSource::read`] for a byte
//!   range of one tensor.
//!
//! * [`scan`] — driver side of a Spark scan: which files belong to it (manifests, corrupt
//!   files), the resolved layout and Spark schema ([`scan::describe`]), and the input
//!   partitions ([`scan::plan`]); serde JSON in and out for the JNI layer.
//! * [`task`] — executor side: [`task::ReadTask`] runs one [`scan::PartitionSpec`] on local
//!   (positioned reads) or remote (ranged reads) files, batch by batch, counting the bytes it reads.
//!
//! Sizes: Spark's `ArrowColumnVector` reads `List` and `Binary` offsets as 32-bit integers, so a
//! batch may hold at most `i32::MAX` elements per list level and `i32::MAX` bytes per binary
//! column; exceeding that is a [`ReadErrorKind::TooLarge`] error, never a wrapped offset — the
//! caller reads fewer rows (or tensors) per batch.

pub mod arrow_types;
pub mod decode;
pub mod error;
pub mod forensic_columns;
pub mod rows;
pub mod scan;
pub mod task;

pub use decode::{common_element, decode_values, spark_element, widen};
pub use error::{ReadError, ReadErrorKind};
pub use rows::{
    batch_samples, file_columns, file_rows, file_rows_schema, row_byte_range, sample_array,
    sample_column, sample_column_as, sample_data_type, sample_rows, sample_target_type,
    tensor_columns, tensor_rows, tensor_rows_schema, FileColumn, SampleOptions, SampleTarget,
    TensorColumn, TensorField, TensorRowOptions,
};

use safetensors_spark_format::file::SafetensorsFile;
use safetensors_spark_format::header::{self, Header, TensorInfo};
use std::borrow::Cow;
use std::ops::Range;

/// A safetensors file whose header is known and whose tensor bytes can be read.
pub trait TensorSource {
    /// The name rows carry in their `file` column and errors carry (a path or URI).
    fn name(&self) -> Cow<'_, str>;

    /// The validated header.
    fn header(&self) -> &Header;

    /// Bytes `range` of tensor `info`'s data, offsets relative to the tensor's first byte
    /// (`0..info.byte_len()` is the whole tensor). Borrowed when the bytes are already in memory
    /// (a whole file in memory), owned when they had to be read or fetched.
    fn read(&self, info: &TensorInfo, range: Range<u64>) -> Result<Cow<'_, [u8]>, ReadError>;
}

/// The bytes of one whole tensor.
pub fn tensor_bytes<'s>(
    src: &'s dyn TensorSource,
    info: &TensorInfo,
) -> Result<Cow<'s, [u8]>, ReadError> {
    src.read(info, 0..info.byte_len())
}

fn slice_tensor<'a>(
    file: &str,
    data: &'a [u8],
    info: &TensorInfo,
    range: Range<u64>,
) -> Result<&'a [u8], ReadError> {
    let len = info.byte_len();
    if range.start > range.end || range.end > len || data.len() as u64 != len {
        return Err(ReadErrorKind::DataLength {
            expected: len,
            actual: data.len() as u64,
        }
        .at(file, &info.name));
    }
    Ok(&data[range.start as usize..range.end as usize])
}

impl TensorSource for SafetensorsFile {
    fn name(&self) -> Cow<'_, str> {
        self.path().to_string_lossy()
    }

    fn header(&self) -> &Header {
        SafetensorsFile::header(self)
    }

    fn read(&self, info: &TensorInfo, range: Range<u64>) -> Result<Cow<'_, [u8]>, ReadError> {
        // Only the bytes asked for are read, each checked against the validated length.
        let len = info.byte_len();
        if range.start > range.end || range.end > len {
            return Err(ReadErrorKind::DataLength {
                expected: len,
                actual: range.end,
            }
            .at(&self.name(), &info.name));
        }
        let base = self.header().data_start() + info.data_offsets[0];
        self.read_range(base + range.start..base + range.end)
            .map(Cow::Owned)
            .map_err(|e| ReadErrorKind::Format(e).at(&self.name(), &info.name))
    }
}

/// A whole safetensors file held in memory (e.g. a buffer the JVM read or a direct ByteBuffer).
pub struct FileBytes<'a> {
    name: String,
    header: Header,
    bytes: &'a [u8],
}

impl<'a> FileBytes<'a> {
    /// Validates the header of `bytes` (the complete file).
    pub fn parse(name: &str, bytes: &'a [u8]) -> Result<Self, ReadError> {
        let header =
            header::parse_file_bytes(bytes).map_err(|e| ReadErrorKind::Format(e).in_file(name))?;
        Ok(FileBytes {
            name: name.to_owned(),
            header,
            bytes,
        })
    }
}

impl TensorSource for FileBytes<'_> {
    fn name(&self) -> Cow<'_, str> {
        Cow::Borrowed(&self.name)
    }

    fn header(&self) -> &Header {
        &self.header
    }

    fn read(&self, info: &TensorInfo, range: Range<u64>) -> Result<Cow<'_, [u8]>, ReadError> {
        // parse_file_bytes checked that every tensor lies within the file.
        let start = (self.header.data_start() + info.data_offsets[0]) as usize;
        let end = (self.header.data_start() + info.data_offsets[1]) as usize;
        let data = self.bytes.get(start..end).unwrap_or(&[]);
        slice_tensor(&self.name, data, info, range).map(Cow::Borrowed)
    }
}

#[cfg(test)]
mod tests;

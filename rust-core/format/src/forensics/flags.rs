//! Flag codes and levels of a forensic report, and the mapping of the strict parser's errors onto
//! them. `spec/forensics.md` lists every code; the names here are that contract.

use crate::error::FormatError;
use serde::Serialize;
use std::fmt;

/// How bad a flag is. Ordered: `Info < Warning < Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Worth knowing; not a problem of the file.
    Info,
    /// The format is respected, but something is suspicious.
    Warning,
    /// The file breaks a rule of the format (the strict reader rejects it), or cannot be read.
    Error,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warning => "warning",
            Level::Error => "error",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

macro_rules! flag_codes {
    ($($variant:ident = $code:literal, $level:ident;)*) => {
        /// A stable flag code. Its string (`code()`) is what reports carry.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum FlagCode { $($variant,)* }

        impl FlagCode {
            /// Every code, in the order of `spec/forensics.md`.
            pub const ALL: &'static [FlagCode] = &[$(FlagCode::$variant,)*];

            /// The stable string of this code.
            pub fn code(self) -> &'static str {
                match self { $(FlagCode::$variant => $code,)* }
            }

            /// The level every flag of this code has.
            pub fn level(self) -> Level {
                match self { $(FlagCode::$variant => Level::$level,)* }
            }
        }
    };
}

flag_codes! {
    // Errors: the file breaks a rule of spec/format.md §3 (what the strict reader rejects).
    HeaderTooSmall = "header_too_small", Error;
    HeaderTooLarge = "header_too_large", Error;
    HeaderBeyondFile = "header_beyond_file", Error;
    HeaderNotUtf8 = "header_not_utf8", Error;
    HeaderInvalidJson = "header_invalid_json", Error;
    DuplicateKey = "duplicate_key", Error;
    MetadataNotStringMap = "metadata_not_string_map", Error;
    TensorEntryInvalid = "tensor_entry_invalid", Error;
    UnknownDtype = "unknown_dtype", Error;
    InvalidShape = "invalid_shape", Error;
    InvalidOffsets = "invalid_offsets", Error;
    ReversedOffsets = "reversed_offsets", Error;
    OverlappingOffsets = "overlapping_offsets", Error;
    BytesOutsideTensors = "bytes_outside_tensors", Error;
    SizeOverflow = "size_overflow", Error;
    SizeNotByteAligned = "size_not_byte_aligned", Error;
    OffsetsShapeMismatch = "offsets_shape_mismatch", Error;
    DataPastEnd = "data_past_end", Error;
    Unreadable = "unreadable", Error;
    // Warnings: valid files with something suspicious.
    HugeTensor = "huge_tensor", Warning;
    GhostTensor = "ghost_tensor", Warning;
    MetadataMalformed = "metadata_malformed", Warning;
    MetadataSpoofed = "metadata_spoofed", Warning;
    MetadataUnlistedKeys = "metadata_unlisted_keys", Warning;
    IntegerFloatWeights = "integer_float_weights", Warning;
    UnusualTensorName = "unusual_tensor_name", Warning;
    // Info.
    MisalignedTensor = "misaligned_tensor", Info;
    // Sharded checkpoints (a `*.safetensors.index.json` and its shards).
    IndexInvalid = "index_invalid", Error;
    ShardMissing = "shard_missing", Error;
    IndexTensorMissing = "index_tensor_missing", Error;
    IndexTensorExtra = "index_tensor_extra", Warning;
    IndexTotalSizeMismatch = "index_total_size_mismatch", Warning;
}

impl Serialize for FlagCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}

impl fmt::Display for FlagCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// One finding of a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Flag {
    pub code: FlagCode,
    pub level: Level,
    /// The tensor it is about, when it is about one.
    pub tensor: Option<String>,
    /// What was found, naming the tensor and the numbers.
    pub message: String,
}

impl Flag {
    pub fn new(code: FlagCode, tensor: Option<&str>, message: impl Into<String>) -> Self {
        Flag {
            code,
            level: code.level(),
            tensor: tensor.map(str::to_owned),
            message: message.into(),
        }
    }

    /// The flag for a rule the strict parser enforces: its code, the tensor the error names and
    /// the error's own message.
    pub fn from_format_error(e: &FormatError) -> Self {
        let (code, tensor) = classify(e);
        Flag::new(code, tensor, e.to_string())
    }
}

/// The flag code of a strict-parser error, and the tensor it names.
pub fn classify(e: &FormatError) -> (FlagCode, Option<&str>) {
    use FlagCode as C;
    use FormatError as E;
    match e {
        E::HeaderTooSmall { .. } => (C::HeaderTooSmall, None),
        E::HeaderTooLarge { .. } => (C::HeaderTooLarge, None),
        E::HeaderBeyondFile { .. } => (C::HeaderBeyondFile, None),
        E::HeaderNotUtf8 { .. } => (C::HeaderNotUtf8, None),
        E::InvalidJson { .. } | E::HeaderNotObject { .. } => (C::HeaderInvalidJson, None),
        E::DuplicateKey { .. } => (C::DuplicateKey, None),
        E::MetadataNotObject { .. } | E::MetadataValueNotString { .. } => {
            (C::MetadataNotStringMap, None)
        }
        E::TensorNotObject { name, .. }
        | E::MissingField { name, .. }
        | E::UnknownField { name, .. } => (C::TensorEntryInvalid, Some(name)),
        E::DtypeNotString { name, .. } | E::UnknownDtype { name, .. } => {
            (C::UnknownDtype, Some(name))
        }
        E::InvalidShape { name, .. } => (C::InvalidShape, Some(name)),
        E::InvalidOffsets { name, .. } => (C::InvalidOffsets, Some(name)),
        E::ReversedOffsets { name, .. } => (C::ReversedOffsets, Some(name)),
        E::OffsetHole { name, .. } => (C::BytesOutsideTensors, Some(name)),
        E::OffsetOverlap { name, .. } => (C::OverlappingOffsets, Some(name)),
        E::SizeOverflow { name, .. } => (C::SizeOverflow, Some(name)),
        E::MisalignedSubByte { name, .. } => (C::SizeNotByteAligned, Some(name)),
        E::SizeMismatch { name, .. } => (C::OffsetsShapeMismatch, Some(name)),
        E::FileLengthMismatch {
            expected, file_len, ..
        } if expected < file_len => (C::BytesOutsideTensors, None),
        E::FileLengthMismatch { .. } | E::FileLengthOverflow { .. } => (C::DataPastEnd, None),
        E::ReservedName
        | E::DuplicateTensorName { .. }
        | E::TensorNotFound { .. }
        | E::DataLengthMismatch { .. }
        | E::Shrank { .. }
        | E::Io { .. } => (C::Unreadable, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn codes_are_unique_snake_case() {
        let mut seen = HashSet::new();
        for c in FlagCode::ALL {
            assert!(seen.insert(c.code()), "{c}");
            assert!(c
                .code()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        }
    }
}

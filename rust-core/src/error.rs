//! Errors of the format core.

/// Why a safetensors header or file is invalid.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("header too small: a file needs at least 8 bytes, this one has {len}")]
    HeaderTooSmall { len: u64 },
}

//! Bulk conversions from Spark's value types to every writable dtype (owned by the conversion work).

/// A value that cannot be represented in the requested dtype.
#[derive(Debug, thiserror::Error)]
#[error("conversion not implemented yet")]
pub struct ConvertError;

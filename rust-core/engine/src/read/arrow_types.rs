//! The Arrow types that the row builders ([`super::rows`]) and the forensic columns
//! ([`super::forensic_columns`]) both use. A leaf module: it imports neither, so neither imports the
//! other for them.

use arrow_array::builder::{MapBuilder, MapFieldNames, StringBuilder};
use arrow_schema::{DataType, Field, Fields};
use std::sync::Arc;

/// Largest offset an Arrow `List`/`Binary`/`Utf8` array (and Spark's reader of it, which reads
/// 32-bit offsets) can hold.
pub(crate) const MAX_OFFSET: u64 = i32::MAX as u64;

/// The `metadata` column's type: `Map<Utf8, Utf8>` (entries `entries`, `key`, `value`; values
/// non-null). `model_info.sources` has the same type.
pub fn metadata_type() -> DataType {
    let entries = Field::new(
        "entries",
        DataType::Struct(Fields::from(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("value", DataType::Utf8, false),
        ])),
        false,
    );
    DataType::Map(Arc::new(entries), false)
}

/// A builder of [`metadata_type`] arrays.
pub(crate) fn string_map_builder() -> MapBuilder<StringBuilder, StringBuilder> {
    let names = MapFieldNames {
        entry: "entries".into(),
        key: "key".into(),
        value: "value".into(),
    };
    MapBuilder::new(Some(names), StringBuilder::new(), StringBuilder::new())
        .with_keys_field(Field::new("key", DataType::Utf8, false))
        .with_values_field(Field::new("value", DataType::Utf8, false))
}

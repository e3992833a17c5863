//! Spark's JSON forms of Arrow fields and types, and header text checks.

use super::*;
pub(super) fn spark_field_json(f: &Field) -> serde_json::Value {
    json!({
        "name": f.name(),
        "type": spark_type_json(f.data_type()),
        "nullable": f.is_nullable(),
        "metadata": {},
    })
}

/// Spark's JSON form of the type Spark gives an Arrow array of type `t` (as `ArrowUtils`
/// maps it): Boolean → `"boolean"`, Int8 → `"byte"`, Int16 → `"short"`, Int32 →
/// `"integer"`, Int64 → `"long"`, Float32 → `"float"`, Float64 → `"double"`, Utf8 →
/// `"string"`, Binary → `"binary"`, List → `{"type":"array","elementType":…,"containsNull":…}`,
/// Struct → `{"type":"struct","fields":[{"name","type","nullable","metadata":{}}]}`, Map →
/// `{"type":"map","keyType":…,"valueType":…,"valueContainsNull":…}`. Other Arrow types (never
/// produced by the read path) give `"null"`.
pub fn spark_type_json(t: &DataType) -> serde_json::Value {
    match t {
        DataType::Boolean => json!("boolean"),
        DataType::Int8 => json!("byte"),
        DataType::Int16 => json!("short"),
        DataType::Int32 => json!("integer"),
        DataType::Int64 => json!("long"),
        DataType::Float32 => json!("float"),
        DataType::Float64 => json!("double"),
        DataType::Utf8 => json!("string"),
        DataType::Binary => json!("binary"),
        DataType::List(f) => json!({
            "type": "array",
            "elementType": spark_type_json(f.data_type()),
            "containsNull": f.is_nullable(),
        }),
        DataType::Struct(fields) => json!({
            "type": "struct",
            "fields": fields.iter().map(|f| spark_field_json(f)).collect::<Vec<_>>(),
        }),
        DataType::Map(entries, _) => {
            let (key, value) = match entries.data_type() {
                DataType::Struct(kv) if kv.len() == 2 => {
                    (spark_type_json(kv[0].data_type()), Some(&kv[1]))
                }
                _ => (json!("null"), None),
            };
            json!({
                "type": "map",
                "keyType": key,
                "valueType": value.map_or(json!("null"), |v| spark_type_json(v.data_type())),
                "valueContainsNull": value.is_none_or(|v| v.is_nullable()),
            })
        }
        _ => json!("null"),
    }
}

/// Validates a file's first `8 + N` bytes (prefix and header JSON) against its length and
/// returns the header JSON text (what [`FileInput::header`] carries): all N bytes, trailing
/// padding included, so that its length is the file's N. Errors name `file`.
pub fn validated_header_text(
    file: &str,
    prefix_and_header: &[u8],
    file_len: u64,
) -> Result<String, ReadError> {
    let fmt = |e| ReadErrorKind::Format(e).in_file(file);
    let n = header::check_prefix(prefix_and_header, file_len).map_err(fmt)?;
    let end = PREFIX_LEN + n; // n ≤ 100 MB: no overflow
    let json = prefix_and_header
        .get(PREFIX_LEN as usize..end as usize)
        .ok_or_else(|| {
            ReadErrorKind::Invalid(format!(
                "{} bytes given, but the prefix and header are {end} bytes",
                prefix_and_header.len()
            ))
            .in_file(file)
        })?;
    header::parse_header(json, file_len).map_err(fmt)?;
    String::from_utf8(json.to_vec())
        .map_err(|e| ReadErrorKind::Invalid(format!("header is not UTF-8: {e}")).in_file(file))
}

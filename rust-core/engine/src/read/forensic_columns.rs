//! The forensic report's columns in the `tensor` and `file` layouts: `flags` and `model_info`.
//!
//! Both come from the validated header alone (no data byte): the flags are
//! [`forensics::header_flags`], the model information [`forensics::metadata::model_info`] of
//! `__metadata__` (the default, every field empty, when the file has none), exactly what
//! `safetensors-spark report` puts in its JSON. Nothing here judges a file: the rules are the
//! forensics module's.
//!
//! Spark's nested-column pruning may ask for some fields of either struct; the columns are
//! built whole and then cut to the fields asked for (in the order asked).

use super::arrow_types::{metadata_type, string_map_builder};
use super::error::ReadErrorKind;
use arrow_array::builder::{Int64Builder, ListBuilder, StringBuilder, StructBuilder};
use arrow_array::{Array, ArrayRef, ListArray, StructArray};
use arrow_schema::{DataType, Field, FieldRef, Fields};
use safetensors_spark_format::forensics::flags::Flag;
use safetensors_spark_format::forensics::metadata::{model_info, ModelInfo};
use safetensors_spark_format::forensics::{self};
use safetensors_spark_format::header::Header;
use std::sync::Arc;

/// The `flags` struct's fields, in the report's order.
pub const FLAG_FIELDS: [&str; 4] = ["code", "level", "tensor", "message"];

/// The `model_info` struct's fields, in the report's order (`spec/forensics.md` §4).
pub const MODEL_INFO_FIELDS: [&str; 26] = [
    "name",
    "description",
    "trigger_words",
    "usage_hint",
    "base_model",
    "architecture",
    "civitai_model_id",
    "civitai_version_id",
    "author",
    "license",
    "training_tool",
    "resolution",
    "date",
    "tags",
    "format",
    "producer",
    "quantization",
    "network_module",
    "network_dim",
    "network_alpha",
    "training_steps",
    "training_epochs",
    "training_images",
    "tag_frequency",
    "distinct_tags",
    "sources",
];

/// Every field of a struct column, as owned names (what a column not pruned carries).
pub fn all_fields(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// Checks the fields Spark asks of the struct column `column` (whose fields are `all`).
pub fn check_fields(column: &str, wanted: &[String], all: &[&str]) -> Result<(), String> {
    match wanted.iter().find(|w| !all.contains(&w.as_str())) {
        Some(w) => Err(format!("no field `{w}` in `{column}` ({})", all.join(", "))),
        None => Ok(()),
    }
}

fn element(data_type: DataType) -> FieldRef {
    Arc::new(Field::new("element", data_type, false))
}

fn flag_struct_fields() -> Fields {
    Fields::from(vec![
        Field::new("code", DataType::Utf8, false),
        Field::new("level", DataType::Utf8, false),
        Field::new("tensor", DataType::Utf8, true),
        Field::new("message", DataType::Utf8, false),
    ])
}

fn strings_type() -> DataType {
    DataType::List(element(DataType::Utf8))
}

fn tag_count_fields() -> Fields {
    Fields::from(vec![
        Field::new("tag", DataType::Utf8, false),
        Field::new("count", DataType::Int64, false),
    ])
}

/// `model_info.sources`: key → source key, the same map type as the `metadata` column.
fn sources_type() -> DataType {
    metadata_type()
}

fn model_info_struct_fields() -> Fields {
    let text = |n: &str| Field::new(n, DataType::Utf8, true);
    let number = |n: &str| Field::new(n, DataType::Int64, true);
    Fields::from(
        MODEL_INFO_FIELDS
            .iter()
            .map(|&n| match n {
                "trigger_words" | "tags" => Field::new(n, strings_type(), false),
                "civitai_model_id" | "civitai_version_id" | "training_steps"
                | "training_epochs" | "training_images" => number(n),
                "distinct_tags" => Field::new(n, DataType::Int64, false),
                "tag_frequency" => Field::new(
                    n,
                    DataType::List(element(DataType::Struct(tag_count_fields()))),
                    false,
                ),
                "sources" => Field::new(n, sources_type(), false),
                _ => text(n),
            })
            .collect::<Vec<_>>(),
    )
}

fn pick(all: &Fields, wanted: &[String]) -> Fields {
    Fields::from(
        wanted
            .iter()
            .filter_map(|w| all.iter().find(|f| f.name() == w).cloned())
            .collect::<Vec<_>>(),
    )
}

/// `flags`: `List<Struct<code, level, tensor (nullable), message>>` cut to `fields`; neither the
/// list nor its elements are null.
pub fn flags_type(fields: &[String]) -> DataType {
    DataType::List(element(DataType::Struct(pick(
        &flag_struct_fields(),
        fields,
    ))))
}

/// `model_info`: a non-null struct of the report's `model_info` fields cut to `fields`: text
/// fields Utf8 (null when absent), ids and counts Int64, `trigger_words`/`tags` `List<Utf8>`,
/// `tag_frequency` `List<Struct<tag, count>>`, `sources` `Map<Utf8, Utf8>`.
pub fn model_info_type(fields: &[String]) -> DataType {
    DataType::Struct(pick(&model_info_struct_fields(), fields))
}

/// The flags of a validated header ([`forensics::header_flags`]).
pub fn flags_of(header: &Header) -> Vec<Flag> {
    forensics::header_flags(header)
}

/// The model information of a header's `__metadata__` (the default when it has none), as the
/// report gives it.
pub fn model_info_of(header: &Header) -> ModelInfo {
    header.metadata.as_ref().map(model_info).unwrap_or_default()
}

/// Bytes of text a row of `flags` and `model_info` holds for `header` (batch sizing).
pub fn text_size(flags: &[Flag], info: &ModelInfo) -> u64 {
    let f: usize = flags
        .iter()
        .map(|f| {
            f.code.code().len()
                + f.level.name().len()
                + f.tensor.as_ref().map_or(0, String::len)
                + f.message.len()
                + 1
        })
        .sum();
    // The model information is small (named fields, at most 50 tags): its JSON length bounds
    // its text.
    let m = serde_json::to_string(info).map_or(0, |s| s.len());
    (f + m) as u64
}

fn cut(s: &StructArray, all: &Fields, wanted: &[String]) -> Result<StructArray, ReadErrorKind> {
    let fields = pick(all, wanted);
    let columns: Vec<ArrayRef> = fields
        .iter()
        .filter_map(|f| all.iter().position(|a| a.name() == f.name()))
        .map(|i| s.column(i).clone())
        .collect();
    if fields.is_empty() {
        return Ok(StructArray::new_empty_fields(s.len(), s.nulls().cloned()));
    }
    Ok(StructArray::try_new(fields, columns, s.nulls().cloned())?)
}

/// The `flags` column: one row per entry of `rows` (the flags of that row's file), cut to
/// `fields`.
pub fn flags_column(rows: &[&[Flag]], fields: &[String]) -> Result<ArrayRef, ReadErrorKind> {
    let all = flag_struct_fields();
    let mut b = ListBuilder::new(StructBuilder::from_fields(all.clone(), 0))
        .with_field(element(DataType::Struct(all.clone())));
    let mut bytes = 0u64;
    for flags in rows {
        for f in *flags {
            let s = b.values();
            s.field_builder::<StringBuilder>(0)
                .ok_or(ReadErrorKind::Invalid("flags: code builder".into()))?
                .append_value(f.code.code());
            s.field_builder::<StringBuilder>(1)
                .ok_or(ReadErrorKind::Invalid("flags: level builder".into()))?
                .append_value(f.level.name());
            s.field_builder::<StringBuilder>(2)
                .ok_or(ReadErrorKind::Invalid("flags: tensor builder".into()))?
                .append_option(f.tensor.as_deref());
            s.field_builder::<StringBuilder>(3)
                .ok_or(ReadErrorKind::Invalid("flags: message builder".into()))?
                .append_value(&f.message);
            s.append(true);
            bytes += (f.message.len() + f.tensor.as_ref().map_or(0, String::len)) as u64;
            if bytes > i32::MAX as u64 {
                return Err(ReadErrorKind::TooLarge {
                    what: "flag message bytes",
                    count: bytes,
                    limit: i32::MAX as u64,
                });
            }
        }
        b.append(true);
    }
    let list = b.finish();
    let values = list
        .values()
        .as_any()
        .downcast_ref::<StructArray>()
        .ok_or(ReadErrorKind::Invalid("flags: not a struct array".into()))?;
    let values = cut(values, &all, fields)?;
    let field = element(values.data_type().clone());
    Ok(Arc::new(ListArray::try_new(
        field,
        list.offsets().clone(),
        Arc::new(values),
        None,
    )?))
}

fn text_column<'a>(values: impl Iterator<Item = Option<&'a str>>) -> ArrayRef {
    let mut b = StringBuilder::new();
    for v in values {
        b.append_option(v);
    }
    Arc::new(b.finish())
}

fn number_column(values: impl Iterator<Item = Option<u64>>) -> ArrayRef {
    let mut b = Int64Builder::new();
    for v in values {
        // Ids and counts above i64::MAX cannot come from real files; they saturate.
        b.append_option(v.map(|n| i64::try_from(n).unwrap_or(i64::MAX)));
    }
    Arc::new(b.finish())
}

fn strings_column<'a>(values: impl Iterator<Item = &'a [String]>) -> ArrayRef {
    let mut b = ListBuilder::new(StringBuilder::new()).with_field(element(DataType::Utf8));
    for v in values {
        for s in v {
            b.values().append_value(s);
        }
        b.append(true);
    }
    Arc::new(b.finish())
}

/// The `model_info` column: one row per entry of `rows`, cut to `fields`.
pub fn model_info_column(
    rows: &[&ModelInfo],
    fields: &[String],
) -> Result<ArrayRef, ReadErrorKind> {
    let all = model_info_struct_fields();
    let text = |get: fn(&ModelInfo) -> Option<&str>| text_column(rows.iter().map(|m| get(m)));
    let number = |get: fn(&ModelInfo) -> Option<u64>| number_column(rows.iter().map(|m| get(m)));
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(all.len());
    for name in MODEL_INFO_FIELDS {
        columns.push(match name {
            "name" => text(|m| m.name.as_deref()),
            "description" => text(|m| m.description.as_deref()),
            "trigger_words" => strings_column(rows.iter().map(|m| m.trigger_words.as_slice())),
            "usage_hint" => text(|m| m.usage_hint.as_deref()),
            "base_model" => text(|m| m.base_model.as_deref()),
            "architecture" => text(|m| m.architecture.as_deref()),
            "civitai_model_id" => number(|m| m.civitai_model_id),
            "civitai_version_id" => number(|m| m.civitai_version_id),
            "author" => text(|m| m.author.as_deref()),
            "license" => text(|m| m.license.as_deref()),
            "training_tool" => text(|m| m.training_tool.as_deref()),
            "resolution" => text(|m| m.resolution.as_deref()),
            "date" => text(|m| m.date.as_deref()),
            "tags" => strings_column(rows.iter().map(|m| m.tags.as_slice())),
            "format" => text(|m| m.format.as_deref()),
            "producer" => text(|m| m.producer.as_deref()),
            "quantization" => text(|m| m.quantization.as_deref()),
            "network_module" => text(|m| m.network_module.as_deref()),
            "network_dim" => text(|m| m.network_dim.as_deref()),
            "network_alpha" => text(|m| m.network_alpha.as_deref()),
            "training_steps" => number(|m| m.training_steps),
            "training_epochs" => number(|m| m.training_epochs),
            "training_images" => number(|m| m.training_images),
            "tag_frequency" => {
                let tc = tag_count_fields();
                let mut b = ListBuilder::new(StructBuilder::from_fields(tc.clone(), 0))
                    .with_field(element(DataType::Struct(tc)));
                for m in rows {
                    for t in &m.tag_frequency {
                        let s = b.values();
                        s.field_builder::<StringBuilder>(0)
                            .ok_or(ReadErrorKind::Invalid("model_info: tag builder".into()))?
                            .append_value(&t.tag);
                        s.field_builder::<Int64Builder>(1)
                            .ok_or(ReadErrorKind::Invalid("model_info: count builder".into()))?
                            .append_value(i64::try_from(t.count).unwrap_or(i64::MAX));
                        s.append(true);
                    }
                    b.append(true);
                }
                Arc::new(b.finish())
            }
            "distinct_tags" => number_column(rows.iter().map(|m| Some(m.distinct_tags))),
            _ => {
                let mut b = string_map_builder();
                for m in rows {
                    for (k, v) in &m.sources {
                        b.keys().append_value(k);
                        b.values().append_value(v);
                    }
                    b.append(true)?;
                }
                Arc::new(b.finish())
            }
        });
    }
    let whole = StructArray::try_new(all.clone(), columns, None)?;
    Ok(Arc::new(cut(&whole, &all, fields)?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::read::TensorSource;
    use crate::read::{file_columns, tensor_columns, FileBytes, FileColumn, TensorColumn};
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use safetensors_spark_format::forensics::report_bytes;

    fn framed(header: &str, data: usize) -> Vec<u8> {
        // Padded to 8 bytes, so that data starts aligned (else a `misaligned_tensor` info).
        let mut header = header.to_owned();
        while !header.len().is_multiple_of(8) {
            header.push(' ');
        }
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.resize(out.len() + data, 7);
        out
    }

    /// A file with two warnings (integer weights, an unusual name) and kohya metadata.
    fn warned() -> Vec<u8> {
        framed(
            r#"{"__metadata__":{"ss_output_name":"ink","ss_steps":"12","ss_tag_frequency":"{\"1_a\": {\"cat\": 3, \"dog\": 5}}"},"q.weight":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"odd name":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
            8,
        )
    }

    #[test]
    fn columns_hold_what_the_report_says() {
        let bytes = warned();
        let report = report_bytes("mem://w", &bytes);
        assert_eq!(report.flags.len(), 2, "{:?}", report.flags);
        let src = FileBytes::parse("mem://w", &bytes).unwrap();
        let all_flags = all_fields(&FLAG_FIELDS);
        let all_info = all_fields(&MODEL_INFO_FIELDS);
        let arrays = file_columns(
            &[&src],
            &[
                FileColumn::Flags(&all_flags),
                FileColumn::ModelInfo(&all_info),
            ],
        )
        .unwrap();
        let flags = arrays[0].as_list::<i32>();
        let values = flags.value(0);
        let values = values.as_struct();
        let codes: Vec<&str> = values
            .column(0)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect();
        let want: Vec<&str> = report.flags.iter().map(|f| f.code.code()).collect();
        assert_eq!(codes, want);
        let messages: Vec<&str> = values
            .column(3)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect();
        let want: Vec<&str> = report.flags.iter().map(|f| f.message.as_str()).collect();
        assert_eq!(messages, want);
        let tensors: Vec<Option<&str>> = values.column(2).as_string::<i32>().iter().collect();
        let want: Vec<Option<&str>> = report.flags.iter().map(|f| f.tensor.as_deref()).collect();
        assert_eq!(tensors, want);

        let info = arrays[1].as_struct();
        let name = info.column_by_name("name").unwrap().as_string::<i32>();
        assert_eq!(Some(name.value(0)), report.model_info.name.as_deref());
        let steps = info.column_by_name("training_steps").unwrap();
        assert_eq!(
            steps.as_primitive::<Int64Type>().value(0) as u64,
            report.model_info.training_steps.unwrap()
        );
        let tags = info
            .column_by_name("tag_frequency")
            .unwrap()
            .as_list::<i32>();
        let first = tags.value(0);
        let tag_names: Vec<&str> = first
            .as_struct()
            .column(0)
            .as_string::<i32>()
            .iter()
            .flatten()
            .collect();
        let want: Vec<&str> = report
            .model_info
            .tag_frequency
            .iter()
            .map(|t| t.tag.as_str())
            .collect();
        assert_eq!(tag_names, want);
        assert_eq!(tag_names, ["dog", "cat"]);

        // Per tensor: the file's lists on every row.
        let rows: Vec<(
            &dyn TensorSource,
            &safetensors_spark_format::header::TensorInfo,
        )> = src
            .header()
            .tensors
            .iter()
            .map(|t| (&src as &dyn TensorSource, t))
            .collect();
        let arrays = tensor_columns(&rows, &[TensorColumn::Flags(vec!["code".into()])]).unwrap();
        let list = arrays[0].as_list::<i32>();
        assert_eq!(list.len(), 2);
        for i in 0..2 {
            assert_eq!(list.value(i).as_struct().num_columns(), 1);
            assert_eq!(list.value(i).len(), 2);
        }
    }

    #[test]
    fn pruned_fields_in_the_order_asked() {
        let wanted = vec!["training_steps".to_owned(), "name".to_owned()];
        let DataType::Struct(fields) = model_info_type(&wanted) else {
            panic!("not a struct")
        };
        let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["training_steps", "name"]);
        let info = ModelInfo::default();
        let array = model_info_column(&[&info], &wanted).unwrap();
        assert_eq!(array.data_type(), &model_info_type(&wanted));
        assert!(
            check_fields("model_info", &["nope".to_owned()], &MODEL_INFO_FIELDS)
                .unwrap_err()
                .contains("no field `nope`")
        );
    }

    #[test]
    fn clean_file_has_no_flags_and_empty_model_info() {
        let bytes = framed(
            r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            8,
        );
        assert!(report_bytes("mem://c", &bytes).flags.is_empty());
        let src = FileBytes::parse("mem://c", &bytes).unwrap();
        assert!(flags_of(src.header()).is_empty());
        assert_eq!(model_info_of(src.header()), ModelInfo::default());
        let all = all_fields(&FLAG_FIELDS);
        let arrays = file_columns(&[&src], &[FileColumn::Flags(&all)]).unwrap();
        assert_eq!(arrays[0].as_list::<i32>().value(0).len(), 0);
        assert_eq!(arrays[0].null_count(), 0);
    }
}

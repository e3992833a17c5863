//! Plan-time validation (driver side, before anything on disk changes): the DataFrame schema
//! (Spark's own `StructType.json`) and the user's options become a [`WritePlan`], or a
//! [`PlanError`] that names the option or column and lists what is allowed.
//!
//! Rules: spec/options.md (options) and spec/dataset.md (layouts).

use super::{
    ColumnPlan, DuplicatesStrategy, InputKind, RaggedElement, RaggedPlan, SparkNumeric,
    TailStrategy, WriteMode, WritePlan,
};
use safetensors_spark_dataset::manifest::{ragged_offsets_name, ManifestExt};
use safetensors_spark_dataset::{DatasetMode, Manifest};
use safetensors_spark_format::header::MAX_HEADER_SIZE;
use safetensors_spark_format::json_object::{first_duplicate_key, Entries};
use safetensors_spark_format::Dtype;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;

/// Every user option of the writer, as spelled in the docs (keys are matched case-insensitively).
pub const WRITE_OPTIONS: [&str; 15] = [
    "batch_size",
    "columns",
    "commit_message",
    "dtype",
    "dtypes",
    "duplicatesStrategy",
    "generate_index",
    "kv_separator",
    "metadata",
    "name_col",
    "ragged",
    "retention",
    "shapes",
    "tail_strategy",
    "target_shard_size_mb",
];

/// Keys Spark itself passes with the options; allowed and ignored.
pub const SPARK_SUPPLIED_OPTIONS: [&str; 2] = ["path", "paths"];

/// Options that only apply in batch mode.
pub const BATCH_ONLY_OPTIONS: [&str; 2] = ["ragged", "tail_strategy"];
/// Options that only apply in KV mode.
pub const KV_ONLY_OPTIONS: [&str; 3] =
    ["kv_separator", "target_shard_size_mb", "duplicatesStrategy"];

pub const DEFAULT_KV_SEPARATOR: &str = "__";
pub const DEFAULT_TARGET_SHARD_SIZE_MB: u64 = 300;
/// Allowed values of `target_shard_size_mb` (MiB): 1 MiB to 64 GiB.
pub const TARGET_SHARD_SIZE_MB_RANGE: RangeInclusive<u64> = 1..=65536;
/// Metadata keys starting with this prefix are written by the engine, never by the user.
pub const RESERVED_METADATA_PREFIX: &str = "safetensors_spark.";

/// The classes Spark uses for ML vectors (`pyspark.ml.linalg.VectorUDT` and the old mllib one).
pub const VECTOR_UDT_CLASSES: [&str; 4] = [
    "org.apache.spark.ml.linalg.VectorUDT",
    "org.apache.spark.mllib.linalg.VectorUDT",
    "pyspark.ml.linalg.VectorUDT",
    "pyspark.mllib.linalg.VectorUDT",
];

const SUPPORTED_TYPES: &str = "numeric arrays (of boolean, byte, short, integer, long, float or \
double, nested to any depth), numeric scalars, binary, string (batch mode), the Tensor Struct \
(data binary, shape array<integer|long>, dtype string) and ML vectors";

/// Why a write cannot be planned. Every message names the option or column and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("unknown option '{key}'; valid options: {valid}")]
    UnknownOption { key: String, valid: String },

    #[error("option {option} is given twice ('{first}' and '{second}'; option keys are case-insensitive)")]
    RepeatedOption {
        option: &'static str,
        first: String,
        second: String,
    },

    #[error("options batch_size and name_col are mutually exclusive: give batch_size for batch mode or name_col for KV mode, not both")]
    BothModes,

    #[error("one of the options batch_size (batch mode) or name_col (KV mode) is required")]
    NoMode,

    #[error("option {option} does not apply to {mode} mode; it applies only to {applies_to} mode")]
    InapplicableOption {
        option: &'static str,
        mode: &'static str,
        applies_to: &'static str,
    },

    #[error("option {option}: '{value}' is not one of {allowed}")]
    InvalidChoice {
        option: String,
        value: String,
        allowed: String,
    },

    #[error("option {option}: '{value}' is not {expected}")]
    InvalidValue {
        option: String,
        value: String,
        expected: String,
    },

    #[error("invalid DataFrame schema JSON: {message}")]
    InvalidSchema { message: String },

    #[error("option {option}: column '{name}' does not exist; columns: {available}")]
    UnknownColumn {
        option: &'static str,
        name: String,
        available: String,
    },

    #[error("option {option}: column '{name}' is ambiguous, it matches {matches}{hint}")]
    AmbiguousColumn {
        option: &'static str,
        name: String,
        matches: String,
        hint: &'static str,
    },

    #[error("option {option}: column '{name}' is listed twice")]
    DuplicateColumn { option: &'static str, name: String },

    #[error(
        "option columns: '{name}' is the name_col key column, which is never written as a tensor"
    )]
    NameColInColumns { name: String },

    #[error("the schema has two columns named '{name}'; written columns must have distinct names")]
    DuplicateSchemaColumn { name: String },

    #[error("columns '{a}' and '{b}' cannot both be written with kv_separator '{separator}': a tensor named <key>{separator}{b} could also be key <…> with column '{a}', so names would not split into key and column one way; rename one, choose another kv_separator, or leave one out with the columns option")]
    AmbiguousKvColumns {
        a: String,
        b: String,
        separator: String,
    },

    #[error("column '{name}' cannot be written in batch mode: {reason}; rename it (e.g. df.withColumnRenamed) or leave it out with the columns option")]
    ReservedColumnName { name: String, reason: &'static str },

    #[error("no columns to write: {reason}")]
    NoColumns { reason: &'static str },

    #[error("column '{name}' has type {spark_type}; writable columns are {SUPPORTED_TYPES}")]
    UnsupportedType { name: String, spark_type: String },

    #[error("column '{name}' has type {spark_type}, which is not a Tensor Struct: {problem}; a Tensor Struct has exactly the fields data (binary), shape (array of integer or long) and dtype (string), in any order")]
    BadTensorStruct {
        name: String,
        spark_type: String,
        problem: String,
    },

    #[error("name_col '{name}' has type {spark_type}; the key column must be a string column")]
    NameColNotString { name: String, spark_type: String },

    #[error("binary column '{name}' needs {missing}: raw bytes carry no dtype or shape, so set the dtype (or dtypes) option and a shapes entry for it")]
    BinaryNeeds { name: String, missing: &'static str },

    #[error("option {option}: column '{name}' is not written (written columns: {written})")]
    ColumnNotWritten {
        option: &'static str,
        name: String,
        written: String,
    },

    #[error("option shapes: column '{name}' is a scalar column (one element per row), so its shape must have exactly 1 element; {shape:?} has {elements}")]
    ScalarShape {
        name: String,
        shape: Vec<u64>,
        elements: String,
    },

    #[error("option metadata is {bytes} bytes as compact JSON; at most {MAX_METADATA_OPTION_BYTES} bytes are allowed (it is written into every shard's header, which the format caps at {MAX_HEADER_SIZE} bytes together with the tensor entries)")]
    MetadataTooLarge { bytes: usize },

    #[error("option metadata: key '{key}' starts with the reserved prefix '{RESERVED_METADATA_PREFIX}' (those keys are written by the engine)")]
    ReservedMetadataKey { key: String },

    #[error("option ragged: column '{name}' has type {spark_type}; ragged columns are arrays of numbers (array<…>), binary and string columns")]
    RaggedType { name: String, spark_type: String },

    #[error("option shapes: column '{name}' {why}, so a shapes entry cannot fix its rows' shape; leave the entry out{hint}")]
    RaggedShapes {
        name: String,
        why: &'static str,
        hint: &'static str,
    },

    #[error("option dtypes: column '{name}' is a ragged {kind} column, whose rows are stored as their bytes (dtype U8); {dtype} is not allowed{hint}")]
    RaggedDtype {
        name: String,
        kind: &'static str,
        dtype: Dtype,
        hint: &'static str,
    },

    #[error("ragged column '{ragged}' stores its row boundaries as tensor '{offsets}', which is also the name of written column '{other}'; rename one (e.g. df.withColumnRenamed) or leave one out with the columns option")]
    RaggedOffsetsCollision {
        ragged: String,
        offsets: String,
        other: String,
    },

    #[error("column '{name}' has type string; string columns are written in batch mode only (ragged, as their UTF-8 bytes); in KV mode the only string column is the name_col key")]
    StringInKvMode { name: String },

    #[error("cannot append to the existing dataset: {problem}")]
    AppendMismatch { problem: String },

    #[error("cannot append to the existing dataset: option {option} is {given}, the dataset has {dataset} (an append takes the dataset's {option} when the option is left out)")]
    AppendConflict {
        option: String,
        given: String,
        dataset: String,
    },

    #[error("cannot append to the existing dataset: it is in KV mode and its manifest does not record the key column; the key column is the DataFrame's one string column that is not one of the dataset's columns ({stored}), but {found}: give option name_col")]
    AppendKeyColumn { stored: String, found: String },
}

/// The most bytes the `metadata` option may take as compact JSON (spec/options.md): it goes into
/// every shard's header (at most `MAX_HEADER_SIZE` bytes with the tensor entries), and the
/// JVM's JSON parser takes strings of at most 20,000,000 characters.
pub const MAX_METADATA_OPTION_BYTES: usize = 16 << 20;

fn invalid_value(option: &str, value: &str, expected: impl Into<String>) -> PlanError {
    PlanError::InvalidValue {
        option: option.to_string(),
        value: value.to_string(),
        expected: expected.into(),
    }
}

fn invalid_choice(option: &str, value: &str, allowed: &[&str]) -> PlanError {
    PlanError::InvalidChoice {
        option: option.to_string(),
        value: value.to_string(),
        allowed: allowed.join(", "),
    }
}

/// The options, keyed by canonical name (as in [`WRITE_OPTIONS`]).
struct Options {
    values: BTreeMap<&'static str, String>,
}

impl Options {
    fn parse(raw: &BTreeMap<String, String>) -> Result<Self, PlanError> {
        let mut values = BTreeMap::new();
        let mut given_as: BTreeMap<&'static str, &str> = BTreeMap::new();
        for (key, value) in raw {
            if SPARK_SUPPLIED_OPTIONS
                .iter()
                .any(|s| s.eq_ignore_ascii_case(key))
            {
                continue;
            }
            let Some(canonical) = WRITE_OPTIONS
                .iter()
                .copied()
                .find(|o| o.eq_ignore_ascii_case(key))
            else {
                return Err(PlanError::UnknownOption {
                    key: key.clone(),
                    valid: WRITE_OPTIONS.join(", "),
                });
            };
            if let Some(first) = given_as.insert(canonical, key) {
                return Err(PlanError::RepeatedOption {
                    option: canonical,
                    first: first.to_string(),
                    second: key.clone(),
                });
            }
            values.insert(canonical, value.clone());
        }
        Ok(Options { values })
    }

    fn get(&self, option: &'static str) -> Option<&str> {
        self.values.get(option).map(String::as_str)
    }

    fn has(&self, option: &'static str) -> bool {
        self.values.contains_key(option)
    }
}

fn parse_choice<T: Copy>(
    option: &'static str,
    value: &str,
    choices: &[(&'static str, T)],
) -> Result<T, PlanError> {
    let v = value.trim();
    choices
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(v))
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            invalid_choice(option, value, &names)
        })
}

fn parse_u64_in(
    option: &'static str,
    value: &str,
    range: RangeInclusive<u64>,
) -> Result<u64, PlanError> {
    let expected = || {
        if *range.end() == u64::MAX {
            format!("an integer ≥ {}", range.start())
        } else {
            format!("an integer from {} to {}", range.start(), range.end())
        }
    };
    let n: u64 = value
        .trim()
        .parse()
        .map_err(|_| invalid_value(option, value, expected()))?;
    if range.contains(&n) {
        Ok(n)
    } else {
        Err(invalid_value(option, value, expected()))
    }
}

/// Parses a dtype name case-insensitively (`bf16` = `BF16`); only writable dtypes are accepted.
pub fn parse_writable_dtype(option: &str, value: &str) -> Result<Dtype, PlanError> {
    Dtype::from_name(&value.trim().to_ascii_uppercase())
        .filter(|d| d.is_writable())
        .ok_or_else(|| invalid_choice(option, value, &Dtype::writable_names()))
}

/// Parses an option holding a JSON object; duplicate keys are an error.
fn parse_json_object(
    option: &'static str,
    value: &str,
    expected: &str,
) -> Result<Vec<(String, Value)>, PlanError> {
    let entries: Entries<Value> = serde_json::from_str(value)
        .map_err(|e| invalid_value(option, value, format!("{expected} ({e})")))?;
    if let Some(k) = first_duplicate_key(&entries.0) {
        return Err(invalid_value(
            option,
            value,
            format!("{expected} (key '{k}' appears twice)"),
        ));
    }
    Ok(entries.0)
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Spark's rendering of a type from its schema JSON, for messages (`array<float>`,
/// `struct<a:integer>`, `decimal(10,2)`, the UDT class…).
pub fn spark_type_string(t: &Value) -> String {
    match t {
        Value::String(s) => s.clone(),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("array") => format!(
                "array<{}>",
                o.get("elementType")
                    .map(spark_type_string)
                    .unwrap_or_default()
            ),
            Some("map") => format!(
                "map<{},{}>",
                o.get("keyType").map(spark_type_string).unwrap_or_default(),
                o.get("valueType")
                    .map(spark_type_string)
                    .unwrap_or_default()
            ),
            Some("struct") => {
                let fields: Vec<String> = o
                    .get("fields")
                    .and_then(Value::as_array)
                    .map(|fs| {
                        fs.iter()
                            .map(|f| {
                                format!(
                                    "{}:{}",
                                    f.get("name").and_then(Value::as_str).unwrap_or_default(),
                                    f.get("type").map(spark_type_string).unwrap_or_default()
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                format!("struct<{}>", fields.join(","))
            }
            Some("udt") => {
                let class = o
                    .get("class")
                    .or_else(|| o.get("pyClass"))
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                format!("udt({class})")
            }
            Some(other) => other.to_string(),
            None => t.to_string(),
        },
        other => other.to_string(),
    }
}

fn numeric_type(name: &str) -> Option<SparkNumeric> {
    Some(match name {
        "boolean" => SparkNumeric::Boolean,
        "byte" => SparkNumeric::Byte,
        "short" => SparkNumeric::Short,
        "integer" => SparkNumeric::Int,
        "long" => SparkNumeric::Long,
        "float" => SparkNumeric::Float,
        "double" => SparkNumeric::Double,
        _ => return None,
    })
}

fn struct_fields(t: &Value) -> Option<&Vec<Value>> {
    (t.get("type")?.as_str()? == "struct")
        .then(|| t.get("fields")?.as_array())
        .flatten()
}

/// Maps one column's Spark type to how it is written, or explains why it cannot be.
pub fn classify_column(name: &str, t: &Value) -> Result<InputKind, PlanError> {
    let unsupported = || PlanError::UnsupportedType {
        name: name.to_string(),
        spark_type: spark_type_string(t),
    };
    match t {
        Value::String(s) if s == "binary" => Ok(InputKind::Binary),
        Value::String(s) if s == "string" => Ok(InputKind::String),
        Value::String(s) => numeric_type(s)
            .map(|element| InputKind::Scalar { element })
            .ok_or_else(unsupported),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("array") => {
                let mut depth = 0u32;
                let mut cur = t;
                while cur.get("type").and_then(Value::as_str) == Some("array") {
                    depth += 1;
                    cur = cur.get("elementType").ok_or_else(unsupported)?;
                }
                cur.as_str()
                    .and_then(numeric_type)
                    .map(|element| InputKind::NumericArray { element, depth })
                    .ok_or_else(unsupported)
            }
            Some("struct") => classify_struct(name, t),
            Some("udt") => {
                let is_vector = ["class", "pyClass"].iter().any(|k| {
                    o.get(*k)
                        .and_then(Value::as_str)
                        .is_some_and(|c| VECTOR_UDT_CLASSES.contains(&c))
                });
                if is_vector {
                    Ok(InputKind::MlVector)
                } else {
                    Err(unsupported())
                }
            }
            _ => Err(unsupported()),
        },
        _ => Err(unsupported()),
    }
}

fn classify_struct(name: &str, t: &Value) -> Result<InputKind, PlanError> {
    let fields = struct_fields(t).cloned().unwrap_or_default();
    let names: Vec<&str> = fields
        .iter()
        .map(|f| f.get("name").and_then(Value::as_str).unwrap_or_default())
        .collect();
    let tensor_fields = ["data", "shape", "dtype"];
    if !names.iter().any(|n| tensor_fields.contains(n)) {
        return Err(PlanError::UnsupportedType {
            name: name.to_string(),
            spark_type: spark_type_string(t),
        });
    }
    let bad = |problem: String| PlanError::BadTensorStruct {
        name: name.to_string(),
        spark_type: spark_type_string(t),
        problem,
    };
    for n in &names {
        if !tensor_fields.contains(n) {
            return Err(bad(format!("unexpected field '{n}'")));
        }
    }
    for want in tensor_fields {
        let matching: Vec<&Value> = fields
            .iter()
            .filter(|f| f.get("name").and_then(Value::as_str) == Some(want))
            .collect();
        let field_type = match matching.as_slice() {
            [] => return Err(bad(format!("field '{want}' is missing"))),
            [f] => f.get("type").cloned().unwrap_or(Value::Null),
            _ => return Err(bad(format!("field '{want}' appears twice"))),
        };
        let ok = match want {
            "data" => field_type.as_str() == Some("binary"),
            "dtype" => field_type.as_str() == Some("string"),
            _ => {
                field_type.get("type").and_then(Value::as_str) == Some("array")
                    && matches!(
                        field_type.get("elementType").and_then(Value::as_str),
                        Some("integer" | "long")
                    )
            }
        };
        if !ok {
            let wanted = match want {
                "data" => "binary",
                "dtype" => "string",
                _ => "array<integer> or array<long>",
            };
            return Err(bad(format!(
                "field '{want}' has type {}, not {wanted}",
                spark_type_string(&field_type)
            )));
        }
    }
    Ok(InputKind::TensorStruct)
}

/// The top-level fields of a schema: (name, type) in order.
fn parse_schema(json: &str) -> Result<Vec<(String, Value)>, PlanError> {
    let err = |message: String| PlanError::InvalidSchema { message };
    let root: Value = serde_json::from_str(json).map_err(|e| err(e.to_string()))?;
    let fields = struct_fields(&root)
        .ok_or_else(|| err("expected a struct type with fields".to_string()))?;
    fields
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| err(format!("field {i} has no name")))?;
            let t = f
                .get("type")
                .ok_or_else(|| err(format!("field '{name}' has no type")))?;
            Ok((name.to_string(), t.clone()))
        })
        .collect()
}

/// Column lookup as Spark resolves names (`spark.sql.caseSensitive`).
struct Resolver<'a> {
    names: Vec<&'a str>,
    case_sensitive: bool,
}

impl Resolver<'_> {
    fn resolve(&self, option: &'static str, name: &str) -> Result<usize, PlanError> {
        let matches: Vec<usize> = self
            .names
            .iter()
            .enumerate()
            .filter(|(_, n)| {
                if self.case_sensitive {
                    **n == name
                } else {
                    n.to_lowercase() == name.to_lowercase()
                }
            })
            .map(|(i, _)| i)
            .collect();
        match matches.as_slice() {
            [i] => Ok(*i),
            [] => Err(PlanError::UnknownColumn {
                option,
                name: name.to_string(),
                available: self.names.join(", "),
            }),
            many => Err(PlanError::AmbiguousColumn {
                option,
                name: name.to_string(),
                matches: many
                    .iter()
                    .map(|i| format!("'{}'", self.names[*i]))
                    .collect::<Vec<_>>()
                    .join(" and "),
                hint: if self.case_sensitive {
                    ""
                } else {
                    " (spark.sql.caseSensitive is false)"
                },
            }),
        }
    }
}

fn parse_shape(name: &str, v: &Value, raw: &str) -> Result<Vec<u64>, PlanError> {
    let expected = || {
        format!(
            "a JSON object of column → array of integers ≥ 0 (column '{name}' has {}, which is not an array of non-negative integers)",
            v
        )
    };
    let dims = v
        .as_array()
        .ok_or_else(|| invalid_value("shapes", raw, expected()))?;
    let shape: Vec<u64> = dims
        .iter()
        .map(|d| {
            d.as_u64()
                .ok_or_else(|| invalid_value("shapes", raw, expected()))
        })
        .collect::<Result<_, _>>()?;
    if shape
        .iter()
        .try_fold(1u64, |a, d| a.checked_mul(*d))
        .is_none()
    {
        return Err(invalid_value(
            "shapes",
            raw,
            format!("a shape whose element count fits in 64 bits (column '{name}')"),
        ));
    }
    Ok(shape)
}

/// Validates the DataFrame schema and the options; see the module docs.
/// KV tensor names `<key><sep><column>` split into key and column one way only when no
/// `<sep><column>` ends another `<sep><column>` (dataset.md §3): then exactly one written column
/// ends any tensor name, whatever the keys are.
fn check_kv_columns_split_one_way(
    separator: &str,
    columns: &[ColumnPlan],
) -> Result<(), PlanError> {
    for a in columns {
        for b in columns {
            if a.name != b.name
                && format!("{separator}{}", b.name).ends_with(&format!("{separator}{}", a.name))
            {
                return Err(PlanError::AmbiguousKvColumns {
                    a: a.name.clone(),
                    b: b.name.clone(),
                    separator: separator.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// Largest `batch_size`: a shard's row count is a Spark array index and a tensor dimension.
pub const MAX_BATCH_SIZE: u64 = i32::MAX as u64;

/// Names a batch-mode column cannot have: they would collide with the per-sample layout's
/// hidden columns (`_file`, `_metadata`) or with the header's metadata key. (`file` and
/// `metadata` are ordinary names: per file, a tensor of such a name takes the column's place and
/// the layout's column becomes hidden, spec/reading.md §2.3.)
const RESERVED_BATCH_COLUMNS: [(&str, &str); 3] = [
    (
        "__metadata__",
        "it is the safetensors header's metadata key",
    ),
    (
        "_file",
        "the per-sample read layout adds a column of that name (the shard's URI)",
    ),
    (
        "_metadata",
        "the per-sample read layout adds a column of that name (the shard's __metadata__)",
    ),
];

/// The `columns` (or `ragged`) option: a comma-separated list (names trimmed), or a JSON array of names for
/// names that contain commas or surrounding spaces (`["a,b", " c"]`).
fn column_list(option: &str, value: &str) -> Result<Vec<String>, PlanError> {
    let names: Vec<String> = if value.trim_start().starts_with('[') {
        serde_json::from_str(value).map_err(|e| {
            invalid_value(option, value, format!("a JSON array of column names ({e})"))
        })?
    } else {
        value.split(',').map(|p| p.trim().to_string()).collect()
    };
    if names.iter().any(String::is_empty) {
        return Err(invalid_value(
            option,
            value,
            "a comma-separated list (or a JSON array) of column names (found an empty name)",
        ));
    }
    Ok(names)
}

/// What a ragged column of this input is read back as; `None`: the input cannot be ragged.
fn ragged_element(input: &InputKind) -> Option<RaggedElement> {
    match input {
        InputKind::NumericArray { .. } => Some(RaggedElement::Array),
        InputKind::Binary => Some(RaggedElement::Binary),
        InputKind::String => Some(RaggedElement::String),
        _ => None,
    }
}

fn ragged_name(element: RaggedElement) -> &'static str {
    match element {
        RaggedElement::Array => "array",
        RaggedElement::Binary => "binary",
        RaggedElement::String => "string",
    }
}

/// Whether a batch-mode column is ragged (spec/options.md, option `ragged`): a string column
/// always; a binary column unless a `shapes` entry (or, on an append, the dataset) fixes its
/// shape; an array column when the option `ragged` names it (left out on an append: when the
/// dataset's column is ragged). An append must agree with the dataset ([`PlanError::AppendConflict`]
/// names the option and both values); its inner shape then comes from the dataset.
fn plan_ragged(
    col: &ColumnPlan,
    pos: usize,
    named: Option<&BTreeSet<usize>>,
    option: Option<&str>,
    user_shape: bool,
    stored: Option<&safetensors_spark_dataset::manifest::ManifestTensor>,
) -> Result<Option<RaggedPlan>, PlanError> {
    let Some(element) = ragged_element(&col.input) else {
        return Ok(None);
    };
    let is_named = named.map(|n| n.contains(&pos));
    let stored_ragged = stored.map(|t| t.ragged.is_some());
    let ragged = match element {
        RaggedElement::String => true,
        RaggedElement::Binary if user_shape => false,
        RaggedElement::Binary => is_named == Some(true) || stored_ragged != Some(false),
        RaggedElement::Array => is_named.or(stored_ragged).unwrap_or(false),
    };
    if user_shape && (ragged || is_named == Some(true)) {
        return Err(PlanError::RaggedShapes {
            name: col.name.clone(),
            why: match element {
                RaggedElement::String => "is a string column, always written ragged",
                _ => "is named in option ragged",
            },
            hint: match element {
                RaggedElement::String => "",
                _ => " or take the column out of option ragged",
            },
        });
    }
    let kind = |r: bool| if r { "ragged" } else { "fixed-shape" };
    if let Some(dataset_ragged) = stored_ragged.filter(|d| *d != ragged) {
        let (option, given) = if user_shape {
            ("shapes", format!("given for column '{}'", col.name))
        } else {
            (
                "ragged",
                format!(
                    "{}, which makes column '{}' {}",
                    option.map_or_else(|| "left out".to_string(), |o| format!("'{o}'")),
                    col.name,
                    kind(ragged)
                ),
            )
        };
        return Err(PlanError::AppendConflict {
            option: option.to_string(),
            given,
            dataset: format!("column '{}' {}", col.name, kind(dataset_ragged)),
        });
    }
    if !ragged {
        return Ok(None);
    }
    let inner_shape = match (stored.and_then(|t| t.ragged.as_ref()), &col.input) {
        (Some(r), _) => Some(r.inner_shape.clone()),
        (None, InputKind::NumericArray { depth, .. }) if *depth > 1 => None,
        (None, _) => Some(Vec::new()),
    };
    Ok(Some(RaggedPlan {
        element,
        inner_shape,
    }))
}

/// Refuses a write where a ragged column's offsets tensor (`<c>.offsets`) would take the name
/// of another written column (compared as Spark resolves names).
fn check_ragged_offsets_names(
    columns: &[ColumnPlan],
    case_sensitive: bool,
) -> Result<(), PlanError> {
    for c in columns.iter().filter(|c| c.ragged.is_some()) {
        let offsets = ragged_offsets_name(&c.name);
        let same = |n: &str| {
            if case_sensitive {
                n == offsets
            } else {
                n.to_lowercase() == offsets.to_lowercase()
            }
        };
        if let Some(other) = columns.iter().find(|o| same(&o.name)) {
            return Err(PlanError::RaggedOffsetsCollision {
                ragged: c.name.clone(),
                offsets,
                other: other.name.clone(),
            });
        }
    }
    Ok(())
}

pub fn plan_write(
    spark_schema_json: &str,
    options: &BTreeMap<String, String>,
    case_sensitive: bool,
) -> Result<WritePlan, PlanError> {
    plan(spark_schema_json, options, case_sensitive, None)
}

/// Plans an append to the dataset whose latest manifest is `existing` (spec/dataset.md §5.2):
/// the settings the manifest records fill in the options the user left out (the mode with its
/// `batch_size` and `tail_strategy`, or the key column and `kv_separator`; each written column's
/// dtype; a binary column's sample shape in batch mode), an option the user gives must agree with
/// the dataset's setting ([`PlanError::AppendConflict`] names the option and both values), and
/// the plan is then checked against the manifest as a whole ([`check_append`]).
pub fn plan_append(
    spark_schema_json: &str,
    options: &BTreeMap<String, String>,
    case_sensitive: bool,
    existing: &Manifest,
) -> Result<WritePlan, PlanError> {
    let plan = plan(spark_schema_json, options, case_sensitive, Some(existing))?;
    check_append(&plan, existing)?;
    Ok(plan)
}

/// This connector's fields of a manifest an append goes on top of; a published-only manifest
/// does not record the settings an append must keep.
fn appendable(existing: &Manifest) -> Result<&ManifestExt, PlanError> {
    existing
        .ext
        .as_ref()
        .ok_or_else(|| PlanError::AppendMismatch {
            problem: "the dataset's manifest has only the published fields (written by another \
                      tool); this connector appends only to datasets it wrote (overwrite it instead)"
                .to_string(),
        })
}

fn mode_name(mode: DatasetMode) -> &'static str {
    match mode {
        DatasetMode::Batch => "batch",
        DatasetMode::Kv => "KV",
    }
}

/// Fills in the mode options an append leaves out from the dataset's manifest: with neither
/// `batch_size` nor `name_col` given, the dataset's mode (a KV dataset's key column is the one
/// string column of the DataFrame that is not a dataset column: string columns are never
/// tensors); then, when the write is in the dataset's mode, `tail_strategy` or `kv_separator`.
fn inherit_mode_options(
    opts: &mut Options,
    fields: &[(String, Value)],
    existing: &Manifest,
) -> Result<(), PlanError> {
    let ext = appendable(existing)?;
    fn inherit(opts: &mut Options, option: &'static str, value: Option<String>) {
        if let (false, Some(v)) = (opts.has(option), value) {
            opts.values.insert(option, v);
        }
    }
    match ext.mode {
        DatasetMode::Batch => {
            if !opts.has("name_col") {
                inherit(opts, "batch_size", ext.batch_size.map(|b| b.to_string()));
                inherit(
                    opts,
                    "tail_strategy",
                    ext.tail_strategy.map(|t| t.name().to_string()),
                );
            }
        }
        DatasetMode::Kv => {
            if !opts.has("batch_size") {
                if !opts.has("name_col") {
                    let stored: BTreeSet<&str> = existing.schema.names().collect();
                    let keys: Vec<&str> = fields
                        .iter()
                        .filter(|(n, t)| {
                            t.as_str() == Some("string") && !stored.contains(n.as_str())
                        })
                        .map(|(n, _)| n.as_str())
                        .collect();
                    let [key] = keys.as_slice() else {
                        let quoted = |names: Vec<&str>| {
                            names
                                .iter()
                                .map(|n| format!("'{n}'"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        };
                        return Err(PlanError::AppendKeyColumn {
                            stored: if stored.is_empty() {
                                "none: it has no shards".to_string()
                            } else {
                                quoted(stored.into_iter().collect())
                            },
                            found: if keys.is_empty() {
                                "the DataFrame has none".to_string()
                            } else {
                                format!("the DataFrame has {}", quoted(keys))
                            },
                        });
                    };
                    opts.values.insert("name_col", key.to_string());
                }
                inherit(opts, "kv_separator", ext.kv_separator.clone());
            }
        }
    }
    Ok(())
}

fn plan(
    spark_schema_json: &str,
    options: &BTreeMap<String, String>,
    case_sensitive: bool,
    existing: Option<&Manifest>,
) -> Result<WritePlan, PlanError> {
    let mut opts = Options::parse(options)?;
    let fields = parse_schema(spark_schema_json)?;
    if let Some(m) = existing {
        inherit_mode_options(&mut opts, &fields, m)?;
    }
    let opts = opts;
    let resolver = Resolver {
        names: fields.iter().map(|(n, _)| n.as_str()).collect(),
        case_sensitive,
    };

    // Mode and mode-specific options.
    let (mode, applies_to, inapplicable): (&str, &str, &[&'static str]) =
        match (opts.has("batch_size"), opts.has("name_col")) {
            (true, true) => return Err(PlanError::BothModes),
            (false, false) => return Err(PlanError::NoMode),
            (true, false) => ("batch", "KV", &KV_ONLY_OPTIONS),
            (false, true) => ("KV", "batch", &BATCH_ONLY_OPTIONS),
        };
    if let Some(option) = inapplicable.iter().copied().find(|o| opts.has(o)) {
        return Err(PlanError::InapplicableOption {
            option,
            mode,
            applies_to,
        });
    }

    let mut name_field: Option<usize> = None;
    let mode = if let Some(v) = opts.get("batch_size") {
        // A shard's rows are one tensor dimension and a Spark array index: at most 2^31 - 1.
        let batch_size = parse_u64_in("batch_size", v, 1..=MAX_BATCH_SIZE)?;
        let tail_strategy = match opts.get("tail_strategy") {
            None => TailStrategy::Write,
            Some(v) => parse_choice(
                "tail_strategy",
                v,
                &[
                    ("write", TailStrategy::Write),
                    ("drop", TailStrategy::Drop),
                    ("pad", TailStrategy::Pad),
                ],
            )?,
        };
        WriteMode::Batch {
            batch_size,
            tail_strategy,
        }
    } else {
        let name = opts.get("name_col").unwrap_or_default();
        let idx = resolver.resolve("name_col", name)?;
        let (key_name, key_type) = &fields[idx];
        if key_type.as_str() != Some("string") {
            return Err(PlanError::NameColNotString {
                name: key_name.clone(),
                spark_type: spark_type_string(key_type),
            });
        }
        name_field = Some(idx);
        let kv_separator = match opts.get("kv_separator") {
            None => DEFAULT_KV_SEPARATOR.to_string(),
            Some("") => return Err(invalid_value("kv_separator", "", "a non-empty string")),
            Some(s) => s.to_string(),
        };
        let mb = match opts.get("target_shard_size_mb") {
            None => DEFAULT_TARGET_SHARD_SIZE_MB,
            Some(v) => parse_u64_in("target_shard_size_mb", v, TARGET_SHARD_SIZE_MB_RANGE)?,
        };
        let duplicates = match opts.get("duplicatesStrategy") {
            None => DuplicatesStrategy::Fail,
            Some(v) => parse_choice(
                "duplicatesStrategy",
                v,
                &[
                    ("fail", DuplicatesStrategy::Fail),
                    ("lastWin", DuplicatesStrategy::LastWin),
                ],
            )?,
        };
        WriteMode::Kv {
            name_col: key_name.clone(),
            name_field_index: idx,
            kv_separator,
            target_shard_bytes: mb << 20,
            duplicates,
        }
    };

    // Which columns, in which order.
    let selected: Vec<usize> = match opts.get("columns") {
        Some(list) => {
            let mut out = Vec::new();
            for part in column_list("columns", list)? {
                let part = part.as_str();
                let idx = resolver.resolve("columns", part)?;
                if Some(idx) == name_field {
                    return Err(PlanError::NameColInColumns {
                        name: fields[idx].0.clone(),
                    });
                }
                if out.contains(&idx) {
                    return Err(PlanError::DuplicateColumn {
                        option: "columns",
                        name: part.to_string(),
                    });
                }
                out.push(idx);
            }
            out
        }
        None => (0..fields.len())
            .filter(|i| Some(*i) != name_field)
            .collect(),
    };
    if selected.is_empty() {
        return Err(PlanError::NoColumns {
            reason: if name_field.is_some() {
                "the DataFrame has no column besides name_col"
            } else {
                "the DataFrame has no columns"
            },
        });
    }
    let mut seen_names = BTreeSet::new();
    for i in &selected {
        if !seen_names.insert(fields[*i].0.as_str()) {
            return Err(PlanError::DuplicateSchemaColumn {
                name: fields[*i].0.clone(),
            });
        }
        if name_field.is_none() {
            if let Some((name, reason)) = RESERVED_BATCH_COLUMNS
                .iter()
                .find(|(n, _)| *n == fields[*i].0)
            {
                return Err(PlanError::ReservedColumnName {
                    name: name.to_string(),
                    reason,
                });
            }
        }
    }
    let mut columns: Vec<ColumnPlan> = selected
        .iter()
        .map(|&i| {
            let (name, t) = &fields[i];
            Ok(ColumnPlan {
                name: name.clone(),
                field_index: i,
                input: classify_column(name, t)?,
                dtype: None,
                sample_shape: None,
                ragged: None,
            })
        })
        .collect::<Result<_, PlanError>>()?;
    let written_list = || {
        columns
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let written_position = |option: &'static str, key: &str| -> Result<usize, PlanError> {
        let idx = resolver.resolve(option, key)?;
        selected
            .iter()
            .position(|&s| s == idx)
            .ok_or_else(|| PlanError::ColumnNotWritten {
                option,
                name: key.to_string(),
                written: written_list(),
            })
    };

    // dtypes.
    let global_dtype = opts
        .get("dtype")
        .map(|v| parse_writable_dtype("dtype", v))
        .transpose()?;
    let mut per_column: BTreeMap<usize, Dtype> = BTreeMap::new();
    if let Some(raw) = opts.get("dtypes") {
        let expected = "a JSON object of column → dtype name";
        for (key, v) in parse_json_object("dtypes", raw, expected)? {
            let pos = written_position("dtypes", &key)?;
            let name = v.as_str().ok_or_else(|| {
                invalid_value(
                    "dtypes",
                    raw,
                    format!("{expected} (column '{key}' has {})", json_kind(&v)),
                )
            })?;
            let dtype = parse_writable_dtype(&format!("dtypes (column '{key}')"), name)?;
            if per_column.insert(pos, dtype).is_some() {
                return Err(PlanError::DuplicateColumn {
                    option: "dtypes",
                    name: key,
                });
            }
        }
    }

    // shapes.
    let mut shapes: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    if let Some(raw) = opts.get("shapes") {
        for (key, v) in parse_json_object(
            "shapes",
            raw,
            "a JSON object of column → array of integers ≥ 0",
        )? {
            let pos = written_position("shapes", &key)?;
            let shape = parse_shape(&key, &v, raw)?;
            if shapes.insert(pos, shape).is_some() {
                return Err(PlanError::DuplicateColumn {
                    option: "shapes",
                    name: key,
                });
            }
        }
    }

    // ragged (batch mode only: the option is refused in KV mode above).
    let ragged_option = opts.get("ragged");
    let mut ragged_named: Option<BTreeSet<usize>> = None;
    if let Some(list) = ragged_option {
        let mut named = BTreeSet::new();
        let parts = if list.trim().is_empty() {
            Vec::new()
        } else {
            column_list("ragged", list)?
        };
        for part in parts {
            let pos = written_position("ragged", &part)?;
            if !named.insert(pos) {
                return Err(PlanError::DuplicateColumn {
                    option: "ragged",
                    name: part,
                });
            }
            let col = &columns[pos];
            if ragged_element(&col.input).is_none() {
                return Err(PlanError::RaggedType {
                    name: col.name.clone(),
                    spark_type: spark_type_string(&fields[col.field_index].1),
                });
            }
        }
        ragged_named = Some(named);
    }

    let batch = matches!(mode, WriteMode::Batch { .. });
    for (pos, col) in columns.iter_mut().enumerate() {
        let user_shape = shapes.remove(&pos);
        // An append: the dataset's settings unless given.
        let stored = existing.and_then(|m| m.schema.get(&col.name).map(|t| (m, t)));
        if !batch && col.input == InputKind::String {
            return Err(PlanError::StringInKvMode {
                name: col.name.clone(),
            });
        }
        if batch {
            col.ragged = plan_ragged(
                col,
                pos,
                ragged_named.as_ref(),
                ragged_option,
                user_shape.is_some(),
                stored.map(|(_, t)| t),
            )?;
        }
        col.sample_shape = user_shape;
        let bytes_column =
            col.ragged.is_some() && matches!(col.input, InputKind::Binary | InputKind::String);
        if bytes_column {
            // Raw bytes: U8 whatever the global dtype option says.
            if let Some(d) = per_column.get(&pos).filter(|d| **d != Dtype::U8) {
                let binary = col.input == InputKind::Binary;
                return Err(PlanError::RaggedDtype {
                    name: col.name.clone(),
                    kind: if binary { "binary" } else { "string" },
                    dtype: *d,
                    hint: if binary {
                        " (a shapes entry makes a binary column fixed-shape, its bytes the elements of the dtype given)"
                    } else {
                        ""
                    },
                });
            }
            col.dtype = Some(Dtype::U8);
            continue;
        }
        let given = per_column
            .get(&pos)
            .map(|d| ("dtypes", *d))
            .or(global_dtype.map(|d| ("dtype", d)));
        let explicit = match (given, stored) {
            (Some((option, d)), Some((_, t))) if d != t.dtype => {
                return Err(PlanError::AppendConflict {
                    option: option.to_string(),
                    given: format!("{d} for column '{}'", col.name),
                    dataset: t.dtype.to_string(),
                })
            }
            (Some((_, d)), _) => Some(d),
            (None, Some((_, t))) => Some(t.dtype),
            (None, None) => None,
        };
        if let (true, Some((m, _))) = (batch, stored) {
            let dataset_shape = m.sample_shape(&col.name);
            match (&col.sample_shape, dataset_shape) {
                (Some(a), Some(b)) if *a != b => {
                    return Err(PlanError::AppendConflict {
                        option: "shapes".to_string(),
                        given: format!("{a:?} for column '{}'", col.name),
                        dataset: format!("{b:?}"),
                    })
                }
                (None, Some(b)) if col.input == InputKind::Binary => col.sample_shape = Some(b),
                _ => {}
            }
        }
        col.dtype = match &col.input {
            InputKind::NumericArray { element, .. } | InputKind::Scalar { element } => {
                Some(explicit.unwrap_or(element.natural_dtype()))
            }
            InputKind::MlVector => Some(explicit.unwrap_or(Dtype::F64)),
            InputKind::TensorStruct => explicit,
            InputKind::String => Some(Dtype::U8),
            InputKind::Binary => {
                let missing = match (explicit.is_some(), col.sample_shape.is_some()) {
                    (true, true) => None,
                    (false, true) => Some("a dtype"),
                    (true, false) => Some("a shapes entry"),
                    (false, false) => Some("a dtype and a shapes entry"),
                };
                if let Some(missing) = missing {
                    return Err(PlanError::BinaryNeeds {
                        name: col.name.clone(),
                        missing,
                    });
                }
                explicit
            }
        };
        if let (InputKind::Scalar { .. }, Some(shape)) = (&col.input, &col.sample_shape) {
            let elements: u64 = shape.iter().product();
            if elements != 1 {
                return Err(PlanError::ScalarShape {
                    name: col.name.clone(),
                    shape: shape.clone(),
                    elements: elements.to_string(),
                });
            }
        }
    }
    check_ragged_offsets_names(&columns, case_sensitive)?;

    let generate_index = match opts.get("generate_index") {
        None => false,
        Some(v) => parse_choice("generate_index", v, &[("true", true), ("false", false)])?,
    };

    let retention_seconds = match opts.get("retention") {
        None => None,
        Some(v) => Some(
            safetensors_spark_dataset::vacuum::parse_retention(v).ok_or_else(|| {
                invalid_value(
                    "retention",
                    v,
                    safetensors_spark_dataset::vacuum::RETENTION_EXPECTED,
                )
            })?,
        ),
    };

    let mut metadata = BTreeMap::new();
    if let Some(raw) = opts.get("metadata") {
        let expected = "a JSON object of string → string";
        for (key, v) in parse_json_object("metadata", raw, expected)? {
            let Value::String(s) = v else {
                return Err(invalid_value(
                    "metadata",
                    raw,
                    format!("{expected} (key '{key}' has {})", json_kind(&v)),
                ));
            };
            if key.starts_with(RESERVED_METADATA_PREFIX) {
                return Err(PlanError::ReservedMetadataKey { key });
            }
            metadata.insert(key, s);
        }
        let bytes = serde_json::to_string(&metadata).map_or(usize::MAX, |j| j.len());
        if bytes > MAX_METADATA_OPTION_BYTES {
            return Err(PlanError::MetadataTooLarge { bytes });
        }
    }

    // recorded in the commit's manifest (spec/dataset.md §5.8); checked here, before anything
    // on disk changes
    if let Some(m) = opts.get("commit_message") {
        let max = safetensors_spark_dataset::manifest::MAX_COMMIT_MESSAGE_BYTES;
        if m.len() > max {
            return Err(invalid_value(
                "commit_message",
                &format!("{}…", m.chars().take(40).collect::<String>()),
                format!("at most {max} bytes of text (it is {} bytes)", m.len()),
            ));
        }
    }

    if let WriteMode::Kv { kv_separator, .. } = &mode {
        check_kv_columns_split_one_way(kv_separator, &columns)?;
    }
    Ok(WritePlan {
        write_id: uuid::Uuid::new_v4().hyphenated().to_string(),
        mode,
        columns,
        metadata,
        generate_index,
        retention_seconds,
    })
}

/// Checks, at plan time, that a write can be appended to a dataset with manifest `existing`:
/// same mode and mode options; when the dataset has columns, the same column set; per
/// column the same dtype (when the plan fixes one) and, in batch mode, the same sample shape
/// (when the plan fixes one with `shapes`). KV sample shapes may differ between rows, so they
/// are not compared.
pub fn check_append(plan: &WritePlan, existing: &Manifest) -> Result<(), PlanError> {
    let mismatch = |problem: String| PlanError::AppendMismatch { problem };
    let conflict = |option: &str, given: String, dataset: String| PlanError::AppendConflict {
        option: option.to_string(),
        given,
        dataset,
    };
    let ext = appendable(existing)?;
    match (&plan.mode, ext.mode) {
        (
            WriteMode::Batch {
                batch_size,
                tail_strategy,
            },
            DatasetMode::Batch,
        ) => {
            if ext.batch_size != Some(*batch_size) {
                return Err(conflict(
                    "batch_size",
                    batch_size.to_string(),
                    opt_to_string(ext.batch_size),
                ));
            }
            if ext.tail_strategy != Some(*tail_strategy) {
                return Err(conflict(
                    "tail_strategy",
                    tail_strategy.name().to_string(),
                    ext.tail_strategy
                        .map_or("none", TailStrategy::name)
                        .to_string(),
                ));
            }
        }
        (WriteMode::Kv { kv_separator, .. }, DatasetMode::Kv) => {
            if ext.kv_separator.as_deref() != Some(kv_separator.as_str()) {
                return Err(conflict(
                    "kv_separator",
                    format!("'{kv_separator}'"),
                    format!("'{}'", ext.kv_separator.as_deref().unwrap_or_default()),
                ));
            }
        }
        (mode, kind) => {
            let (mode, option) = match mode {
                WriteMode::Batch { .. } => ("batch", "batch_size"),
                WriteMode::Kv { .. } => ("KV", "name_col"),
            };
            return Err(mismatch(format!(
                "this write is in {mode} mode (option {option}), the dataset is in {} mode \
                 (leave {option} out to append in the dataset's mode)",
                mode_name(kind)
            )));
        }
    }
    if existing.schema.is_empty() {
        return Ok(());
    }
    let planned: BTreeSet<&str> = plan.columns.iter().map(|c| c.name.as_str()).collect();
    let stored: BTreeSet<&str> = existing.schema.names().collect();
    if planned != stored {
        let extra: Vec<&str> = planned.difference(&stored).copied().collect();
        let missing: Vec<&str> = stored.difference(&planned).copied().collect();
        let mut parts = Vec::new();
        if !extra.is_empty() {
            parts.push(format!(
                "columns {} are not in the dataset",
                extra.join(", ")
            ));
        }
        if !missing.is_empty() {
            parts.push(format!(
                "the dataset's columns {} are not written",
                missing.join(", ")
            ));
        }
        return Err(mismatch(format!(
            "the column set differs: {}",
            parts.join("; ")
        )));
    }
    let batch = matches!(plan.mode, WriteMode::Batch { .. });
    for col in &plan.columns {
        let Some(stored) = existing.schema.get(&col.name) else {
            continue;
        };
        if let Some(d) = col.dtype {
            if d != stored.dtype {
                return Err(mismatch(format!(
                    "column '{}' is written as {d}, the dataset stores {}",
                    col.name, stored.dtype
                )));
            }
        }
        if let (Some(a), Some(b)) = (&col.ragged, &stored.ragged) {
            if a.element != b.element {
                return Err(mismatch(format!(
                    "column '{}' is a ragged {} column, the dataset's holds ragged {} rows",
                    col.name,
                    ragged_name(a.element),
                    ragged_name(b.element)
                )));
            }
        }
        if batch {
            if let (Some(a), Some(b)) = (&col.sample_shape, &existing.sample_shape(&col.name)) {
                if a != b {
                    return Err(mismatch(format!(
                        "column '{}' has sample shape {a:?}, the dataset has {b:?}",
                        col.name
                    )));
                }
            }
        }
    }
    Ok(())
}

fn opt_to_string(v: Option<u64>) -> String {
    v.map_or_else(|| "none".to_string(), |v| v.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

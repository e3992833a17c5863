//! Plan-time validation (driver side, before anything on disk changes): the DataFrame schema
//! (Spark's own `StructType.json`) and the user's options become a [`WritePlan`], or a
//! [`PlanError`] that names the option or column and lists what is allowed.
//!
//! Rules: spec/options.md (options) and spec/dataset.md (layouts).

use super::{
    ColumnPlan, DuplicatesStrategy, InputKind, RaggedElement, RaggedPlan, SparkNumeric,
    TailStrategy, WriteMode, WritePlan,
};
use safetensors_spark_dataset::kv::find_key_column;
use safetensors_spark_dataset::manifest::{ragged_offsets_name, ManifestExt};
use safetensors_spark_dataset::{DatasetMode, Manifest};
use safetensors_spark_format::header::MAX_HEADER_SIZE;
use safetensors_spark_format::json_object::{first_duplicate_key, Entries};
use safetensors_spark_format::Dtype;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;

mod append;
mod column_types;
mod options;
mod ragged;

pub use append::*;
pub use column_types::*;
pub use options::*;
use ragged::*;

/// Every user option of the writer, as spelled in the docs (keys are matched case-insensitively).
pub const WRITE_OPTIONS: [&str; 16] = [
    "batch_size",
    "checkpoint_interval",
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

pub use safetensors_spark_dataset::names::DEFAULT_KV_SEPARATOR;
pub const DEFAULT_TARGET_SHARD_SIZE_MB: u64 = 300;
/// Allowed values of `target_shard_size_mb` (MiB): 1 MiB to 64 GiB.
pub const TARGET_SHARD_SIZE_MB_RANGE: RangeInclusive<u64> = 1..=65536;
pub use safetensors_spark_dataset::names::RESERVED_METADATA_PREFIX;

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

    #[error("cannot append to the existing dataset: it is in KV mode and its manifest does not record the key column; {problem}: give option name_col")]
    AppendKeyColumn { problem: String },
}

/// The most bytes the `metadata` option may take as compact JSON (spec/options.md): it goes into
/// every shard's header (at most `MAX_HEADER_SIZE` bytes with the tensor entries), and the
/// JVM's JSON parser takes strings of at most 20,000,000 characters.
pub const MAX_METADATA_OPTION_BYTES: usize = 16 << 20;

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
const RESERVED_BATCH_COLUMNS: [(&str, &str); 5] = [
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
    (
        "_row_index",
        "the per-sample read layout adds a column of that name (the row's index in its shard)",
    ),
    (
        "_added_version",
        "the per-sample read layout adds a column of that name (the version that added the shard)",
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

pub fn plan_write(
    spark_schema_json: &str,
    options: &BTreeMap<String, String>,
    case_sensitive: bool,
) -> Result<WritePlan, PlanError> {
    plan(spark_schema_json, options, case_sensitive, None)
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
    let (mode, name_field) = write_mode(&opts, &fields, &resolver)?;
    let selected = selected_columns(&opts, &fields, &resolver, name_field)?;
    let mut columns = selected
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
        .collect::<Result<Vec<_>, PlanError>>()?;
    let written = Written {
        resolver: &resolver,
        selected: &selected,
        columns: &columns,
    };
    let given = ColumnOptions {
        dtype: opts
            .get("dtype")
            .map(|v| parse_writable_dtype("dtype", v))
            .transpose()?,
        dtypes: column_dtypes(&opts, &written)?,
        shapes: column_shapes(&opts, &written)?,
        ragged_option: opts.get("ragged"),
        ragged: ragged_columns(&opts, &written, &fields)?,
    };
    let batch = matches!(mode, WriteMode::Batch { .. });
    for (pos, col) in columns.iter_mut().enumerate() {
        resolve_column(col, pos, &given, batch, existing)?;
    }
    check_ragged_offsets_names(&columns, case_sensitive)?;
    let DatasetOptions {
        generate_index,
        retention_seconds,
        checkpoint_interval,
        metadata,
    } = dataset_options(&opts)?;
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
        checkpoint_interval,
    })
}

/// Step 1: the mode (batch or KV) and its options; the index of `name_col` in KV mode.
fn write_mode(
    opts: &Options,
    fields: &[(String, Value)],
    resolver: &Resolver<'_>,
) -> Result<(WriteMode, Option<usize>), PlanError> {
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
    if let Some(v) = opts.get("batch_size") {
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
        return Ok((
            WriteMode::Batch {
                batch_size,
                tail_strategy,
            },
            None,
        ));
    }
    let name = opts.get("name_col").unwrap_or_default();
    let idx = resolver.resolve("name_col", name)?;
    let (key_name, key_type) = &fields[idx];
    if key_type.as_str() != Some("string") {
        return Err(PlanError::NameColNotString {
            name: key_name.clone(),
            spark_type: spark_type_string(key_type),
        });
    }
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
    Ok((
        WriteMode::Kv {
            name_col: key_name.clone(),
            name_field_index: idx,
            kv_separator,
            target_shard_bytes: mb << 20,
            duplicates,
        },
        Some(idx),
    ))
}

/// Step 2: which DataFrame columns are written, in which order (option `columns`, else all but
/// `name_col`); names unique, none reserved in batch mode.
fn selected_columns(
    opts: &Options,
    fields: &[(String, Value)],
    resolver: &Resolver<'_>,
    name_field: Option<usize>,
) -> Result<Vec<usize>, PlanError> {
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
    Ok(selected)
}

/// The written columns, for the options that name them (`dtypes`, `shapes`, `ragged`).
struct Written<'a> {
    resolver: &'a Resolver<'a>,
    selected: &'a [usize],
    columns: &'a [ColumnPlan],
}

impl Written<'_> {
    /// The position among the written columns of the column `key` names in `option`.
    fn position(&self, option: &'static str, key: &str) -> Result<usize, PlanError> {
        let idx = self.resolver.resolve(option, key)?;
        self.selected
            .iter()
            .position(|&s| s == idx)
            .ok_or_else(|| PlanError::ColumnNotWritten {
                option,
                name: key.to_string(),
                written: self
                    .columns
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

/// What the options say of each written column (by position), before the dataset's settings.
struct ColumnOptions<'a> {
    dtype: Option<Dtype>,
    dtypes: BTreeMap<usize, Dtype>,
    shapes: BTreeMap<usize, Vec<u64>>,
    ragged_option: Option<&'a str>,
    ragged: Option<BTreeSet<usize>>,
}

/// Step 3: option `dtypes`, a JSON object of column → dtype name.
fn column_dtypes(
    opts: &Options,
    written: &Written<'_>,
) -> Result<BTreeMap<usize, Dtype>, PlanError> {
    let mut per_column = BTreeMap::new();
    if let Some(raw) = opts.get("dtypes") {
        let expected = "a JSON object of column → dtype name";
        for (key, v) in parse_json_object("dtypes", raw, expected)? {
            let pos = written.position("dtypes", &key)?;
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
    Ok(per_column)
}

/// Step 4: option `shapes`, a JSON object of column → sample shape.
fn column_shapes(
    opts: &Options,
    written: &Written<'_>,
) -> Result<BTreeMap<usize, Vec<u64>>, PlanError> {
    let mut shapes = BTreeMap::new();
    if let Some(raw) = opts.get("shapes") {
        for (key, v) in parse_json_object(
            "shapes",
            raw,
            "a JSON object of column → array of integers ≥ 0",
        )? {
            let pos = written.position("shapes", &key)?;
            let shape = parse_shape(&key, &v, raw)?;
            if shapes.insert(pos, shape).is_some() {
                return Err(PlanError::DuplicateColumn {
                    option: "shapes",
                    name: key,
                });
            }
        }
    }
    Ok(shapes)
}

/// Step 5: option `ragged` (batch mode only: the option is refused in KV mode in step 1), the
/// columns it names; each must be of a type that can be ragged.
fn ragged_columns(
    opts: &Options,
    written: &Written<'_>,
    fields: &[(String, Value)],
) -> Result<Option<BTreeSet<usize>>, PlanError> {
    let Some(list) = opts.get("ragged") else {
        return Ok(None);
    };
    let mut named = BTreeSet::new();
    let parts = if list.trim().is_empty() {
        Vec::new()
    } else {
        column_list("ragged", list)?
    };
    for part in parts {
        let pos = written.position("ragged", &part)?;
        if !named.insert(pos) {
            return Err(PlanError::DuplicateColumn {
                option: "ragged",
                name: part,
            });
        }
        let col = &written.columns[pos];
        if ragged_element(&col.input).is_none() {
            return Err(PlanError::RaggedType {
                name: col.name.clone(),
                spark_type: spark_type_string(&fields[col.field_index].1),
            });
        }
    }
    Ok(Some(named))
}

/// Step 6: one written column's dtype, sample shape and raggedness, from the options and (an
/// append) the dataset's settings.
fn resolve_column(
    col: &mut ColumnPlan,
    pos: usize,
    given: &ColumnOptions<'_>,
    batch: bool,
    existing: Option<&Manifest>,
) -> Result<(), PlanError> {
    let user_shape = given.shapes.get(&pos).cloned();
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
            given.ragged.as_ref(),
            given.ragged_option,
            user_shape.is_some(),
            stored.map(|(_, t)| t),
        )?;
    }
    col.sample_shape = user_shape;
    let bytes_column =
        col.ragged.is_some() && matches!(col.input, InputKind::Binary | InputKind::String);
    if bytes_column {
        // Raw bytes: U8 whatever the global dtype option says.
        if let Some(d) = given.dtypes.get(&pos).filter(|d| **d != Dtype::U8) {
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
        return Ok(());
    }
    let option_dtype = given
        .dtypes
        .get(&pos)
        .map(|d| ("dtypes", *d))
        .or(given.dtype.map(|d| ("dtype", d)));
    let explicit = match (option_dtype, stored) {
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
    Ok(())
}

/// The largest `checkpoint_interval`: beyond it a reader of an old version replays more entries
/// than a checkpoint saves.
const MAX_CHECKPOINT_INTERVAL: u64 = 100_000;

/// Step 7: the dataset-wide options: `generate_index`, `retention`, `metadata`, and the
/// `commit_message` check (it is recorded in the commit's manifest, spec/dataset.md §5.8;
/// checked here, before anything on disk changes).
struct DatasetOptions {
    generate_index: bool,
    retention_seconds: Option<u64>,
    checkpoint_interval: Option<u64>,
    metadata: BTreeMap<String, String>,
}

fn dataset_options(opts: &Options) -> Result<DatasetOptions, PlanError> {
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
    let checkpoint_interval = match opts.get("checkpoint_interval") {
        None => None,
        Some(v) => Some(
            v.trim()
                .parse::<u64>()
                .ok()
                .filter(|n| (1..=MAX_CHECKPOINT_INTERVAL).contains(n))
                .ok_or_else(|| {
                    invalid_value(
                        "checkpoint_interval",
                        v,
                        format!(
                            "an integer from 1 to {MAX_CHECKPOINT_INTERVAL}: the versions between \
                             checkpoints of the manifest log"
                        ),
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
    Ok(DatasetOptions {
        generate_index,
        retention_seconds,
        checkpoint_interval,
        metadata,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

//! Appending to an existing dataset: the options it inherits from the manifest, and the checks
//! that the new rows fit it (mode, columns, dtypes, shapes).

use super::*;

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
pub(super) fn appendable(existing: &Manifest) -> Result<&ManifestExt, PlanError> {
    existing
        .ext
        .as_ref()
        .ok_or_else(|| PlanError::AppendMismatch {
            problem: "the dataset's manifest has only the published fields (written by another \
                      tool); this connector appends only to datasets it wrote (overwrite it instead)"
                .to_string(),
        })
}

pub(super) fn mode_name(mode: DatasetMode) -> &'static str {
    match mode {
        DatasetMode::Batch => "batch",
        DatasetMode::Kv => "KV",
    }
}

/// Fills in the mode options an append leaves out from the dataset's manifest: with neither
/// `batch_size` nor `name_col` given, the dataset's mode (a KV dataset's key column is the one
/// string column of the DataFrame that is not a dataset column: string columns are never
/// tensors); then, when the write is in the dataset's mode, `tail_strategy` or `kv_separator`.
pub(super) fn inherit_mode_options(
    opts: &mut Options,
    fields: &[(String, Value)],
    existing: &Manifest,
) -> Result<(), PlanError> {
    let ext = appendable(existing)?;
    pub(super) fn inherit(opts: &mut Options, option: &'static str, value: Option<String>) {
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
                    let mut stored: Vec<&str> = existing.schema.names().collect();
                    stored.sort_unstable();
                    let strings: Vec<&str> = fields
                        .iter()
                        .filter(|(_, t)| t.as_str() == Some("string"))
                        .map(|(n, _)| n.as_str())
                        .collect();
                    let key = find_key_column(&strings, &stored, "the DataFrame")
                        .map_err(|problem| PlanError::AppendKeyColumn { problem })?;
                    opts.values.insert("name_col", key.to_string());
                }
                inherit(opts, "kv_separator", ext.kv_separator.clone());
            }
        }
    }
    Ok(())
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

pub(super) fn opt_to_string(v: Option<u64>) -> String {
    v.map_or_else(|| "none".to_string(), |v| v.to_string())
}

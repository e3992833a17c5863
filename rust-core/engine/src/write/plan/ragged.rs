//! The `ragged` option: which batch-mode columns are written as values + offsets, and the
//! offsets columns' names.

use super::*;

/// What a ragged column of this input is read back as; `None`: the input cannot be ragged.
pub(super) fn ragged_element(input: &InputKind) -> Option<RaggedElement> {
    match input {
        InputKind::NumericArray { .. } => Some(RaggedElement::Array),
        InputKind::Binary => Some(RaggedElement::Binary),
        InputKind::String => Some(RaggedElement::String),
        _ => None,
    }
}

pub(super) fn ragged_name(element: RaggedElement) -> &'static str {
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
pub(super) fn plan_ragged(
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
pub(super) fn check_ragged_offsets_names(
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

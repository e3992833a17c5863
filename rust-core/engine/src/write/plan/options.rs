//! Parsing the writer options: choices, ranges, dtypes and JSON-valued options, with errors that
//! name the option and what it allows.

use super::*;

pub(super) fn invalid_value(option: &str, value: &str, expected: impl Into<String>) -> PlanError {
    PlanError::InvalidValue {
        option: option.to_string(),
        value: value.to_string(),
        expected: expected.into(),
    }
}

pub(super) fn invalid_choice(option: &str, value: &str, allowed: &[&str]) -> PlanError {
    PlanError::InvalidChoice {
        option: option.to_string(),
        value: value.to_string(),
        allowed: allowed.join(", "),
    }
}

/// The options, keyed by canonical name (as in [`WRITE_OPTIONS`]).
pub(super) struct Options {
    pub(super) values: BTreeMap<&'static str, String>,
}

impl Options {
    pub(super) fn parse(raw: &BTreeMap<String, String>) -> Result<Self, PlanError> {
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

    pub(super) fn get(&self, option: &'static str) -> Option<&str> {
        self.values.get(option).map(String::as_str)
    }

    pub(super) fn has(&self, option: &'static str) -> bool {
        self.values.contains_key(option)
    }
}

pub(super) fn parse_choice<T: Copy>(
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

pub(super) fn parse_u64_in(
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
pub(super) fn parse_json_object(
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

pub(super) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

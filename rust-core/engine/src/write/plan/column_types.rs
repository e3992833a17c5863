//! Classifying the DataFrame's Spark columns: which kind of tensor input each is (arrays, vectors,
//! structs of them), from the schema's JSON.

use super::*;

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

pub(super) fn numeric_type(name: &str) -> Option<SparkNumeric> {
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

pub(super) fn struct_fields(t: &Value) -> Option<&Vec<Value>> {
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

pub(super) fn classify_struct(name: &str, t: &Value) -> Result<InputKind, PlanError> {
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
pub(super) fn parse_schema(json: &str) -> Result<Vec<(String, Value)>, PlanError> {
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

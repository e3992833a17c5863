use super::*;
use crate::write::RaggedElement;
use safetensors_spark_dataset::manifest::{ColumnMap, ManifestTensor};
use serde_json::json;

fn arr(t: Value) -> Value {
    json!({"type": "array", "elementType": t, "containsNull": true})
}

fn field(name: &str, t: Value) -> Value {
    json!({"name": name, "type": t, "nullable": true, "metadata": {}})
}

fn schema(fields: Vec<Value>) -> String {
    json!({"type": "struct", "fields": fields}).to_string()
}

fn tensor_struct(shape_elem: &str) -> Value {
    json!({"type": "struct", "fields": [
        field("shape", arr(json!(shape_elem))),
        field("dtype", json!("string")),
        field("data", json!("binary")),
    ]})
}

fn vector(class: &str) -> Value {
    json!({"type": "udt", "class": class, "pyClass": "pyspark.ml.linalg.VectorUDT",
        "sqlType": {"type": "struct", "fields": [
            field("type", json!("byte")), field("size", json!("integer")),
            field("indices", arr(json!("integer"))), field("values", arr(json!("double")))]}})
}

/// x: array<float>, y: array<array<long>>, k: string, s: double
fn base() -> String {
    schema(vec![
        field("x", arr(json!("float"))),
        field("y", arr(arr(json!("long")))),
        field("k", json!("string")),
        field("s", json!("double")),
    ])
}

fn opts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn plan(schema: &str, pairs: &[(&str, &str)]) -> Result<WritePlan, PlanError> {
    plan_write(schema, &opts(pairs), false)
}

fn err(schema: &str, pairs: &[(&str, &str)]) -> PlanError {
    plan(schema, pairs).unwrap_err()
}

fn msg(schema: &str, pairs: &[(&str, &str)]) -> String {
    err(schema, pairs).to_string()
}

fn names(p: &WritePlan) -> Vec<&str> {
    p.columns.iter().map(|c| c.name.as_str()).collect()
}

fn xs() -> String {
    schema(vec![field("x", arr(json!("float")))])
}

#[test]
fn batch_defaults() {
    let p = plan(
        &xs(),
        &[("batch_size", "4"), ("path", "/d"), ("paths", "[]")],
    )
    .unwrap();
    assert_eq!(
        p.mode,
        WriteMode::Batch {
            batch_size: 4,
            tail_strategy: TailStrategy::Write
        }
    );
    assert_eq!(
        p.columns,
        vec![ColumnPlan {
            name: "x".into(),
            field_index: 0,
            input: InputKind::NumericArray {
                element: SparkNumeric::Float,
                depth: 1
            },
            dtype: Some(Dtype::F32),
            sample_shape: None,
            ragged: None,
        }]
    );
    assert!(p.metadata.is_empty());
    assert!(!p.generate_index);
    assert_eq!(p.write_id.len(), 36);
    assert_eq!(p.write_id, p.write_id.to_lowercase());
    assert!(uuid::Uuid::parse_str(&p.write_id).is_ok());
    let q = plan(&xs(), &[("batch_size", "4")]).unwrap();
    assert_ne!(p.write_id, q.write_id);
    // The plan travels as JSON.
    let back: WritePlan = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
}

#[test]
fn unsupported_types_name_column_type_and_what_is_supported() {
    for (t, shown) in [
        (json!("decimal(10,2)"), "decimal(10,2)"),
        (json!("timestamp"), "timestamp"),
        (json!("date"), "date"),
        (arr(json!("string")), "array<string>"),
        (arr(json!("binary")), "array<binary>"),
        (arr(json!("decimal(5,1)")), "array<decimal(5,1)>"),
        (
            json!({"type":"map","keyType":"string","valueType":"float","valueContainsNull":true}),
            "map<string,float>",
        ),
        (
            json!({"type":"struct","fields":[field("a", json!("integer"))]}),
            "struct<a:integer>",
        ),
        (
            json!({"type":"udt","class":"com.x.PointUDT","sqlType":"string"}),
            "udt(com.x.PointUDT)",
        ),
    ] {
        let s = schema(vec![field("c", t.clone())]);
        let e = err(&s, &[("batch_size", "1")]);
        assert!(matches!(e, PlanError::UnsupportedType { .. }), "{t}: {e}");
        let m = e.to_string();
        assert!(m.contains("column 'c'"), "{m}");
        assert!(m.contains(&format!("type {shown};")), "{m}");
        assert!(
            m.contains("numeric arrays") && m.contains("ML vectors"),
            "{m}"
        );
    }
}

#[test]
fn input_kinds_and_natural_dtypes() {
    let all = [
        ("boolean", SparkNumeric::Boolean, Dtype::Bool),
        ("byte", SparkNumeric::Byte, Dtype::I8),
        ("short", SparkNumeric::Short, Dtype::I16),
        ("integer", SparkNumeric::Int, Dtype::I32),
        ("long", SparkNumeric::Long, Dtype::I64),
        ("float", SparkNumeric::Float, Dtype::F32),
        ("double", SparkNumeric::Double, Dtype::F64),
    ];
    for (name, element, dtype) in all {
        let s = schema(vec![
            field("a", arr(json!(name))),
            field("sc", json!(name)),
            field("deep", arr(arr(arr(json!(name))))),
        ]);
        let p = plan(&s, &[("batch_size", "2")]).unwrap();
        assert_eq!(
            p.columns[0].input,
            InputKind::NumericArray { element, depth: 1 }
        );
        assert_eq!(p.columns[1].input, InputKind::Scalar { element });
        assert_eq!(
            p.columns[2].input,
            InputKind::NumericArray { element, depth: 3 }
        );
        assert!(p.columns.iter().all(|c| c.dtype == Some(dtype)), "{name}");
    }
}

#[test]
fn tensor_struct_detection() {
    for (shape_elem, order) in [
        ("integer", ["data", "shape", "dtype"]),
        ("long", ["dtype", "data", "shape"]),
    ] {
        let types = |n: &str| match n {
            "data" => json!("binary"),
            "dtype" => json!("string"),
            _ => arr(json!(shape_elem)),
        };
        let st = json!({"type":"struct","fields": order.iter().map(|n| {
            json!({"name": n, "type": types(n), "nullable": false, "metadata": {}})
        }).collect::<Vec<_>>()});
        let s = schema(vec![field("t", st)]);
        let p = plan(&s, &[("batch_size", "1")]).unwrap();
        assert_eq!(p.columns[0].input, InputKind::TensorStruct);
        assert_eq!(p.columns[0].dtype, None);
        let p = plan(&s, &[("batch_size", "1"), ("dtype", "f16")]).unwrap();
        assert_eq!(p.columns[0].dtype, Some(Dtype::F16));
    }
    // Extra field, missing field, wrong field types.
    let mut extra = tensor_struct("integer");
    extra["fields"]
        .as_array_mut()
        .unwrap()
        .push(field("name", json!("string")));
    let missing = json!({"type":"struct","fields":[field("data", json!("binary")),
        field("shape", arr(json!("integer")))]});
    let bad_shape = json!({"type":"struct","fields":[field("data", json!("binary")),
        field("shape", arr(json!("short"))), field("dtype", json!("string"))]});
    let bad_data = json!({"type":"struct","fields":[field("data", arr(json!("byte"))),
        field("shape", arr(json!("long"))), field("dtype", json!("string"))]});
    for (st, needle) in [
        (extra, "unexpected field 'name'"),
        (missing, "field 'dtype' is missing"),
        (bad_shape, "field 'shape' has type array<short>"),
        (bad_data, "field 'data' has type array<byte>, not binary"),
    ] {
        let e = err(&schema(vec![field("t", st)]), &[("batch_size", "1")]);
        assert!(matches!(e, PlanError::BadTensorStruct { .. }), "{e}");
        assert!(e.to_string().contains(needle), "{e}");
        assert!(e.to_string().contains("column 't'"), "{e}");
    }
}

#[test]
fn vector_udt_detection() {
    for class in [
        "org.apache.spark.ml.linalg.VectorUDT",
        "org.apache.spark.mllib.linalg.VectorUDT",
    ] {
        let s = schema(vec![field("v", vector(class))]);
        let p = plan(&s, &[("batch_size", "1")]).unwrap();
        assert_eq!(p.columns[0].input, InputKind::MlVector);
        assert_eq!(p.columns[0].dtype, Some(Dtype::F64));
        let p = plan(&s, &[("batch_size", "1"), ("dtype", "F32")]).unwrap();
        assert_eq!(p.columns[0].dtype, Some(Dtype::F32));
    }
    // A Python-only UDT description (no JVM class) is recognised by its pyClass.
    let py = json!({"type":"udt","pyClass":"pyspark.ml.linalg.VectorUDT","sqlType":"string"});
    let p = plan(&schema(vec![field("v", py)]), &[("batch_size", "1")]).unwrap();
    assert_eq!(p.columns[0].input, InputKind::MlVector);
}

#[test]
fn binary_needs_dtype_and_shapes() {
    let s = schema(vec![
        field("b", json!("binary")),
        field("k", json!("string")),
    ]);
    // Without a shapes entry a binary column is ragged U8 in batch mode (spec/options.md);
    // in KV mode it still needs both.
    for (pairs, needle) in [
        (vec![("name_col", "k")], "a dtype and a shapes entry"),
        (vec![("name_col", "k"), ("dtype", "F32")], "a shapes entry"),
        (
            vec![("batch_size", "1"), ("shapes", r#"{"b":[2]}"#)],
            "a dtype",
        ),
    ] {
        let e = err(&s, &pairs);
        assert!(matches!(e, PlanError::BinaryNeeds { .. }), "{e}");
        assert!(e.to_string().contains(&format!("needs {needle}:")), "{e}");
        assert!(e.to_string().contains("'b'"), "{e}");
    }
    let p = plan(
        &s,
        &[
            ("batch_size", "1"),
            ("dtypes", r#"{"b":"u16"}"#),
            ("shapes", r#"{"b":[2,3]}"#),
        ],
    )
    .unwrap();
    assert_eq!(p.columns[0].input, InputKind::Binary);
    assert_eq!(p.columns[0].dtype, Some(Dtype::U16));
    assert_eq!(p.columns[0].sample_shape, Some(vec![2, 3]));
    assert_eq!(p.columns[0].ragged, None);
}

#[test]
fn unknown_option_lists_every_valid_key() {
    let e = err(&xs(), &[("batch_size", "1"), ("dtpye", "F32")]);
    assert_eq!(
        e.to_string(),
        "unknown option 'dtpye'; valid options: batch_size, checkpoint_interval, columns, \
commit_message, dtype, dtypes, duplicatesStrategy, generate_index, kv_separator, metadata, name_col, ragged, retention, shapes, \
tail_strategy, target_shard_size_mb"
    );
}

/// `commit_message` (recorded in the version, dataset.md §5.8) is checked at plan time.
#[test]
fn commit_message_is_any_text_up_to_64_kib() {
    plan(
        &xs(),
        &[
            ("batch_size", "1"),
            ("commit_message", "nightly \"load\" ✓"),
        ],
    )
    .unwrap();
    let long = "x".repeat(65_537);
    let e = err(&xs(), &[("batch_size", "1"), ("commit_message", &long)]).to_string();
    assert!(
        e.contains("option commit_message")
            && e.contains("at most 65536 bytes of text (it is 65537 bytes)"),
        "{e}"
    );
}

#[test]
fn keys_and_values_are_case_insensitive() {
    let p = plan(
        &xs(),
        &[
            ("BATCH_SIZE", "3"),
            ("Tail_Strategy", "PAD"),
            ("DTYPE", "bf16"),
            ("Generate_Index", "TRUE"),
        ],
    )
    .unwrap();
    assert_eq!(
        p.mode,
        WriteMode::Batch {
            batch_size: 3,
            tail_strategy: TailStrategy::Pad
        }
    );
    assert_eq!(p.columns[0].dtype, Some(Dtype::Bf16));
    assert!(p.generate_index);
    let s = schema(vec![
        field("k", json!("string")),
        field("x", arr(json!("float"))),
    ]);
    let p = plan(&s, &[("NAME_COL", "k"), ("duplicatesstrategy", "LASTWIN")]).unwrap();
    assert!(matches!(
        p.mode,
        WriteMode::Kv {
            duplicates: DuplicatesStrategy::LastWin,
            ..
        }
    ));
    let p = plan(&xs(), &[("batch_size", "1"), ("generate_index", "False")]).unwrap();
    assert!(!p.generate_index);
    // The same option twice under different cases.
    let e = err(
        &xs(),
        &[("batch_size", "1"), ("DTYPE", "F32"), ("dtype", "F16")],
    );
    assert!(
        matches!(
            e,
            PlanError::RepeatedOption {
                option: "dtype",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn bad_enum_and_number_values() {
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![("batch_size", "1"), ("tail_strategy", "bogus")],
            "option tail_strategy: 'bogus' is not one of write, drop, pad",
        ),
        (
            vec![("batch_size", "1"), ("dtype", "f8_e4m3")],
            "option dtype: 'f8_e4m3' is not one of BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64",
        ),
        (
            vec![("batch_size", "1"), ("generate_index", "yes")],
            "option generate_index: 'yes' is not one of true, false",
        ),
        (vec![("batch_size", "0")], "option batch_size: '0' is not an integer from 1 to 2147483647"),
        (vec![("batch_size", "-1")], "option batch_size: '-1' is not an integer from 1 to 2147483647"),
        (vec![("batch_size", "abc")], "option batch_size: 'abc' is not an integer from 1 to 2147483647"),
        (vec![("batch_size", "2.5")], "option batch_size: '2.5' is not an integer from 1 to 2147483647"),
        (
            vec![("batch_size", "2147483648")],
            "option batch_size: '2147483648' is not an integer from 1 to 2147483647",
        ),
        (
            vec![("batch_size", "18446744073709551615")],
            "option batch_size: '18446744073709551615' is not an integer from 1 to 2147483647",
        ),
    ];
    for (pairs, expected) in cases {
        assert_eq!(msg(&xs(), &pairs), expected);
    }
    let kv = schema(vec![
        field("k", json!("string")),
        field("x", arr(json!("float"))),
    ]);
    assert_eq!(
        msg(&kv, &[("name_col", "k"), ("duplicatesStrategy", "first")]),
        "option duplicatesStrategy: 'first' is not one of fail, lastWin"
    );
    assert_eq!(
        msg(&kv, &[("name_col", "k"), ("kv_separator", "")]),
        "option kv_separator: '' is not a non-empty string"
    );
    // Surrounding whitespace is ignored in numbers and enumerated values.
    assert!(plan(&xs(), &[("batch_size", " 8 "), ("tail_strategy", " drop")]).is_ok());
}

#[test]
fn target_shard_size_range() {
    let kv = schema(vec![
        field("k", json!("string")),
        field("x", arr(json!("float"))),
    ]);
    let bytes = |v: &str| match plan(&kv, &[("name_col", "k"), ("target_shard_size_mb", v)])
        .unwrap()
        .mode
    {
        WriteMode::Kv {
            target_shard_bytes, ..
        } => target_shard_bytes,
        other => panic!("{other:?}"),
    };
    assert_eq!(bytes("1"), 1 << 20);
    assert_eq!(bytes("65536"), 65536 << 20);
    match plan(&kv, &[("name_col", "k")]).unwrap().mode {
        WriteMode::Kv {
            target_shard_bytes,
            kv_separator,
            duplicates,
            name_col,
            name_field_index,
        } => {
            assert_eq!(target_shard_bytes, 300 << 20);
            assert_eq!(kv_separator, "__");
            assert_eq!(duplicates, DuplicatesStrategy::Fail);
            assert_eq!((name_col.as_str(), name_field_index), ("k", 0));
        }
        other => panic!("{other:?}"),
    }
    for bad in ["0", "65537", "-5", "1e3", ""] {
        assert_eq!(
            msg(&kv, &[("name_col", "k"), ("target_shard_size_mb", bad)]),
            format!("option target_shard_size_mb: '{bad}' is not an integer from 1 to 65536")
        );
    }
}

#[test]
fn exactly_one_mode() {
    let kv = schema(vec![
        field("k", json!("string")),
        field("x", arr(json!("float"))),
    ]);
    assert_eq!(
        err(&kv, &[("batch_size", "1"), ("name_col", "k")]),
        PlanError::BothModes
    );
    assert_eq!(err(&kv, &[("dtype", "F32")]), PlanError::NoMode);
    assert!(msg(&kv, &[]).contains("batch_size (batch mode) or name_col (KV mode)"));
}

#[test]
fn mode_inapplicable_options() {
    let kv = schema(vec![
        field("k", json!("string")),
        field("x", arr(json!("float"))),
    ]);
    for opt in ["kv_separator", "target_shard_size_mb", "duplicatesStrategy"] {
        assert_eq!(
            msg(&kv, &[("batch_size", "1"), (opt, "x")]),
            format!("option {opt} does not apply to batch mode; it applies only to KV mode")
        );
    }
    assert_eq!(
        msg(&kv, &[("name_col", "k"), ("TAIL_STRATEGY", "pad")]),
        "option tail_strategy does not apply to KV mode; it applies only to batch mode"
    );
}

#[test]
fn kv_name_col_rules() {
    let s = base();
    let p = plan(&s, &[("name_col", "k")]).unwrap();
    assert_eq!(names(&p), ["x", "y", "s"]);
    assert_eq!(
        p.columns.iter().map(|c| c.field_index).collect::<Vec<_>>(),
        [0, 1, 3]
    );
    assert_eq!(
        msg(&s, &[("name_col", "x")]),
        "name_col 'x' has type array<float>; the key column must be a string column"
    );
    assert_eq!(
        msg(&s, &[("name_col", "nope")]),
        "option name_col: column 'nope' does not exist; columns: x, y, k, s"
    );
    assert_eq!(
        err(&s, &[("name_col", "k"), ("columns", "x, K")]),
        PlanError::NameColInColumns { name: "k".into() }
    );
    let only_key = schema(vec![field("k", json!("string"))]);
    assert!(matches!(
        err(&only_key, &[("name_col", "k")]),
        PlanError::NoColumns { .. }
    ));
    // Without `columns`, every other column must be writable: the key is not, the others are.
    let two_strings = schema(vec![
        field("k", json!("string")),
        field("j", json!("string")),
    ]);
    assert!(msg(&two_strings, &[("name_col", "k")]).starts_with("column 'j' has type string;"));
    assert!(plan(&two_strings, &[("name_col", "k"), ("columns", "j")]).is_err());
}

#[test]
fn columns_select_and_order() {
    let s = base();
    let p = plan(&s, &[("batch_size", "1"), ("columns", " s , x ")]).unwrap();
    assert_eq!(names(&p), ["s", "x"]);
    assert_eq!(p.columns[0].field_index, 3);
    // Unlisted columns of any type are ignored (k is a string, written ragged when listed).
    assert!(plan(&s, &[("batch_size", "1")]).is_ok());
    assert_eq!(
        msg(&s, &[("batch_size", "1"), ("columns", "x,nope")]),
        "option columns: column 'nope' does not exist; columns: x, y, k, s"
    );
    assert_eq!(
        msg(&s, &[("batch_size", "1"), ("columns", "x,X")]),
        "option columns: column 'X' is listed twice"
    );
    assert!(matches!(
        err(&s, &[("batch_size", "1"), ("columns", "x,,s")]),
        PlanError::InvalidValue { .. }
    ));
    assert!(matches!(
        err(&s, &[("batch_size", "1"), ("columns", "")]),
        PlanError::InvalidValue { .. }
    ));
    let empty = schema(vec![]);
    assert!(matches!(
        err(&empty, &[("batch_size", "1")]),
        PlanError::NoColumns { .. }
    ));
}

#[test]
fn kv_columns_must_split_tensor_names_one_way() {
    let s = schema(vec![
        field("k", json!("string")),
        field("c", arr(json!("float"))),
        field("b__c", arr(json!("float"))),
        field("_c", arr(json!("float"))),
    ]);
    // `x__b__c`: key x__b + column c, or key x + column b__c
    assert!(matches!(
        err(&s, &[("name_col", "k"), ("columns", "c,b__c")]),
        PlanError::AmbiguousKvColumns { .. }
    ));
    // `x___c`: key x_ + column c, or key x + column _c
    assert!(matches!(
        err(&s, &[("name_col", "k"), ("columns", "_c,c")]),
        PlanError::AmbiguousKvColumns { .. }
    ));
    plan(
        &s,
        &[
            ("name_col", "k"),
            ("columns", "c,b__c"),
            ("kv_separator", "::"),
        ],
    )
    .unwrap();
    plan(&s, &[("name_col", "k"), ("columns", "b__c,_c")]).unwrap();
    // batch mode names tensors by column alone
    plan(&s, &[("batch_size", "1"), ("columns", "c,b__c,_c")]).unwrap();
}

#[test]
fn columns_as_a_json_array_name_any_column() {
    let s = schema(vec![
        field("a,b", arr(json!("float"))),
        field(" c", arr(json!("float"))),
        field("d", arr(json!("float"))),
    ]);
    let p = plan(&s, &[("batch_size", "1"), ("columns", r#"["a,b", " c"]"#)]).unwrap();
    assert_eq!(names(&p), ["a,b", " c"]);
    // the comma form cannot name them
    assert!(matches!(
        err(&s, &[("batch_size", "1"), ("columns", "a,b")]),
        PlanError::UnknownColumn { .. }
    ));
    for bad in [r#"["d""#, r#"["d", 1]"#, r#"["d", ""]"#] {
        assert!(
            matches!(
                err(&s, &[("batch_size", "1"), ("columns", bad)]),
                PlanError::InvalidValue { .. }
            ),
            "{bad}"
        );
    }
}

#[test]
fn batch_columns_that_would_collide_with_read_columns_are_refused_at_plan_time() {
    for name in ["_file", "_metadata", "__metadata__"] {
        let s = schema(vec![field(name, arr(json!("float")))]);
        let e = msg(&s, &[("batch_size", "1")]);
        assert!(
            e.starts_with(&format!("column '{name}' cannot be written in batch mode")),
            "{e}"
        );
        // not selected: fine; in KV mode the column name is only a tensor name suffix
        let s2 = schema(vec![
            field(name, arr(json!("float"))),
            field("x", arr(json!("float"))),
            field("k", json!("string")),
        ]);
        plan(&s2, &[("batch_size", "1"), ("columns", "x")]).unwrap();
        plan(&s2, &[("name_col", "k")]).unwrap();
    }
    // The per-file layout's own column names are ordinary names (spec/reading.md §2.3).
    for name in ["file", "metadata", "flags", "model_info", "sha256"] {
        let s = schema(vec![field(name, arr(json!("float")))]);
        plan(&s, &[("batch_size", "1")]).unwrap();
    }
}

#[test]
fn case_sensitive_vs_insensitive_resolution() {
    let s = schema(vec![
        field("Feat", arr(json!("float"))),
        field("feat", arr(json!("double"))),
    ]);
    // Case-sensitive: both exist, exact names pick one each.
    let p = plan_write(&s, &opts(&[("batch_size", "1"), ("columns", "feat")]), true).unwrap();
    assert_eq!(names(&p), ["feat"]);
    assert_eq!(p.columns[0].dtype, Some(Dtype::F64));
    assert!(matches!(
        plan_write(&s, &opts(&[("batch_size", "1"), ("columns", "FEAT")]), true).unwrap_err(),
        PlanError::UnknownColumn { .. }
    ));
    // Case-insensitive: ambiguous.
    let e = plan_write(
        &s,
        &opts(&[("batch_size", "1"), ("columns", "feat")]),
        false,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "option columns: column 'feat' is ambiguous, it matches 'Feat' and 'feat' (spark.sql.caseSensitive is false)"
    );
    // Case-insensitive with a unique match: the schema's spelling is used.
    let p = plan(
        &base(),
        &[
            ("batch_size", "1"),
            ("columns", "X,S"),
            ("shapes", r#"{"x":[2]}"#),
        ],
    )
    .unwrap();
    assert_eq!(names(&p), ["x", "s"]);
    assert_eq!(p.columns[0].sample_shape, Some(vec![2]));
    assert!(matches!(
        plan_write(
            &base(),
            &opts(&[("batch_size", "1"), ("columns", "X")]),
            true
        )
        .unwrap_err(),
        PlanError::UnknownColumn { .. }
    ));
    // Duplicate names in the schema that are both written.
    let dup = schema(vec![
        field("a", arr(json!("float"))),
        field("a", arr(json!("float"))),
    ]);
    assert!(matches!(
        plan_write(&dup, &opts(&[("batch_size", "1")]), true).unwrap_err(),
        PlanError::DuplicateSchemaColumn { .. }
    ));
}

#[test]
fn dtype_and_dtypes() {
    let s = base();
    let p = plan(
        &s,
        &[
            ("batch_size", "1"),
            ("columns", "x,y,s"),
            ("dtype", "f16"),
            ("dtypes", r#"{"Y": "u64", "s": "Bool"}"#),
        ],
    )
    .unwrap();
    let dtypes: Vec<_> = p.columns.iter().map(|c| c.dtype).collect();
    assert_eq!(
        dtypes,
        [Some(Dtype::F16), Some(Dtype::U64), Some(Dtype::Bool)]
    );
    // A boolean column may target BOOL or any numeric dtype.
    let b = schema(vec![field("b", arr(json!("boolean")))]);
    for d in Dtype::writable_names() {
        let p = plan(&b, &[("batch_size", "1"), ("dtype", d)]).unwrap();
        assert_eq!(p.columns[0].dtype.map(|d| d.name()), Some(d));
    }
    let base_opts = [("batch_size", "1"), ("columns", "x,s")];
    let with = |extra: (&'static str, &'static str)| {
        let mut v = base_opts.to_vec();
        v.push(extra);
        msg(&s, &v)
    };
    assert_eq!(
        with(("dtypes", r#"{"nope": "F32"}"#)),
        "option dtypes: column 'nope' does not exist; columns: x, y, k, s"
    );
    assert_eq!(
        with(("dtypes", r#"{"y": "F32"}"#)),
        "option dtypes: column 'y' is not written (written columns: x, s)"
    );
    assert!(with(("dtypes", r#"{"x": "F9"}"#))
        .starts_with("option dtypes (column 'x'): 'F9' is not one of BOOL, U8"));
    assert!(with(("dtypes", r#"{"x": 32}"#)).contains("column 'x' has a number"));
    assert!(
        with(("dtypes", "{x: F32}")).starts_with("option dtypes: '{x: F32}' is not a JSON object")
    );
    assert!(with(("dtypes", r#"["F32"]"#)).contains("is not a JSON object"));
    assert!(with(("dtypes", r#"{"x":"F32","x":"F16"}"#)).contains("key 'x' appears twice"));
    assert!(with(("dtypes", r#"{"x":"F32","X":"F16"}"#)).contains("column 'X' is listed twice"));
}

#[test]
fn shapes_option() {
    let s = base();
    let p = plan(
        &s,
        &[
            ("batch_size", "1"),
            ("columns", "x,y,s"),
            ("shapes", r#"{"x":[2,3],"y":[],"s":[1,1]}"#),
        ],
    )
    .unwrap();
    let shapes: Vec<_> = p.columns.iter().map(|c| c.sample_shape.clone()).collect();
    assert_eq!(shapes, [Some(vec![2, 3]), Some(vec![]), Some(vec![1, 1])]);
    let o = |v: &'static str| vec![("batch_size", "1"), ("columns", "x,s"), ("shapes", v)];
    assert_eq!(
        msg(&s, &o(r#"{"y":[2]}"#)),
        "option shapes: column 'y' is not written (written columns: x, s)"
    );
    assert!(msg(&s, &o(r#"{"q":[2]}"#)).starts_with("option shapes: column 'q' does not exist"));
    for bad in [
        r#"{"x":[-1]}"#,
        r#"{"x":[2.5]}"#,
        r#"{"x":[2.0]}"#,
        r#"{"x":"[2]"}"#,
        r#"{"x":[[2]]}"#,
        r#"{"x":[null]}"#,
    ] {
        let m = msg(&s, &o(bad));
        assert!(m.contains("column 'x' has"), "{bad}: {m}");
        assert!(
            m.contains("not an array of non-negative integers"),
            "{bad}: {m}"
        );
    }
    assert!(msg(&s, &o("{")).starts_with("option shapes: '{' is not a JSON object"));
    assert!(msg(&s, &o(r#"{"x":[4294967296,4294967296]}"#)).contains("fits in 64 bits"));
    // A scalar column's shape must hold one element.
    let e = err(&s, &o(r#"{"s":[2]}"#));
    assert!(matches!(e, PlanError::ScalarShape { .. }), "{e}");
    // Zero-sized dims are allowed for arrays.
    assert!(plan(&s, &o(r#"{"x":[0,3]}"#)).is_ok());
}

#[test]
fn metadata_option() {
    let p = plan(
        &xs(),
        &[("batch_size", "1"), ("metadata", r#"{"b":"2","a":"x"}"#)],
    )
    .unwrap();
    assert_eq!(
        p.metadata,
        BTreeMap::from([("a".into(), "x".into()), ("b".into(), "2".into())])
    );
    let m = |v: &'static str| msg(&xs(), &[("batch_size", "1"), ("metadata", v)]);
    assert_eq!(
        m(r#"{"safetensors_spark.samples":"3"}"#),
        "option metadata: key 'safetensors_spark.samples' starts with the reserved prefix 'safetensors_spark.' (those keys are written by the engine)"
    );
    assert!(m(r#"{"a":1}"#).contains("key 'a' has a number"));
    assert!(m(r#"{"a":null}"#).contains("key 'a' has null"));
    assert!(m("[]").contains("is not a JSON object of string → string"));
    assert!(m("nope").contains("is not a JSON object of string → string"));
    assert!(m(r#"{"a":"1","a":"2"}"#).contains("key 'a' appears twice"));
    // Size: at most MAX_METADATA_OPTION_BYTES as compact JSON (`{"a":"…"}` is 8 bytes more).
    let at = |n: usize| format!(r#"{{"a":"{}"}}"#, "x".repeat(n - 8));
    let limit = crate::write::plan::MAX_METADATA_OPTION_BYTES;
    assert!(plan(&xs(), &[("batch_size", "1"), ("metadata", &at(limit))]).is_ok());
    let e = err(&xs(), &[("batch_size", "1"), ("metadata", &at(limit + 1))]);
    assert!(
        matches!(e, PlanError::MetadataTooLarge { bytes } if bytes == limit + 1),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.len() < 400,
        "the message does not quote the value: {}",
        text.len()
    );
    assert!(
        text.contains("option metadata") && text.contains(&format!("at most {limit} bytes")),
        "{text}"
    );
}

#[test]
fn invalid_schema_json() {
    for bad in [
        "",
        "{",
        r#"{"type":"array"}"#,
        r#"{"type":"struct","fields":[{"type":"float"}]}"#,
    ] {
        assert!(
            matches!(
                plan_write(bad, &opts(&[("batch_size", "1")]), false),
                Err(PlanError::InvalidSchema { .. })
            ),
            "{bad}"
        );
    }
}

fn manifest_for(p: &WritePlan, cols: &[(&str, Dtype, Option<Vec<u64>>)]) -> Manifest {
    let mut m = crate::write::commit::empty_manifest(p);
    let batch = match &p.mode {
        WriteMode::Batch { batch_size, .. } => Some(*batch_size),
        WriteMode::Kv { .. } => None,
    };
    m.schema = ColumnMap(
        cols.iter()
            .map(|(n, d, s)| {
                (
                    n.to_string(),
                    ManifestTensor {
                        dtype: *d,
                        // batch mode: [batch_size, …sample shape]
                        shape: match batch {
                            Some(b) => s
                                .as_ref()
                                .map(|s| std::iter::once(b).chain(s.iter().copied()).collect()),
                            None => s.clone(),
                        },
                        ragged: None,
                    },
                )
            })
            .collect(),
    );
    m
}

#[test]
fn append_compatibility() {
    let s = base();
    let p = plan(
        &s,
        &[
            ("batch_size", "4"),
            ("columns", "x,s"),
            ("shapes", r#"{"x":[3]}"#),
        ],
    )
    .unwrap();
    let ok = manifest_for(
        &p,
        &[
            ("x", Dtype::F32, Some(vec![3])),
            ("s", Dtype::F64, Some(vec![])),
        ],
    );
    check_append(&p, &ok).unwrap();
    // An empty dataset accepts any columns.
    check_append(&p, &crate::write::commit::empty_manifest(&p)).unwrap();

    let other_batch = plan(&s, &[("batch_size", "5"), ("columns", "x,s")]).unwrap();
    let e = check_append(&other_batch, &ok).unwrap_err().to_string();
    assert_eq!(
        e,
        "cannot append to the existing dataset: option batch_size is 5, the dataset has 4 (an append takes the dataset's batch_size when the option is left out)"
    );
    let pad = plan(
        &s,
        &[
            ("batch_size", "4"),
            ("columns", "x,s"),
            ("tail_strategy", "pad"),
        ],
    )
    .unwrap();
    assert!(check_append(&pad, &ok)
        .unwrap_err()
        .to_string()
        .contains("option tail_strategy is pad, the dataset has write"));
    let kvp = plan(&s, &[("name_col", "k"), ("columns", "x,s")]).unwrap();
    assert!(check_append(&kvp, &ok)
        .unwrap_err()
        .to_string()
        .contains("this write is in KV mode (option name_col), the dataset is in batch mode"));

    let wrong_dtype = manifest_for(
        &p,
        &[
            ("x", Dtype::F16, Some(vec![3])),
            ("s", Dtype::F64, Some(vec![])),
        ],
    );
    assert!(check_append(&p, &wrong_dtype)
        .unwrap_err()
        .to_string()
        .contains("column 'x' is written as F32, the dataset stores F16"));
    let wrong_shape = manifest_for(
        &p,
        &[
            ("x", Dtype::F32, Some(vec![4])),
            ("s", Dtype::F64, Some(vec![])),
        ],
    );
    assert!(check_append(&p, &wrong_shape)
        .unwrap_err()
        .to_string()
        .contains("column 'x' has sample shape [3], the dataset has [4]"));
    let other_cols = manifest_for(
        &p,
        &[
            ("x", Dtype::F32, Some(vec![3])),
            ("y", Dtype::I64, Some(vec![2])),
        ],
    );
    assert_eq!(
        check_append(&p, &other_cols).unwrap_err().to_string(),
        "cannot append to the existing dataset: the column set differs: columns s are not in the dataset; the dataset's columns y are not written"
    );

    // KV: separator must match, shapes are not compared.
    let kv_ok = manifest_for(
        &kvp,
        &[("x", Dtype::F32, Some(vec![9])), ("s", Dtype::F64, None)],
    );
    check_append(&kvp, &kv_ok).unwrap();
    let kv_sep = plan(
        &s,
        &[("name_col", "k"), ("columns", "x,s"), ("kv_separator", "/")],
    )
    .unwrap();
    assert!(check_append(&kv_sep, &kv_ok)
        .unwrap_err()
        .to_string()
        .contains("option kv_separator is '/', the dataset has '__'"));
}

fn append(
    schema: &str,
    pairs: &[(&str, &str)],
    existing: &Manifest,
) -> Result<WritePlan, PlanError> {
    plan_append(schema, &opts(pairs), false, existing)
}

#[test]
fn an_append_takes_the_settings_its_manifest_records() {
    let s = base();
    // batch: batch_size, tail_strategy and the stored dtypes fill what the append leaves out
    let created = plan(
        &s,
        &[
            ("batch_size", "8"),
            ("tail_strategy", "pad"),
            ("columns", "x,s"),
            ("dtypes", r#"{"x":"F16"}"#),
        ],
    )
    .unwrap();
    let m = manifest_for(
        &created,
        &[
            ("x", Dtype::F16, Some(vec![2])),
            ("s", Dtype::F64, Some(vec![])),
        ],
    );
    let p = append(&s, &[("columns", "x,s")], &m).unwrap();
    assert_eq!(
        p.mode,
        WriteMode::Batch {
            batch_size: 8,
            tail_strategy: TailStrategy::Pad
        }
    );
    assert_eq!(
        p.columns.iter().map(|c| c.dtype).collect::<Vec<_>>(),
        vec![Some(Dtype::F16), Some(Dtype::F64)]
    );
    // the same values given are no conflict; a global dtype equal to every stored one neither
    append(
        &s,
        &[
            ("columns", "x,s"),
            ("batch_size", "8"),
            ("dtypes", r#"{"x":"f16"}"#),
        ],
        &m,
    )
    .unwrap();
    // a value that differs is refused naming the option and both values
    let conflict = |pairs: &[(&str, &str)]| append(&s, pairs, &m).unwrap_err().to_string();
    assert_eq!(
        conflict(&[("columns", "x,s"), ("batch_size", "4")]),
        "cannot append to the existing dataset: option batch_size is 4, the dataset has 8 (an append takes the dataset's batch_size when the option is left out)"
    );
    assert!(conflict(&[("columns", "x,s"), ("tail_strategy", "drop")])
        .contains("option tail_strategy is drop, the dataset has pad"));
    assert!(
        conflict(&[("columns", "x,s"), ("dtypes", r#"{"x":"BF16"}"#)])
            .contains("option dtypes is BF16 for column 'x', the dataset has F16")
    );
    assert!(conflict(&[("columns", "x,s"), ("dtype", "F64")])
        .contains("option dtype is F64 for column 'x', the dataset has F16"));
    assert!(
        conflict(&[("columns", "x,s"), ("shapes", r#"{"x":[1,2]}"#)])
            .contains("option shapes is [1, 2] for column 'x', the dataset has [2]")
    );
    assert!(conflict(&[("columns", "x,s"), ("kv_separator", "/")])
        .contains("option kv_separator does not apply to batch mode"));
    assert!(conflict(&[("columns", "x,s"), ("name_col", "k")])
        .contains("this write is in KV mode (option name_col), the dataset is in batch mode"));

    // a binary column takes the stored sample shape with the dtype (raw bytes carry neither)
    let bin = schema(vec![field("b", json!("binary"))]);
    let bp = plan(
        &bin,
        &[
            ("batch_size", "2"),
            ("dtype", "I16"),
            ("shapes", r#"{"b":[3]}"#),
        ],
    )
    .unwrap();
    let bm = manifest_for(&bp, &[("b", Dtype::I16, Some(vec![3]))]);
    let p = append(&bin, &[], &bm).unwrap();
    assert_eq!(p.columns[0].dtype, Some(Dtype::I16));
    assert_eq!(p.columns[0].sample_shape, Some(vec![3]));
    // other columns keep their own shape (a value is never reshaped unless asked)
    let p = append(&s, &[("columns", "x,s")], &m).unwrap();
    assert!(p.columns.iter().all(|c| c.sample_shape.is_none()));

    // a published-only manifest records no settings: no append
    let mut published = m.clone();
    published.ext = None;
    assert!(
        append(&s, &[("batch_size", "8"), ("columns", "x,s")], &published)
            .unwrap_err()
            .to_string()
            .contains("has only the published fields")
    );
}

#[test]
fn a_kv_append_finds_its_key_column_and_separator() {
    let s = base();
    let created = plan(
        &s,
        &[("name_col", "k"), ("columns", "x,s"), ("kv_separator", "/")],
    )
    .unwrap();
    let m = manifest_for(
        &created,
        &[("x", Dtype::F32, None), ("s", Dtype::F64, None)],
    );
    // k is the one string column that is not a dataset column
    let p = append(&s, &[("columns", "x,s")], &m).unwrap();
    assert!(matches!(
        &p.mode,
        WriteMode::Kv { name_col, kv_separator, .. } if name_col == "k" && kv_separator == "/"
    ));
    // KV-only options alone leave the mode to the dataset
    append(
        &s,
        &[("columns", "x,s"), ("duplicatesStrategy", "lastWin")],
        &m,
    )
    .unwrap();
    let two = schema(vec![
        field("k", json!("string")),
        field("j", json!("string")),
        field("x", arr(json!("float"))),
    ]);
    let m2 = manifest_for(&created, &[("x", Dtype::F32, None)]);
    assert_eq!(
        append(&two, &[], &m2).unwrap_err().to_string(),
        "cannot append to the existing dataset: it is in KV mode and its manifest does not record the key column; the key column is the DataFrame's one string column that is not one of the dataset's columns ('x'), but the DataFrame has 'k', 'j': give option name_col"
    );
    append(&two, &[("name_col", "j"), ("columns", "x")], &m2).unwrap();
    assert!(
        append(&s, &[("columns", "x,s"), ("kv_separator", "__")], &m)
            .unwrap_err()
            .to_string()
            .contains("option kv_separator is '__', the dataset has '/'")
    );
    assert!(append(&s, &[("columns", "x,s"), ("batch_size", "2")], &m)
        .unwrap_err()
        .to_string()
        .contains("this write is in batch mode (option batch_size), the dataset is in KV mode"));
}

#[test]
fn retention_option_is_parsed_or_refused_naming_it() {
    let p = plan(&xs(), &[("batch_size", "1"), ("retention", "2 hours")]).unwrap();
    assert_eq!(p.retention_seconds, Some(7200));
    let p = plan(&xs(), &[("batch_size", "1"), ("retention", "0")]).unwrap();
    assert_eq!(p.retention_seconds, Some(0));
    assert_eq!(
        plan(&xs(), &[("batch_size", "1")])
            .unwrap()
            .retention_seconds,
        None
    );
    for bad in ["-1 days", "a week", "99999999999999999999 seconds"] {
        let e = err(&xs(), &[("batch_size", "1"), ("retention", bad)]).to_string();
        assert!(e.contains("retention") && e.contains(bad), "{e}");
        assert!(e.contains("seconds, minutes, hours or days"), "{e}");
    }
}

#[test]
fn ragged_columns_are_binary_string_and_named_arrays() {
    let s = schema(vec![
        field("tok", arr(json!("integer"))),
        field("emb", arr(arr(json!("float")))),
        field("jpeg", json!("binary")),
        field("txt", json!("string")),
        field("n", json!("long")),
    ]);
    let p = plan(&s, &[("batch_size", "2"), ("ragged", "tok, EMB")]).unwrap();
    let r: Vec<Option<(RaggedElement, Option<Vec<u64>>)>> = p
        .columns
        .iter()
        .map(|c| {
            c.ragged
                .as_ref()
                .map(|r| (r.element, r.inner_shape.clone()))
        })
        .collect();
    assert_eq!(
        r,
        vec![
            Some((RaggedElement::Array, Some(vec![]))),
            Some((RaggedElement::Array, None)),
            Some((RaggedElement::Binary, Some(vec![]))),
            Some((RaggedElement::String, Some(vec![]))),
            None,
        ]
    );
    assert_eq!(p.columns[2].dtype, Some(Dtype::U8));
    assert_eq!(p.columns[3].dtype, Some(Dtype::U8));
    // global dtype applies to arrays, not to the bytes of binary/string columns
    let p = plan(&s, &[("batch_size", "2"), ("dtype", "bf16")]).unwrap();
    assert_eq!(p.columns[0].ragged, None);
    assert_eq!(p.columns[0].dtype, Some(Dtype::Bf16));
    assert_eq!(p.columns[2].dtype, Some(Dtype::U8));
    // a shapes entry keeps a binary column fixed-shape, exactly as before
    let p = plan(
        &s,
        &[
            ("batch_size", "2"),
            ("dtypes", r#"{"jpeg":"F32"}"#),
            ("shapes", r#"{"jpeg":[2]}"#),
        ],
    )
    .unwrap();
    assert_eq!(p.columns[2].ragged, None);
    assert_eq!(p.columns[2].dtype, Some(Dtype::F32));
    let m = msg(&s, &[("batch_size", "2"), ("ragged", "n")]);
    assert!(
        m.starts_with("option ragged: column 'n' has type long;"),
        "{m}"
    );
    let m = msg(&s, &[("batch_size", "2"), ("dtypes", r#"{"jpeg":"F32"}"#)]);
    assert!(
        m.contains("column 'jpeg' is a ragged binary column") && m.contains("F32"),
        "{m}"
    );
    let m = msg(
        &s,
        &[
            ("batch_size", "2"),
            ("ragged", "tok"),
            ("shapes", r#"{"tok":[2]}"#),
        ],
    );
    assert!(
        m.contains("option shapes: column 'tok' is named in option ragged"),
        "{m}"
    );
    let m = msg(&s, &[("name_col", "txt"), ("ragged", "tok")]);
    assert!(m.contains("option ragged does not apply to KV mode"), "{m}");
    let kv = schema(vec![
        field("k", json!("string")),
        field("txt", json!("string")),
    ]);
    let m = msg(&kv, &[("name_col", "k")]);
    assert!(
        m.contains("column 'txt' has type string; string columns are written in batch mode only"),
        "{m}"
    );
}

#[test]
fn ragged_offsets_name_may_not_collide_with_a_column() {
    let s = schema(vec![
        field("tok", arr(json!("integer"))),
        field("tok.offsets", arr(json!("long"))),
    ]);
    assert!(plan(&s, &[("batch_size", "2")]).is_ok());
    assert_eq!(
        msg(&s, &[("batch_size", "2"), ("ragged", "tok")]),
        "ragged column 'tok' stores its row boundaries as tensor 'tok.offsets', which is also the name of written column 'tok.offsets'; rename one (e.g. df.withColumnRenamed) or leave one out with the columns option"
    );
}

#[test]
fn append_inherits_ragged_and_refuses_a_conflict() {
    let s = schema(vec![field("tok", arr(arr(json!("integer"))))]);
    let first = plan(&s, &[("batch_size", "2"), ("ragged", "tok")]).unwrap();
    let mut m = manifest_for(&first, &[("tok", Dtype::I32, None)]);
    m.schema.0[0].1.ragged = Some(safetensors_spark_dataset::manifest::RaggedColumn {
        inner_shape: vec![3],
        element: RaggedElement::Array,
    });
    let p = plan_append(&s, &opts(&[]), false, &m).unwrap();
    let r = p.columns[0].ragged.as_ref().unwrap();
    assert_eq!(r.inner_shape, Some(vec![3]));
    assert_eq!(p.columns[0].dtype, Some(Dtype::I32));
    let e = plan_append(&s, &opts(&[("ragged", "")]), false, &m)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "cannot append to the existing dataset: option ragged is '', which makes column 'tok' fixed-shape, the dataset has column 'tok' ragged (an append takes the dataset's ragged when the option is left out)"
    );
    let e = plan_append(&s, &opts(&[("dtype", "F16")]), false, &m)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("option dtype is F16 for column 'tok', the dataset has I32"),
        "{e}"
    );
}

#[test]
fn checkpoint_interval_is_a_whole_number_from_one_to_the_bound() {
    let p = plan(
        &xs(),
        &[("batch_size", "1"), ("checkpoint_interval", " 7 ")],
    )
    .unwrap();
    assert_eq!(p.checkpoint_interval, Some(7));
    assert_eq!(
        plan(&xs(), &[("batch_size", "1")])
            .unwrap()
            .checkpoint_interval,
        None
    );
    assert_eq!(
        plan(
            &xs(),
            &[("batch_size", "1"), ("checkpoint_interval", "100000")]
        )
        .unwrap()
        .checkpoint_interval,
        Some(100_000)
    );
    for bad in ["0", "-1", "1.5", "x", "100001", ""] {
        let e = err(&xs(), &[("batch_size", "1"), ("checkpoint_interval", bad)]).to_string();
        assert!(
            e.contains("checkpoint_interval") && e.contains("an integer from 1 to 100000"),
            "{bad}: {e}"
        );
    }
}

use super::*;
use crate::write::commit::{index_rows, shard_report_from_header};
use crate::write::plan::plan_write;
use crate::write::{ShardReport, TensorReport};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

static N: AtomicU64 = AtomicU64::new(0);

fn tempdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "st-index-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&d).unwrap();
    d
}

fn shard(file: &str, tensors: Vec<TensorReport>) -> ShardReport {
    ShardReport {
        file: file.into(),
        local_path: String::new(),
        partition: 0,
        shard: 0,
        samples: 1,
        padded_samples: 0,
        bytes: 0,
        tensors,
    }
}

fn t(name: &str, start: u64, key: Option<&str>, column: Option<&str>) -> TensorReport {
    TensorReport {
        name: name.into(),
        dtype: Dtype::Bf16,
        shape: vec![2, 0, 3],
        data_start: start,
        data_end: start + 12,
        sample_key: key.map(String::from),
        column: column.map(String::from),
    }
}

#[test]
fn write_then_read_back_sorted() {
    let dir = tempdir();
    let path = dir.join(crate::dataset::names::index_part_file_name(1));
    let kv = shard(
        "b.safetensors",
        vec![
            t("k2__x", 200, Some("k2"), Some("x")),
            t("k1__x", 100, Some("k1"), Some("x")),
        ],
    );
    let batch = shard(
        "a.safetensors",
        vec![t("x", 80, None, None), t("y", 8, None, None)],
    );
    let rows: Vec<IndexRow> = index_rows(&kv)
        .into_iter()
        .chain(index_rows(&batch))
        .collect();
    assert_eq!(rows[2].column, "x"); // batch: the tensor name
    assert_eq!(write_index(&path, rows.clone()).unwrap(), 4);
    let back = read_index(&path).unwrap();
    let mut expected = rows;
    expected.sort_by(|a, b| (&a.file_name, a.data_start).cmp(&(&b.file_name, b.data_start)));
    assert_eq!(back, expected);
    assert_eq!(
        back.iter()
            .map(|r| r.tensor_key.as_str())
            .collect::<Vec<_>>(),
        ["y", "x", "k1__x", "k2__x"]
    );
    // One file, no temporaries.
    assert!(path.is_file());
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
    // Overwrite, and an empty index.
    write_index(&path, Vec::new()).unwrap();
    assert!(read_index(&path).unwrap().is_empty());
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn many_rows_span_batches() {
    let dir = tempdir();
    let path = dir.join(crate::dataset::names::index_part_file_name(1));
    let rows: Vec<IndexRow> = (0..(BATCH_ROWS as u64 * 2 + 5))
        .map(|i| IndexRow {
            tensor_key: format!("k{i}__v"),
            file_name: "f.safetensors".into(),
            dtype: Dtype::F32,
            shape: vec![i % 7],
            data_start: i * 4,
            data_end: i * 4 + 4,
            sample_key: Some(format!("k{i}")),
            column: "v".into(),
        })
        .collect();
    write_index(&path, rows.clone()).unwrap();
    assert_eq!(read_index(&path).unwrap(), rows);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn schema_is_the_spec_one() {
    let s = index_schema();
    let cols: Vec<(&str, bool)> = s
        .fields()
        .iter()
        .map(|f| (f.name().as_str(), f.is_nullable()))
        .collect();
    assert_eq!(
        cols,
        [
            ("tensor_key", false),
            ("file_name", false),
            ("dtype", false),
            ("shape", false),
            ("data_start", false),
            ("data_end", false),
            ("sample_key", true),
            ("column", false),
        ]
    );
}

#[test]
fn errors() {
    let dir = tempdir();
    let path = dir.join(crate::dataset::names::index_part_file_name(1));
    let mut row = index_rows(&shard("a.safetensors", vec![t("x", 0, None, None)])).remove(0);
    row.data_end = u64::MAX;
    assert!(matches!(
        write_index(&path, vec![row]),
        Err(IndexError::BadRow { .. })
    ));
    assert!(!path.exists());
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    fs::write(&path, b"not parquet").unwrap();
    assert!(matches!(read_index(&path), Err(IndexError::Parquet { .. })));
    assert!(matches!(
        read_index(&dir.join("missing")),
        Err(IndexError::Io { .. })
    ));
    // A Parquet file with other columns.
    let other = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, false)]));
    let batch = RecordBatch::try_new(
        other.clone(),
        vec![Arc::new(arrow_array::Int64Array::from(vec![1])) as ArrayRef],
    )
    .unwrap();
    let mut w = ArrowWriter::try_new(File::create(&path).unwrap(), other, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    assert!(matches!(read_index(&path), Err(IndexError::Invalid { .. })));
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn tampered_file_names_in_an_index_are_refused() {
    let dir = tempdir();
    let path = dir.join(crate::dataset::names::index_part_file_name(3));
    for tampered in [
        "../victim/x.safetensors",
        "/abs.safetensors",
        "s3://b/x.safetensors",
        "a\0.safetensors",
    ] {
        let mut row = index_rows(&shard("a.safetensors", vec![t("x", 0, None, None)])).remove(0);
        row.file_name = tampered.replace("\\0", "\0");
        write_index(&path, vec![row]).unwrap();
        let e = read_index(&path).unwrap_err().to_string();
        assert!(e.contains("is not a shard file name"), "{tampered}: {e}");
    }
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn earlier_kv_shard_is_rebuilt_from_its_header_with_keys_and_columns() {
    let schema = r#"{"type":"struct","fields":[
        {"name":"k","type":"string","nullable":true,"metadata":{}},
        {"name":"v","type":{"type":"array","elementType":"float","containsNull":true},"nullable":true,"metadata":{}},
        {"name":"x_v","type":"long","nullable":true,"metadata":{}}]}"#;
    let options = BTreeMap::from([("name_col".to_string(), "k".to_string())]);
    let plan = plan_write(schema, &options, false).unwrap();
    let file = "part-00003-0001-0f0e0d0c-0b0a-0908-0706-050403020100.safetensors";
    let json = r#"{"__metadata__":{"safetensors_spark.samples":"2"},"a__v":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a__x_v":{"dtype":"I64","shape":[],"data_offsets":[4,12]},"b_x__v":{"dtype":"F32","shape":[0],"data_offsets":[12,12]}}"#;
    let header = crate::header::parse_header(json.as_bytes(), 8 + json.len() as u64 + 12).unwrap();
    let report = shard_report_from_header(file, &header, &plan);
    assert_eq!((report.partition, report.shard, report.samples), (3, 1, 2));
    let got: Vec<_> = report
        .tensors
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.sample_key.as_deref(),
                t.column.as_deref(),
                t.data_start,
            )
        })
        .collect();
    let start = 8 + json.len() as u64;
    assert_eq!(
        got,
        [
            ("a__v", Some("a"), Some("v"), start),
            ("a__x_v", Some("a"), Some("x_v"), start + 4),
            ("b_x__v", Some("b_x"), Some("v"), start + 12),
        ]
    );
}

//! Tests of the tensor index (`safetensors_spark_dataset::index`) with rows built from the write
//! path's shard reports, as the commit builds them.
use crate::write::commit::{index_rows, shard_report_from_header};
use crate::write::plan::plan_write;
use crate::write::{SealedTensor, ShardReport};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use safetensors_spark_dataset::index::*;
use safetensors_spark_dataset::names;
use safetensors_spark_format::Dtype;
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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

fn shard(file: &str, tensors: Vec<SealedTensor>) -> ShardReport {
    ShardReport {
        file: file.into(),
        local_path: String::new(),
        partition: 0,
        shard: 0,
        samples: 1,
        padded_samples: 0,
        bytes: 0,
        crc32c: None,
        tensors,
        num_tensors: None,
    }
}

fn t(name: &str, start: u64, key: Option<&str>, column: Option<&str>) -> SealedTensor {
    SealedTensor {
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
    let path = dir.join(names::index_part_file_name(1));
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
    let path = dir.join(names::index_part_file_name(1));
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
    let path = dir.join(names::index_part_file_name(1));
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
    let path = dir.join(names::index_part_file_name(3));
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
    let header =
        safetensors_spark_format::header::parse_header(json.as_bytes(), 8 + json.len() as u64 + 12)
            .unwrap();
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

/// `n` KV rows `k{i:08}__x` of one shard, in a scrambled order.
fn kv_rows(file: &str, n: u64) -> Vec<IndexRow> {
    (0..n)
        .map(|i| (i * 7919) % n)
        .map(|i| IndexRow {
            tensor_key: format!("k{i:08}__x"),
            file_name: file.into(),
            dtype: Dtype::F32,
            shape: vec![8],
            data_start: 100 + 32 * i,
            data_end: 132 + 32 * i,
            sample_key: Some(format!("k{i:08}")),
            column: "x".into(),
        })
        .collect()
}

#[test]
fn a_shard_part_is_sorted_by_name_in_small_row_groups_with_name_statistics() {
    let dir = tempdir();
    let path = dir.join("p.parquet");
    let n = 3 * PART_ROW_GROUP_ROWS as u64 + 5;
    assert_eq!(
        write_index_part(&path, kv_rows("s.safetensors", n)).unwrap(),
        n
    );
    let back = read_index(&path).unwrap();
    assert_eq!(back.len() as u64, n);
    assert!(back.windows(2).all(|w| w[0].tensor_key < w[1].tensor_key));
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
    let md = builder.metadata();
    assert_eq!(md.num_row_groups(), 4);
    let rg = md.row_group(1);
    match rg.column(0).statistics() {
        Some(parquet::file::statistics::Statistics::ByteArray(s)) => {
            assert_eq!(s.min_opt().unwrap().data(), b"k00008192__x");
            assert_eq!(s.max_opt().unwrap().data(), b"k00016383__x");
        }
        other => panic!("no tensor_key statistics: {other:?}"),
    }
    assert!(rg.column(6).statistics().is_some(), "sample_key statistics");
    assert!(rg.column(4).statistics().is_none(), "data_start has none");
}

#[test]
fn a_shard_part_refuses_rows_of_two_shards_and_a_name_twice() {
    let dir = tempdir();
    let mut rows = kv_rows("a.safetensors", 3);
    rows[1].file_name = "b.safetensors".into();
    let e = write_index_part(&dir.join("p.parquet"), rows).unwrap_err();
    assert!(
        e.to_string().contains("also has rows of a.safetensors"),
        "{e}"
    );
    let mut rows = kv_rows("a.safetensors", 3);
    rows[2].tensor_key = rows[0].tensor_key.clone();
    let e = write_index_part(&dir.join("p.parquet"), rows).unwrap_err();
    assert!(
        e.to_string().contains("two rows for the same tensor"),
        "{e}"
    );
    assert!(!dir.join("p.parquet").exists());
}

#[test]
fn row_group_selection_by_name_statistics() {
    let dir = tempdir();
    let path = dir.join("p.parquet");
    let n = 4 * PART_ROW_GROUP_ROWS as u64;
    write_index_part(&path, kv_rows("s.safetensors", n)).unwrap();
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
    let md = builder.metadata();
    let pick = |exact: Vec<&str>, prefixes: Vec<&str>| {
        row_groups_for_keys(md, &KeyFilter { exact, prefixes })
    };
    assert_eq!(pick(vec![], vec![]), vec![0, 1, 2, 3]);
    assert_eq!(pick(vec!["k00000000__x"], vec![]), vec![0]);
    assert_eq!(
        pick(vec!["k00020000__x", "k00030000__x"], vec![]),
        vec![2, 3]
    );
    assert_eq!(pick(vec!["a"], vec![]), Vec::<usize>::new());
    assert_eq!(pick(vec!["z"], vec![]), Vec::<usize>::new());
    // a prefix spans the groups its names can be in
    assert_eq!(pick(vec![], vec!["k0001"]), vec![1, 2]);
    assert_eq!(pick(vec![], vec!["k00009"]), vec![1]);
    assert_eq!(pick(vec![], vec!["k"]), vec![0, 1, 2, 3]);
    assert_eq!(pick(vec![], vec!["k00008191"]), vec![0]);
    assert_eq!(pick(vec![], vec!["l"]), Vec::<usize>::new());
}

#[test]
fn a_lookup_reads_the_footer_and_one_row_group() {
    let dir = tempdir();
    let path = dir.join("p.parquet");
    let n = 16 * PART_ROW_GROUP_ROWS as u64;
    write_index_part(&path, kv_rows("s.safetensors", n)).unwrap();
    let size = fs::metadata(&path).unwrap().len();
    let file = CountingFile::new(File::open(&path).unwrap());
    let read = file.counter();
    let key = "k00100000__x";
    let filter = KeyFilter {
        exact: vec![key],
        prefixes: vec![],
    };
    let (total, rows) = lookup_index_part(file, &path, &filter, |r| r.tensor_key == key).unwrap();
    assert_eq!(total, n);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].data_start, 100 + 32 * 100_000);
    let read = read.load(Ordering::Relaxed);
    // the footer and one of 16 row groups
    assert!(read * 8 < size, "read {read} of {size} bytes");
    // without a filter: everything
    let file = CountingFile::new(File::open(&path).unwrap());
    let all = file.counter();
    let (_, rows) = lookup_index_part(file, &path, &KeyFilter::default(), |_| true).unwrap();
    assert_eq!(rows.len() as u64, n);
    assert!(all.load(Ordering::Relaxed) * 10 > size * 9);
}

#[test]
fn a_sparse_lookup_asks_for_the_footer_then_the_row_group_only() {
    let dir = tempdir();
    let path = dir.join("p.parquet");
    let n = 16 * PART_ROW_GROUP_ROWS as u64;
    write_index_part(&path, kv_rows("s.safetensors", n)).unwrap();
    let whole = bytes::Bytes::from(fs::read(&path).unwrap());
    let len = whole.len() as u64;
    let key = "k00050000__x";
    let filter = KeyFilter {
        exact: vec![key],
        prefixes: vec![],
    };
    let mut file = SparseFile::new(len);
    let mut rounds = 0;
    let rows = loop {
        rounds += 1;
        assert!(rounds <= 4);
        match lookup_sparse(&file, &path, &filter, |r| r.tensor_key == key).unwrap() {
            SparseLookup::NeedRanges(ranges) => {
                for (s, l) in ranges {
                    file.add(s, whole.slice(s as usize..(s + l) as usize));
                }
            }
            SparseLookup::Ready(total, rows) => {
                assert_eq!(total, n);
                break rows;
            }
        }
    };
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].tensor_key, key);
    assert!(
        file.bytes_held() * 8 < len,
        "{} of {len}",
        file.bytes_held()
    );
    // an absent key outside every group's range needs the footer only
    let mut file = SparseFile::new(len);
    let tail = len - 8;
    file.add(tail, whole.slice(tail as usize..));
    let filter = KeyFilter {
        exact: vec!["zzz"],
        prefixes: vec![],
    };
    let SparseLookup::NeedRanges(r) = lookup_sparse(&file, &path, &filter, |_| true).unwrap()
    else {
        panic!("footer needed");
    };
    file.add(
        r[0].0,
        whole.slice(r[0].0 as usize..(r[0].0 + r[0].1) as usize),
    );
    assert_eq!(
        lookup_sparse(&file, &path, &filter, |_| true).unwrap(),
        SparseLookup::Ready(n, Vec::new())
    );
    // not Parquet
    let mut junk = SparseFile::new(100);
    junk.add(0, bytes::Bytes::from(vec![0u8; 100]));
    let e = lookup_sparse(&junk, &path, &filter, |_| true).unwrap_err();
    assert!(e.to_string().contains("footer magic"), "{e}");
}

#[test]
fn a_key_run_streams_a_part_in_name_order_and_refuses_an_unsorted_one() {
    let dir = tempdir();
    let path = dir.join("p.parquet");
    let n = 2 * PART_ROW_GROUP_ROWS as u64 + 3;
    write_index_part(&path, kv_rows("s.safetensors", n)).unwrap();
    let mut run = KeyRun::open(&path).unwrap();
    let mut count = 0u64;
    while let Some((name, key)) = run.current() {
        assert_eq!(name, format!("k{count:08}__x"));
        assert_eq!(key, Some(format!("k{count:08}").as_str()));
        count += 1;
        run.advance().unwrap();
    }
    assert_eq!(count, n);
    // a part in another order (the whole-dataset index writer sorts by data_start)
    let unsorted = dir.join("u.parquet");
    let mut rows = kv_rows("s.safetensors", 10);
    rows.reverse();
    for (i, r) in rows.iter_mut().enumerate() {
        r.data_start = i as u64;
    }
    write_index(&unsorted, rows).unwrap();
    let mut run = KeyRun::open(&unsorted).unwrap();
    let e = loop {
        if let Err(e) = run.advance() {
            break e;
        }
        assert!(run.current().is_some(), "the unsorted part was accepted");
    };
    assert!(e.to_string().contains("not sorted by tensor_key"), "{e}");
}

#[test]
fn a_shard_part_name_is_the_shard_name_with_parquet() {
    use names::shard_index_part_file_name as part;
    assert_eq!(
        part("part-00001-0002-abc.safetensors").as_deref(),
        Some("part-00001-0002-abc.parquet")
    );
    assert_eq!(part("../x.safetensors"), None);
    assert_eq!(part("x.bin"), None);
}

#[test]
fn streamed_part_equals_the_sorted_part_and_refuses_unsorted_rows() {
    let dir = tempdir();
    // more rows than a row group, keys in name order
    let names: Vec<String> = (0..(PART_ROW_GROUP_ROWS + 5))
        .map(|i| format!("k{i:06}__x"))
        .collect();
    let tensors = |names: &[String]| -> Vec<SealedTensor> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| t(n, 100 + 12 * i as u64, Some(&n[..7]), Some("x")))
            .collect()
    };
    let s = shard("s.safetensors", tensors(&names));
    let (streamed, whole) = (dir.join("streamed.parquet"), dir.join("whole.parquet"));
    let n =
        write_index_part_streamed(&streamed, index_rows(&s).into_iter().map(Ok::<_, ()>)).unwrap();
    assert_eq!(n, names.len() as u64);
    write_index_part(&whole, index_rows(&s)).unwrap();
    assert_eq!(read_index(&streamed).unwrap(), read_index(&whole).unwrap());

    // a name out of order (or twice) is an error naming it, and leaves nothing
    let mut swapped = names.clone();
    swapped.swap(3, 4);
    let bad = dir.join("bad.parquet");
    let rows = index_rows(&shard("s.safetensors", tensors(&swapped)));
    match write_index_part_streamed(&bad, rows.into_iter().map(Ok::<_, ()>)) {
        Err(Ok(IndexError::BadRow {
            tensor, problem, ..
        })) => {
            assert_eq!(tensor, names[3]);
            assert!(problem.contains("sorted"), "{problem}");
        }
        other => panic!("expected a BadRow error, got {other:?}"),
    }
    assert!(!bad.exists() && !safetensors_spark_format::file::temp_sibling(&bad).exists());
    // the caller's own error comes back as it was
    let failing = vec![Ok(index_rows(&s).remove(0)), Err("boom")];
    assert!(matches!(
        write_index_part_streamed(&bad, failing),
        Err(Err("boom"))
    ));
    assert!(!bad.exists());
}

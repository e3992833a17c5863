#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::type_complexity
)]

use super::*;
use crate::write::{ColumnPlan, DuplicatesStrategy, InputKind, SparkNumeric};
use arrow_array::builder::{NullBufferBuilder, OffsetBufferBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int32Type, Int64Type, Int8Type};
use arrow_array::{
    ArrayRef, BinaryArray, Float32Array, Float64Array, Int32Array, Int64Array, Int8Array,
    ListArray, StringArray,
};
use arrow_schema::{Field, Fields};
use safetensors_spark_format::file::SafetensorsFile;
use safetensors_spark_format::Dtype;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static DIRS: AtomicU64 = AtomicU64::new(0);

fn tmpdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "st-task-test-{tag}-{}-{}",
        std::process::id(),
        DIRS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn col(name: &str, input: InputKind, dtype: Option<Dtype>, shape: Option<Vec<u64>>) -> ColumnPlan {
    ColumnPlan {
        name: name.into(),
        field_index: 0,
        input,
        dtype,
        sample_shape: shape,
        ragged: None,
    }
}

fn arr(element: SparkNumeric, depth: u32) -> InputKind {
    InputKind::NumericArray { element, depth }
}

const WID: &str = "0b7c6f4e-1111-2222-3333-444455556666";

fn plan_batch(columns: Vec<ColumnPlan>, batch_size: u64, tail: TailStrategy) -> WritePlan {
    WritePlan {
        write_id: WID.into(),
        mode: WriteMode::Batch {
            batch_size,
            tail_strategy: tail,
        },
        columns,
        metadata: BTreeMap::from([("owner".to_string(), "tests".to_string())]),
        generate_index: false,
        retention_seconds: None,
        checkpoint_interval: None,
    }
}

fn plan_kv(columns: Vec<ColumnPlan>, target: u64, duplicates: DuplicatesStrategy) -> WritePlan {
    WritePlan {
        write_id: WID.into(),
        mode: WriteMode::Kv {
            name_col: "id".into(),
            name_field_index: 0,
            kv_separator: "__".into(),
            target_shard_bytes: target,
            duplicates,
        },
        columns,
        metadata: BTreeMap::new(),
        generate_index: false,
        retention_seconds: None,
        checkpoint_interval: None,
    }
}

fn batch(children: Vec<(&str, ArrayRef)>) -> StructArray {
    let fields: Vec<(Arc<Field>, ArrayRef)> = children
        .into_iter()
        .map(|(n, a)| (Arc::new(Field::new(n, a.data_type().clone(), true)), a))
        .collect();
    StructArray::from(fields)
}

fn f32_rows(rows: &[Option<Vec<Option<f32>>>]) -> ArrayRef {
    Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(
        rows.iter().cloned(),
    ))
}

fn f32_dense(rows: &[&[f32]]) -> ArrayRef {
    f32_rows(
        &rows
            .iter()
            .map(|r| Some(r.iter().map(|&v| Some(v)).collect()))
            .collect::<Vec<_>>(),
    )
}

/// Wraps `inner` in one more List level with the given offsets.
fn wrap(inner: ArrayRef, offsets: &[i32]) -> ArrayRef {
    let mut b = OffsetBufferBuilder::<i32>::new(offsets.len());
    for w in offsets.windows(2) {
        b.push_length((w[1] - w[0]) as usize);
    }
    Arc::new(ListArray::new(
        Arc::new(Field::new("element", inner.data_type().clone(), true)),
        b.finish(),
        inner,
        None,
    ))
}

fn le_f32(b: impl AsRef<[u8]>) -> Vec<f32> {
    b.as_ref()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn le_f64(b: impl AsRef<[u8]>) -> Vec<f64> {
    b.as_ref()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn open(report: &ShardReport) -> SafetensorsFile {
    SafetensorsFile::open(&report.local_path).unwrap()
}

/// Finishes `w` and reads its report file back (then deletes it, so directory listings show
/// only shards).
fn finish(w: TaskWriter) -> (Vec<ShardReport>, TaskReport) {
    let done = w.finish().unwrap();
    assert_eq!(
        done.report_path.file_name().unwrap().to_str().unwrap(),
        done.report_file
    );
    assert!(done.report_file.starts_with("task-") && done.report_file.ends_with(".report.json"));
    let mut report = read_report(&done.report_path).unwrap();
    fs::remove_file(&done.report_path).unwrap();
    // Every KV shard has an index part (its tensors; the report carries their count only),
    // named after the shard, next to it: the tensors come back from it, in data order.
    let kv_or_indexed =
        !done.index_parts.is_empty() || report.shards.iter().any(|s| s.num_tensors.is_some());
    if kv_or_indexed {
        assert_eq!(done.index_parts.len(), report.shards.len());
    }
    for s in report.shards.iter_mut().filter(|_| kv_or_indexed) {
        let (_, name, path) = done
            .index_parts
            .iter()
            .find(|(shard, _, _)| *shard == s.file)
            .unwrap_or_else(|| panic!("no index part for {}", s.file));
        assert_eq!(
            Some(name.clone()),
            safetensors_spark_dataset::names::shard_index_part_file_name(&s.file)
        );
        if let Some(n) = s.num_tensors.take() {
            assert!(s.tensors.is_empty());
            let mut rows = safetensors_spark_dataset::index::read_index(path).unwrap();
            assert_eq!(rows.len() as u64, n);
            assert!(rows.windows(2).all(|w| w[0].tensor_key < w[1].tensor_key));
            rows.sort_by_key(|r| r.data_start);
            s.tensors = rows
                .into_iter()
                .map(|r| SealedTensor {
                    name: r.tensor_key,
                    dtype: r.dtype,
                    shape: r.shape,
                    data_start: r.data_start,
                    data_end: r.data_end,
                    sample_key: r.sample_key,
                    column: Some(r.column),
                })
                .collect();
        }
        fs::remove_file(path).unwrap();
    }
    (done.sealed, report)
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn err_of<T>(r: Result<T, WriteError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

/// Waits until every shard handed to the sealer is in place and returns those not reported yet
/// (what the next `write_batch` would report first).
fn settle(w: &mut TaskWriter) -> Vec<ShardReport> {
    w.sealer.wait().unwrap();
    w.sealer.take_ready().unwrap()
}

/// Checks that the shards reported by a task's calls (in call order) are the task's shards,
/// each exactly once, in sealing order, and that each is in place with its reported size.
fn assert_reported_once(calls: &[&[ShardReport]], report: &TaskReport) {
    let reported: Vec<&str> = calls
        .iter()
        .flat_map(|c| c.iter().map(|s| s.file.as_str()))
        .collect();
    let shards: Vec<&str> = report.shards.iter().map(|s| s.file.as_str()).collect();
    assert_eq!(reported, shards);
    for s in calls.iter().flat_map(|c| c.iter()) {
        assert_eq!(fs::metadata(&s.local_path).unwrap().len(), s.bytes);
    }
}

/// Writes `batches` and returns the error message of the first failing call.
fn batch_error(plan: WritePlan, batches: &[StructArray]) -> String {
    let dir = tmpdir("err");
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    for b in batches {
        if let Err(e) = w.write_batch(b) {
            assert!(matches!(w.write_batch(b), Err(WriteError::Failed)));
            w.abort();
            assert!(names_in(&dir).is_empty());
            return e.to_string();
        }
    }
    let msg = err_of(w.finish());
    let _ = fs::remove_dir_all(dir);
    msg
}

// ---------------------------------------------------------------- batch mode

#[test]
fn batch_shapes_values_offsets_and_metadata() {
    let dir = tmpdir("batch");
    let plan = plan_batch(
        vec![col(
            "x",
            arr(SparkNumeric::Float, 1),
            Some(Dtype::F32),
            None,
        )],
        2,
        TailStrategy::Write,
    );
    let mut w = TaskWriter::open(plan, 7, dir.clone()).unwrap();
    let b1 = batch(vec![(
        "x",
        f32_dense(&[&[1., 2., 3.], &[4., 5., 6.], &[7., 8., 9.]]),
    )]);
    // b1 fills shard 0, b2 shard 1; each is reported once it is in place (maybe by a later
    // call), the tail shard by finish.
    let sealed = w.write_batch(&b1).unwrap();
    assert!(sealed.len() <= 1);
    let b2 = batch(vec![(
        "x",
        f32_dense(&[&[10., 11., 12.], &[13., 14., 15.]]),
    )]);
    let sealed2 = w.write_batch(&b2).unwrap();
    assert!(sealed.len() + sealed2.len() <= 2);
    let (last, report) = finish(w);
    assert!(!last.is_empty());
    assert_eq!(report.shards.len(), 3);
    assert_reported_once(&[&sealed, &sealed2, &last], &report);
    assert_eq!(report.partition, 7);
    assert_eq!(report.dropped_samples, 0);
    assert_eq!(
        report.columns["x"],
        ColumnReport {
            dtype: Dtype::F32,
            sample_shape: Some(vec![3]),
            inner_shape: None
        }
    );
    let expected = [
        (vec![2, 3], vec![1., 2., 3., 4., 5., 6.]),
        (vec![2, 3], vec![7., 8., 9., 10., 11., 12.]),
        (vec![1, 3], vec![13., 14., 15.]),
    ];
    for (i, (s, (shape, values))) in report.shards.iter().zip(expected).enumerate() {
        assert_eq!(s.shard, i as u32);
        assert_eq!(s.file, shard_file_name(7, i as u32, WID));
        assert_eq!(s.file, format!("part-00007-000{i}-{WID}.safetensors"));
        assert_eq!(s.samples, shape[0]);
        assert_eq!(s.padded_samples, 0);
        let f = open(s);
        let (info, data) = f.tensor("x").unwrap();
        assert_eq!(info.shape, shape);
        assert_eq!(le_f32(&data), values);
        assert_eq!(s.bytes, fs::metadata(&s.local_path).unwrap().len());
        let t = &s.tensors[0];
        assert_eq!((t.name.as_str(), t.dtype), ("x", Dtype::F32));
        assert_eq!(t.shape, shape);
        let raw = fs::read(&s.local_path).unwrap();
        assert_eq!(&raw[t.data_start as usize..t.data_end as usize], &data[..]);
        assert_eq!(t.sample_key, None);
        let meta = f.header().metadata.clone().unwrap();
        assert_eq!(
            meta,
            BTreeMap::from([
                ("owner".to_string(), "tests".to_string()),
                ("safetensors_spark.format_version".into(), "1".into()),
                ("safetensors_spark.layout".into(), "batch".into()),
                ("safetensors_spark.write_id".into(), WID.into()),
                ("safetensors_spark.samples".into(), shape[0].to_string()),
                ("safetensors_spark.padded_samples".into(), "0".into()),
            ])
        );
    }
    // Only the shards: no temporaries.
    assert_eq!(names_in(&dir).len(), 3);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn batch_tail_drop() {
    let dir = tmpdir("drop");
    let plan = plan_batch(
        vec![col(
            "x",
            arr(SparkNumeric::Float, 1),
            Some(Dtype::F32),
            None,
        )],
        2,
        TailStrategy::Drop,
    );
    let mut w = TaskWriter::open(plan.clone(), 0, dir.clone()).unwrap();
    let sealed = w
        .write_batch(&batch(vec![("x", f32_dense(&[&[1.], &[2.], &[3.]]))]))
        .unwrap();
    let (last, report) = finish(w);
    assert_eq!(report.shards.len(), 1);
    assert_reported_once(&[&sealed, &last], &report);
    assert_eq!(report.dropped_samples, 1);
    assert_eq!(names_in(&dir).len(), 1);
    // A partition with fewer rows than the batch size writes no shard.
    let dir2 = tmpdir("drop2");
    let mut w = TaskWriter::open(plan, 1, dir2.clone()).unwrap();
    w.write_batch(&batch(vec![("x", f32_dense(&[&[1.]]))]))
        .unwrap();
    let (last, report) = finish(w);
    assert!(last.is_empty() && report.shards.is_empty());
    assert_eq!(report.dropped_samples, 1);
    assert!(names_in(&dir2).is_empty());
    fs::remove_dir_all(dir).unwrap();
    fs::remove_dir_all(dir2).unwrap();
}

#[test]
fn batch_tail_pad_with_zero_rows() {
    let dir = tmpdir("pad");
    let plan = plan_batch(
        vec![
            col("x", arr(SparkNumeric::Float, 1), Some(Dtype::F32), None),
            col(
                "y",
                InputKind::Scalar {
                    element: SparkNumeric::Long,
                },
                Some(Dtype::I64),
                None,
            ),
        ],
        4,
        TailStrategy::Pad,
    );
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    let b = batch(vec![
        (
            "x",
            f32_dense(&[&[1., 1.], &[2., 2.], &[3., 3.], &[4., 4.], &[5., 5.]]),
        ),
        ("y", Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5]))),
    ]);
    let sealed = w.write_batch(&b).unwrap();
    assert!(sealed.len() <= 1);
    let (last, report) = finish(w);
    assert_reported_once(&[&sealed, &last], &report);
    let s = &report.shards[1];
    assert_eq!((s.samples, s.padded_samples), (1, 3));
    let f = open(s);
    let (info, x) = f.tensor("x").unwrap();
    assert_eq!(info.shape, vec![4, 2]);
    assert_eq!(le_f32(x), vec![5., 5., 0., 0., 0., 0., 0., 0.]);
    let (info, y) = f.tensor("y").unwrap();
    assert_eq!(info.shape, vec![4]);
    assert_eq!(&y[..8], &5i64.to_le_bytes());
    assert!(y[8..].iter().all(|&b| b == 0));
    let meta = f.header().metadata.clone().unwrap();
    assert_eq!(meta["safetensors_spark.samples"], "1");
    assert_eq!(meta["safetensors_spark.padded_samples"], "3");
    assert_eq!(report.dropped_samples, 0);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn nested_rank_2_and_3() {
    let dir = tmpdir("nested");
    let plan = plan_batch(
        vec![
            col("m", arr(SparkNumeric::Double, 2), Some(Dtype::F64), None),
            col("c", arr(SparkNumeric::Int, 3), Some(Dtype::I32), None),
        ],
        10,
        TailStrategy::Write,
    );
    // m: two rows of 2x3
    let leaf: ArrayRef = Arc::new(Float64Array::from_iter_values((0..12).map(f64::from)));
    let m = wrap(wrap(leaf, &[0, 3, 6, 9, 12]), &[0, 2, 4]);
    // c: two rows of 2x1x2
    let leaf: ArrayRef = Arc::new(Int32Array::from_iter_values(0..8));
    let c = wrap(
        wrap(wrap(leaf, &[0, 2, 4, 6, 8]), &[0, 1, 2, 3, 4]),
        &[0, 2, 4],
    );
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    w.write_batch(&batch(vec![("m", m), ("c", c)])).unwrap();
    let (_, report) = finish(w);
    let f = open(&report.shards[0]);
    let (info, data) = f.tensor("m").unwrap();
    assert_eq!(info.shape, vec![2, 2, 3]);
    assert_eq!(le_f64(data), (0..12).map(f64::from).collect::<Vec<_>>());
    let (info, data) = f.tensor("c").unwrap();
    assert_eq!(info.shape, vec![2, 2, 1, 2]);
    let ints: Vec<i32> = data
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(ints, (0..8).collect::<Vec<_>>());
    assert_eq!(report.columns["c"].sample_shape, Some(vec![2, 1, 2]));
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn ragged_and_shape_mismatch_errors_name_the_row() {
    let plan = plan_batch(
        vec![col(
            "x",
            arr(SparkNumeric::Double, 2),
            Some(Dtype::F64),
            None,
        )],
        10,
        TailStrategy::Write,
    );
    let leaf: ArrayRef = Arc::new(Float64Array::from_iter_values((0..11).map(f64::from)));
    // row 0: [[0,1],[2,3]], row 1: [[4,5,6],[7,8]] (ragged)
    let m = wrap(wrap(leaf, &[0, 2, 4, 7, 9]), &[0, 2, 4]);
    assert_eq!(
        batch_error(plan.clone(), &[batch(vec![("x", m)])]),
        "column 'x', row 1: ragged nested array: inner lengths 3 and 2; name the column in option ragged to store rows of different lengths"
    );
    // Shape differs in a later batch.
    let plan1 = plan_batch(
        vec![col(
            "x",
            arr(SparkNumeric::Float, 1),
            Some(Dtype::F32),
            None,
        )],
        10,
        TailStrategy::Write,
    );
    let msg = batch_error(
        plan1,
        &[
            batch(vec![("x", f32_dense(&[&[1f32, 2., 3., 4.][..]; 17]))]),
            batch(vec![("x", f32_dense(&[&[1., 2., 3.]]))]),
        ],
    );
    assert_eq!(
        msg,
        "column 'x', row 17: sample shape [3] differs from [4] of earlier rows; name the column in option ragged to store rows of different lengths"
    );
}

#[test]
fn null_value_and_null_element() {
    let plan = plan_batch(
        vec![col(
            "x",
            arr(SparkNumeric::Float, 1),
            Some(Dtype::F32),
            None,
        )],
        10,
        TailStrategy::Write,
    );
    let rows = vec![
        Some(vec![Some(1.), Some(2.), Some(3.)]),
        Some(vec![Some(1.), Some(2.), Some(3.)]),
        Some(vec![Some(1.), Some(2.), Some(3.)]),
        None,
    ];
    assert_eq!(
        batch_error(plan.clone(), &[batch(vec![("x", f32_rows(&rows))])]),
        "column 'x', row 3: null value"
    );
    let rows = vec![
        Some(vec![Some(1.), Some(2.), Some(3.)]),
        Some(vec![Some(1.), Some(2.), None]),
    ];
    assert_eq!(
        batch_error(plan, &[batch(vec![("x", f32_rows(&rows))])]),
        "column 'x', row 1: null element at index 2"
    );
    let plan = plan_batch(
        vec![col(
            "s",
            InputKind::Scalar {
                element: SparkNumeric::Int,
            },
            Some(Dtype::I32),
            None,
        )],
        10,
        TailStrategy::Write,
    );
    assert_eq!(
        batch_error(
            plan,
            &[batch(vec![(
                "s",
                Arc::new(Int32Array::from(vec![Some(1), None]))
            )])]
        ),
        "column 's', row 1: null value"
    );
}

#[test]
fn scalar_columns_with_conversion() {
    let dir = tmpdir("scalar");
    let plan = plan_batch(
        vec![
            col(
                "label",
                InputKind::Scalar {
                    element: SparkNumeric::Long,
                },
                Some(Dtype::U8),
                None,
            ),
            col(
                "w",
                InputKind::Scalar {
                    element: SparkNumeric::Double,
                },
                Some(Dtype::F32),
                None,
            ),
        ],
        3,
        TailStrategy::Write,
    );
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    w.write_batch(&batch(vec![
        ("label", Arc::new(Int64Array::from(vec![1, 2, 255]))),
        ("w", Arc::new(Float64Array::from(vec![0.5, 1.5, -2.0]))),
    ]))
    .unwrap();
    let (_, report) = finish(w);
    let f = open(&report.shards[0]);
    let (info, label) = f.tensor("label").unwrap();
    assert_eq!((info.dtype, info.shape.clone()), (Dtype::U8, vec![3]));
    assert_eq!(label, &[1, 2, 255]);
    assert_eq!(le_f32(f.tensor("w").unwrap().1), vec![0.5, 1.5, -2.0]);
    assert_eq!(report.columns["label"].sample_shape, Some(vec![]));
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn conversion_errors_name_column_and_row() {
    let plan = plan_batch(
        vec![col("x", arr(SparkNumeric::Int, 1), Some(Dtype::U8), None)],
        2,
        TailStrategy::Write,
    );
    let list = |rows: Vec<Vec<i32>>| -> ArrayRef {
        Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
            rows.into_iter().map(|r| Some(r.into_iter().map(Some))),
        ))
    };
    let msg = batch_error(
        plan,
        &[
            batch(vec![("x", list(vec![vec![1, 2], vec![3, 4], vec![5, 6]]))]),
            batch(vec![("x", list(vec![vec![1, 1], vec![7, 300]]))]),
        ],
    );
    assert!(
        msg.starts_with("column 'x', row 4: value 300 at element 1 (i32) does not fit in U8"),
        "{msg}"
    );
    // A conversion error in an earlier row wins over a shape error in a later one.
    let plan = plan_batch(
        vec![col("x", arr(SparkNumeric::Int, 1), Some(Dtype::U8), None)],
        10,
        TailStrategy::Write,
    );
    let msg = batch_error(
        plan,
        &[batch(vec![(
            "x",
            list(vec![vec![1, 2], vec![-1, 4], vec![5]]),
        )])],
    );
    assert!(
        msg.starts_with("column 'x', row 1: value -1 at element 0"),
        "{msg}"
    );
}

#[test]
fn bool_arrays_become_bool_and_bad_bytes_fail() {
    let dir = tmpdir("bool");
    let plan = plan_batch(
        vec![col(
            "b",
            arr(SparkNumeric::Boolean, 1),
            Some(Dtype::Bool),
            None,
        )],
        4,
        TailStrategy::Write,
    );
    let list = |rows: Vec<Vec<i8>>| -> ArrayRef {
        Arc::new(ListArray::from_iter_primitive::<Int8Type, _, _>(
            rows.into_iter().map(|r| Some(r.into_iter().map(Some))),
        ))
    };
    let mut w = TaskWriter::open(plan.clone(), 0, dir.clone()).unwrap();
    w.write_batch(&batch(vec![("b", list(vec![vec![1, 0], vec![0, 1]]))]))
        .unwrap();
    let (_, report) = finish(w);
    let f = open(&report.shards[0]);
    let (info, data) = f.tensor("b").unwrap();
    assert_eq!((info.dtype, info.shape.clone()), (Dtype::Bool, vec![2, 2]));
    assert_eq!(data, &[1, 0, 0, 1]);
    fs::remove_dir_all(dir).unwrap();
    assert_eq!(
        batch_error(
            plan,
            &[batch(vec![("b", list(vec![vec![1, 0], vec![0, 2]]))])]
        ),
        "column 'b', row 1: boolean element at index 1 has byte value 2 (expected 0 or 1)"
    );
}

#[test]
fn reshape_with_shapes_option() {
    let dir = tmpdir("reshape");
    let plan = plan_batch(
        vec![col(
            "img",
            arr(SparkNumeric::Float, 1),
            Some(Dtype::F32),
            Some(vec![2, 3]),
        )],
        2,
        TailStrategy::Write,
    );
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    w.write_batch(&batch(vec![(
        "img",
        f32_dense(&[&[1., 2., 3., 4., 5., 6.], &[6., 5., 4., 3., 2., 1.]]),
    )]))
    .unwrap();
    let (_, report) = finish(w);
    assert_eq!(
        open(&report.shards[0]).tensor("img").unwrap().0.shape,
        vec![2, 2, 3]
    );
    fs::remove_dir_all(dir).unwrap();
    let plan = plan_batch(
        vec![col(
            "img",
            arr(SparkNumeric::Float, 1),
            Some(Dtype::F32),
            Some(vec![3, 2, 3]),
        )],
        2,
        TailStrategy::Write,
    );
    assert_eq!(
        batch_error(plan, &[batch(vec![("img", f32_dense(&[&[0.; 12]]))])]),
        "column 'img', row 0: 12 elements cannot be reshaped to [3,2,3] (18 elements)"
    );
}

#[test]
fn binary_with_shapes() {
    let dir = tmpdir("binary");
    let plan = plan_batch(
        vec![col(
            "raw",
            InputKind::Binary,
            Some(Dtype::F32),
            Some(vec![2]),
        )],
        2,
        TailStrategy::Write,
    );
    let a = f32_bytes(&[1., 2.]);
    let b = f32_bytes(&[3., 4.]);
    let mut w = TaskWriter::open(plan.clone(), 0, dir.clone()).unwrap();
    w.write_batch(&batch(vec![(
        "raw",
        Arc::new(BinaryArray::from(vec![&a[..], &b[..]])),
    )]))
    .unwrap();
    let (_, report) = finish(w);
    let f = open(&report.shards[0]);
    let (info, data) = f.tensor("raw").unwrap();
    assert_eq!(info.shape, vec![2, 2]);
    assert_eq!(le_f32(data), vec![1., 2., 3., 4.]);
    fs::remove_dir_all(dir).unwrap();
    assert_eq!(
        batch_error(
            plan,
            &[batch(vec![(
                "raw",
                Arc::new(BinaryArray::from(vec![&a[..], &a[..6]]))
            )])]
        ),
        "column 'raw', row 1: binary value has 6 bytes but shape [2] of F32 needs 8 bytes"
    );
}

fn tensor_structs(rows: Vec<Option<(Vec<u8>, Vec<i64>, &str)>>) -> ArrayRef {
    let data = BinaryArray::from(
        rows.iter()
            .map(|r| r.as_ref().map(|(d, _, _)| d.as_slice()))
            .collect::<Vec<_>>(),
    );
    let shape = ListArray::from_iter_primitive::<Int64Type, _, _>(rows.iter().map(|r| {
        r.as_ref()
            .map(|(_, s, _)| s.iter().map(|&d| Some(d)).collect::<Vec<_>>())
    }));
    let dtype = StringArray::from(
        rows.iter()
            .map(|r| r.as_ref().map(|(_, _, t)| *t))
            .collect::<Vec<_>>(),
    );
    let mut nulls = NullBufferBuilder::new(rows.len());
    for r in &rows {
        nulls.append(r.is_some());
    }
    let fields = Fields::from(vec![
        Field::new("data", DataType::Binary, true),
        Field::new("shape", shape.data_type().clone(), true),
        Field::new("dtype", DataType::Utf8, true),
    ]);
    Arc::new(
        StructArray::try_new(
            fields,
            vec![Arc::new(data), Arc::new(shape), Arc::new(dtype)],
            nulls.finish(),
        )
        .unwrap(),
    )
}

#[test]
fn tensor_struct_keeps_or_converts_dtype() {
    let dir = tmpdir("ts");
    let plan = plan_batch(
        vec![
            col("keep", InputKind::TensorStruct, None, None),
            col("bf", InputKind::TensorStruct, Some(Dtype::Bf16), None),
            col("wide", InputKind::TensorStruct, Some(Dtype::F32), None),
        ],
        2,
        TailStrategy::Write,
    );
    let h = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
    let f16s: Vec<u8> = [1.5f32, -2.0, 0.25].iter().flat_map(|&v| h(v)).collect();
    let keep = tensor_structs(vec![
        Some((vec![1, 2, 3, 4], vec![2, 2], "U8")),
        Some((vec![5, 6, 7, 8], vec![2, 2], "U8")),
    ]);
    let bf = tensor_structs(vec![
        Some((f32_bytes(&[1.0, 3.0]), vec![2], "F32")),
        Some((f32_bytes(&[-0.5, 1.0 + 1.0 / 256.0]), vec![2], "F32")),
    ]);
    let wide = tensor_structs(vec![
        Some((f16s.clone(), vec![3], "F16")),
        Some((f16s, vec![3], "F16")),
    ]);
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    w.write_batch(&batch(vec![("keep", keep), ("bf", bf), ("wide", wide)]))
        .unwrap();
    let (_, report) = finish(w);
    let f = open(&report.shards[0]);
    let (info, data) = f.tensor("keep").unwrap();
    assert_eq!((info.dtype, info.shape.clone()), (Dtype::U8, vec![2, 2, 2]));
    assert_eq!(data, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let (info, data) = f.tensor("bf").unwrap();
    assert_eq!((info.dtype, info.shape.clone()), (Dtype::Bf16, vec![2, 2]));
    let bfs: Vec<f32> = data
        .chunks_exact(2)
        .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
        .collect();
    // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0).
    assert_eq!(bfs, vec![1.0, 3.0, -0.5, 1.0]);
    let (info, data) = f.tensor("wide").unwrap();
    assert_eq!((info.dtype, info.shape.clone()), (Dtype::F32, vec![2, 3]));
    assert_eq!(le_f32(data), vec![1.5, -2.0, 0.25, 1.5, -2.0, 0.25]);
    assert_eq!(report.columns["keep"].dtype, Dtype::U8);
    fs::remove_dir_all(dir).unwrap();
}

/// A BOOL tensor's bytes decode by the one rule of the read path (read/decode.rs): any non-zero
/// byte is `true`, so a Tensor Struct converted to another dtype gives 1 where the reader reads
/// `true` (the writer refused a byte 2 before, while the reader took it as `true`).
#[test]
fn tensor_struct_bool_bytes_decode_as_the_reader_decodes_them() {
    let dir = tmpdir("tsbool");
    let plan = plan_batch(
        vec![col("i", InputKind::TensorStruct, Some(Dtype::I32), None)],
        1,
        TailStrategy::Write,
    );
    let bools = tensor_structs(vec![Some((vec![0, 2, 1, 255], vec![4], "BOOL"))]);
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    w.write_batch(&batch(vec![("i", bools)])).unwrap();
    let (_, report) = finish(w);
    let f = open(&report.shards[0]);
    let (info, data) = f.tensor("i").unwrap();
    assert_eq!(info.dtype, Dtype::I32);
    let ints: Vec<i32> = data
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(ints, vec![0, 1, 1, 1]);
    let read = crate::read::decode::decode_values(Dtype::Bool, &[0, 2, 1, 255]).unwrap();
    let read: Vec<bool> = read.as_boolean().values().iter().collect();
    assert_eq!(read, vec![false, true, true, true]);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn tensor_struct_errors() {
    let plan = plan_batch(
        vec![col("t", InputKind::TensorStruct, None, None)],
        4,
        TailStrategy::Write,
    );
    let one = |d: Vec<u8>, s: Vec<i64>, t: &'static str| {
        batch(vec![("t", tensor_structs(vec![Some((d, s, t))]))])
    };
    assert_eq!(
        batch_error(plan.clone(), &[one(vec![0; 4], vec![1], "f32")]),
        "column 't', row 0: unknown dtype 'f32' (dtype names are exact and case-sensitive)"
    );
    assert_eq!(
        batch_error(plan.clone(), &[one(vec![0; 10], vec![2, 3], "F32")]),
        "column 't', row 0: data has 10 bytes but shape [2,3] of F32 needs 24"
    );
    assert_eq!(
        batch_error(plan.clone(), &[one(vec![0; 4], vec![-1], "F32")]),
        "column 't', row 0: negative dimension -1 in shape [-1]"
    );
    assert_eq!(
        batch_error(
            plan.clone(),
            &[batch(vec![(
                "t",
                tensor_structs(vec![
                    Some((vec![0; 4], vec![1], "F32")),
                    Some((vec![0; 2], vec![1], "F16")),
                ])
            )])]
        ),
        "column 't', row 1: dtype F16 differs from F32 of earlier rows"
    );
    assert_eq!(
        batch_error(
            plan.clone(),
            &[batch(vec![(
                "t",
                tensor_structs(vec![Some((vec![0; 4], vec![1], "F32")), None])
            )])]
        ),
        "column 't', row 1: null value"
    );
    // Non-writable source dtypes are neither kept nor converted.
    assert!(batch_error(plan, &[one(vec![0; 2], vec![2], "F8_E4M3")])
        .starts_with("column 't', row 0: dtype F8_E4M3 cannot be written"));
    let plan = plan_batch(
        vec![col("t", InputKind::TensorStruct, Some(Dtype::F32), None)],
        4,
        TailStrategy::Write,
    );
    assert_eq!(
        batch_error(plan.clone(), &[one(vec![0; 2], vec![2], "F8_E4M3")]),
        "column 't', row 0: cannot convert F8_E4M3 to F32: values of dtype F8_E4M3 cannot be converted"
    );
    let plan = plan_batch(
        vec![col("t", InputKind::TensorStruct, Some(Dtype::U8), None)],
        4,
        TailStrategy::Write,
    );
    assert!(
        batch_error(plan, &[one(f32_bytes(&[1.0, 2.5]), vec![2], "F32")])
            .starts_with("column 't', row 0: value 2.5 at element 1 (f32) is not a whole number")
    );
}

fn vectors(rows: Vec<(i8, Option<i32>, Option<Vec<i32>>, Vec<f64>)>) -> ArrayRef {
    let kinds = Int8Array::from(rows.iter().map(|r| r.0).collect::<Vec<_>>());
    let sizes = Int32Array::from(rows.iter().map(|r| r.1).collect::<Vec<_>>());
    let indices = ListArray::from_iter_primitive::<Int32Type, _, _>(rows.iter().map(|r| {
        r.2.as_ref()
            .map(|v| v.iter().map(|&i| Some(i)).collect::<Vec<_>>())
    }));
    let values = ListArray::from_iter_primitive::<Float64Type, _, _>(
        rows.iter()
            .map(|r| Some(r.3.iter().map(|&v| Some(v)).collect::<Vec<_>>())),
    );
    let fields = Fields::from(vec![
        Field::new("type", DataType::Int8, false),
        Field::new("size", DataType::Int32, true),
        Field::new("indices", indices.data_type().clone(), true),
        Field::new("values", values.data_type().clone(), true),
    ]);
    Arc::new(
        StructArray::try_new(
            fields,
            vec![
                Arc::new(kinds),
                Arc::new(sizes),
                Arc::new(indices),
                Arc::new(values),
            ],
            None,
        )
        .unwrap(),
    )
}

#[test]
fn ml_vectors_dense_and_sparse() {
    let dir = tmpdir("vec");
    let plan = plan_batch(
        vec![col("v", InputKind::MlVector, Some(Dtype::F32), None)],
        3,
        TailStrategy::Write,
    );
    let v = vectors(vec![
        (1, None, None, vec![1., 2., 3., 4.]),
        (0, Some(4), Some(vec![1, 3]), vec![5., 6.]),
        (0, Some(4), Some(vec![]), vec![]),
    ]);
    let mut w = TaskWriter::open(plan.clone(), 0, dir.clone()).unwrap();
    w.write_batch(&batch(vec![("v", v)])).unwrap();
    let (_, report) = finish(w);
    let f = open(&report.shards[0]);
    let (info, data) = f.tensor("v").unwrap();
    assert_eq!(info.shape, vec![3, 4]);
    assert_eq!(
        le_f32(data),
        vec![1., 2., 3., 4., 0., 5., 0., 6., 0., 0., 0., 0.]
    );
    fs::remove_dir_all(dir).unwrap();
    assert_eq!(
        batch_error(
            plan.clone(),
            &[batch(vec![(
                "v",
                vectors(vec![(0, Some(4), Some(vec![2, 1]), vec![1., 1.])])
            )])]
        ),
        "column 'v', row 0: sparse indices are not strictly increasing: 1 at position 1 follows 2"
    );
    assert_eq!(
        batch_error(
            plan,
            &[batch(vec![(
                "v",
                vectors(vec![(0, Some(4), Some(vec![4]), vec![1.])])
            )])]
        ),
        "column 'v', row 0: sparse index 4 at position 0 is outside [0, 4)"
    );
}

#[test]
fn malformed_batches_are_errors_not_panics() {
    let plan = plan_batch(
        vec![col(
            "x",
            arr(SparkNumeric::Float, 1),
            Some(Dtype::F32),
            None,
        )],
        4,
        TailStrategy::Write,
    );
    assert_eq!(
        batch_error(
            plan.clone(),
            &[batch(vec![(
                "x",
                Arc::new(Float32Array::from(vec![1.0f32]))
            )])]
        ),
        "column 'x': malformed batch: expected Arrow type List<Float32>, found Float32"
    );
    assert_eq!(
        batch_error(
            plan,
            &[batch(vec![
                ("x", f32_dense(&[&[1.]])),
                ("y", f32_dense(&[&[1.]]))
            ])]
        ),
        "malformed batch: expected 1 children (1 columns), found 2"
    );
}

// ---------------------------------------------------------------- KV mode

fn keys(k: &[Option<&str>]) -> ArrayRef {
    Arc::new(StringArray::from(k.to_vec()))
}

fn kv_batch(k: &[Option<&str>], x: &[&[f32]]) -> StructArray {
    batch(vec![("id", keys(k)), ("x", f32_dense(x))])
}

fn kv_plan(target: u64, dup: DuplicatesStrategy) -> WritePlan {
    plan_kv(
        vec![col(
            "x",
            arr(SparkNumeric::Float, 1),
            Some(Dtype::F32),
            None,
        )],
        target,
        dup,
    )
}

/// KV plan with an F32 array column `x` and an I64 scalar column `y`, 1 MiB shards.
fn kv_plan_x_y() -> WritePlan {
    plan_kv(
        vec![
            col("x", arr(SparkNumeric::Float, 1), Some(Dtype::F32), None),
            col(
                "y",
                InputKind::Scalar {
                    element: SparkNumeric::Int,
                },
                Some(Dtype::I64),
                None,
            ),
        ],
        1 << 20,
        DuplicatesStrategy::Fail,
    )
}

/// Every stored (key, values) over the final shards.
fn kv_contents(report: &TaskReport) -> BTreeMap<String, Vec<f32>> {
    let mut out = BTreeMap::new();
    for s in &report.shards {
        let f = open(s);
        assert_eq!(f.header().tensors.len(), s.tensors.len());
        for t in &s.tensors {
            let key = t.sample_key.clone().unwrap();
            let (_, data) = f.tensor(&t.name).unwrap();
            assert!(out.insert(key, le_f32(data)).is_none(), "{}", t.name);
        }
    }
    out
}

#[test]
fn kv_names_metadata_and_reports() {
    let dir = tmpdir("kv");
    let plan = kv_plan_x_y();
    let mut w = TaskWriter::open(plan, 3, dir.clone()).unwrap();
    let b = batch(vec![
        ("id", keys(&[Some("a"), Some("b")])),
        ("x", f32_dense(&[&[1., 2.], &[3.]])),
        ("y", Arc::new(Int32Array::from(vec![10, 20]))),
    ]);
    assert!(w.write_batch(&b).unwrap().is_empty());
    let (sealed, report) = finish(w);
    assert_eq!(sealed.len(), 1);
    let s = &report.shards[0];
    assert_eq!(s.samples, 2);
    let f = open(s);
    let (info, data) = f.tensor("a__x").unwrap();
    assert_eq!(info.shape, vec![2]);
    assert_eq!(le_f32(data), vec![1., 2.]);
    assert_eq!(f.tensor("b__x").unwrap().0.shape, vec![1]);
    let (info, data) = f.tensor("b__y").unwrap();
    assert_eq!((info.dtype, info.shape.clone()), (Dtype::I64, vec![]));
    assert_eq!(data, &20i64.to_le_bytes());
    let meta = f.header().metadata.clone().unwrap();
    assert_eq!(meta["safetensors_spark.layout"], "kv");
    assert_eq!(meta["safetensors_spark.kv_separator"], "__");
    assert_eq!(meta["safetensors_spark.samples"], "2");
    assert_eq!(meta["safetensors_spark.padded_samples"], "0");
    let raw = fs::read(&s.local_path).unwrap();
    for t in &s.tensors {
        assert_eq!(
            &raw[t.data_start as usize..t.data_end as usize],
            f.tensor(&t.name).unwrap().1
        );
        let k = t.sample_key.as_deref().unwrap();
        let c = t.column.as_deref().unwrap();
        assert_eq!(t.name, format!("{k}__{c}"));
    }
    assert_eq!(
        report.columns["x"],
        ColumnReport {
            dtype: Dtype::F32,
            sample_shape: None,
            inner_shape: None
        }
    );
    assert_eq!(report.columns["y"].sample_shape, Some(vec![]));
    // No spill file left.
    assert_eq!(names_in(&dir), vec![s.file.clone()]);
    fs::remove_dir_all(dir).unwrap();
}

/// A KV shard's header is serialised from the task's records, not through `plan_file`: it
/// must be byte-for-byte what `plan_file` produces for the same tensors (order, escaping,
/// offsets, padding), with keys that need JSON escaping and several dtypes.
#[test]
fn kv_header_is_the_reference_layout() {
    let dir = tmpdir("kv-layout");
    let plan = kv_plan_x_y();
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    let ks = ["z\"q", "é/\\", "a\u{1}b", "\u{1F600}", "m"];
    let b = batch(vec![
        ("id", keys(&ks.iter().map(|k| Some(*k)).collect::<Vec<_>>())),
        (
            "x",
            f32_dense(&[&[1., 2.], &[3.], &[], &[4., 5., 6.], &[7.]]),
        ),
        ("y", Arc::new(Int32Array::from(vec![1, 2, 3, 4, 5]))),
    ]);
    w.write_batch(&b).unwrap();
    let (_, report) = finish(w);
    assert_eq!(report.shards.len(), 1);
    let f = open(&report.shards[0]);
    let entries: Vec<TensorEntry> = f
        .header()
        .tensors
        .iter()
        .map(|t| TensorEntry {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        })
        .collect();
    assert_eq!(entries.len(), 10);
    let file_plan =
        safetensors_spark_format::header::plan_file(f.header().metadata.as_ref(), entries).unwrap();
    let raw = fs::read(&report.shards[0].local_path).unwrap();
    assert_eq!(
        &raw[..file_plan.header_bytes.len()],
        &file_plan.header_bytes[..]
    );
    assert_eq!(raw.len() as u64, file_plan.file_len());
    // The report's offsets are the header's.
    for t in &report.shards[0].tensors {
        let (info, data) = f.tensor(&t.name).unwrap();
        assert_eq!(t.data_end - t.data_start, info.byte_len());
        assert_eq!(&raw[t.data_start as usize..t.data_end as usize], data);
    }
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn kv_rollover_keeps_shards_under_target() {
    let dir = tmpdir("roll");
    let target = 2048;
    let mut w =
        TaskWriter::open(kv_plan(target, DuplicatesStrategy::Fail), 0, dir.clone()).unwrap();
    let mut sealed_during = 0;
    let mut expected = BTreeMap::new();
    for b in 0..5 {
        let ks: Vec<String> = (0..40).map(|i| format!("key-{b}-{i}")).collect();
        let rows: Vec<Vec<f32>> = (0..40)
            .map(|i| vec![(b * 100 + i) as f32; 1 + (i % 7) as usize])
            .collect();
        for (k, r) in ks.iter().zip(&rows) {
            expected.insert(k.clone(), r.clone());
        }
        let kref: Vec<Option<&str>> = ks.iter().map(|k| Some(k.as_str())).collect();
        let rref: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
        let sealed = w.write_batch(&kv_batch(&kref, &rref)).unwrap();
        // The spill file holds the open shard's bytes only: it is emptied at each seal.
        let spill: Vec<String> = names_in(&dir)
            .into_iter()
            .filter(|n| n.starts_with(".kv-") && n.ends_with(".spill.tmp"))
            .collect();
        assert_eq!(spill.len(), 1);
        assert!(fs::metadata(dir.join(&spill[0])).unwrap().len() <= target);
        for s in &sealed {
            assert!(Path::new(&s.local_path).exists());
        }
        sealed_during += sealed.len();
    }
    let (last, report) = finish(w);
    assert!(sealed_during > 3);
    assert_eq!(report.shards.len(), sealed_during + last.len());
    for (i, s) in report.shards.iter().enumerate() {
        assert!(s.bytes <= target, "{} bytes > {target}", s.bytes);
        // The size bound is tight enough that shards are well filled.
        if i + 1 < report.shards.len() {
            assert!(s.bytes > target * 3 / 4, "{} bytes", s.bytes);
        }
        assert_eq!(s.bytes, fs::metadata(&s.local_path).unwrap().len());
    }
    assert_eq!(report.shards.iter().map(|s| s.samples).sum::<u64>(), 200);
    assert_eq!(kv_contents(&report), expected);
    assert!(names_in(&dir).iter().all(|n| !n.starts_with('.')));
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn kv_oversize_row_gets_its_own_shard() {
    let dir = tmpdir("big");
    let mut w = TaskWriter::open(kv_plan(512, DuplicatesStrategy::Fail), 0, dir.clone()).unwrap();
    let big = vec![1.0f32; 400];
    w.write_batch(&kv_batch(
        &[Some("a"), Some("big"), Some("c")],
        &[&[1.], &big, &[2.]],
    ))
    .unwrap();
    let (_, report) = finish(w);
    assert_eq!(report.shards.len(), 3);
    let samples: Vec<u64> = report.shards.iter().map(|s| s.samples).collect();
    assert_eq!(samples, vec![1, 1, 1]);
    assert!(report.shards[1].bytes > 512);
    assert_eq!(report.shards[1].tensors[0].name, "big__x");
    assert!(report.shards[0].bytes <= 512 && report.shards[2].bytes <= 512);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn kv_duplicate_fail_and_null_key() {
    let msg = batch_error(
        kv_plan(1 << 20, DuplicatesStrategy::Fail),
        &[
            kv_batch(&[Some("a"), Some("b")], &[&[1.], &[2.]]),
            kv_batch(&[Some("c"), Some("a")], &[&[1.], &[2.]]),
        ],
    );
    assert_eq!(
        msg,
        "column 'id', row 3: duplicate key 'a' (first seen at row 0); duplicatesStrategy=fail"
    );
    let msg = batch_error(
        kv_plan(1 << 20, DuplicatesStrategy::LastWin),
        &[kv_batch(&[Some("a"), None], &[&[1.], &[2.]])],
    );
    assert_eq!(msg, "column 'id', row 1: null key");
}

#[test]
fn kv_name_collisions_and_reserved_name() {
    let plan = plan_kv(
        vec![
            col("c", arr(SparkNumeric::Float, 1), Some(Dtype::F32), None),
            col("b__c", arr(SparkNumeric::Float, 1), Some(Dtype::F32), None),
        ],
        1 << 20,
        DuplicatesStrategy::Fail,
    );
    let msg = batch_error(
        plan,
        &[batch(vec![
            ("id", keys(&[Some("a"), Some("a__b")])),
            ("c", f32_dense(&[&[1.], &[2.]])),
            ("b__c", f32_dense(&[&[1.], &[2.]])),
        ])],
    );
    assert_eq!(
        msg,
        "column 'c', row 1: tensor name 'a__b__c' (key 'a__b') is also the name of a tensor of an earlier row with another key"
    );
    let plan = plan_kv(
        vec![col(
            "metadata__",
            arr(SparkNumeric::Float, 1),
            Some(Dtype::F32),
            None,
        )],
        1 << 20,
        DuplicatesStrategy::Fail,
    );
    let msg = batch_error(
        plan,
        &[batch(vec![
            ("id", keys(&[Some("")])),
            ("metadata__", f32_dense(&[&[1.]])),
        ])],
    );
    assert_eq!(
        msg,
        "column 'metadata__', row 0: tensor name '__metadata__' (key '') is reserved"
    );
}

#[test]
fn kv_keys_with_equal_hashes_are_told_apart() {
    // Every key gets the same 32-bit hash: duplicate detection must compare the stored keys
    // along the whole chain, across sealed shards.
    super::kv::ALL_KEYS_COLLIDE.with(|c| c.set(true));
    let dir = tmpdir("collide");
    let mut w = TaskWriter::open(kv_plan(600, DuplicatesStrategy::Fail), 0, dir.clone()).unwrap();
    // Equal lengths, prefixes of each other, the empty key.
    let ks: Vec<String> = (0..60)
        .map(|i| match i {
            0 => String::new(),
            _ => format!("k{i}"),
        })
        .collect();
    let kref: Vec<Option<&str>> = ks.iter().map(|k| Some(k.as_str())).collect();
    let rows: Vec<Vec<f32>> = (0..60).map(|i| vec![i as f32; 4]).collect();
    let rref: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
    w.write_batch(&kv_batch(&kref, &rref)).unwrap();
    let (_, report) = finish(w);
    assert!(report.shards.len() > 3);
    let expected: BTreeMap<String, Vec<f32>> =
        ks.iter().cloned().zip(rows.iter().cloned()).collect();
    assert_eq!(kv_contents(&report), expected);
    // A real duplicate of a key deep in the chain (the chain starts at the latest row).
    let msg = batch_error(
        kv_plan(600, DuplicatesStrategy::Fail),
        &[kv_batch(&kref, &rref), kv_batch(&[Some("k11")], &[&[0.]])],
    );
    assert_eq!(
        msg,
        "column 'id', row 60: duplicate key 'k11' (first seen at row 11); duplicatesStrategy=fail"
    );
    // lastWin: replacements in sealed shards and in the open one.
    let mut w =
        TaskWriter::open(kv_plan(600, DuplicatesStrategy::LastWin), 0, dir.clone()).unwrap();
    w.write_batch(&kv_batch(&kref, &rref)).unwrap();
    w.write_batch(&kv_batch(
        &[Some("k1"), Some("k59"), Some("k1"), Some("")],
        &[&[-1.], &[-59.], &[-2.], &[-100.]],
    ))
    .unwrap();
    let (_, report) = finish(w);
    let mut expected = expected;
    expected.insert("k1".into(), vec![-2.]);
    expected.insert("k59".into(), vec![-59.]);
    expected.insert(String::new(), vec![-100.]);
    assert_eq!(kv_contents(&report), expected);
    assert_eq!(report.shards.iter().map(|s| s.samples).sum::<u64>(), 60);
    super::kv::ALL_KEYS_COLLIDE.with(|c| c.set(false));
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn kv_last_win_in_open_shard() {
    let dir = tmpdir("lw-open");
    let mut w = TaskWriter::open(
        kv_plan(1 << 20, DuplicatesStrategy::LastWin),
        0,
        dir.clone(),
    )
    .unwrap();
    w.write_batch(&kv_batch(
        &[Some("a"), Some("b"), Some("a")],
        &[&[1., 1., 1.], &[2.], &[3.]],
    ))
    .unwrap();
    w.write_batch(&kv_batch(&[Some("b")], &[&[4., 4.]]))
        .unwrap();
    let (_, report) = finish(w);
    assert_eq!(report.shards.len(), 1);
    assert_eq!(report.shards[0].samples, 2);
    let contents = kv_contents(&report);
    assert_eq!(
        contents,
        BTreeMap::from([("a".into(), vec![3.]), ("b".into(), vec![4., 4.])])
    );
    // Dead spill bytes are not copied: the data section holds exactly the live tensors.
    let f = open(&report.shards[0]);
    assert_eq!(f.header().data_len, 12);
    assert_eq!(
        report.columns["x"],
        ColumnReport {
            dtype: Dtype::F32,
            sample_shape: None,
            inner_shape: None
        }
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn kv_last_win_rewrites_sealed_shard() {
    let dir = tmpdir("lw-sealed");
    let mut w =
        TaskWriter::open(kv_plan(600, DuplicatesStrategy::LastWin), 0, dir.clone()).unwrap();
    let handed_out = w
        .write_batch(&kv_batch(
            &[Some("a"), Some("b"), Some("c"), Some("d"), Some("e")],
            &[&[1.; 8], &[2.; 8], &[3.; 8], &[4.; 8], &[5.; 8]],
        ))
        .unwrap();
    // lastWin hands out no shard before finish (finish may rewrite it, reading it from the work
    // dir), although shard 0 is sealed and in place.
    assert!(handed_out.is_empty());
    w.sealer.wait().unwrap();
    let first_path = dir.join(shard_file_name(0, 0, WID));
    let first = SafetensorsFile::open(&first_path).unwrap();
    let first_samples: u64 = first.header().metadata.as_ref().unwrap()["safetensors_spark.samples"]
        .parse()
        .unwrap();
    assert!(first.tensor("a__x").is_ok());
    drop(first);
    // Replace "a" (sealed) twice: the second replacement is in the open shard.
    let handed_out = w
        .write_batch(&kv_batch(&[Some("a"), Some("a")], &[&[9.; 2], &[7.; 3]]))
        .unwrap();
    assert!(handed_out.is_empty());
    let (last, report) = finish(w);
    // finish hands out every shard, each once (the rewritten one last, with its new size).
    let mut handed: Vec<&str> = last.iter().map(|s| s.file.as_str()).collect();
    handed.sort_unstable();
    let mut listed: Vec<&str> = report.shards.iter().map(|s| s.file.as_str()).collect();
    listed.sort_unstable();
    assert_eq!(handed, listed);
    assert_eq!(handed.len(), 2);
    let rewritten = last.iter().find(|s| s.shard == 0).unwrap();
    assert_eq!(rewritten.local_path, first_path.to_string_lossy());
    assert_eq!(rewritten.samples, first_samples - 1);
    let contents = kv_contents(&report);
    assert_eq!(contents["a"], vec![7.; 3]);
    assert_eq!(contents.len(), 5);
    assert_eq!(report.shards.iter().map(|s| s.samples).sum::<u64>(), 5);
    let f = open(rewritten);
    assert!(f.tensor("a__x").is_err());
    assert_eq!(
        f.header().metadata.as_ref().unwrap()["safetensors_spark.samples"],
        rewritten.samples.to_string()
    );
    assert_eq!(
        rewritten.bytes,
        fs::metadata(&rewritten.local_path).unwrap().len()
    );
    assert!(rewritten.samples >= 1);
    for s in &report.shards {
        assert!(s.bytes <= 600);
    }
    assert!(names_in(&dir).iter().all(|n| !n.starts_with('.')));
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn kv_shard_emptied_by_last_win_is_deleted() {
    let dir = tmpdir("lw-empty");
    // Each row fills a shard on its own.
    let mut w =
        TaskWriter::open(kv_plan(200, DuplicatesStrategy::LastWin), 0, dir.clone()).unwrap();
    w.write_batch(&kv_batch(
        &[Some("a"), Some("b"), Some("a")],
        &[&[1.; 20], &[2.; 20], &[3.; 20]],
    ))
    .unwrap();
    let (_, report) = finish(w);
    assert_eq!(report.shards.len(), 2);
    assert_eq!(kv_contents(&report).len(), 2);
    assert_eq!(kv_contents(&report)["a"], vec![3.; 20]);
    assert_eq!(names_in(&dir).len(), 2);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn abort_deletes_everything() {
    let dir = tmpdir("abort");
    let mut w = TaskWriter::open(kv_plan(300, DuplicatesStrategy::Fail), 0, dir.clone()).unwrap();
    let mut sealed = w
        .write_batch(&kv_batch(
            &[Some("a"), Some("b"), Some("c")],
            &[&[1.; 20], &[2.; 20], &[3.; 20]],
        ))
        .unwrap();
    sealed.extend(settle(&mut w));
    assert!(!sealed.is_empty());
    // Sealed shards plus the task's scratch files (the open shard's spill among them).
    assert!(names_in(&dir).iter().any(|n| n.ends_with(".spill.tmp")));
    w.abort();
    assert!(names_in(&dir).is_empty());
    // Batch mode too.
    let plan = plan_batch(
        vec![col(
            "x",
            arr(SparkNumeric::Float, 1),
            Some(Dtype::F32),
            None,
        )],
        1,
        TailStrategy::Write,
    );
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    w.write_batch(&batch(vec![("x", f32_dense(&[&[1.], &[2.]]))]))
        .unwrap();
    assert_eq!(names_in(&dir).len(), 2);
    w.abort();
    assert!(names_in(&dir).is_empty());
    // Dropping a KV writer removes its scratch files (spill, rows, keys, tensors, reports).
    let mut w =
        TaskWriter::open(kv_plan(1 << 20, DuplicatesStrategy::Fail), 0, dir.clone()).unwrap();
    w.write_batch(&kv_batch(&[Some("a")], &[&[1.]])).unwrap();
    assert_eq!(names_in(&dir).len(), 5);
    assert!(names_in(&dir).iter().all(|n| n.starts_with(".kv-")));
    drop(w);
    assert!(names_in(&dir).is_empty());
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn ffi_round_trip() {
    let b = kv_batch(&[Some("a"), Some("b")], &[&[1., 2.], &[3.]]);
    let (mut array, mut schema) = arrow_array::ffi::to_ffi(&b.to_data()).unwrap();
    let imported = unsafe { import_batch(&mut array, &mut schema) }.unwrap();
    assert!(array.is_released());
    assert_eq!(imported, b);
    let dir = tmpdir("ffi");
    let mut w =
        TaskWriter::open(kv_plan(1 << 20, DuplicatesStrategy::Fail), 0, dir.clone()).unwrap();
    w.write_batch(&imported).unwrap();
    drop(imported);
    let (_, report) = finish(w);
    assert_eq!(
        kv_contents(&report),
        BTreeMap::from([("a".into(), vec![1., 2.]), ("b".into(), vec![3.])])
    );
    // A non-struct array is refused.
    let plain: ArrayRef = Arc::new(Int32Array::from(vec![1]));
    let (mut array, mut schema) = arrow_array::ffi::to_ffi(&plain.to_data()).unwrap();
    let e = unsafe { import_batch(&mut array, &mut schema) }.unwrap_err();
    assert!(e.to_string().contains("expected a Struct array"), "{e}");
    assert!(unsafe { import_batch(std::ptr::null_mut(), &mut schema) }.is_err());
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn finish_after_a_failure_cleans_up() {
    let dir = tmpdir("fail-finish");
    let plan = plan_batch(
        vec![col(
            "x",
            arr(SparkNumeric::Float, 1),
            Some(Dtype::F32),
            None,
        )],
        1,
        TailStrategy::Write,
    );
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    w.write_batch(&batch(vec![("x", f32_dense(&[&[1.]]))]))
        .unwrap();
    assert!(w
        .write_batch(&batch(vec![("x", f32_dense(&[&[1., 2.]]))]))
        .is_err());
    assert!(matches!(w.finish(), Err(WriteError::Failed)));
    assert!(names_in(&dir).is_empty());
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn kv_struct_and_vector_columns_keep_per_row_shapes() {
    let dir = tmpdir("kv-mixed");
    let plan = plan_kv(
        vec![
            col("t", InputKind::TensorStruct, None, None),
            col("v", InputKind::MlVector, Some(Dtype::F64), None),
        ],
        1 << 20,
        DuplicatesStrategy::Fail,
    );
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    w.write_batch(&batch(vec![
        ("id", keys(&[Some("p"), Some("q")])),
        (
            "t",
            tensor_structs(vec![
                Some((vec![1, 0, 0, 0, 2, 0, 0, 0], vec![2, 1], "I32")),
                Some((vec![3, 0, 0, 0], vec![1], "I32")),
            ]),
        ),
        (
            "v",
            vectors(vec![
                (1, None, None, vec![0.5]),
                (0, Some(3), Some(vec![2]), vec![9.]),
            ]),
        ),
    ]))
    .unwrap();
    let (_, report) = finish(w);
    let f = open(&report.shards[0]);
    assert_eq!(f.tensor("p__t").unwrap().0.shape, vec![2, 1]);
    assert_eq!(f.tensor("q__t").unwrap().1, &[3, 0, 0, 0]);
    assert_eq!(le_f64(f.tensor("q__v").unwrap().1), vec![0., 0., 9.]);
    assert_eq!(
        report.columns["t"],
        ColumnReport {
            dtype: Dtype::I32,
            sample_shape: None,
            inner_shape: None
        }
    );
    assert_eq!(report.columns["v"].sample_shape, None);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn kv_batches_larger_than_a_chunk() {
    let dir = tmpdir("kv-chunks");
    let plan = plan_kv(
        vec![col(
            "s",
            InputKind::Scalar {
                element: SparkNumeric::Int,
            },
            Some(Dtype::I32),
            None,
        )],
        4096,
        DuplicatesStrategy::Fail,
    );
    let n = 3 * KV_CHUNK_ROWS + 5;
    let ks: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    w.write_batch(&batch(vec![
        (
            "id",
            keys(&ks.iter().map(|k| Some(k.as_str())).collect::<Vec<_>>()),
        ),
        ("s", Arc::new(Int32Array::from_iter_values(0..n as i32))),
    ]))
    .unwrap();
    let (_, report) = finish(w);
    assert!(report.shards.len() > 1);
    let mut seen = 0;
    for s in &report.shards {
        assert!(s.bytes <= 4096);
        let f = open(s);
        for t in &s.tensors {
            let i: i32 = t.sample_key.as_ref().unwrap()[1..].parse().unwrap();
            assert_eq!(f.tensor(&t.name).unwrap().1, &i.to_le_bytes());
            seen += 1;
        }
    }
    assert_eq!(seen, n);
    fs::remove_dir_all(dir).unwrap();
}

// ---------------------------------------------------------------- sealing in the background

fn f32_plan(batch_size: u64) -> WritePlan {
    plan_batch(
        vec![col(
            "x",
            arr(SparkNumeric::Float, 1),
            Some(Dtype::F32),
            None,
        )],
        batch_size,
        TailStrategy::Write,
    )
}

fn rows_f32(values: &[f32]) -> StructArray {
    let rows: Vec<&[f32]> = values.chunks(1).collect();
    batch(vec![("x", f32_dense(&rows))])
}

fn hidden(dir: &Path) -> Vec<String> {
    names_in(dir)
        .into_iter()
        .filter(|n| n.starts_with('.'))
        .collect()
}

#[test]
fn shards_are_reported_only_once_synced_and_in_place() {
    let dir = tmpdir("seal-held");
    let mut w = TaskWriter::open(f32_plan(2), 0, dir.clone()).unwrap();
    w.sealer.pause();
    // Shards 0 and 1 are full but their sync is held: nothing is reported and only their hidden
    // temporary files exist.
    assert!(w.write_batch(&rows_f32(&[1., 2., 3.])).unwrap().is_empty());
    assert!(w.write_batch(&rows_f32(&[4.])).unwrap().is_empty());
    assert!(w.sealer.has_thread());
    assert_eq!(hidden(&dir).len(), 2);
    assert_eq!(names_in(&dir).len(), 2);
    for i in 0..2 {
        assert!(!dir.join(shard_file_name(0, i, WID)).exists());
    }
    // Once synced and renamed they are reported by the next call, in order, with their bytes.
    w.sealer.resume();
    w.sealer.settle();
    assert_eq!(names_in(&dir).len(), 2);
    assert!(hidden(&dir).is_empty());
    let reported = w.write_batch(&rows_f32(&[])).unwrap();
    assert_eq!(
        reported.iter().map(|s| s.shard).collect::<Vec<_>>(),
        vec![0, 1]
    );
    for (s, values) in reported.iter().zip([[1., 2.], [3., 4.]]) {
        assert_eq!(s.local_path, dir.join(&s.file).to_string_lossy());
        assert_eq!(le_f32(open(s).tensor("x").unwrap().1), values);
        assert_eq!(fs::metadata(&s.local_path).unwrap().len(), s.bytes);
    }
    assert!(w.write_batch(&rows_f32(&[5.])).unwrap().is_empty());
    // finish waits for the tail shard and reports only what was not reported yet.
    let (last, report) = finish(w);
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].shard, 2);
    assert_eq!(le_f32(open(&last[0]).tensor("x").unwrap().1), vec![5.]);
    assert_reported_once(&[&reported, &last], &report);
    assert_eq!(names_in(&dir).len(), 3);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn every_shard_is_reported_once_and_in_place_when_reported() {
    let dir = tmpdir("seal-many");
    let mut w = TaskWriter::open(f32_plan(3), 0, dir.clone()).unwrap();
    let mut calls: Vec<Vec<ShardReport>> = Vec::new();
    let mut next = 0f32;
    for n in [1usize, 7, 2, 30, 0, 5, 11, 3, 9, 1] {
        let values: Vec<f32> = (0..n).map(|i| next + i as f32).collect();
        next += n as f32;
        let sealed = w.write_batch(&rows_f32(&values)).unwrap();
        for s in &sealed {
            // In place (complete, renamed) at the moment it is reported.
            let f = open(s);
            let first = s.shard as f32 * 3.;
            assert_eq!(
                le_f32(f.tensor("x").unwrap().1),
                vec![first, first + 1., first + 2.]
            );
        }
        calls.push(sealed);
    }
    let (last, report) = finish(w);
    calls.push(last);
    assert_eq!(report.shards.len(), 23); // 69 rows / 3
    let refs: Vec<&[ShardReport]> = calls.iter().map(Vec::as_slice).collect();
    assert_reported_once(&refs, &report);
    assert_eq!(names_in(&dir).len(), 23);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn background_seal_failure_is_reported_by_the_next_call_and_cleaned_up() {
    let dir = tmpdir("seal-fail");
    // A directory where shard 1 must go: its rename fails (EISDIR), whoever runs the test.
    let blocked = shard_file_name(0, 1, WID);
    fs::create_dir(dir.join(&blocked)).unwrap();
    let mut w = TaskWriter::open(f32_plan(1), 0, dir.clone()).unwrap();
    w.sealer.pause();
    assert!(w.write_batch(&rows_f32(&[1., 2.])).unwrap().is_empty());
    w.sealer.resume();
    w.sealer.settle();
    // Shard 0 is in place; shard 1 failed and its temporary file is gone.
    assert!(dir.join(shard_file_name(0, 0, WID)).is_file());
    assert!(hidden(&dir).is_empty());
    let e = w.write_batch(&rows_f32(&[3.])).unwrap_err();
    assert!(
        matches!(e, WriteError::Seal { ref file, .. } if *file == blocked),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains(&blocked), "{msg}");
    assert!(
        msg.contains(&dir.join(&blocked).to_string_lossy().into_owned()),
        "{msg}"
    );
    assert!(matches!(
        w.write_batch(&rows_f32(&[3.])),
        Err(WriteError::Failed)
    ));
    w.abort();
    assert_eq!(names_in(&dir), vec![blocked.clone()]);

    // Reported by finish at the latest; finish then deletes every file, shard 0 included.
    let dir2 = tmpdir("seal-fail-finish");
    fs::create_dir(dir2.join(&blocked)).unwrap();
    let mut w = TaskWriter::open(f32_plan(1), 0, dir2.clone()).unwrap();
    let mut reported = w.write_batch(&rows_f32(&[1.])).unwrap();
    w.sealer.pause();
    reported.extend(w.write_batch(&rows_f32(&[2., 3.])).unwrap());
    w.sealer.resume();
    let msg = err_of(w.finish());
    assert!(msg.contains(&blocked), "{msg}");
    assert!(reported.iter().all(|s| s.shard == 0));
    assert_eq!(names_in(&dir2), vec![blocked]);
    fs::remove_dir_all(dir).unwrap();
    fs::remove_dir_all(dir2).unwrap();
}

#[test]
fn abort_with_syncs_in_flight_leaves_no_files_and_no_thread() {
    let dir = tmpdir("seal-abort");
    // Batch mode: one shard held by the thread, QUEUED more waiting for it.
    const { assert!(sealer::QUEUED >= 2) };
    let mut w = TaskWriter::open(f32_plan(1), 0, dir.clone()).unwrap();
    w.sealer.pause();
    assert!(w.write_batch(&rows_f32(&[1., 2., 3.])).unwrap().is_empty());
    assert_eq!(hidden(&dir).len(), 3);
    w.abort_files();
    assert!(!w.sealer.has_thread());
    assert!(names_in(&dir).is_empty());
    drop(w);

    // Shards in place but not reported yet are deleted too.
    let mut w = TaskWriter::open(f32_plan(1), 0, dir.clone()).unwrap();
    w.write_batch(&rows_f32(&[1., 2.])).unwrap();
    w.sealer.wait().unwrap();
    assert_eq!(names_in(&dir).len(), 2);
    w.abort();
    assert!(names_in(&dir).is_empty());

    // KV mode: a held shard, the spill file of the open one.
    let mut w = TaskWriter::open(kv_plan(300, DuplicatesStrategy::Fail), 0, dir.clone()).unwrap();
    w.sealer.pause();
    assert!(w
        .write_batch(&kv_batch(
            &[Some("a"), Some("b"), Some("c")],
            &[&[1.; 20], &[2.; 20], &[3.; 20]],
        ))
        .unwrap()
        .is_empty());
    assert!(hidden(&dir).iter().any(|n| n.ends_with(".spill.tmp")));
    assert!(hidden(&dir).iter().any(|n| n.starts_with(".part-")));
    w.abort();
    assert!(names_in(&dir).is_empty());
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn kv_shards_in_flight_are_reported_once_and_last_win_waits_for_them() {
    let dir = tmpdir("seal-kv");
    let mut w =
        TaskWriter::open(kv_plan(600, DuplicatesStrategy::LastWin), 0, dir.clone()).unwrap();
    w.sealer.pause();
    // Shard 0 (with "a") is full and held; "a" is then replaced, so finish must rewrite shard 0,
    // which it can only read once it is in place.
    let first = w
        .write_batch(&kv_batch(
            &[Some("a"), Some("b"), Some("c"), Some("d"), Some("e")],
            &[&[1.; 8], &[2.; 8], &[3.; 8], &[4.; 8], &[5.; 8]],
        ))
        .unwrap();
    assert!(first.is_empty());
    assert!(!dir.join(shard_file_name(0, 0, WID)).exists());
    let second = w.write_batch(&kv_batch(&[Some("a")], &[&[7.; 3]])).unwrap();
    assert!(second.is_empty());
    w.sealer.resume();
    let (last, report) = finish(w);
    // Each shard once: the rewritten shard 0 with its new report.
    let files: HashSet<&str> = last.iter().map(|s| s.file.as_str()).collect();
    assert_eq!(files.len(), last.len());
    assert_eq!(last.len(), report.shards.len());
    let s0 = last.iter().find(|s| s.shard == 0).unwrap();
    assert_eq!(fs::metadata(&s0.local_path).unwrap().len(), s0.bytes);
    // Its tensors, in the task report: "a" is gone from it.
    let r0 = report.shards.iter().find(|s| s.shard == 0).unwrap();
    assert_eq!((r0.bytes, r0.samples), (s0.bytes, s0.samples));
    assert_eq!(r0.tensors.len(), r0.samples as usize);
    assert!(r0
        .tensors
        .iter()
        .all(|t| t.sample_key.as_deref() != Some("a")));
    let contents = kv_contents(&report);
    assert_eq!(contents.len(), 5);
    assert_eq!(contents["a"], vec![7.; 3]);
    assert!(names_in(&dir).iter().all(|n| !n.starts_with('.')));
    fs::remove_dir_all(dir).unwrap();
}

// ---------------------------------------------------------------- ragged columns

fn ragged(
    mut c: ColumnPlan,
    element: crate::write::RaggedElement,
    inner: Option<Vec<u64>>,
) -> ColumnPlan {
    c.ragged = Some(crate::write::RaggedPlan {
        element,
        inner_shape: inner,
    });
    c
}

fn le_i64(b: impl AsRef<[u8]>) -> Vec<i64> {
    b.as_ref()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn ragged_columns_store_values_and_offsets_with_pad_rows_empty() {
    use crate::write::RaggedElement;
    let dir = tmpdir("ragged");
    let plan = plan_batch(
        vec![
            ragged(
                col("t", arr(SparkNumeric::Float, 1), Some(Dtype::Bf16), None),
                RaggedElement::Array,
                Some(vec![]),
            ),
            ragged(
                col("s", InputKind::String, Some(Dtype::U8), None),
                RaggedElement::String,
                Some(vec![]),
            ),
        ],
        4,
        TailStrategy::Pad,
    );
    let mut w = TaskWriter::open(plan, 0, dir.clone()).unwrap();
    let t = f32_rows(&[
        Some(vec![Some(1.0), Some(2.5)]),
        Some(vec![]),
        Some(vec![Some(-3.0)]),
    ]);
    let s: ArrayRef = Arc::new(arrow_array::StringArray::from(vec!["héllo", "", "ab"]));
    w.write_batch(&batch(vec![("t", t), ("s", s)])).unwrap();
    let done = w.finish().unwrap();
    let report = read_report(&done.report_path).unwrap();
    assert_eq!(report.shards.len(), 1);
    let shard = &report.shards[0];
    assert_eq!((shard.samples, shard.padded_samples), (3, 1));
    assert_eq!(shard.tensors.len(), 4);
    let f = SafetensorsFile::open(&shard.local_path).unwrap();
    let (info, bytes) = f.tensor("t").unwrap();
    assert_eq!((info.dtype, info.shape.clone()), (Dtype::Bf16, vec![3]));
    let vals: Vec<f32> = bytes
        .chunks_exact(2)
        .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
        .collect();
    assert_eq!(vals, vec![1.0, 2.5, -3.0]);
    let (info, bytes) = f.tensor("t.offsets").unwrap();
    assert_eq!((info.dtype, info.shape.clone()), (Dtype::I64, vec![5]));
    assert_eq!(le_i64(bytes), vec![0, 2, 2, 3, 3]);
    let (info, bytes) = f.tensor("s").unwrap();
    assert_eq!((info.dtype, info.shape.clone()), (Dtype::U8, vec![8]));
    assert_eq!(bytes, "hélloab".as_bytes());
    assert_eq!(
        le_i64(f.tensor("s.offsets").unwrap().1),
        vec![0, 6, 6, 8, 8]
    );
    let meta = f.header().metadata.clone().unwrap();
    assert_eq!(meta["safetensors_spark.ragged"], r#"["t","s"]"#);
    assert_eq!(
        report.columns["t"].inner_shape,
        Some(Vec::<Option<u64>>::new())
    );
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn ragged_nested_rows_keep_one_inner_shape() {
    use crate::write::RaggedElement;
    let plan = plan_batch(
        vec![ragged(
            col("x", arr(SparkNumeric::Double, 2), Some(Dtype::F64), None),
            RaggedElement::Array,
            None,
        )],
        10,
        TailStrategy::Write,
    );
    let leaf: ArrayRef = Arc::new(Float64Array::from_iter_values((0..10).map(f64::from)));
    // row 0: [[0,1],[2,3]], row 1: [] , row 2: [[4,5,6],[7,8,9]] (inner [3] vs [2])
    let m = wrap(wrap(leaf, &[0, 2, 4, 7, 10]), &[0, 2, 2, 4]);
    assert_eq!(
        batch_error(plan, &[batch(vec![("x", m)])]),
        "column 'x', row 2: inner shape [3] differs from the column's inner shape [2] (of earlier rows); only the first dimension of a ragged column may vary"
    );
}

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::read::scan::tests::{
    input, manifest, path_of, plan_ok, plan_req, shard, shard_name, two_shards, with_header, write,
    Dir,
};
use crate::read::scan::{FileInput, ManifestInput, PartitionSpec, PlanRequest, ScanInput};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Int64Type};
use arrow_array::Array;
use safetensors_spark_format::dtype::Dtype;

/// Runs every unit on the local files; the batches and `bytes_read`.
fn run_local(spec: &PartitionSpec) -> (Vec<RecordBatch>, u64) {
    let mut task = ReadTask::new(spec.clone());
    let mut out = Vec::new();
    for i in 0..task.unit_count() {
        let path = path_of(&spec.units[i].file);
        task.open_local(i, &path).unwrap();
        assert!(task.needed_ranges().unwrap().is_empty());
        while let Some(b) = task.next_batch().unwrap() {
            assert_eq!(b.schema(), task.schema());
            out.push(b);
        }
    }
    (out, task.bytes_read())
}

fn header_bytes(bytes: &[u8]) -> &[u8] {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    &bytes[..8usize.saturating_add(n as usize).min(bytes.len())]
}

/// Runs every unit through ranged reads, supplying exactly the needed ranges.
fn run_remote(spec: &PartitionSpec) -> (Vec<RecordBatch>, u64) {
    let mut task = ReadTask::new(spec.clone());
    let mut out = Vec::new();
    for i in 0..task.unit_count() {
        let bytes = std::fs::read(path_of(&spec.units[i].file)).unwrap();
        task.open_remote(i, header_bytes(&bytes)).unwrap();
        loop {
            let ranges = task.needed_ranges().unwrap();
            for w in ranges.windows(2) {
                assert!(w[0].end < w[1].start, "coalesced and sorted: {ranges:?}");
            }
            for r in ranges {
                task.supply(r.start, bytes[r.start as usize..r.end as usize].to_vec())
                    .unwrap();
            }
            // Everything needed is supplied now.
            assert!(task.needed_ranges().unwrap().is_empty());
            match task.next_batch().unwrap() {
                Some(b) => out.push(b),
                None => break,
            }
        }
    }
    (out, task.bytes_read())
}

/// Local and remote runs agree; returns the batches and bytes read (locally: the remote run
/// also fetches the small gaps it reads through, at most as many bytes again as it needs).
fn run(spec: &PartitionSpec) -> (Vec<RecordBatch>, u64) {
    let local = run_local(spec);
    let remote = run_remote(spec);
    assert_eq!(local.0, remote.0);
    assert!(
        local.1 <= remote.1 && remote.1 <= 2 * local.1,
        "{} vs {}",
        local.1,
        remote.1
    );
    local
}

fn header_total(files: &[&FileInput]) -> u64 {
    files
        .iter()
        .map(|f| header_bytes(&std::fs::read(path_of(&f.file)).unwrap()).len() as u64)
        .sum()
}

fn only(specs: Vec<PartitionSpec>) -> PartitionSpec {
    assert_eq!(specs.len(), 1, "{specs:?}");
    specs.into_iter().next().unwrap()
}

fn i64s(a: &dyn Array) -> Vec<Option<i64>> {
    a.as_primitive::<Int64Type>().iter().collect()
}

#[test]
fn sample_batches_local_and_remote_exclude_pad_rows() {
    let dir = Dir::new("t-sample");
    let (a, b, m) = two_shards(&dir);
    let mut r = plan_req(
        RowLayout::Sample,
        input(&[a.clone(), b.clone()], &[m]),
        &["y", "x", "_file", "_metadata"],
    );
    r.batch_rows = 3;
    let spec = only(plan_ok(&r));
    let (batches, bytes) = run(&spec);
    // a: 4 real rows → batches of 3 + 1; b: 3 rows → 1 batch.
    let mut rows: Vec<usize> = batches.iter().map(|b| b.num_rows()).collect();
    rows.sort();
    assert_eq!(rows, [1, 3, 3]);
    let total_rows: usize = rows.iter().sum();
    assert_eq!(total_rows, 7);
    // Data bytes: 7 rows · (24 + 8), plus both headers.
    assert_eq!(bytes, 7 * 32 + header_total(&[&a, &b]));
    let names: Vec<_> = batches[0]
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["y", "x", "_file", "_metadata"]);
    // Rows of a in order: y = 100..104 (the fixture's values for tensor 1), never the pad rows.
    let mut a_rows: Vec<Option<i64>> = Vec::new();
    for batch in &batches {
        let f = batch.column(2).as_string::<i32>();
        if f.value(0) == a.file {
            a_rows.extend(i64s(batch.column(0)));
            let x = batch.column(1).as_list::<i32>();
            assert_eq!(x.value(0).as_list::<i32>().value(0).len(), 3);
            let m = batch.column(3).as_map();
            assert!(m.is_valid(0));
        }
    }
    assert_eq!(a_rows, [100, 101, 102, 103].map(Some));
    // The first x sample of a: values 0.5 .. 5.5.
    let first = batches
        .iter()
        .find(|b| b.column(2).as_string::<i32>().value(0) == a.file)
        .unwrap();
    let x0 = first.column(1).as_list::<i32>().value(0);
    let inner = x0.as_list::<i32>();
    assert_eq!(inner.len(), 2);
    let row = |i: usize| {
        inner
            .value(i)
            .as_primitive::<Float32Type>()
            .values()
            .to_vec()
    };
    assert_eq!((row(0), row(1)), (vec![0.5, 1.5, 2.5], vec![3.5, 4.5, 5.5]));

    // batch_bytes bounds rows too: 32 bytes a row, 70 bytes → 2 rows a batch.
    r.batch_rows = 100;
    r.batch_bytes = 70;
    let (batches, _) = run(&only(plan_ok(&r)));
    let mut rows: Vec<usize> = batches.iter().map(|b| b.num_rows()).collect();
    rows.sort();
    assert_eq!(rows, [1, 2, 2, 2]);
}

#[test]
fn count_only_reads_no_data_bytes() {
    let dir = Dir::new("t-count");
    let (a, b, m) = two_shards(&dir);
    let mut r = plan_req(RowLayout::Sample, input(&[a.clone(), b.clone()], &[m]), &[]);
    r.batch_rows = 2;
    let spec = only(plan_ok(&r));
    assert_eq!(spec.bytes, 0);
    let (batches, bytes) = run(&spec);
    assert!(batches.iter().all(|b| b.num_columns() == 0));
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 7);
    assert_eq!(bytes, header_total(&[&a, &b]));
}

#[test]
fn missing_tensor_gives_null_rows_and_widening() {
    let dir = Dir::new("t-missing");
    let a = with_header(&shard(
        &dir,
        "a.safetensors",
        2,
        0,
        &[("x", Dtype::F16, &[2]), ("y", Dtype::I8, &[])],
    ));
    let b = with_header(&shard(
        &dir,
        "b.safetensors",
        3,
        0,
        &[("x", Dtype::F32, &[2])],
    ));
    let spec = only(plan_ok(&plan_req(
        RowLayout::Sample,
        input(&[a.clone(), b.clone()], &[]),
        &["x", "y", "_file"],
    )));
    let (batches, bytes) = run(&spec);
    assert_eq!(bytes, 2 * (4 + 1) + 3 * 8 + header_total(&[&a, &b]));
    for batch in &batches {
        let file = batch.column(2).as_string::<i32>().value(0).to_string();
        let x = batch.column(0).as_list::<i32>();
        assert_eq!(x.values().data_type(), &arrow_schema::DataType::Float32);
        assert_eq!(x.null_count(), 0);
        let y = batch.column(1);
        if file == b.file {
            assert_eq!(y.null_count(), 3, "b has no y: null rows");
        } else {
            assert_eq!(y.data_type(), &arrow_schema::DataType::Int8);
            assert_eq!(y.null_count(), 0);
            // F16 0.0, 1.0 widened exactly.
            assert_eq!(
                x.value(0).as_primitive::<Float32Type>().values(),
                &[0.0, 1.0]
            );
        }
    }
}

#[test]
fn tensor_layout_local_remote_and_pruning() {
    let dir = Dir::new("t-tensor");
    let a = with_header(&write(
        &dir,
        "a.safetensors",
        Some(&[("k", "v")]),
        &[
            ("w", Dtype::F16, &[2, 2]),
            ("f8", Dtype::F8E4M3, &[3]),
            ("n", Dtype::I64, &[2]),
        ],
    ));
    let inp = input(std::slice::from_ref(&a), &[]);
    // All columns.
    let all = [
        "file",
        "key",
        "dtype",
        "shape",
        "byte_size",
        "data",
        "metadata",
    ];
    let mut r = plan_req(RowLayout::Tensor, inp.clone(), &all);
    r.batch_rows = 2;
    let spec = only(plan_ok(&r));
    let (batches, bytes) = run(&spec);
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    assert_eq!(batches.len(), 2);
    assert_eq!(bytes, 8 + 3 + 16 + header_total(&[&a]));
    assert_eq!(batches[0].num_columns(), all.len());
    // F16 and I64 have no common element type: there is no `decoded` column.
    r.required.push(crate::read::scan::tests::req("decoded"));
    let e = plan(&r).unwrap_err();
    assert!(e.to_string().contains("`decoded`"), "{e}");
    // Pruned: key/shape only: 0 data bytes.
    let spec = only(plan_ok(&plan_req(
        RowLayout::Tensor,
        inp.clone(),
        &["key", "shape"],
    )));
    let (batches, bytes) = run(&spec);
    assert_eq!(bytes, header_total(&[&a]));
    assert_eq!(batches[0].num_rows(), 3);
    // data only.
    let spec = only(plan_ok(&plan_req(RowLayout::Tensor, inp, &["key", "data"])));
    let (batches, bytes) = run(&spec);
    assert_eq!(bytes, 8 + 3 + 16 + header_total(&[&a]));
    let data = batches[0].column(1).as_binary::<i32>();
    assert_eq!(
        data.value(0).len() + data.value(1).len() + data.value(2).len(),
        27
    );
}

use crate::read::scan::plan;

#[test]
fn tensor_layout_decoded_widens() {
    let dir = Dir::new("t-decoded");
    let a = with_header(&write(
        &dir,
        "a.safetensors",
        None,
        &[("w", Dtype::F16, &[2]), ("b", Dtype::F8E5M2, &[2])],
    ));
    let b = with_header(&write(
        &dir,
        "b.safetensors",
        None,
        &[("v", Dtype::F64, &[1])],
    ));
    let spec = only(plan_ok(&plan_req(
        RowLayout::Tensor,
        input(&[a.clone(), b.clone()], &[]),
        &["key", "decoded"],
    )));
    let (batches, bytes) = run(&spec);
    // F8 is not decoded (null) and not read.
    assert_eq!(bytes, 4 + 8 + header_total(&[&a, &b]));
    let mut seen = 0;
    for batch in &batches {
        let keys = batch.column(0).as_string::<i32>();
        let dec = batch.column(1).as_list::<i32>();
        for i in 0..batch.num_rows() {
            seen += 1;
            match keys.value(i) {
                "b" => assert!(dec.is_null(i)),
                "w" => assert_eq!(
                    dec.value(i)
                        .as_primitive::<arrow_array::types::Float64Type>()
                        .values(),
                    &[0.0, 1.0]
                ),
                "v" => assert_eq!(dec.value(i).len(), 1),
                other => panic!("{other}"),
            }
        }
    }
    assert_eq!(seen, 3);
}

#[test]
fn file_layout_pruned_struct_reads_no_data() {
    let dir = Dir::new("t-file");
    let a = with_header(&write(
        &dir,
        "a.safetensors",
        Some(&[("k", "v")]),
        &[("w", Dtype::F32, &[4]), ("v", Dtype::I8, &[2])],
    ));
    let b = with_header(&write(
        &dir,
        "b.safetensors",
        None,
        &[("v", Dtype::I8, &[3])],
    ));
    let inp = input(&[a.clone(), b.clone()], &[]);
    let mut r = plan_req(RowLayout::File, inp.clone(), &["file", "w", "metadata"]);
    r.required[1].fields = Some(vec!["shape".into(), "dtype".into()]);
    let specs = plan_ok(&r);
    assert_eq!(specs.iter().map(|s| s.bytes).sum::<u64>(), 0);
    let mut bytes = 0;
    let mut batches = Vec::new();
    for s in &specs {
        let (bs, n) = run(s);
        bytes += n;
        batches.extend(bs);
    }
    assert_eq!(bytes, header_total(&[&a, &b]), "no data byte read");
    assert_eq!(batches.len(), 2);
    for batch in &batches {
        assert_eq!(batch.num_rows(), 1);
        let w = batch.column(1).as_struct();
        assert_eq!(w.num_columns(), 2);
        let file = batch.column(0).as_string::<i32>().value(0);
        if file == a.file {
            assert!(w.is_valid(0));
            assert_eq!(w.column(1).as_string::<i32>().value(0), "F32");
            assert!(batch.column(2).is_valid(0));
        } else {
            assert!(w.is_null(0));
            assert!(batch.column(2).is_null(0));
        }
    }
    // The full struct reads the data.
    r.required[1].fields = None;
    let mut bytes = 0;
    for s in &plan_ok(&r) {
        bytes += run(s).1;
    }
    assert_eq!(bytes, 16 + header_total(&[&a, &b]));
}

#[test]
fn header_changed_since_planning_is_an_error() {
    let dir = Dir::new("t-changed");
    let (a, b, m) = two_shards(&dir);
    let spec = only(plan_ok(&plan_req(
        RowLayout::Sample,
        input(&[a.clone(), b.clone()], &[m]),
        &["x"],
    )));
    // Rewrite b with one more row (a different length and row count).
    let b2 = shard(
        &dir,
        &shard_name(1, 0),
        4,
        0,
        &[("x", Dtype::F32, &[2, 3]), ("y", Dtype::I64, &[])],
    );
    assert_ne!(b2.length, b.length);
    let i = spec.units.iter().position(|u| u.file == b.file).unwrap();
    let mut task = ReadTask::new(spec.clone());
    let e = task.open_local(i, &path_of(&b.file)).unwrap_err();
    assert!(
        e.to_string().contains("changed since the scan was planned"),
        "{e}"
    );
    assert_eq!(e.file, b.file);
    // Same length, different dtype: the tensor assumption catches it.
    let b3 = shard(
        &dir,
        &shard_name(1, 0),
        3,
        0,
        &[("x", Dtype::I32, &[2, 3]), ("y", Dtype::I64, &[])],
    );
    assert_eq!(b3.length, b.length);
    let bytes = std::fs::read(path_of(&b.file)).unwrap();
    let mut task = ReadTask::new(spec.clone());
    let e = task.open_remote(i, header_bytes(&bytes)).unwrap_err();
    assert!(
        e.to_string().contains("changed since the scan was planned"),
        "{e}"
    );
    assert_eq!(e.tensor.as_deref(), Some("x"));
    // A missing tensor.
    shard(
        &dir,
        &shard_name(1, 0),
        3,
        0,
        &[("y", Dtype::I64, &[]), ("q", Dtype::F32, &[2, 3])],
    );
    let mut task = ReadTask::new(spec);
    let e = task.open_local(i, &path_of(&b.file)).unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
}

/// A local file truncated after its unit was opened (header read and checked against the plan)
/// fails its next batch with an error naming the file; the old memory map raised SIGBUS here
/// (the file is 64 KiB, so whole pages lie past the new end) and killed the test process.
#[test]
fn a_local_file_truncated_while_read_is_an_error_naming_it() {
    let dir = Dir::new("t-shrink");
    let cols: [(&str, Dtype, &[u64]); 1] = [("x", Dtype::F32, &[256])];
    let a = shard(&dir, &shard_name(0, 0), 64, 0, &cols);
    let m = manifest(&dir, &cols, &[(&a, 64, 0)]);
    let mut r = plan_req(
        RowLayout::Sample,
        input(std::slice::from_ref(&a), &[m]),
        &["x"],
    );
    r.batch_rows = 16;
    let spec = only(plan_ok(&r));
    let mut task = ReadTask::new(spec);
    let path = path_of(&a.file);
    task.open_local(0, &path).unwrap();
    assert_eq!(task.next_batch().unwrap().unwrap().num_rows(), 16);
    let header = header_bytes(&std::fs::read(&path).unwrap()).len() as u64;
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(header + 1024)
        .unwrap();
    let e = task.next_batch().unwrap_err();
    assert_eq!(e.file, a.file);
    let msg = e.to_string();
    assert!(msg.contains("changed while being read"), "{msg}");
    assert!(
        msg.contains(&format!("now {} bytes", header + 1024)),
        "{msg}"
    );
}

#[test]
fn corrupt_files_at_open_with_and_without_ignore_corrupt() {
    let dir = Dir::new("t-corrupt");
    let (a, b, m) = two_shards(&dir);
    let mut inp: ScanInput = input(&[a.clone(), b.clone()], &[m]);
    let spec = only(plan_ok(&plan_req(RowLayout::Sample, inp.clone(), &["y"])));
    // Planned from the manifest; now b's bytes are garbage of the same length.
    std::fs::write(path_of(&b.file), vec![0xffu8; b.length as usize]).unwrap();
    let i = spec.units.iter().position(|u| u.file == b.file).unwrap();
    let mut task = ReadTask::new(spec);
    let e = task.open_local(i, &path_of(&b.file)).unwrap_err();
    assert_eq!(e.file, b.file);
    assert!(matches!(e.kind, ReadErrorKind::Format(_)), "{e}");
    inp.ignore_corrupt = true;
    let spec = only(plan_ok(&plan_req(RowLayout::Sample, inp, &["y"])));
    assert!(spec.ignore_corrupt);
    let (batches, _) = run(&spec);
    assert_eq!(
        batches.iter().map(|b| b.num_rows()).sum::<usize>(),
        4,
        "only a's rows"
    );
    let mut task = ReadTask::new(spec.clone());
    task.open_local(i, &path_of(&b.file)).unwrap();
    assert!(task.next_batch().unwrap().is_none());
    assert_eq!(task.skipped().len(), 1);
    assert_eq!(task.skipped()[0].file, b.file);
}

#[test]
fn remote_needs_supplied_bytes_and_accepts_pieces() {
    let dir = Dir::new("t-remote");
    let (a, _, m) = two_shards(&dir);
    let spec = only(plan_ok(&plan_req(
        RowLayout::Sample,
        input(&[with_header(&a)], &[]),
        &["x", "y"],
    )));
    let _ = m;
    let bytes = std::fs::read(path_of(&a.file)).unwrap();
    let mut task = ReadTask::new(spec.clone());
    task.open_remote(0, header_bytes(&bytes)).unwrap();
    // Nothing supplied: an error naming the missing bytes.
    let e = task.next_batch().unwrap_err();
    assert!(matches!(e.kind, ReadErrorKind::NotSupplied { .. }), "{e}");
    assert_eq!(e.file, a.file);
    // Supplied in 5-byte pieces: fine, and equal to the local batch.
    let mut task = ReadTask::new(spec.clone());
    task.open_remote(0, header_bytes(&bytes)).unwrap();
    let ranges = task.needed_ranges().unwrap();
    // Two tensors, rows 0..4 only (not the 2 pad rows), in one range: the pad rows of the
    // first tensor (2 × 8 bytes) lie between them and are read through.
    let need: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    assert_eq!((ranges.len(), need), (1, 4 * (24 + 8) + 2 * 8));
    for r in &ranges {
        let mut s = r.start;
        while s < r.end {
            let e = (s + 5).min(r.end);
            task.supply(s, bytes[s as usize..e as usize].to_vec())
                .unwrap();
            s = e;
        }
    }
    let remote = task.next_batch().unwrap().unwrap();
    assert!(task.next_batch().unwrap().is_none());
    let (local, _) = run_local(&spec);
    assert_eq!(local, vec![remote]);
    // Bytes beyond the file are refused; supply without an open remote unit too.
    assert!(task.supply(a.length, vec![1]).is_err());
    let mut local_task = ReadTask::new(spec);
    local_task.open_local(0, &path_of(&a.file)).unwrap();
    assert!(local_task.supply(0, vec![0]).is_err());
    assert!(local_task.open_local(9, &path_of(&a.file)).is_err());
}

#[test]
fn coalesce_merges_adjacent_and_overlapping_ranges() {
    assert_eq!(
        coalesce(vec![10..20, 0..5, 5..8, 15..30, 40..40]),
        vec![0..8, 10..30]
    );
    let r = Remote {
        header: safetensors_spark_format::header::parse_file_bytes(
            &safetensors_spark_format::file::serialize(None, &[]).unwrap(),
        )
        .unwrap(),
        length: 100,
        segments: [(10u64, vec![0u8; 5]), (20u64, vec![0u8; 5])]
            .into_iter()
            .collect(),
        whole: None,
    };
    assert_eq!(r.uncovered(&(0..30)), vec![0..10, 15..20, 25..30]);
    assert_eq!(r.uncovered(&(11..14)), Vec::<Range<u64>>::new());
    assert!(r.read(12..22).is_err());
    assert_eq!(r.read(11..14).unwrap().len(), 3);
}

#[test]
fn remote_reads_through_small_gaps_within_a_budget() {
    // Gaps of at most `gap` bytes are read through, the smallest first, while the bytes read
    // through stay at most the bytes needed.
    assert_eq!(
        read_through_gaps(vec![0..10, 12..20, 30..40, 100..200], 50),
        vec![0..40, 100..200]
    );
    // 0..10 and 60..70 need 20 bytes: the 50-byte gap is over the budget.
    assert_eq!(
        read_through_gaps(vec![0..10, 60..70], 50),
        vec![0..10, 60..70]
    );
    // Over the gap limit: never merged, however much is needed.
    assert_eq!(
        read_through_gaps(vec![0..1000, 1051..2000], 50),
        vec![0..1000, 1051..2000]
    );
    // The budget goes to the smallest gaps: 2 and 5 fit in 12 bytes needed, 9 does not.
    assert_eq!(
        read_through_gaps(vec![0..4, 13..17, 19..21, 26..28], 10),
        vec![0..4, 13..28]
    );
    assert_eq!(read_through_gaps(vec![], 10), Vec::<Range<u64>>::new());
    let one: Vec<Range<u64>> = std::iter::once(5..9).collect();
    assert_eq!(read_through_gaps(one.clone(), 10), one);

    // A remote per-tensor read of two tensors with an unselected one between them fetches the
    // gap in the same range; the batch equals the local one.
    let dir = Dir::new("t-gaps");
    let a = with_header(&write(
        &dir,
        "a.safetensors",
        None,
        &[
            ("a", Dtype::F32, &[64]),
            ("b", Dtype::F32, &[8]),
            ("c", Dtype::F32, &[64]),
        ],
    ));
    let mut r = plan_req(
        RowLayout::Tensor,
        input(std::slice::from_ref(&a), &[]),
        &["key", "data"],
    );
    r.predicates = vec![crate::read::scan::Predicate {
        column: "key".into(),
        test: crate::read::scan::PredicateTest::In(vec!["a".into(), "c".into()]),
    }];
    let spec = only(plan_ok(&r));
    let bytes = std::fs::read(path_of(&a.file)).unwrap();
    let mut task = ReadTask::new(spec.clone());
    task.open_remote(0, header_bytes(&bytes)).unwrap();
    let ranges = task.needed_ranges().unwrap();
    let h = header_bytes(&bytes).len() as u64;
    assert_eq!(
        ranges,
        vec![h..h + 4 * (64 + 8 + 64)],
        "a, b (read through) and c: one range"
    );
    let (_, remote) = run_remote(&spec);
    let (_, local) = run_local(&spec);
    assert_eq!((local, remote), (h + 512, h + 544));
}

/// A bare shard with a ragged I32 column `t` (rows [], [1, 2], [3], [4, 5, 6], then 1 padding
/// row) and a fixed I64 column `id`.
fn ragged_shard(dir: &Dir, offsets: &[i64]) -> FileInput {
    use safetensors_spark_format::file::write_file;
    use safetensors_spark_format::header::TensorEntry;
    let values: Vec<u8> = (1..=6i32).flat_map(|v| v.to_le_bytes()).collect();
    let offs: Vec<u8> = offsets.iter().flat_map(|v| v.to_le_bytes()).collect();
    let ids: Vec<u8> = (0..5i64).flat_map(|v| v.to_le_bytes()).collect();
    let entry = |n: &str, d, s: &[u64]| TensorEntry {
        name: n.into(),
        dtype: d,
        shape: s.to_vec(),
    };
    let mut meta: BTreeMap<String, String> = crate::read::scan::tests::batch_meta(4, 1)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    meta.insert("safetensors_spark.ragged".into(), "[\"t\"]".into());
    let name = shard_name(0, 0);
    let written = write_file(
        dir.0.join(&name),
        Some(&meta),
        &[
            (entry("id", Dtype::I64, &[5]), ids.as_slice()),
            (entry("t", Dtype::I32, &[6]), values.as_slice()),
            (entry("t.offsets", Dtype::I64, &[6]), offs.as_slice()),
        ],
    )
    .unwrap();
    with_header(&FileInput {
        file: format!("{}/{name}", dir.uri()),
        length: written.bytes,
        header: None,
        header_error: None,
    })
}

#[test]
fn ragged_rows_local_and_remote_in_two_rounds() {
    let dir = Dir::new("ragged-task");
    let f = ragged_shard(&dir, &[0, 0, 2, 3, 6, 6]);
    let mut req = plan_req(RowLayout::Sample, input(&[f], &[]), &["t", "id"]);
    req.batch_rows = 3;
    let specs = plan_ok(&req);
    assert_eq!(specs.len(), 1);
    let (local, _) = run_local(&specs[0]);
    // remote: offsets first, then the values; asked until nothing is needed
    let mut task = ReadTask::new(specs[0].clone());
    let bytes = std::fs::read(path_of(&specs[0].units[0].file)).unwrap();
    task.open_remote(0, header_bytes(&bytes)).unwrap();
    let mut remote = Vec::new();
    let mut rounds = 0;
    loop {
        loop {
            let ranges = task.needed_ranges().unwrap();
            if ranges.is_empty() {
                break;
            }
            rounds += 1;
            for r in ranges {
                task.supply(r.start, bytes[r.start as usize..r.end as usize].to_vec())
                    .unwrap();
            }
        }
        match task.next_batch().unwrap() {
            Some(b) => remote.push(b),
            None => break,
        }
    }
    assert_eq!(local, remote);
    assert_eq!(rounds, 4, "two batches, two rounds each");
    let rows: Vec<Vec<i32>> = local
        .iter()
        .flat_map(|b| {
            let l = b.column(0).as_list::<i32>().clone();
            (0..l.len())
                .map(|i| {
                    l.value(i)
                        .as_primitive::<arrow_array::types::Int32Type>()
                        .values()
                        .to_vec()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(rows, vec![vec![], vec![1, 2], vec![3], vec![4, 5, 6]]);
    // batch_bytes counts each row's values (4 B per element) and the fixed `id` (8 B): rows
    // of 8, 16, 12 and 20 B in batches of at most 24 B are {0, 1}, {2}, {3}
    req.batch_rows = 1024;
    req.batch_bytes = 24;
    let (batches, _) = run_local(&plan_ok(&req)[0]);
    let sizes: Vec<usize> = batches.iter().map(|b| b.num_rows()).collect();
    assert_eq!(sizes, vec![2, 1, 1]);
}

#[test]
fn ragged_bad_offsets_are_errors_naming_the_column() {
    for (offsets, needle) in [
        (&[1i64, 1, 2, 3, 6, 6][..], "starts at 1, not 0"),
        (&[0, 0, 2, 3, 6, 5], "ends at 5"),
        (&[0, 2, 1, 3, 6, 6], "entry 2 is 1, smaller than entry 1"),
        (&[0, 0, 9, 3, 6, 6], "entry 2 is 9, outside [0, 6]"),
    ] {
        let dir = Dir::new("ragged-bad");
        let f = ragged_shard(&dir, offsets);
        let specs = plan_ok(&plan_req(RowLayout::Sample, input(&[f], &[]), &["t"]));
        let mut task = ReadTask::new(specs[0].clone());
        task.open_local(0, &path_of(&specs[0].units[0].file))
            .unwrap();
        let e = task.next_batch().unwrap_err().to_string();
        assert!(e.contains("tensor `t`") && e.contains(needle), "{e}");
    }
}

/// `m` with each listed shard's `crc32c` set to its file's (as the writer records it).
fn with_crc32c(m: &ManifestInput) -> ManifestInput {
    let mut v: serde_json::Value = serde_json::from_str(&m.text).unwrap();
    for s in v["shards"].as_array_mut().unwrap() {
        let name = s["shard_path"].as_str().unwrap().to_string();
        let path = path_of(&format!("{}/{name}", m.dir));
        let crc = safetensors_spark_dataset::versions::file_crc32c(&path).unwrap();
        s["crc32c"] = serde_json::Value::String(crc);
    }
    ManifestInput {
        text: v.to_string(),
        ..m.clone()
    }
}

#[test]
fn verify_checksums_reads_each_file_whole_once_and_names_a_mismatch() {
    let dir = Dir::new("t-verify");
    let (a, b, m) = two_shards(&dir);
    let m = with_crc32c(&m);
    let mut r = plan_req(
        RowLayout::Sample,
        input(&[a.clone(), b.clone()], std::slice::from_ref(&m)),
        &["y"],
    );
    let plain = only(plan_ok(&r));
    assert!(
        plain.checksums.is_empty(),
        "without the option nothing is checked"
    );
    r.verify_checksums = true;
    let spec = only(plan_ok(&r));
    assert_eq!(spec.checksums.len(), 2);
    // local: each file read whole once on top of what the read takes
    let (rows, plain_bytes) = run_local(&plain);
    let (checked_rows, bytes) = run_local(&spec);
    assert_eq!(rows, checked_rows);
    assert_eq!(bytes, plain_bytes + a.length + b.length);
    // remote: the whole object through verify_update, in pieces
    let mut task = ReadTask::new(spec.clone());
    assert!(task.verify_needed(0).unwrap());
    let whole = std::fs::read(path_of(&spec.units[0].file)).unwrap();
    for piece in whole.chunks(7) {
        task.verify_update(0, piece).unwrap();
    }
    task.verify_finish(0).unwrap();
    assert!(!task.verify_needed(0).unwrap(), "checked once per task");
    // a short object and a changed byte: errors naming the file, both values and the option
    let mut task = ReadTask::new(spec.clone());
    task.verify_update(0, &whole[..whole.len() - 1]).unwrap();
    let e = task.verify_finish(0).unwrap_err().to_string();
    let n = whole.len();
    assert!(
        e.contains(&spec.units[0].file)
            && e.contains(&format!("has {} bytes", n - 1))
            && e.contains(&format!("records {n}"))
            && e.contains("verify_checksums"),
        "{e}"
    );
    let mut changed = whole.clone();
    changed[n - 1] ^= 0xff;
    let mut task = ReadTask::new(spec.clone());
    task.verify_update(0, &changed).unwrap();
    let e = task.verify_finish(0).unwrap_err().to_string();
    assert!(
        e.contains(&spec.units[0].file) && e.contains("CRC-32C"),
        "{e}"
    );
    std::fs::write(path_of(&spec.units[0].file), &changed).unwrap();
    let mut task = ReadTask::new(spec.clone());
    let e = task
        .open_local(0, &path_of(&spec.units[0].file))
        .unwrap_err();
    assert!(matches!(e.kind, ReadErrorKind::Checksum(_)), "{e}");
    // a manifest without crc32c: the option checks nothing
    let r = PlanRequest {
        verify_checksums: true,
        ..plan_req(
            RowLayout::Sample,
            input(&[a, b], &[two_shards_manifest_without_crc(&m)]),
            &["y"],
        )
    };
    assert!(only(plan_ok(&r)).checksums.is_empty());
}

fn two_shards_manifest_without_crc(m: &ManifestInput) -> ManifestInput {
    let mut v: serde_json::Value = serde_json::from_str(&m.text).unwrap();
    for s in v["shards"].as_array_mut().unwrap() {
        s.as_object_mut().unwrap().remove("crc32c");
    }
    ManifestInput {
        text: v.to_string(),
        ..m.clone()
    }
}

#[test]
fn provenance_columns_give_each_row_its_index_and_its_shards_added_version() {
    let dir = Dir::new("t-provenance");
    let (a, b, m) = two_shards(&dir);
    // the manifest records the version that added shard a, not b's (an older dataset's entry)
    let mut v: serde_json::Value = serde_json::from_str(&m.text).unwrap();
    for s in v["shards"].as_array_mut().unwrap() {
        if a.file.ends_with(s["shard_path"].as_str().unwrap()) {
            s["added_version"] = 7.into();
        }
    }
    let m = ManifestInput {
        text: v.to_string(),
        ..m
    };
    let mut r = plan_req(
        RowLayout::Sample,
        input(&[a.clone(), b.clone()], &[m]),
        &["_file", "_row_index", "_added_version"],
    );
    r.batch_rows = 3;
    let (batches, bytes) = run(&only(plan_ok(&r)));
    assert_eq!(bytes, header_total(&[&a, &b]), "provenance reads no data");
    let mut got: Vec<(String, i64, Option<i64>)> = Vec::new();
    for batch in &batches {
        let f = batch.column(0).as_string::<i32>();
        let idx = batch.column(1).as_primitive::<Int64Type>();
        let ver = i64s(batch.column(2));
        assert!(!batch.schema().field(1).is_nullable());
        for (i, v) in ver.iter().enumerate() {
            got.push((f.value(i).to_string(), idx.value(i), *v));
        }
    }
    got.sort();
    let mut want: Vec<(String, i64, Option<i64>)> = (0..4)
        .map(|i| (a.file.clone(), i, Some(7)))
        .chain((0..3).map(|i| (b.file.clone(), i, None)))
        .collect();
    want.sort();
    assert_eq!(got, want);
}

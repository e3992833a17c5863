#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::write::TailStrategy;
use arrow_schema::{Field, Fields};
use safetensors_spark_dataset::manifest::{
    ColumnMap, ManifestExt, ManifestShard, ManifestTensor, FORMAT_VERSION, MANIFEST_FORMAT,
    SAFETENSORS_VERSION,
};
use safetensors_spark_dataset::names::{index_part_file_name, parse_shard_file_name};
use safetensors_spark_format::file::write_file;
use safetensors_spark_format::header::TensorEntry;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

// ---------------------------------------------------------------------------------------------
// Fixtures (shared with the task tests)
// ---------------------------------------------------------------------------------------------

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary directory, removed on drop.
pub(crate) struct Dir(pub PathBuf);

impl Dir {
    pub fn new(tag: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!(
            "st-scan-test-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    pub fn uri(&self) -> String {
        format!("file:{}", self.0.display())
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn path_of(uri: &str) -> PathBuf {
    PathBuf::from(uri.strip_prefix("file:").unwrap())
}

/// `n` elements of `dtype` with recognisable values (element i ≈ i + seed).
pub(crate) fn values(dtype: Dtype, n: u64, seed: u64) -> Vec<u8> {
    if dtype.bits() < 8 {
        let len = dtype.checked_byte_len(n).unwrap();
        return (0..len).map(|i| (i * 7 + seed) as u8).collect();
    }
    let mut out = Vec::new();
    for i in 0..n {
        let v = i + seed;
        match dtype {
            Dtype::F32 => out.extend((v as f32 + 0.5).to_le_bytes()),
            Dtype::F64 => out.extend((v as f64 + 0.25).to_le_bytes()),
            Dtype::F16 => out.extend(half::f16::from_f32(v as f32).to_bits().to_le_bytes()),
            Dtype::I64 => out.extend((v as i64).to_le_bytes()),
            Dtype::I32 => out.extend((v as i32).to_le_bytes()),
            Dtype::I16 => out.extend((v as i16).to_le_bytes()),
            Dtype::I8 | Dtype::U8 => out.push((v % 100) as u8),
            Dtype::Bool => out.push((v % 2) as u8),
            _ => {
                let bits = u64::from(dtype.bits());
                out.extend((0..(bits / 8).max(1)).map(|k| (v * 7 + k) as u8));
            }
        }
    }
    out
}

/// Writes `name` in `dir` with `tensors` (name, dtype, shape) and returns its listing.
pub(crate) fn write(
    dir: &Dir,
    name: &str,
    meta: Option<&[(&str, &str)]>,
    tensors: &[(&str, Dtype, &[u64])],
) -> FileInput {
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .enumerate()
        .map(|(k, (_, d, s))| values(*d, s.iter().product(), k as u64 * 100))
        .collect();
    let entries: Vec<(TensorEntry, &[u8])> = tensors
        .iter()
        .zip(&data)
        .map(|((n, d, s), b)| {
            (
                TensorEntry {
                    name: n.to_string(),
                    dtype: *d,
                    shape: s.to_vec(),
                },
                b.as_slice(),
            )
        })
        .collect();
    let meta: Option<BTreeMap<String, String>> = meta.map(|m| {
        m.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
    let written = write_file(dir.0.join(name), meta.as_ref(), &entries).unwrap();
    FileInput {
        file: format!("{}/{name}", dir.uri()),
        length: written.bytes,
        header: None,
        header_error: None,
    }
}

/// `f` with its header text, as the JVM would pass it after reading the first 8 + N bytes.
pub(crate) fn with_header(f: &FileInput) -> FileInput {
    let bytes = std::fs::read(path_of(&f.file)).unwrap();
    let text = validated_header_text(&f.file, &bytes, f.length).unwrap();
    FileInput {
        header: Some(text),
        ..f.clone()
    }
}

pub(crate) fn shard_name(partition: u32, shard: u32) -> String {
    format!("part-{partition:05}-{shard:04}-0b9d6ce1-6f2e-4b7c-9d1e-2f3a4b5c6d7e.safetensors")
}

pub(crate) fn batch_meta(samples: u64, padded: u64) -> Vec<(&'static str, String)> {
    vec![
        ("safetensors_spark.format_version", "1".into()),
        ("safetensors_spark.layout", "batch".into()),
        ("safetensors_spark.samples", samples.to_string()),
        ("safetensors_spark.padded_samples", padded.to_string()),
        ("user", "u".into()),
    ]
}

/// Writes a batch-mode shard of `samples` real + `padded` pad rows with `columns`
/// (name, dtype, sample shape).
pub(crate) fn shard(
    dir: &Dir,
    name: &str,
    samples: u64,
    padded: u64,
    columns: &[(&str, Dtype, &[u64])],
) -> FileInput {
    let meta = batch_meta(samples, padded);
    let meta: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let shapes: Vec<Vec<u64>> = columns
        .iter()
        .map(|(_, _, s)| {
            let mut shape = vec![samples + padded];
            shape.extend_from_slice(s);
            shape
        })
        .collect();
    let tensors: Vec<(&str, Dtype, &[u64])> = columns
        .iter()
        .zip(&shapes)
        .map(|((n, d, _), s)| (*n, *d, s.as_slice()))
        .collect();
    write(dir, name, Some(&meta), &tensors)
}

/// A consistent manifest for `dir` listing `shards` (file, samples, padded).
pub(crate) fn manifest(
    dir: &Dir,
    columns: &[(&str, Dtype, &[u64])],
    shards: &[(&FileInput, u64, u64)],
) -> ManifestInput {
    let mut listed: Vec<ManifestShard> = shards
        .iter()
        .map(|(f, samples, padded)| ManifestShard {
            shard_path: f.file.rsplit_once('/').unwrap().1.to_string(),
            partition: Some(
                parse_shard_file_name(f.file.rsplit_once('/').unwrap().1)
                    .unwrap()
                    .0,
            ),
            samples_count: *samples,
            padded_samples: Some(*padded),
            num_tensors: Some(columns.len() as u64),
            bytes: f.length,
            crc32c: None,
            added_version: None,
        })
        .collect();
    listed.sort_by(|a, b| a.shard_path.cmp(&b.shard_path));
    let pad = shards.iter().any(|s| s.2 > 0);
    let m = Manifest {
        format_version: FORMAT_VERSION.into(),
        safetensors_version: SAFETENSORS_VERSION.into(),
        schema: ColumnMap(
            columns
                .iter()
                .map(|(n, d, s)| {
                    (
                        n.to_string(),
                        ManifestTensor {
                            dtype: *d,
                            shape: Some(std::iter::once(4).chain(s.iter().copied()).collect()),
                            ragged: None,
                        },
                    )
                })
                .collect(),
        ),
        total_samples: shards.iter().map(|s| s.1).sum(),
        total_bytes: shards.iter().map(|s| s.0.length).sum(),
        shards: listed,
        ext: Some(ManifestExt {
            format: MANIFEST_FORMAT.into(),
            created_by: "test".into(),
            manifest_version: 1,
            mode: DatasetMode::Batch,
            batch_size: Some(4),
            tail_strategy: Some(if pad {
                TailStrategy::Pad
            } else {
                TailStrategy::Write
            }),
            kv_separator: None,
            padded_samples: shards.iter().map(|s| s.2).sum(),
            dropped_samples: 0,
            stream_commits: Default::default(),
            committed_at_ms: None,
            operation: None,
            commit_message: None,
            app_id: None,
            retention_seconds: None,
            vacuumed: None,
            checkpoint_interval: None,
        }),
    };
    ManifestInput {
        dir: dir.uri(),
        text: m.to_json_pretty().unwrap(),
        has_index: false,
        index: None,
    }
}

pub(crate) fn input(files: &[FileInput], manifests: &[ManifestInput]) -> ScanInput {
    ScanInput {
        files: files.to_vec(),
        manifests: manifests.to_vec(),
        ignore_corrupt: false,
        ignore_missing: false,
        file_layout_max_tensors: None,
    }
}

pub(crate) fn ready<T: std::fmt::Debug>(a: Answer<T>) -> T {
    match a {
        Answer::Ready(t) => t,
        other => panic!("expected Ready, got {other:?}"),
    }
}

pub(crate) fn describe_ok(layout: RowLayoutOption, input: ScanInput) -> ScanDescription {
    ready(describe(&DescribeRequest { layout, input }).unwrap())
}

pub(crate) fn req(name: &str) -> RequiredColumn {
    RequiredColumn {
        name: name.into(),
        fields: None,
    }
}

pub(crate) fn plan_req(layout: RowLayout, input: ScanInput, required: &[&str]) -> PlanRequest {
    PlanRequest {
        layout,
        input,
        required: required.iter().map(|n| req(n)).collect(),
        predicates: vec![],
        max_partition_bytes: 1 << 20,
        open_cost_bytes: 0,
        min_partitions: 1,
        batch_rows: 1024,
        batch_bytes: 1 << 20,
        verify_checksums: false,
    }
}

pub(crate) fn plan_ok(r: &PlanRequest) -> Vec<PartitionSpec> {
    ready(plan(r).unwrap())
}

/// The example shards: `a` (4 real + 2 pad rows), `b` (3 rows), with a manifest.
pub(crate) fn two_shards(dir: &Dir) -> (FileInput, FileInput, ManifestInput) {
    let cols: [(&str, Dtype, &[u64]); 2] = [("x", Dtype::F32, &[2, 3]), ("y", Dtype::I64, &[])];
    let a = shard(dir, &shard_name(0, 0), 4, 2, &cols);
    let b = shard(dir, &shard_name(1, 0), 3, 0, &cols);
    let m = manifest(dir, &cols, &[(&a, 4, 2), (&b, 3, 0)]);
    (a, b, m)
}

fn field_names(schema: &serde_json::Value) -> Vec<String> {
    schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect()
}

fn err_text<T: std::fmt::Debug>(r: Result<T, ReadError>) -> String {
    r.unwrap_err().to_string()
}

fn array_of(element: serde_json::Value) -> serde_json::Value {
    json!({"type": "array", "elementType": element, "containsNull": false})
}

fn meta_json() -> serde_json::Value {
    json!({"type": "map", "keyType": "string", "valueType": "string", "valueContainsNull": false})
}

// ---------------------------------------------------------------------------------------------
// spark_type_json, validated_header_text
// ---------------------------------------------------------------------------------------------

#[test]
fn spark_type_json_for_every_type() {
    use DataType::*;
    for (t, name) in [
        (Boolean, "boolean"),
        (Int8, "byte"),
        (Int16, "short"),
        (Int32, "integer"),
        (Int64, "long"),
        (Float32, "float"),
        (Float64, "double"),
        (Utf8, "string"),
        (Binary, "binary"),
    ] {
        assert_eq!(spark_type_json(&t), json!(name));
    }
    let list = List(Arc::new(Field::new("element", Int64, false)));
    assert_eq!(spark_type_json(&list), array_of(json!("long")));
    let nullable_list = List(Arc::new(Field::new("element", Float32, true)));
    assert_eq!(spark_type_json(&nullable_list)["containsNull"], json!(true));
    let s = Struct(Fields::from(vec![
        Field::new("a", Binary, false),
        Field::new("b", list.clone(), true),
    ]));
    assert_eq!(
        spark_type_json(&s),
        json!({"type": "struct", "fields": [
            {"name": "a", "type": "binary", "nullable": false, "metadata": {}},
            {"name": "b", "type": array_of(json!("long")), "nullable": true, "metadata": {}},
        ]})
    );
    assert_eq!(spark_type_json(&metadata_type()), meta_json());
    // Spark parses every one of these with DataType.fromJson; the schema is a struct.
    let d = spark_type_json(&Struct(Fields::empty()));
    assert_eq!(d, json!({"type": "struct", "fields": []}));
}

use std::sync::Arc;

#[test]
fn validated_header_text_keeps_padding_and_rejects_bad_prefixes() {
    let dir = Dir::new("hdr");
    let f = write(&dir, "a.safetensors", None, &[("t", Dtype::F32, &[3])]);
    let bytes = std::fs::read(path_of(&f.file)).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let text = validated_header_text(&f.file, &bytes[..8 + n as usize], f.length).unwrap();
    assert_eq!(text.len() as u64, n);
    let h = header::parse_header(text.as_bytes(), f.length).unwrap();
    assert_eq!(h.data_start(), 8 + n);
    // Too few bytes, a wrong length, a huge prefix: errors naming the file.
    let e = validated_header_text(&f.file, &bytes[..8 + n as usize - 1], f.length).unwrap_err();
    assert_eq!(e.file, f.file);
    assert!(validated_header_text(&f.file, &bytes, f.length + 1).is_err());
    let mut huge = bytes.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = validated_header_text(&f.file, &huge, f.length).unwrap_err();
    assert!(matches!(e.kind, ReadErrorKind::Format(_)), "{e}");
}

// ---------------------------------------------------------------------------------------------
// describe
// ---------------------------------------------------------------------------------------------

#[test]
fn describe_sample_from_a_consistent_manifest_needs_no_header() {
    let dir = Dir::new("manifest");
    let (a, b, m) = two_shards(&dir);
    let d = describe_ok(RowLayoutOption::Auto, input(&[b.clone(), a.clone()], &[m]));
    assert_eq!(d.layout, RowLayout::Sample);
    assert_eq!(
        d.schema,
        json!({"type": "struct", "fields": [
            {"name": "x", "type": array_of(array_of(json!("float"))), "nullable": true, "metadata": {}},
            {"name": "y", "type": "long", "nullable": true, "metadata": {}},
        ]})
    );
    assert_eq!(
        d.metadata_columns,
        json!({"type": "struct", "fields": [
            {"name": "_file", "type": "string", "nullable": false, "metadata": {}},
            {"name": "_metadata", "type": meta_json(), "nullable": true, "metadata": {}},
            {"name": "_row_index", "type": "long", "nullable": false, "metadata": {}},
            {"name": "_added_version", "type": "long", "nullable": true, "metadata": {}},
        ]})
    );
    assert!(d.excluded.is_empty());
}

#[test]
fn describe_auto_asks_for_headers_then_resolves() {
    let dir = Dir::new("auto");
    let cols: [(&str, Dtype, &[u64]); 1] = [("x", Dtype::I32, &[2])];
    let a = shard(&dir, &shard_name(0, 0), 2, 0, &cols);
    let b = shard(&dir, &shard_name(0, 1), 2, 0, &cols);
    // No manifest, no headers: every file's header is needed.
    let r = describe(&DescribeRequest {
        layout: RowLayoutOption::Auto,
        input: input(&[b.clone(), a.clone()], &[]),
    })
    .unwrap();
    assert_eq!(r, Answer::NeedHeaders(vec![a.file.clone(), b.file.clone()]));
    // Only the missing one is asked for.
    let r = describe(&DescribeRequest {
        layout: RowLayoutOption::Auto,
        input: input(&[with_header(&a), b.clone()], &[]),
    })
    .unwrap();
    assert_eq!(r, Answer::NeedHeaders(vec![b.file.clone()]));
    let d = describe_ok(
        RowLayoutOption::Auto,
        input(&[with_header(&a), with_header(&b)], &[]),
    );
    assert_eq!(d.layout, RowLayout::Sample);
    assert_eq!(field_names(&d.schema), ["x"]);
    // A file that is not a batch shard makes it per tensor.
    let other = write(
        &dir,
        "other.safetensors",
        None,
        &[("w", Dtype::F16, &[2, 2])],
    );
    let d = describe_ok(
        RowLayoutOption::Auto,
        input(
            &[with_header(&a), with_header(&b), with_header(&other)],
            &[],
        ),
    );
    assert_eq!(d.layout, RowLayout::Tensor);
    // Nothing at all: per tensor, without `decoded`.
    let d = describe_ok(RowLayoutOption::Auto, input(&[], &[]));
    assert_eq!(d.layout, RowLayout::Tensor);
    assert_eq!(
        field_names(&d.schema),
        [
            "file",
            "key",
            "dtype",
            "shape",
            "byte_size",
            "data",
            "metadata",
            "flags",
            "model_info",
            "sha256"
        ]
    );
    assert_eq!(d.metadata_columns, json!({"type": "struct", "fields": []}));
}

#[test]
fn describe_tensor_and_file_layouts() {
    let dir = Dir::new("tf");
    let a = with_header(&write(
        &dir,
        "a.safetensors",
        Some(&[("k", "v")]),
        &[("w", Dtype::F16, &[2, 2]), ("b", Dtype::F8E4M3, &[3])],
    ));
    let b = with_header(&write(
        &dir,
        "b.safetensors",
        None,
        &[("v", Dtype::F32, &[1]), ("w", Dtype::F32, &[4])],
    ));
    let d = describe_ok(RowLayoutOption::Tensor, input(&[b.clone(), a.clone()], &[]));
    assert_eq!(d.layout, RowLayout::Tensor);
    let expected = spark_type_json(&DataType::Struct(tensor_rows_schema_fields(Some(
        DataType::Float32,
    ))));
    assert_eq!(d.schema, expected);
    assert_eq!(d.schema["fields"][6]["type"], array_of(json!("float")));
    assert_eq!(d.schema["fields"][6]["name"], json!("decoded"));
    // Only bytes-only dtypes, or no common type: no `decoded` column.
    let c = with_header(&write(
        &dir,
        "c.safetensors",
        None,
        &[("q", Dtype::Bool, &[1])],
    ));
    let d = describe_ok(RowLayoutOption::Tensor, input(&[a.clone(), c], &[]));
    assert!(!field_names(&d.schema).contains(&"decoded".to_string()));

    let d = describe_ok(RowLayoutOption::File, input(&[b.clone(), a.clone()], &[]));
    assert_eq!(d.layout, RowLayout::File);
    // Keys: first appearance over files sorted by URI (a: w, b by data order; then b: v).
    let names = field_names(&d.schema);
    assert_eq!(names[0], "file");
    assert_eq!(
        names[names.len() - 4..],
        ["metadata", "flags", "model_info", "sha256"]
    );
    let mut keys = names[1..names.len() - 4].to_vec();
    assert_eq!(keys.len(), 3);
    assert_eq!(keys.pop().unwrap(), "v");
    let t = &d.schema["fields"][1];
    assert_eq!(t["nullable"], json!(true));
    assert_eq!(
        t["type"],
        json!({"type": "struct", "fields": [
            {"name": "data", "type": "binary", "nullable": false, "metadata": {}},
            {"name": "shape", "type": array_of(json!("long")), "nullable": false, "metadata": {}},
            {"name": "dtype", "type": "string", "nullable": false, "metadata": {}},
        ]})
    );
    // These layouts need every header.
    let r = describe(&DescribeRequest {
        layout: RowLayoutOption::File,
        input: input(
            &[
                a,
                FileInput {
                    header: None,
                    ..b.clone()
                },
            ],
            &[],
        ),
    })
    .unwrap();
    assert_eq!(r, Answer::NeedHeaders(vec![b.file]));
}

/// The per-tensor scan's fields: the layout's rows, then the forensic columns, every field.
fn tensor_rows_schema_fields(decoded: Option<DataType>) -> Fields {
    use super::super::forensic_columns::{all_fields, FLAG_FIELDS, MODEL_INFO_FIELDS};
    use super::super::rows::TensorColumn;
    let mut fields: Vec<_> =
        super::super::rows::tensor_rows_schema(&super::super::rows::TensorRowOptions {
            data: true,
            decoded,
        })
        .fields()
        .iter()
        .cloned()
        .collect();
    fields.push(Arc::new(
        TensorColumn::Flags(all_fields(&FLAG_FIELDS)).field(),
    ));
    fields.push(Arc::new(
        TensorColumn::ModelInfo(all_fields(&MODEL_INFO_FIELDS)).field(),
    ));
    fields.push(Arc::new(TensorColumn::Sha256.field()));
    Fields::from(fields)
}

#[test]
fn manifest_excludes_unlisted_files_and_inconsistent_manifests_need_headers() {
    let dir = Dir::new("excl");
    let (a, b, m) = two_shards(&dir);
    let stray = shard(&dir, &shard_name(7, 0), 1, 0, &[("zz", Dtype::I8, &[])]);
    let other_dir = Dir::new("excl-other");
    let loose = shard(
        &other_dir,
        "loose.safetensors",
        2,
        0,
        &[("x", Dtype::F16, &[2, 3])],
    );
    let d = describe_ok(
        RowLayoutOption::Sample,
        input(
            &[a.clone(), b.clone(), stray.clone(), with_header(&loose)],
            std::slice::from_ref(&m),
        ),
    );
    assert_eq!(field_names(&d.schema), ["x", "y"]);
    assert_eq!(d.excluded.len(), 1);
    assert_eq!(d.excluded[0].file, stray.file);
    assert!(
        d.excluded[0].reason.contains("dataset_manifest.json"),
        "{}",
        d.excluded[0].reason
    );
    // The loose F16 file merged into x: still float.
    assert_eq!(
        d.schema["fields"][0]["type"],
        array_of(array_of(json!("float")))
    );

    // A listed shard missing from the listing (read with ignoreMissingFiles; otherwise that is
    // the scan's error) or with another length: the manifest is not trusted, so its (listed,
    // present) files need headers.
    for files in [
        vec![a.clone()],
        vec![
            a.clone(),
            FileInput {
                length: b.length + 1,
                ..b.clone()
            },
        ],
    ] {
        let r = describe(&DescribeRequest {
            layout: RowLayoutOption::Auto,
            input: ScanInput {
                ignore_missing: true,
                ..input(&files, std::slice::from_ref(&m))
            },
        })
        .unwrap();
        let files_needed: Vec<String> = files.iter().map(|f| f.file.clone()).collect();
        assert_eq!(r, Answer::NeedHeaders(files_needed));
    }
    let d = describe_ok(
        RowLayoutOption::Auto,
        ScanInput {
            ignore_missing: true,
            ..input(&[with_header(&a)], &[m])
        },
    );
    assert_eq!(d.layout, RowLayout::Sample);
    // Untrusted manifest: the header's (data) order.
    let mut names = field_names(&d.schema);
    names.sort();
    assert_eq!(names, ["x", "y"]);
}

#[test]
fn files_in_subdirectories_of_a_dataset_are_not_part_of_it() {
    let dir = Dir::new("subdir");
    let (a, b, m) = two_shards(&dir);
    let name = a.file.rsplit_once('/').unwrap().1;
    // a stray copy of a listed shard, and the same through a loop back into the directory
    let copy = |sub: &str| {
        let p = dir.0.join(sub);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::copy(path_of(&a.file), p.join(name)).unwrap();
        FileInput {
            file: format!("{}/{sub}/{name}", dir.uri()),
            ..a.clone()
        }
    };
    let strays = [copy("sub"), copy("loop/loop")];
    // a sibling directory whose name starts with the dataset's is not under it
    let sibling = Dir(PathBuf::from(format!("{}2", dir.0.display())));
    std::fs::create_dir_all(&sibling.0).unwrap();
    let loose = shard(
        &sibling,
        "loose.safetensors",
        2,
        0,
        &[("x", Dtype::F32, &[2, 3])],
    );
    let mut files = vec![a.clone(), b.clone(), with_header(&loose)];
    files.extend(strays.iter().cloned());
    let d = describe_ok(
        RowLayoutOption::Auto,
        input(&files, std::slice::from_ref(&m)),
    );
    let excluded: Vec<&str> = d.excluded.iter().map(|e| e.file.as_str()).collect();
    assert_eq!(excluded, [strays[1].file.as_str(), strays[0].file.as_str()]); // by URI
    assert!(
        d.excluded[0].reason.contains("subdirectory of the dataset"),
        "{}",
        d.excluded[0].reason
    );
    let specs = plan_ok(&plan_req(RowLayout::Sample, input(&files, &[m]), &["y"]));
    let planned: std::collections::HashSet<&str> = specs
        .iter()
        .flat_map(|s| s.units.iter().map(|u| u.file.as_str()))
        .collect();
    assert_eq!(
        planned,
        std::collections::HashSet::from([a.file.as_str(), b.file.as_str(), loose.file.as_str()])
    );
}

#[test]
fn a_listed_shard_that_is_missing_fails_the_scan_naming_it_unless_ignored() {
    let dir = Dir::new("missing");
    let (a, b, m) = two_shards(&dir);
    let req = |ignore_missing| DescribeRequest {
        layout: RowLayoutOption::Auto,
        input: ScanInput {
            ignore_missing,
            ..input(std::slice::from_ref(&a), std::slice::from_ref(&m))
        },
    };
    let e = describe(&req(false)).unwrap_err();
    assert_eq!(e.file, b.file, "{e}");
    assert!(matches!(e.kind, ReadErrorKind::MissingShard { .. }), "{e}");
    assert!(e.to_string().contains("dataset_manifest.json"), "{e}");
    // ignored: left out with the reason, the rest read from its header
    let bytes = std::fs::read(path_of(&a.file)).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let with_header = FileInput {
        header: Some(String::from_utf8(bytes[8..8 + n].to_vec()).unwrap()),
        ..a.clone()
    };
    let d = describe(&DescribeRequest {
        layout: RowLayoutOption::Auto,
        input: ScanInput {
            ignore_missing: true,
            ..input(&[with_header], std::slice::from_ref(&m))
        },
    })
    .unwrap();
    let Answer::Ready(d) = d else {
        panic!("expected a description, got {d:?}")
    };
    assert!(
        d.excluded
            .iter()
            .any(|x| x.file == b.file && x.reason.contains("missing")),
        "{:?}",
        d.excluded
    );
}

#[test]
fn manifest_with_unknown_version_is_an_error_naming_it() {
    let dir = Dir::new("ver");
    let (a, _, m) = two_shards(&dir);
    let text = m
        .text
        .replace("\"format_version\": \"1.0\"", "\"format_version\": \"2.0\"");
    let e = describe(&DescribeRequest {
        layout: RowLayoutOption::Auto,
        input: input(&[a], &[ManifestInput { text, ..m }]),
    })
    .unwrap_err();
    assert!(e.file.ends_with("dataset_manifest.json"), "{e}");
    assert!(e.to_string().contains("format_version"), "{e}");
}

#[test]
fn sample_schema_merges_and_reports_conflicts() {
    let dir = Dir::new("merge");
    let mk =
        |name: &str, cols: &[(&str, Dtype, &[u64])]| with_header(&shard(&dir, name, 2, 0, cols));
    let a = mk(
        "a.safetensors",
        &[
            ("x", Dtype::F16, &[3]),
            ("i", Dtype::I8, &[]),
            ("f8", Dtype::F8E4M3, &[2]),
        ],
    );
    let b = mk(
        "b.safetensors",
        &[
            ("x", Dtype::F32, &[3]),
            ("i", Dtype::U8, &[]),
            ("only_b", Dtype::Bool, &[]),
        ],
    );
    let d = describe_ok(RowLayoutOption::Sample, input(&[b.clone(), a.clone()], &[]));
    // Columns: a's in its header (data) order, then b's new one.
    let a_order: Vec<String> =
        header::parse_header(a.header.as_ref().unwrap().as_bytes(), a.length)
            .unwrap()
            .tensors
            .iter()
            .map(|t| t.name.clone())
            .collect();
    let mut expected = a_order.clone();
    expected.push("only_b".into());
    assert_eq!(field_names(&d.schema), expected);
    let type_of = |name: &str| {
        d.schema["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == json!(name))
            .unwrap()["type"]
            .clone()
    };
    assert_eq!(type_of("x"), array_of(json!("float")));
    assert_eq!(type_of("i"), json!("short"));
    assert_eq!(type_of("f8"), json!("binary"));
    assert_eq!(type_of("only_b"), json!("boolean"));

    type Cols<'a> = &'a [(&'a str, Dtype, &'a [u64])];
    let cases: [(Cols, &str); 5] = [
        (&[("x", Dtype::F32, &[3, 1])], "ranks differ"),
        (&[("i", Dtype::I64, &[])], "no common Spark type"),
        (
            &[("x", Dtype::F8E5M2, &[3])],
            "cannot share a column with decodable",
        ),
        (
            &[("f8", Dtype::F8E5M2, &[2])],
            "different dtypes without a Spark type",
        ),
        (
            &[("f8", Dtype::F32, &[2])],
            "cannot share a column with decodable",
        ),
    ];
    for (i, (cols, problem)) in cases.iter().enumerate() {
        // i64 with a's I8 is fine: use F32 as the partner of that case.
        let partner = if i == 1 {
            mk(&format!("p{i}.safetensors"), &[("i", Dtype::F32, &[])])
        } else {
            a.clone()
        };
        let z = mk(&format!("z{i}.safetensors"), cols);
        let e = describe(&DescribeRequest {
            layout: RowLayoutOption::Sample,
            input: input(&[partner.clone(), z.clone()], &[]),
        })
        .unwrap_err();
        let text = e.to_string();
        assert!(text.contains(problem), "{text}");
        assert_eq!(e.file, z.file, "{text}");
        assert!(text.contains(&partner.file), "{text}");
        assert!(e.tensor.is_some(), "{text}");
    }
    // A sample that is not a whole number of bytes cannot be binary.
    let f4 = mk("f4.safetensors", &[("q", Dtype::F4, &[3])]);
    let e = describe(&DescribeRequest {
        layout: RowLayoutOption::Sample,
        input: input(&[f4], &[]),
    })
    .unwrap_err();
    assert!(e.to_string().contains("whole number of bytes"), "{e}");
    // A KV shard read per sample: the batch_samples error.
    let kv = with_header(&write(
        &dir,
        "kv.safetensors",
        Some(&[("safetensors_spark.layout", "kv")]),
        &[("k__c", Dtype::F32, &[2])],
    ));
    let e = describe(&DescribeRequest {
        layout: RowLayoutOption::Sample,
        input: input(&[kv], &[]),
    })
    .unwrap_err();
    assert!(e.to_string().contains("KV shard"), "{e}");
}

#[test]
fn corrupt_files_fail_or_are_excluded() {
    let dir = Dir::new("corrupt");
    let good = with_header(&write(
        &dir,
        "good.safetensors",
        None,
        &[("t", Dtype::F32, &[2])],
    ));
    let bad_json = FileInput {
        file: format!("{}/bad.safetensors", dir.uri()),
        length: 100,
        header: Some("{\"t\": 3}".into()),
        header_error: None,
    };
    let bad_prefix = FileInput {
        file: format!("{}/prefix.safetensors", dir.uri()),
        length: 4,
        header: None,
        header_error: Some("header too small".into()),
    };
    for bad in [&bad_json, &bad_prefix] {
        let mut inp = input(&[good.clone(), bad.clone()], &[]);
        let e = describe(&DescribeRequest {
            layout: RowLayoutOption::Tensor,
            input: inp.clone(),
        })
        .unwrap_err();
        assert_eq!(e.file, bad.file);
        inp.ignore_corrupt = true;
        let d = describe_ok(RowLayoutOption::Tensor, inp.clone());
        assert_eq!(d.excluded.len(), 1);
        assert_eq!(d.excluded[0].file, bad.file);
        // Planning with the same input leaves it out too.
        let specs = plan_ok(&plan_req(RowLayout::Tensor, inp, &["key"]));
        let files: Vec<&str> = specs
            .iter()
            .flat_map(|s| s.units.iter().map(|u| u.file.as_str()))
            .collect();
        assert_eq!(files, [good.file.as_str()]);
    }
}

// ---------------------------------------------------------------------------------------------
// plan
// ---------------------------------------------------------------------------------------------

fn sample_parts(specs: &[PartitionSpec]) -> Vec<(String, u64, u64, u64)> {
    let mut out: Vec<_> = specs
        .iter()
        .flat_map(|s| s.units.iter())
        .map(|u| match &u.part {
            UnitPart::Sample { start, end, .. } => (u.file.clone(), *start, *end, u.bytes),
            other => panic!("{other:?}"),
        })
        .collect();
    out.sort();
    out
}

#[test]
fn plan_sample_splits_shards_by_bytes_and_packs_partitions() {
    let dir = Dir::new("plan");
    let (a, b, m) = two_shards(&dir);
    // Row bytes: x = 2·3·4 = 24, y = 8.
    let mut r = plan_req(
        RowLayout::Sample,
        input(&[a.clone(), b.clone()], &[m]),
        &["x", "y", "_file"],
    );
    r.max_partition_bytes = 64; // two rows per unit
    let specs = plan_ok(&r);
    assert_eq!(
        sample_parts(&specs),
        [
            (a.file.clone(), 0, 2, 64),
            (a.file.clone(), 2, 4, 64),
            (b.file.clone(), 0, 2, 64),
            (b.file.clone(), 2, 3, 32),
        ]
    );
    // Each 64-byte unit fills a partition; the 32-byte one is alone.
    assert_eq!(specs.len(), 4);
    assert!(specs
        .iter()
        .all(|s| s.units.len() == 1 && s.bytes == s.units[0].bytes));
    assert_eq!(specs.last().unwrap().bytes, 32);
    let names: Vec<_> = specs[0].columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["x", "y", "_file"]);
    // Only y: 8 bytes a row; everything fits one partition.
    r.required = vec![req("y")];
    let specs = plan_ok(&r);
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0].bytes, 7 * 8);
    assert_eq!(specs[0].units.len(), 2);
    // count(): no data, one unit per shard.
    r.required = vec![];
    let specs = plan_ok(&r);
    assert_eq!(
        sample_parts(&specs),
        [(a.file.clone(), 0, 4, 0), (b.file.clone(), 0, 3, 0)]
    );
    // File predicate.
    r.predicates = vec![Predicate {
        column: "_file".into(),
        test: PredicateTest::In(vec![b.file.clone()]),
    }];
    assert_eq!(sample_parts(&plan_ok(&r)), [(b.file.clone(), 0, 3, 0)]);
    r.predicates[0].test = PredicateTest::Prefix(vec!["nope".into()]);
    assert!(plan_ok(&r).is_empty());
    // Unknown column / predicate column: errors naming it.
    r.required = vec![req("nope")];
    let e = plan(&r).unwrap_err();
    assert!(e.to_string().contains("`nope`"), "{e}");
    r.required = vec![];
    r.predicates[0].column = "key".into();
    assert!(err_text(plan(&r)).contains("`key`"));
}

#[test]
fn pack_follows_spark_file_partitions() {
    let unit = |bytes: u64| Unit {
        file: format!("f{bytes}"),
        length: bytes,
        part: UnitPart::File { tensors: vec![] },
        bytes,
    };
    let parts = pack(vec![unit(10), unit(60), unit(30), unit(50)], 100, 5);
    let sizes: Vec<Vec<u64>> = parts
        .iter()
        .map(|p| p.iter().map(|u| u.bytes).collect())
        .collect();
    // 60 (+5) then 50 would exceed 100: new partition; 50+5+30 = 85 ≤ 100 then 10: 85+10 ≤ 100.
    assert_eq!(sizes, [vec![60], vec![50, 30, 10]]);
    assert!(pack(vec![], 100, 5).is_empty());
}

#[test]
fn max_split_bytes_follows_spark() {
    let unit = |file: &str, bytes: u64| Unit {
        file: file.into(),
        length: bytes,
        part: UnitPart::File { tensors: vec![] },
        bytes,
    };
    // Two files: 100 bytes (two units) and 50; open cost 10 per file → total 170.
    let units = [unit("f1", 60), unit("f1", 40), unit("f2", 50)];
    assert_eq!(max_split_bytes(&units, 100, 10, 2), 85); // 170 / 2
    assert_eq!(max_split_bytes(&units, 80, 10, 2), 80); // capped by maxPartitionBytes
    assert_eq!(max_split_bytes(&units, 100, 10, 1), 100);
    assert_eq!(max_split_bytes(&units, 100, 10, 0), 100); // 0: as 1
    assert_eq!(max_split_bytes(&units, 100, 10, 100), 10); // at least the open cost
    assert_eq!(max_split_bytes(&[], 100, 10, 2), 10);
}

#[test]
fn plan_spreads_a_small_scan_over_min_partitions() {
    let dir = Dir::new("pmin");
    let (a, b, m) = two_shards(&dir);
    // 32 bytes a row: a = 4 rows (128 bytes), b = 3 rows (96); far below max_partition_bytes.
    let mut r = plan_req(
        RowLayout::Sample,
        input(&[a.clone(), b.clone()], &[m]),
        &["x", "y"],
    );
    r.min_partitions = 1;
    let one = plan_ok(&r);
    assert_eq!(one.len(), 1);
    assert_eq!(
        sample_parts(&one),
        [(a.file.clone(), 0, 4, 128), (b.file.clone(), 0, 3, 96)]
    );
    // Two cores: split = 224 / 2 = 112 bytes = 3 rows; packed largest first as Spark does.
    r.min_partitions = 2;
    let two = plan_ok(&r);
    assert_eq!(
        sample_parts(&two),
        [
            (a.file.clone(), 0, 3, 96),
            (a.file.clone(), 3, 4, 32),
            (b.file.clone(), 0, 3, 96),
        ]
    );
    let sizes: Vec<u64> = two.iter().map(|s| s.bytes).collect();
    assert_eq!(sizes, [96, 96, 32]);
    // With an open cost of 16 per file: split = (224 + 32) / 2 = 128, one shard per partition.
    r.open_cost_bytes = 16;
    let sizes: Vec<u64> = plan_ok(&r).iter().map(|s| s.bytes).collect();
    assert_eq!(sizes, [128, 96]);
    // max_partition_bytes still caps the split.
    r.max_partition_bytes = 64;
    assert!(plan_ok(&r).iter().all(|s| s.bytes <= 64));
}

#[test]
fn plan_tensor_layout_predicates_and_splitting() {
    let dir = Dir::new("ptensor");
    let a = with_header(&write(
        &dir,
        "a.safetensors",
        None,
        &[
            ("enc.w", Dtype::F32, &[10]),
            ("enc.b", Dtype::F16, &[10]),
            ("dec.w", Dtype::F32, &[10]),
        ],
    ));
    let b = with_header(&write(
        &dir,
        "b.safetensors",
        None,
        &[("dec.b", Dtype::I8, &[4])],
    ));
    let mut r = plan_req(
        RowLayout::Tensor,
        input(&[a.clone(), b.clone()], &[]),
        &["key", "shape"],
    );
    // Without data: one unit per file, 0 bytes.
    let specs = plan_ok(&r);
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0].bytes, 0);
    assert_eq!(specs[0].units.len(), 2);
    // With data: split by bytes (40 bytes max: each F32 alone, the F16 (20) alone too since
    // 40 + 20 > 40).
    r.required = vec![req("key"), req("data")];
    r.max_partition_bytes = 40;
    let specs = plan_ok(&r);
    let mut groups: Vec<Vec<String>> = specs
        .iter()
        .flat_map(|s| s.units.iter())
        .map(|u| match &u.part {
            UnitPart::Tensors { tensors } => tensors.iter().map(|t| t.name.clone()).collect(),
            other => panic!("{other:?}"),
        })
        .collect();
    groups.sort();
    assert_eq!(groups.len(), 4, "{groups:?}");
    assert_eq!(specs.iter().map(|s| s.bytes).sum::<u64>(), 40 + 20 + 40 + 4);
    // Predicates: key prefix AND dtype in.
    r.predicates = vec![
        Predicate {
            column: "key".into(),
            test: PredicateTest::Prefix(vec!["enc.".into()]),
        },
        Predicate {
            column: "dtype".into(),
            test: PredicateTest::In(vec!["F16".into(), "I8".into()]),
        },
    ];
    r.max_partition_bytes = 1 << 20;
    let specs = plan_ok(&r);
    let units: Vec<_> = specs.iter().flat_map(|s| s.units.iter()).collect();
    assert_eq!(
        units.len(),
        1,
        "b.safetensors has no matching tensor and is not opened"
    );
    assert_eq!(units[0].file, a.file);
    assert_eq!(
        units[0].part,
        UnitPart::Tensors {
            tensors: vec![TensorAssumption {
                name: "enc.b".into(),
                dtype: Dtype::F16,
                shape: vec![10],
                ragged: None,
            }]
        }
    );
    // `decoded` exists (F32, F16, I8 → float); pruned struct fields are rejected for unknown names.
    r.required = vec![req("decoded")];
    assert_eq!(
        plan_ok(&r)[0].columns[0].source,
        ColumnSource::Decoded {
            element: ElementType::Float
        }
    );
    // Empty scan: no partitions.
    assert!(plan_ok(&plan_req(RowLayout::Tensor, input(&[], &[]), &["key"])).is_empty());
}

#[test]
fn plan_file_layout_pruned_struct() {
    let dir = Dir::new("pfile");
    let a = with_header(&write(
        &dir,
        "a.safetensors",
        None,
        &[("w", Dtype::F32, &[8]), ("v", Dtype::F32, &[2])],
    ));
    let b = with_header(&write(
        &dir,
        "b.safetensors",
        None,
        &[("v", Dtype::F32, &[3])],
    ));
    let mut r = plan_req(RowLayout::File, input(&[a, b], &[]), &["file", "w"]);
    r.required[1].fields = Some(vec!["shape".into(), "dtype".into()]);
    let specs = plan_ok(&r);
    assert_eq!(specs.iter().map(|s| s.bytes).sum::<u64>(), 0);
    assert_eq!(
        specs[0].columns[1].source,
        ColumnSource::Tensor {
            key: "w".into(),
            fields: vec![TensorField::Shape, TensorField::Dtype],
        }
    );
    r.required[1].fields = None;
    let specs = plan_ok(&r);
    assert_eq!(specs.iter().map(|s| s.bytes).sum::<u64>(), 32);
    r.required[1].fields = Some(vec!["bytes".into()]);
    assert!(err_text(plan(&r)).contains("`bytes`"));
}

#[test]
fn file_layout_tensors_named_like_its_columns_take_their_place() {
    let dir = Dir::new("pfile-clash");
    let a = with_header(&write(
        &dir,
        "a.safetensors",
        Some(&[("k", "v")]),
        &[
            ("file", Dtype::F32, &[2]),
            ("metadata", Dtype::I64, &[1]),
            ("w", Dtype::F32, &[1]),
        ],
    ));
    let d = describe_ok(RowLayoutOption::File, input(std::slice::from_ref(&a), &[]));
    let mut visible = field_names(&d.schema);
    visible.sort();
    assert_eq!(
        visible,
        ["file", "flags", "metadata", "model_info", "sha256", "w"]
    );
    assert_eq!(field_names(&d.metadata_columns), ["_file", "_metadata"]);
    let at = |name: &str| {
        d.schema["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap()["type"]["type"]
            .clone()
    };
    assert_eq!(
        (at("file"), at("metadata")),
        (json!("struct"), json!("struct"))
    );
    assert_eq!(d.metadata_columns["fields"][0]["type"], json!("string"));

    let mut r = plan_req(
        RowLayout::File,
        input(std::slice::from_ref(&a), &[]),
        &["_file", "file", "_metadata", "metadata"],
    );
    let sources: Vec<ColumnSource> = plan_ok(&r)[0]
        .columns
        .iter()
        .map(|c| c.source.clone())
        .collect();
    assert_eq!(sources[0], ColumnSource::File);
    assert!(matches!(&sources[1], ColumnSource::Tensor { key, .. } if key == "file"));
    assert_eq!(sources[2], ColumnSource::Metadata);
    assert!(matches!(&sources[3], ColumnSource::Tensor { key, .. } if key == "metadata"));
    // the URI is `_file` now: a predicate on `file` (the tensor) is refused, on `_file` applied
    r.predicates = vec![Predicate {
        column: "file".into(),
        test: PredicateTest::In(vec![a.file.clone()]),
    }];
    assert!(err_text(plan(&r)).contains("`_file`"));
    r.predicates[0].column = "_file".into();
    r.predicates[0].test = PredicateTest::In(vec!["elsewhere".into()]);
    assert!(plan_ok(&r).is_empty());

    // a tensor `_file` beside a tensor `file`: no name is left for the URI
    let b = with_header(&write(
        &dir,
        "b.safetensors",
        None,
        &[("file", Dtype::F32, &[2]), ("_file", Dtype::F32, &[2])],
    ));
    let e = err_text(describe(&DescribeRequest {
        layout: RowLayoutOption::File,
        input: input(&[b], &[]),
    }));
    assert!(e.contains("b.safetensors") && e.contains("`_file`"), "{e}");
}

#[test]
fn json_shapes_round_trip() {
    let dir = Dir::new("json");
    let (a, b, m) = two_shards(&dir);
    let r = plan_req(RowLayout::Sample, input(&[a, b], &[m]), &["x", "_metadata"]);
    let text = serde_json::to_string(&r).unwrap();
    let back: PlanRequest = serde_json::from_str(&text).unwrap();
    assert_eq!(back, r);
    let specs = plan_ok(&r);
    let v = serde_json::to_value(&specs[0]).unwrap();
    assert_eq!(v["layout"], json!("sample"));
    assert_eq!(
        v["columns"][0],
        json!({"name": "x", "source": {"kind": "sample", "tensor": "x", "element": "float", "rank": 2}})
    );
    assert_eq!(v["columns"][1]["source"], json!({"kind": "metadata"}));
    assert_eq!(v["units"][0]["part"]["kind"], json!("sample"));
    let back: PartitionSpec = serde_json::from_value(v).unwrap();
    assert_eq!(back, specs[0]);
    let need: Answer<ScanDescription> = Answer::NeedHeaders(vec!["f".into()]);
    assert_eq!(
        serde_json::to_value(&need).unwrap(),
        json!({"need_headers": ["f"]})
    );
    let pred: Predicate =
        serde_json::from_value(json!({"column": "key", "op": "prefix", "values": ["a"]})).unwrap();
    assert_eq!(pred.test, PredicateTest::Prefix(vec!["a".into()]));
}

// ---------------------------------------------------------------------------------------------
// Key lookups through `_tensor_index.parquet`
// ---------------------------------------------------------------------------------------------

/// Key `i` of the KV fixtures.
fn kv_key(i: usize) -> String {
    format!("k{i:03}")
}

/// A KV dataset: `shards` shards of `per_shard` keys each; key i has `k<i>__v` (F32 [4]) and
/// `k<i>__n` (I16 []). Returns the shards, a consistent manifest (`has_index` set when the index
/// is written) and the index rows of every shard (written to `_tensor_index.parquet` when
/// `index`).
fn kv_dataset(
    dir: &Dir,
    shards: usize,
    per_shard: usize,
    index: bool,
) -> (Vec<FileInput>, ManifestInput, Vec<IndexRow>) {
    use safetensors_spark_dataset::index::{write_index, IndexRow};
    let mut files = Vec::new();
    let mut rows = Vec::new();
    let mut listed = Vec::new();
    for s in 0..shards {
        let name = shard_name(s as u32, 0);
        let keys: Vec<String> = (s * per_shard..(s + 1) * per_shard).map(kv_key).collect();
        let names: Vec<(String, String)> = keys
            .iter()
            .map(|k| (format!("{k}__v"), format!("{k}__n")))
            .collect();
        let mut tensors: Vec<(&str, Dtype, &[u64])> = Vec::new();
        for (v, n) in &names {
            tensors.push((v, Dtype::F32, &[4]));
            tensors.push((n, Dtype::I16, &[]));
        }
        let n = per_shard.to_string();
        let meta = [
            ("safetensors_spark.format_version", "1"),
            ("safetensors_spark.layout", "kv"),
            ("safetensors_spark.samples", n.as_str()),
            ("safetensors_spark.padded_samples", "0"),
            ("safetensors_spark.kv_separator", "__"),
        ];
        let f = write(dir, &name, Some(&meta), &tensors);
        let h = safetensors_spark_format::file::read_header(path_of(&f.file)).unwrap();
        for t in &h.tensors {
            let (key, column) = t.name.rsplit_once("__").unwrap();
            rows.push(IndexRow {
                tensor_key: t.name.clone(),
                file_name: name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                data_start: h.data_start() + t.data_offsets[0],
                data_end: h.data_start() + t.data_offsets[1],
                sample_key: Some(key.to_string()),
                column: column.to_string(),
            });
        }
        listed.push(ManifestShard {
            shard_path: name,
            partition: Some(s as u32),
            samples_count: per_shard as u64,
            padded_samples: Some(0),
            num_tensors: Some(2 * per_shard as u64),
            bytes: f.length,
            crc32c: None,
            added_version: None,
        });
        files.push(f);
    }
    let m = Manifest {
        format_version: FORMAT_VERSION.into(),
        safetensors_version: SAFETENSORS_VERSION.into(),
        schema: ColumnMap(vec![
            (
                "v".into(),
                ManifestTensor {
                    dtype: Dtype::F32,
                    shape: Some(vec![4]),
                    ragged: None,
                },
            ),
            (
                "n".into(),
                ManifestTensor {
                    dtype: Dtype::I16,
                    shape: Some(vec![]),
                    ragged: None,
                },
            ),
        ]),
        total_samples: (shards * per_shard) as u64,
        total_bytes: files.iter().map(|f| f.length).sum(),
        shards: listed,
        ext: Some(ManifestExt {
            format: MANIFEST_FORMAT.into(),
            created_by: "test".into(),
            manifest_version: 1,
            mode: DatasetMode::Kv,
            batch_size: None,
            tail_strategy: None,
            kv_separator: Some("__".into()),
            padded_samples: 0,
            dropped_samples: 0,
            stream_commits: Default::default(),
            committed_at_ms: None,
            operation: None,
            commit_message: None,
            app_id: None,
            retention_seconds: None,
            vacuumed: None,
            checkpoint_interval: None,
        }),
    };
    if index {
        write_index(&dir.0.join(index_part_file_name(1)), rows.clone()).unwrap();
    }
    let m = ManifestInput {
        dir: dir.uri(),
        text: m.to_json_pretty().unwrap(),
        has_index: index,
        index: None,
    };
    (files, m, rows)
}

use safetensors_spark_dataset::index::IndexRow;

/// What the JVM does for `need_index`: the index file's bytes through [`index_summary`].
fn with_index(dir: &Dir, m: &ManifestInput, predicates: &[Predicate]) -> ManifestInput {
    let bytes = std::fs::read(dir.0.join(index_part_file_name(1))).unwrap();
    ManifestInput {
        index: Some(index_summary(&m.dir, bytes::Bytes::from(bytes), predicates).unwrap()),
        ..m.clone()
    }
}

fn key_in(keys: &[&str]) -> Predicate {
    Predicate {
        column: "key".into(),
        test: PredicateTest::In(keys.iter().map(|k| k.to_string()).collect()),
    }
}

fn key_prefix(prefix: &str) -> Predicate {
    Predicate {
        column: "key".into(),
        test: PredicateTest::Prefix(vec![prefix.into()]),
    }
}

/// (file name, tensor names) of every unit, sorted.
fn unit_tensors(specs: &[PartitionSpec]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = specs
        .iter()
        .flat_map(|s| s.units.iter())
        .map(|u| match &u.part {
            UnitPart::Tensors { tensors } => (
                u.file.rsplit_once('/').unwrap().1.to_string(),
                tensors.iter().map(|t| t.name.clone()).collect(),
            ),
            other => panic!("{other:?}"),
        })
        .collect();
    out.sort();
    out
}

#[test]
fn describe_per_tensor_from_a_consistent_manifest_needs_no_header() {
    let dir = Dir::new("kvdesc");
    let (files, m, _) = kv_dataset(&dir, 3, 4, true);
    // Auto on a KV manifest is per tensor; the schema (decoded: F32 + I16 → float) comes from
    // the manifest's column dtypes, the same as from every header.
    let d = describe_ok(
        RowLayoutOption::Auto,
        input(&files, std::slice::from_ref(&m)),
    );
    assert_eq!(d.layout, RowLayout::Tensor);
    let headers: Vec<FileInput> = files.iter().map(with_header).collect();
    let from_headers = describe_ok(RowLayoutOption::Tensor, input(&headers, &[]));
    assert_eq!(d.schema, from_headers.schema);
    assert_eq!(d.schema["fields"][6]["name"], json!("decoded"));
    assert_eq!(d.schema["fields"][6]["type"], array_of(json!("float")));
    // An inconsistent manifest (a listed shard gone, read with ignoreMissingFiles) is not
    // trusted: headers.
    let r = describe(&DescribeRequest {
        layout: RowLayoutOption::Tensor,
        input: ScanInput {
            ignore_missing: true,
            ..input(&files[..2], &[m])
        },
    })
    .unwrap();
    assert_eq!(
        r,
        Answer::NeedHeaders(files[..2].iter().map(|f| f.file.clone()).collect())
    );
}

#[test]
fn key_lookups_are_planned_from_the_index_without_headers() {
    let dir = Dir::new("kvidx");
    let (files, m, _) = kv_dataset(&dir, 4, 5, true);
    let key = kv_key(7);
    let wanted = format!("{key}__v");
    let mut r = plan_req(
        RowLayout::Tensor,
        input(&files, std::slice::from_ref(&m)),
        &["key", "decoded"],
    );
    r.predicates = vec![key_in(&[&wanted])];
    // First the index, not the headers.
    assert_eq!(plan(&r).unwrap(), Answer::NeedIndex(vec![m.dir.clone()]));
    assert_eq!(
        serde_json::to_value(plan(&r).unwrap()).unwrap(),
        json!({"need_index": [m.dir.clone()]})
    );
    // With the index's summary: one unit, in the shard holding the key; no header given.
    let summary = with_index(&dir, &m, &r.predicates);
    assert_eq!(
        summary.index.as_ref().unwrap().rows.len(),
        1,
        "only matching rows cross JNI"
    );
    assert_eq!(summary.index.as_ref().unwrap().files.len(), 4);
    r.input.manifests = vec![summary];
    let specs = plan_ok(&r);
    assert_eq!(
        unit_tensors(&specs),
        [(shard_name(1, 0), vec![wanted.clone()])]
    );
    let unit = &specs[0].units[0];
    assert_eq!(unit.file, files[1].file);
    assert_eq!(unit.length, files[1].length);
    assert_eq!(unit.bytes, 16);
    assert_eq!(
        unit.part,
        UnitPart::Tensors {
            tensors: vec![TensorAssumption {
                name: wanted.clone(),
                dtype: Dtype::F32,
                shape: vec![4],
                ragged: None,
            }]
        }
    );
    assert_eq!(
        specs[0].columns[1].source,
        ColumnSource::Decoded {
            element: ElementType::Float
        }
    );
    // The plan equals the one made from every header (index ignored: no `has_index`).
    let headers: Vec<FileInput> = files.iter().map(with_header).collect();
    let mut from_headers = r.clone();
    from_headers.input = input(
        &headers,
        &[ManifestInput {
            has_index: false,
            index: None,
            ..m.clone()
        }],
    );
    assert_eq!(plan_ok(&from_headers), specs);
    // The task runs it: the header agrees with the index.
    let mut task = crate::read::task::ReadTask::new(specs[0].clone());
    task.open_local(0, &path_of(&unit.file)).unwrap();
    let batch = task.next_batch().unwrap().unwrap();
    assert_eq!(batch.num_rows(), 1);

    // Prefix and IN over several files, with a dtype predicate: only matching files get units.
    r.predicates = vec![
        key_prefix("k01"),
        Predicate {
            column: "dtype".into(),
            test: PredicateTest::In(vec!["I16".into()]),
        },
    ];
    r.input.manifests = vec![with_index(&dir, &m, &r.predicates)];
    let expect = |keys: std::ops::Range<usize>, shard: u32| {
        (
            shard_name(shard, 0),
            keys.map(|i| format!("{}__n", kv_key(i)))
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(
        unit_tensors(&plan_ok(&r)),
        [expect(10..15, 2), expect(15..20, 3)]
    );
    r.predicates = vec![key_in(&["k001__v", "k019__n", "nope"])];
    r.input.manifests = vec![with_index(&dir, &m, &r.predicates)];
    assert_eq!(
        unit_tensors(&plan_ok(&r)),
        [
            (shard_name(0, 0), vec!["k001__v".to_string()]),
            (shard_name(3, 0), vec!["k019__n".to_string()]),
        ]
    );
    // A `file` predicate: applied to the index rows by URI.
    r.predicates = vec![
        key_prefix("k"),
        Predicate {
            column: "file".into(),
            test: PredicateTest::In(vec![files[2].file.clone()]),
        },
    ];
    r.input.manifests = vec![with_index(&dir, &m, &r.predicates)];
    let got = unit_tensors(&plan_ok(&r));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, shard_name(2, 0));
    assert_eq!(got[0].1.len(), 10);
    // No match at all: no partition, still no header.
    r.predicates = vec![key_in(&["absent"])];
    r.input.manifests = vec![with_index(&dir, &m, &r.predicates)];
    assert!(plan_ok(&r).is_empty());
}

#[test]
fn an_index_not_covering_the_manifest_is_ignored() {
    let dir = Dir::new("kvcover");
    let (files, m, rows) = kv_dataset(&dir, 3, 2, true);
    let mut r = plan_req(
        RowLayout::Tensor,
        input(&files, std::slice::from_ref(&m)),
        &["key"],
    );
    r.predicates = vec![key_in(&["k000__v"])];
    let all: Vec<String> = files.iter().map(|f| f.file.clone()).collect();
    let summary = with_index(&dir, &m, &r.predicates).index.unwrap();
    let mut variants = Vec::new();
    // A shard missing from the index.
    let mut missing = summary.clone();
    missing.files.remove(&shard_name(2, 0));
    variants.push(missing);
    // A file the manifest does not list.
    let mut extra = summary.clone();
    extra.files.insert("other.safetensors".into(), 1);
    variants.push(extra);
    // A shard with another number of tensors than the manifest says.
    let mut count = summary.clone();
    *count.files.get_mut(&shard_name(0, 0)).unwrap() += 1;
    variants.push(count);
    // An index that could not be read.
    variants.push(IndexSummary {
        error: Some("boom".into()),
        ..IndexSummary::default()
    });
    for index in variants {
        r.input.manifests = vec![ManifestInput {
            index: Some(index.clone()),
            ..m.clone()
        }];
        assert_eq!(
            plan(&r).unwrap(),
            Answer::NeedHeaders(all.clone()),
            "{index:?}"
        );
    }
    // Actually rewritten without the last shard: the summary says so.
    safetensors_spark_dataset::index::write_index(
        &dir.0.join(index_part_file_name(1)),
        rows.iter()
            .filter(|x| x.file_name != shard_name(2, 0))
            .cloned(),
    )
    .unwrap();
    r.input.manifests = vec![with_index(&dir, &m, &r.predicates)];
    assert_eq!(plan(&r).unwrap(), Answer::NeedHeaders(all.clone()));
    // With the headers, the plan is right.
    r.input.files = files.iter().map(with_header).collect();
    assert_eq!(
        unit_tensors(&plan_ok(&r)),
        [(shard_name(0, 0), vec!["k000__v".to_string()])]
    );
    // An inconsistent manifest (a shard with another length): its index is not even asked for.
    let mut r2 = r.clone();
    r2.input.files = files.clone();
    r2.input.files[1].length += 1;
    r2.input.manifests = vec![m.clone()];
    assert_eq!(plan(&r2).unwrap(), Answer::NeedHeaders(all));
}

#[test]
fn the_index_is_only_for_key_predicates_per_tensor() {
    let dir = Dir::new("kvonly");
    let (files, m, _) = kv_dataset(&dir, 2, 2, true);
    let all: Vec<String> = files.iter().map(|f| f.file.clone()).collect();
    let mut r = plan_req(
        RowLayout::Tensor,
        input(&files, std::slice::from_ref(&m)),
        &["key"],
    );
    // No predicate, or only dtype/file ones: headers, never the index.
    for predicates in [
        vec![],
        vec![Predicate {
            column: "dtype".into(),
            test: PredicateTest::In(vec!["F32".into()]),
        }],
        vec![Predicate {
            column: "file".into(),
            test: PredicateTest::Prefix(vec![dir.uri()]),
        }],
    ] {
        r.predicates = predicates;
        assert_eq!(plan(&r).unwrap(), Answer::NeedHeaders(all.clone()));
    }
    // A key predicate but no index in the directory: headers.
    r.predicates = vec![key_prefix("k")];
    r.input.manifests = vec![ManifestInput {
        has_index: false,
        ..m.clone()
    }];
    assert_eq!(plan(&r).unwrap(), Answer::NeedHeaders(all.clone()));
    // A key predicate whose files the `file` predicate all excludes: nothing to ask.
    r.input.manifests = vec![m.clone()];
    r.predicates = vec![
        key_prefix("k"),
        Predicate {
            column: "file".into(),
            test: PredicateTest::In(vec!["file:/elsewhere.safetensors".into()]),
        },
    ];
    assert!(plan_ok(&r).is_empty());
    // A file outside the dataset: its header is needed for the schema (`decoded`) even when a
    // `file` predicate leaves it out, and asked for together with the plan's.
    let other = Dir::new("kvonly-other");
    let loose = write(
        &other,
        "loose.safetensors",
        None,
        &[("w", Dtype::F64, &[2])],
    );
    let mut with_loose = plan_req(
        RowLayout::Tensor,
        input(
            &[files[0].clone(), files[1].clone(), loose.clone()],
            std::slice::from_ref(&m),
        ),
        &["key"],
    );
    with_loose.predicates = vec![
        key_prefix("k"),
        Predicate {
            column: "file".into(),
            test: PredicateTest::In(vec![files[0].file.clone()]),
        },
    ];
    assert_eq!(
        plan(&with_loose).unwrap(),
        Answer::NeedIndex(vec![m.dir.clone()])
    );
    with_loose.input.manifests = vec![with_index(&dir, &m, &with_loose.predicates)];
    assert_eq!(
        plan(&with_loose).unwrap(),
        Answer::NeedHeaders(vec![loose.file.clone()])
    );
    with_loose.input.files[2] = with_header(&loose);
    let specs = plan_ok(&with_loose);
    assert_eq!(unit_tensors(&specs).len(), 1);
    // Without the index: the planned file's and the schema's headers in one round.
    with_loose.input.files[2] = loose.clone();
    with_loose.input.manifests = vec![ManifestInput {
        has_index: false,
        ..m.clone()
    }];
    assert_eq!(
        plan(&with_loose).unwrap(),
        Answer::NeedHeaders(vec![files[0].file.clone(), loose.file.clone()])
    );
    // The per-file layout needs headers whatever the index.
    let f = plan_req(RowLayout::File, input(&files, &[m]), &["file"]);
    assert_eq!(plan(&f).unwrap(), Answer::NeedHeaders(all));
}

#[test]
fn a_stale_index_fails_the_task_loudly() {
    let dir = Dir::new("kvstale");
    let (files, m, _) = kv_dataset(&dir, 2, 2, true);
    let mut r = plan_req(
        RowLayout::Tensor,
        input(&files, std::slice::from_ref(&m)),
        &["key", "data"],
    );
    r.predicates = vec![key_in(&["k003__v"])];
    let mut stale = with_index(&dir, &m, &r.predicates);
    // The index says k003__v is F32 [5]; the file holds F32 [4].
    stale.index.as_mut().unwrap().rows[0].shape = vec![5];
    r.input.manifests = vec![stale];
    let specs = plan_ok(&r);
    let mut task = crate::read::task::ReadTask::new(specs[0].clone());
    let e = task
        .open_local(0, &path_of(&specs[0].units[0].file))
        .unwrap_err();
    assert!(
        e.to_string().contains("changed since the scan was planned"),
        "{e}"
    );
    assert_eq!(e.tensor.as_deref(), Some("k003__v"));
    // A key the index has but the file lost: missing.
    let mut gone = with_index(&dir, &m, &r.predicates);
    gone.index.as_mut().unwrap().rows[0].tensor_key = "k003__gone".into();
    r.predicates = vec![key_prefix("k003")];
    r.input.manifests = vec![gone];
    let specs = plan_ok(&r);
    let mut task = crate::read::task::ReadTask::new(specs[0].clone());
    let e = task
        .open_local(0, &path_of(&specs[0].units[0].file))
        .unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
}

#[test]
fn index_summary_counts_rows_and_rejects_bad_input() {
    let dir = Dir::new("kvsum");
    let (_, m, rows) = kv_dataset(&dir, 2, 3, true);
    let bytes = bytes::Bytes::from(std::fs::read(dir.0.join(index_part_file_name(1))).unwrap());
    let s = index_summary(&m.dir, bytes.clone(), &[key_prefix("k00")]).unwrap();
    assert_eq!(s.files.values().sum::<u64>(), rows.len() as u64);
    assert_eq!(s.files[&shard_name(0, 0)], 6);
    let keys: Vec<&str> = s.rows.iter().map(|r| r.tensor_key.as_str()).collect();
    assert_eq!(keys.len(), 12, "k000..k005, two tensors each");
    assert!(s
        .rows
        .windows(2)
        .all(|w| w[0].data_start < w[1].data_start || w[0].file_name < w[1].file_name));
    let e = index_summary(&m.dir, bytes::Bytes::from_static(b"PAR1"), &[]).unwrap_err();
    assert!(e.to_string().contains(INDEX_DIR_NAME), "{e}");
    let bad = Predicate {
        column: "shape".into(),
        test: PredicateTest::In(vec![]),
    };
    assert!(index_summary(&m.dir, bytes, &[bad]).is_err());
    // JSON shape of a summary.
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["rows"][0]["dtype"], json!("F32"));
    assert!(v.get("error").is_none());
}

#[test]
fn per_file_layout_limits_tensors_per_file_and_columns_over_the_scan() {
    let dir = Dir::new("wide");
    let names: Vec<String> = (0..5).map(|i| format!("t{i}")).collect();
    let wide: Vec<(&str, Dtype, &[u64])> = names
        .iter()
        .map(|n| (n.as_str(), Dtype::F32, &[0u64][..]))
        .collect();
    let big = with_header(&write(&dir, "big.safetensors", None, &wide));
    let small = with_header(&write(&dir, "small.safetensors", None, &wide[..3]));
    let other = with_header(&write(
        &dir,
        "z.safetensors",
        None,
        &[("u", Dtype::F32, &[1]), ("v", Dtype::F32, &[1])],
    ));
    let limited = |files: &[FileInput], ignore_corrupt| ScanInput {
        file_layout_max_tensors: Some(4),
        ignore_corrupt,
        ..input(files, &[])
    };
    // A file beyond the limit: its error, naming the count, the limit and the option.
    let e = describe(&DescribeRequest {
        layout: RowLayoutOption::File,
        input: limited(&[big.clone(), small.clone()], false),
    })
    .unwrap_err();
    assert_eq!(e.file, big.file, "{e}");
    let text = e.to_string();
    for part in ["5 tensors", "at most 4", "file_layout_max_tensors"] {
        assert!(text.contains(part), "{text}");
    }
    // ... skipped with ignoreCorruptFiles, in the description and the plan.
    let d = describe_ok(
        RowLayoutOption::File,
        limited(&[big.clone(), small.clone()], true),
    );
    assert_eq!(d.excluded.len(), 1);
    assert_eq!(d.excluded[0].file, big.file);
    let specs = plan_ok(&plan_req(
        RowLayout::File,
        limited(&[big.clone(), small.clone()], true),
        &["file"],
    ));
    let files: Vec<&str> = specs
        .iter()
        .flat_map(|s| s.units.iter().map(|u| u.file.as_str()))
        .collect();
    assert_eq!(files, [small.file.as_str()]);
    // The other layouts have no such limit.
    let d = describe_ok(
        RowLayoutOption::Tensor,
        limited(std::slice::from_ref(&big), false),
    );
    assert!(d.excluded.is_empty());
    // Files within it whose names add up beyond it: an error naming the file that adds the
    // column beyond the limit (not skippable: no file is at fault alone).
    let e = describe(&DescribeRequest {
        layout: RowLayoutOption::File,
        input: limited(&[small.clone(), other.clone()], true),
    })
    .unwrap_err();
    assert_eq!(e.file, other.file, "{e}");
    assert!(e.to_string().contains("at most 4"), "{e}");
    // The default limit lets ordinary files through.
    let d = describe_ok(RowLayoutOption::File, input(&[big, small, other], &[]));
    assert_eq!(field_names(&d.schema).len(), 1 + 7 + 4);
}

#[test]
fn layout_option_names_are_the_serialized_ones_and_parse_back() {
    for l in RowLayoutOption::ALL {
        assert_eq!(
            serde_json::to_string(&l).unwrap(),
            format!("\"{}\"", l.name())
        );
        assert_eq!(
            RowLayoutOption::parse(&format!(" {} ", l.name().to_uppercase())),
            Ok(l)
        );
    }
    assert_eq!(
        RowLayoutOption::parse("rows"),
        Err("option 'layout' must be one of auto, sample, tensor, file, got 'rows'".to_string())
    );
}

//! Key lookups through `_tensor_index.parquet`: which manifests an index covers, the files a
//! pushed key needs, and the index summaries the JVM asks for.

use super::*;

/// One file of a per-tensor plan: its matching tensors (in file order) with their byte sizes.
pub(super) struct TensorFile<'a> {
    pub(super) entry: &'a Entry<'a>,
    pub(super) tensors: Vec<(TensorAssumption, u64)>,
}

/// Whether an index's rows cover exactly the manifest's shards: the same file names, each with
/// as many rows as the shard has tensors.
pub(super) fn index_covers(m: &Manifest, index: &IndexSummary) -> bool {
    index.error.is_none()
        && index.files.len() == m.shards.len()
        && m.shards.iter().all(|s| {
            s.num_tensors.is_some() && index.files.get(&s.shard_path) == s.num_tensors.as_ref()
        })
}

/// Per manifest of the catalog: whether the per-tensor plan takes its directory's tensors
/// from its index. Only with a `key` predicate (the index answers which files hold a key),
/// only for a consistent manifest whose directory has an index and a shard the `file`
/// predicates keep; asks for the summaries it lacks ([`Answer::NeedIndex`]).
pub(super) fn indexed_manifests(cat: &Catalog<'_>, filters: &Filters<'_>) -> Answer<Vec<bool>> {
    let mut use_index = vec![false; cat.manifests.len()];
    if filters.key.is_empty() {
        return Answer::Ready(use_index);
    }
    let mut need = Vec::new();
    for (m, used) in cat.manifests.iter().zip(&mut use_index) {
        let wanted = m.consistent
            && m.input.has_index
            && m.manifest
                .shards
                .iter()
                .any(|s| passes(&filters.file, &format!("{}/{}", m.dir, s.shard_path)));
        if !wanted {
            continue;
        }
        match &m.input.index {
            None => need.push(m.dir.clone()),
            Some(index) => *used = index_covers(&m.manifest, index),
        }
    }
    if need.is_empty() {
        Answer::Ready(use_index)
    } else {
        Answer::NeedIndex(need)
    }
}

/// The files a per-tensor plan reads, with their matching tensors: from the index for the
/// directories `indexed` marks, else from headers (asked for when missing). Files the `file`
/// predicates exclude need nothing.
pub(super) fn tensor_files<'a>(
    cat: &'a Catalog<'a>,
    filters: &Filters<'_>,
    indexed: &[bool],
) -> Answer<Vec<TensorFile<'a>>> {
    let mut rows: HashMap<(usize, &str), Vec<&IndexedTensor>> = HashMap::new();
    for (mi, m) in cat.manifests.iter().enumerate() {
        if !indexed.get(mi).copied().unwrap_or(false) {
            continue;
        }
        for r in m.input.index.iter().flat_map(|i| &i.rows) {
            rows.entry((mi, r.file_name.as_str())).or_default().push(r);
        }
    }
    let keep = |name: &str, dtype: Dtype| {
        passes(&filters.key, name) && passes(&filters.dtype, dtype.name())
    };
    let mut out = Vec::new();
    let mut need = Vec::new();
    for e in &cat.files {
        let uri = e.input.file.as_str();
        if !passes(&filters.file, uri) {
            continue;
        }
        let from_index = e
            .shard
            .filter(|(mi, _)| indexed.get(*mi).copied().unwrap_or(false));
        if let Some((mi, _)) = from_index {
            let (_, name) = split_uri(uri);
            let mut found: Vec<&IndexedTensor> = rows.remove(&(mi, name)).unwrap_or_default();
            found.sort_by_key(|r| r.data_start);
            let tensors: Vec<_> = found
                .into_iter()
                .filter(|r| keep(&r.tensor_key, r.dtype))
                .map(|r| {
                    (
                        TensorAssumption {
                            name: r.tensor_key.clone(),
                            dtype: r.dtype,
                            shape: r.shape.clone(),
                            ragged: None,
                        },
                        r.data_end.saturating_sub(r.data_start),
                    )
                })
                .collect();
            if !tensors.is_empty() {
                out.push(TensorFile { entry: e, tensors });
            }
            continue;
        }
        match &e.header {
            None => need.push(uri.to_owned()),
            Some(h) => {
                let tensors: Vec<_> = h
                    .tensors
                    .iter()
                    .filter(|t| keep(&t.name, t.dtype))
                    .map(|t| (assumption(t), t.byte_len()))
                    .collect();
                if !tensors.is_empty() {
                    out.push(TensorFile { entry: e, tensors });
                }
            }
        }
    }
    if need.is_empty() {
        Answer::Ready(out)
    } else {
        Answer::NeedHeaders(need)
    }
}

/// Summarises a dataset directory's `_tensor_index.parquet` (the whole file's bytes, or any
/// Parquet source) for a per-tensor plan with `predicates`: every file's row count and the rows
/// the `key`/`dtype`/`file` predicates keep (a row's file is `dir + "/" + file_name`). Errors:
/// an invalid predicate, or an index that is not valid Parquet with the index's columns.
pub fn index_summary<R: ChunkReader + 'static>(
    dir: &str,
    parquet: R,
    predicates: &[Predicate],
) -> Result<IndexSummary, ReadError> {
    let f = filters(RowLayout::Tensor, predicates)?;
    let name = format!("{dir}/{INDEX_DIR_NAME}");
    let mut files: BTreeMap<String, u64> = BTreeMap::new();
    let rows = read_index_from(parquet, Path::new(&name), |r| {
        match files.get_mut(r.file_name) {
            Some(n) => *n += 1,
            None => {
                files.insert(r.file_name.to_owned(), 1);
            }
        }
        passes(&f.key, r.tensor_key)
            && passes(&f.dtype, r.dtype)
            && (f.file.is_empty() || passes(&f.file, &format!("{dir}/{}", r.file_name)))
    })
    .map_err(|e| ReadErrorKind::Index(e.to_string()).in_scan())?;
    Ok(IndexSummary {
        files,
        rows: rows.into_iter().map(IndexedTensor::from).collect(),
        error: None,
    })
}

/// The answer of [`index_part_summary`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartAnswer {
    /// Fetch these `[start, length]` byte ranges of the part too and ask again.
    Need(Vec<(u64, u64)>),
    /// The part's summary: its shard's row count and the rows the predicates keep.
    Summary(IndexSummary),
}

/// A key lookup in the index part of shard `shard` of the dataset directory `dir`
/// (spec/dataset.md §6.1) of which the JVM fetched some byte ranges (`file`): asks for the
/// footer, then for the row groups whose `tensor_key` statistics can hold a key the `key`
/// predicates want (all of them without a `key` predicate), then summarises those rows like
/// [`index_summary`]. Every row must name `shard`.
pub fn index_part_summary(
    dir: &str,
    shard: &str,
    file: &SparseFile,
    predicates: &[Predicate],
) -> Result<PartAnswer, ReadError> {
    let f = filters(RowLayout::Tensor, predicates)?;
    let name = format!("{dir}/{INDEX_DIR_NAME}/{shard}");
    let bad = |e: String| ReadErrorKind::Index(e).in_scan();
    // the key tests all hold (AND): any one of them bounds the row groups; an exact one best
    let key_test = f
        .key
        .iter()
        .find(|t| matches!(t, PredicateTest::In(_)))
        .or_else(|| f.key.first());
    let filter = match key_test {
        Some(PredicateTest::In(v)) => KeyFilter {
            exact: v.iter().map(String::as_str).collect(),
            prefixes: Vec::new(),
        },
        Some(PredicateTest::Prefix(v)) => KeyFilter {
            exact: Vec::new(),
            prefixes: v.iter().map(String::as_str).collect(),
        },
        None => KeyFilter::default(),
    };
    let mut other_file = None;
    let answer = lookup_sparse(file, Path::new(&name), &filter, |r| {
        if r.file_name != shard && other_file.is_none() {
            other_file = Some(r.file_name.to_string());
        }
        passes(&f.key, r.tensor_key)
            && passes(&f.dtype, r.dtype)
            && (f.file.is_empty() || passes(&f.file, &format!("{dir}/{}", r.file_name)))
    })
    .map_err(|e| bad(e.to_string()))?;
    if let Some(other) = other_file {
        return Err(bad(format!(
            "{name}: the index part of {shard} lists rows of {other}"
        )));
    }
    Ok(match answer {
        SparseLookup::NeedRanges(r) => PartAnswer::Need(r),
        SparseLookup::Ready(total, rows) => PartAnswer::Summary(IndexSummary {
            files: BTreeMap::from([(shard.to_string(), total)]),
            rows: rows.into_iter().map(IndexedTensor::from).collect(),
            error: None,
        }),
    })
}

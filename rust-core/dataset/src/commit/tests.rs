use super::*;
use crate::local::{
    commit_changes, latest_head, latest_manifest, manifest_at, newest_version, publish_changes,
    publish_version,
};
use crate::log::{parse_log_file, LogFile};
use crate::names::MANIFEST_LOG_DIR;
use std::fs;
use std::path::{Path, PathBuf};

/// A batch manifest of version `v` listing `shards` (1 row, 4 bytes each), checkpoint interval
/// `interval` (the log's tests' manifest).
fn manifest(v: u64, shards: &[u64], interval: u64) -> Manifest {
    let mut m = crate::log::tests::manifest(v, shards, v, None);
    if let Some(x) = &mut m.ext {
        x.checkpoint_interval = Some(interval);
    }
    m
}

fn tmp(name: &str) -> PathBuf {
    crate::log::tests::tmp(&format!("commit-{name}"))
}

fn log_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir.join(MANIFEST_LOG_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

/// The own fields of version `v` holding shards 1..=v.
fn fields(v: u64, interval: u64) -> Manifest {
    let mut m = manifest(v, &(1..=v).collect::<Vec<_>>(), interval);
    m.shards.clear();
    m
}

/// One shard appended as version `v`, committed and published from the base's head alone.
fn append_by_head(dir: &Path, known: Option<u64>, v: u64, interval: u64) -> bool {
    let head = latest_head(dir, known).unwrap();
    assert_eq!(head.as_ref().map_or(0, Head::version), v - 1);
    let changes = Changes {
        add: manifest(v, &[v], interval).shards,
        remove: Vec::new(),
    };
    let next = fields(v, interval);
    if !commit_changes(dir, head.as_ref(), &next, &changes, "t").unwrap() {
        return false;
    }
    let whole = publish_changes(dir, v - 1, &next, &changes, "t").unwrap();
    assert_eq!(whole, manifest(v, &(1..=v).collect::<Vec<_>>(), interval));
    true
}

#[test]
fn an_entry_from_the_changes_is_the_entry_of_the_diff() {
    // one rule: a writer that knows what it added writes the very entry a diff of the whole
    // manifests writes, for an append and for a version that also removes
    for (base_shards, next_shards) in [(vec![1, 2], vec![1, 2, 3]), (vec![1, 2, 3], vec![2, 4])] {
        let base = manifest(3, &base_shards, 100);
        let next = manifest(4, &next_shards, 100);
        let changes = diff(Some(&base), &next);
        let mut own = next.clone();
        own.shards.clear();
        let by_head = entry_text(Some(&Head::of(&base)), &own, &changes).unwrap();
        assert_eq!(
            by_head,
            crate::log::log_entry_text(Some(&base), &next).unwrap()
        );
        // the entry gives the schema, so the next commit reads its base from it alone
        let r = parse_log_file(LogFile::Entry(4), &by_head).unwrap();
        assert!(!r.schema_from_base);
        let head = Head::of_record(r).unwrap();
        assert_eq!(
            head,
            Head {
                from_delta_entry: true,
                ..Head::of(&next)
            }
        );
    }
}

#[test]
fn changes_that_do_not_lead_to_the_version_are_refused_naming_it() {
    let base = Head::of(&manifest(3, &[1, 2], 100));
    let add = manifest(4, &[3], 100).shards;
    // totals that do not add up
    let mut next = fields(4, 100);
    next.total_samples = 7;
    let e = entry_text(
        Some(&base),
        &next,
        &Changes {
            add: add.clone(),
            remove: vec![],
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("version 4 does not follow from version 3") && e.contains("7 rows"),
        "{e}"
    );
    // removing more shards than the base lists
    let mut empty = fields(4, 100);
    (empty.total_samples, empty.total_bytes) = (0, 0);
    let three = manifest(3, &[1, 2, 3], 100).shards;
    let e = entry_text(
        Some(&base),
        &empty,
        &Changes {
            add: vec![],
            remove: three,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("of 2 shards"), "{e}");
    // a version that does not follow its base
    let e = entry_text(
        Some(&base),
        &fields(3, 100),
        &Changes {
            add,
            remove: vec![],
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("version 3 cannot be committed on version 3"),
        "{e}"
    );
}

#[test]
fn the_chores_list_the_log_only_when_they_may_have_work() {
    let next = fields(7, 5);
    let delta = Head {
        from_delta_entry: true,
        ..Head::of(&manifest(6, &[1], 5))
    };
    let whole = Head::of(&manifest(6, &[1], 5));
    assert!(!chores_need_listing(7, &next, Some(&delta), false));
    // a checkpoint version, retention 0, a first commit, a base of an older log
    assert!(chores_need_listing(10, &fields(10, 5), Some(&delta), false));
    assert!(chores_need_listing(7, &next, Some(&delta), true));
    assert!(chores_need_listing(1, &fields(1, 5), None, false));
    assert!(chores_need_listing(7, &next, Some(&whole), false));
}

#[test]
fn commits_from_heads_find_the_newest_version_by_probing_and_keep_checkpoints() {
    let dir = tmp("heads");
    for v in 1..=23 {
        // the writer knows version 1 only (or nothing): the probe finds the newest
        let known = (v > 1 && v % 2 == 0).then_some(1);
        assert!(append_by_head(&dir, known, v, 5));
    }
    assert_eq!(newest_version(&dir, Some(1)).unwrap(), Some(23));
    assert_eq!(newest_version(&dir, Some(17)).unwrap(), Some(23));
    assert_eq!(newest_version(&dir, None).unwrap(), Some(23));
    // checkpoints at the first commit and every 5 versions (rebuilt from the log), the
    // superseded ones removed at those versions: the oldest and the newest three are kept
    let names = log_names(&dir);
    let checkpoints: Vec<&String> = names.iter().filter(|n| n.contains("checkpoint")).collect();
    assert_eq!(
        checkpoints,
        [1, 10, 15, 20]
            .iter()
            .map(|v| LogFile::Checkpoint(*v).name())
            .collect::<Vec<_>>()
            .iter()
            .collect::<Vec<_>>()
    );
    // every version reads back as the whole manifest a whole commit would have written
    for v in [1, 9, 10, 23] {
        assert_eq!(
            manifest_at(&dir, v).unwrap(),
            manifest(v, &(1..=v).collect::<Vec<_>>(), 5)
        );
    }
    assert_eq!(
        latest_manifest(&dir).unwrap().unwrap(),
        manifest(23, &(1..=23).collect::<Vec<_>>(), 5)
    );
    // a known version whose entry is gone (pruned): the log is listed
    fs::remove_file(dir.join(MANIFEST_LOG_DIR).join(LogFile::Entry(2).name())).unwrap();
    assert_eq!(newest_version(&dir, Some(2)).unwrap(), Some(23));
    assert_eq!(newest_version(&dir, Some(99)).unwrap(), Some(23));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn two_writers_on_one_head_commit_one_version_and_the_loser_commits_on_the_winner() {
    let dir = tmp("race");
    assert!(append_by_head(&dir, None, 1, 100));
    // both read version 1 before either commits (the race forced)
    let a = latest_head(&dir, Some(1)).unwrap().unwrap();
    let b = latest_head(&dir, Some(1)).unwrap().unwrap();
    let add = |i: u64| Changes {
        add: manifest(2, &[i], 100).shards,
        remove: vec![],
    };
    let mut two = fields(2, 100);
    (two.total_samples, two.total_bytes) = (2, 8);
    assert!(commit_changes(&dir, Some(&a), &two, &add(2), "a").unwrap());
    assert!(!commit_changes(&dir, Some(&b), &two, &add(3), "b").unwrap());
    // the loser reads the winner as its base and commits version 3 with its own shard
    let b = latest_head(&dir, Some(1)).unwrap().unwrap();
    assert_eq!(b.version(), 2);
    let mut three = fields(3, 100);
    three.shards.clear();
    assert!(commit_changes(&dir, Some(&b), &three, &add(3), "b").unwrap());
    publish_changes(&dir, 2, &three, &add(3), "b").unwrap();
    assert_eq!(
        latest_manifest(&dir).unwrap().unwrap(),
        manifest(3, &[1, 2, 3], 100)
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_log_of_an_older_kind_continues_from_its_whole_base() {
    // entries written before they always gave the schema, and whole ones: the head is the
    // whole base, and the commit lists the log (its first checkpoint)
    let dir = tmp("older");
    let one = manifest(1, &[1], 100);
    let log = dir.join(MANIFEST_LOG_DIR);
    fs::create_dir_all(&log).unwrap();
    fs::write(
        log.join(LogFile::Entry(1).name()),
        one.to_json_pretty().unwrap(),
    )
    .unwrap();
    publish_version(&dir, &one, "t").unwrap();
    let head = latest_head(&dir, Some(1)).unwrap().unwrap();
    assert!(!head.from_delta_entry);
    assert!(append_by_head(&dir, Some(1), 2, 100));
    assert!(log_names(&dir).contains(&LogFile::Checkpoint(2).name()));
    let two = manifest(2, &[1, 2], 100);
    let three = manifest(3, &[1, 2, 3], 100);
    let mut older = crate::log::log_entry_text(Some(&two), &three).unwrap();
    older = older.replace(r#""schema":{"x":{"dtype":"F32","shape":[1]}},"#, "");
    assert!(!older.contains("schema"), "{older}");
    fs::write(log.join(LogFile::Entry(3).name()), older).unwrap();
    assert!(
        !latest_head(&dir, Some(2))
            .unwrap()
            .unwrap()
            .from_delta_entry
    );
    assert!(append_by_head(&dir, Some(2), 4, 100));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn an_entry_keeps_the_columns_in_their_written_order() {
    // a JSON map value sorts its keys: the entry writes and reads the schema in column order
    let mut base = manifest(3, &[1], 100);
    let x = base.schema.0[0].1.clone();
    base.schema.0 = vec![("zeta".into(), x.clone()), ("alpha".into(), x)];
    let mut next = manifest(4, &[1, 2], 100);
    next.schema = base.schema.clone();
    let text = crate::log::log_entry_text(Some(&base), &next).unwrap();
    assert!(text.find("zeta") < text.find("alpha"), "{text}");
    let r = parse_log_file(LogFile::Entry(4), &text).unwrap();
    assert_eq!(r.manifest.schema, next.schema);
    assert_eq!(Head::of_record(r).unwrap().manifest.schema, next.schema);
}

/// An append (and a stream's micro-batch) made on the base's head alone is the append made on
/// the whole base: the same entry, and the base with that entry applied is the same manifest —
/// padded or dropped rows and stream records included. The append's rules hold without the
/// shard list: a replayed batch and a write that does not fit are refused.
#[test]
fn an_append_on_the_head_is_the_append_on_the_whole_base() {
    use crate::log::Replay;
    use crate::manifest::{next_manifest, next_stream_manifest, StreamBatch, TailStrategy};
    for tail in [TailStrategy::Pad, TailStrategy::Drop] {
        // (padding, dropped rows) of the base and of the write
        let of = |m: &mut Manifest, rows: u64| {
            let x = m.ext.as_mut().unwrap();
            x.tail_strategy = Some(tail);
            if tail == TailStrategy::Drop {
                x.dropped_samples = rows;
            } else {
                m.shards[0].padded_samples = Some(rows);
                m.recompute_totals();
            }
        };
        let mut base = manifest(5, &[1, 2, 3, 4, 5], 10);
        of(&mut base, 3);
        base.ext
            .as_mut()
            .unwrap()
            .stream_commits
            .insert("q".into(), 4);
        let mut new = manifest(1, &[7, 8], 10);
        of(&mut new, 1);
        let mut four = manifest(4, &[1, 2, 4, 5], 10);
        of(&mut four, 3);
        let base_entry = crate::log::log_entry_text(Some(&four), &base).unwrap();
        let from_entry = Head::of_record(parse_log_file(LogFile::Entry(5), &base_entry).unwrap());
        let batch = |id| StreamBatch {
            query_id: "q".into(),
            batch_id: id,
        };
        // the head of the whole base, and the head read from the base's own delta entry
        for head in [Head::of(&base), from_entry.unwrap()] {
            for b in [None, Some(batch(5))] {
                let whole = match &b {
                    None => next_manifest(Some(&base), &new, true, &[]),
                    Some(b) => next_stream_manifest(Some(&base), &new, &[], b),
                }
                .unwrap();
                let (fields, changes) = next_append_on_head(&head, &new, b.as_ref())
                    .unwrap()
                    .unwrap();
                assert_eq!(fields.manifest_version(), 6);
                let entry = entry_text(Some(&head), &fields, &changes).unwrap();
                assert_eq!(
                    entry,
                    crate::log::log_entry_text(Some(&base), &whole).unwrap()
                );
                let mut replay = Replay::from_manifest(&base);
                replay
                    .apply(&parse_log_file(LogFile::Entry(6), &entry).unwrap())
                    .unwrap();
                assert_eq!(replay.manifest().unwrap(), whole);
                let x = whole.ext.as_ref().unwrap();
                assert_eq!(x.padded_samples + x.dropped_samples, 4);
            }
            let e = next_append_on_head(&head, &new, Some(&batch(4))).unwrap_err();
            assert!(e.to_string().contains("already committed batch 4"), "{e}");
            let mut other = new.clone();
            other.ext.as_mut().unwrap().batch_size = Some(2);
            let e = next_append_on_head(&head, &other, None).unwrap_err();
            assert!(e.to_string().contains("batch_size=2"), "{e}");
            // a write of no rows: the whole base decides (its columns stay the base's)
            let mut empty = new.clone();
            empty.shards.clear();
            empty.recompute_totals();
            empty.schema = Default::default();
            assert!(next_append_on_head(&head, &empty, None).unwrap().is_none());
        }
    }
}

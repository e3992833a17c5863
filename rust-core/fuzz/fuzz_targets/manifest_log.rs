//! Any text as a `_manifest_log/` entry or checkpoint (spec/dataset.md §5.10): parsing never
//! panics; a parsed record's shard names pass the trust rule; replaying it on a state never
//! panics, and a replay that succeeds gives a manifest that validates. The first byte picks the
//! file kind and version; the rest is the text.
#![no_main]
use libfuzzer_sys::fuzz_target;
use safetensors_spark_dataset::log::{log_entry_text, parse_log_file, LogFile, Replay};
use safetensors_spark_dataset::names::check_shard_path;

fuzz_target!(|data: &[u8]| {
    let Some((first, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let version = u64::from(first & 0x7f);
    let file = if first & 0x80 == 0 {
        LogFile::Entry(version)
    } else {
        LogFile::Checkpoint(version)
    };
    let Ok(r) = parse_log_file(file, text) else {
        return;
    };
    if let safetensors_spark_dataset::log::Change::Delta { add, remove } = &r.change {
        for s in add.iter().chain(remove) {
            assert!(check_shard_path(&s.shard_path).is_ok(), "{:?}", s.shard_path);
        }
    }
    // replayed from nothing and on top of itself (as a whole manifest when it is one)
    let mut replay = Replay::default();
    if replay.apply(&r).is_ok() {
        if let Ok(m) = replay.manifest() {
            assert!(m.validate().is_ok());
            // an entry written from that state round-trips
            let t = (m.manifest_version() > 0).then(|| log_entry_text(None, &m));
            if let Some(Ok(t)) = t {
                let again = parse_log_file(LogFile::Entry(m.manifest_version()), &t)
                    .expect("an entry this code writes parses");
                let mut r2 = Replay::default();
                r2.apply(&again).expect("and replays");
                assert_eq!(r2.manifest().expect("to the same manifest"), m);
            }
        }
    }
});

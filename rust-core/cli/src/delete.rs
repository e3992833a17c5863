//! `safetensors-spark delete (--keys FILE | --rows FILE) [--message TEXT] [--dry-run] DATASET`:
//! spec/dataset.md §5.11 on a local dataset directory, without Spark. `--keys`: a KV dataset's
//! keys, one per line; `--rows`: a batch dataset's rows, one `SHARD ROW` pair per line (the
//! provenance `_file` name and `_row_index` the readers give). Prints the JSON outcome. Exit 0
//! done (or dry run, or nothing matched), 1 on an error (nothing committed), 2 on a usage error.

use safetensors_spark_dataset::compaction::local::write_index_part;
use safetensors_spark_dataset::delete::local::{delete_keys_dir, delete_rows_dir, DeleteOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::ExitCode;

enum What {
    Keys(String),
    Rows(String),
}

/// The lines of `file` (`-`: stdin), `\r` and surrounding blanks trimmed, empty ones dropped.
fn lines(file: &str) -> Result<Vec<String>, String> {
    let text = if file == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| format!("stdin: {e}"))?
    } else {
        std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?
    };
    Ok(text
        .lines()
        .map(|l| l.trim_end_matches('\r').trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

fn rows(file: &str) -> Result<BTreeMap<String, BTreeSet<u64>>, String> {
    let mut out: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for (n, l) in lines(file)?.iter().enumerate() {
        let mut parts = l.split_whitespace();
        let (Some(shard), Some(row), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "{file} line {}: expected 'SHARD ROW' (a shard file name and a row index), got '{l}'",
                n + 1
            ));
        };
        let shard = shard.rsplit('/').next().unwrap_or(shard).to_string();
        let row = row
            .parse::<u64>()
            .map_err(|_| format!("{file} line {}: row '{row}' is not a whole number", n + 1))?;
        out.entry(shard).or_default().insert(row);
    }
    Ok(out)
}

pub fn run(args: &[String], usage: &str) -> ExitCode {
    let mut opts = DeleteOptions::default();
    let (mut what, mut dir) = (None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--dry-run" => opts.dry_run = true,
            "--keys" | "--rows" | "--message" => {
                let Some(v) = it.next() else {
                    eprintln!("{a} needs a value");
                    return ExitCode::from(2);
                };
                match a.as_str() {
                    "--message" => opts.commit_message = Some(v.clone()),
                    _ if what.is_some() => {
                        eprintln!("give one of --keys and --rows, once");
                        return ExitCode::from(2);
                    }
                    "--keys" => what = Some(What::Keys(v.clone())),
                    _ => what = Some(What::Rows(v.clone())),
                }
            }
            _ if dir.is_none() && !a.starts_with("--") => dir = Some(a.clone()),
            _ => {
                eprintln!("{usage}");
                return ExitCode::from(2);
            }
        }
    }
    let (Some(dir), Some(what)) = (dir, what) else {
        eprintln!("delete needs --keys FILE or --rows FILE, and a DATASET\n{usage}");
        return ExitCode::from(2);
    };
    let dir = Path::new(&dir);
    let out = match what {
        What::Keys(f) => match lines(&f) {
            Ok(keys) => delete_keys_dir(
                dir,
                &keys.into_iter().collect(),
                &opts,
                Some(write_index_part),
                &mut |_| {},
            )
            .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        },
        What::Rows(f) => match rows(&f) {
            Ok(rows) => delete_rows_dir(dir, &rows, &opts, Some(write_index_part), &mut |_| {})
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        },
    };
    super::print_outcome("delete", out)
}

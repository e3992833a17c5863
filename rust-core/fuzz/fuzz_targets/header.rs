//! Any bytes as a whole safetensors file: the strict parser either accepts them (then every
//! tensor's data lies in the file and the forensic checks of the header run) or returns an
//! error; it never panics, hangs or allocates beyond the input. The forensic report of the same
//! bytes (the CLI's code path for a file) must agree on whether the header is valid. The two
//! header parsers agree: the fast path gives the detailed path's header, or `None` exactly when
//! the detailed path errs, and `parse_header` returns the detailed path's result, error included.
#![no_main]
use libfuzzer_sys::fuzz_target;
use safetensors_spark_format::forensics;
use safetensors_spark_format::header::{check_paths_agree, parse_file_bytes};

fuzz_target!(|data: &[u8]| {
    if let Err(e) = check_paths_agree(data) {
        panic!("{e}");
    }
    let parsed = parse_file_bytes(data);
    if let Ok(h) = &parsed {
        for t in &h.tensors {
            let end = h.data_start() + t.data_offsets[1];
            assert!(
                end <= data.len() as u64,
                "tensor {} ends past the file",
                t.name
            );
        }
        let _ = forensics::header_flags(h);
        if let Some(meta) = &h.metadata {
            let _ = forensics::metadata::model_info(meta);
        }
    }
    let report = forensics::report_bytes("fuzz", data);
    let _ = serde_json::to_string(&report);
});

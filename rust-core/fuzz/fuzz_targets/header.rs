//! Any bytes as a whole safetensors file: the strict parser either accepts them (then every
//! tensor's data lies in the file and the forensic checks of the header run) or returns an
//! error; it never panics, hangs or allocates beyond the input. The forensic report of the same
//! bytes (the CLI's code path for a file) must agree on whether the header is valid. The two
//! header parsers agree: the fast path gives the detailed path's header, or `None` exactly when
//! the detailed path errs, and `parse_header` returns the detailed path's result, error included.
#![no_main]
use libfuzzer_sys::fuzz_target;
use safetensors_spark::forensics;
use safetensors_spark::header::{
    check_prefix, parse_file_bytes, parse_header, parse_header_detailed, parse_header_fast,
};

fuzz_target!(|data: &[u8]| {
    let file_len = data.len() as u64;
    if let Some(json) = check_prefix(data, file_len)
        .ok()
        .and_then(|n| data.get(8..8 + usize::try_from(n).ok()?))
    {
        let fast = parse_header_fast(json, file_len);
        let detailed = parse_header_detailed(json, file_len);
        match (&fast, &detailed) {
            (Some(f), Ok(d)) => assert_eq!(f, d, "the two parsers read different headers"),
            (None, Err(_)) => {}
            _ => panic!("fast path {fast:?}, detailed path {detailed:?}"),
        }
        let strict = format!("{:?}", parse_header(json, file_len));
        assert_eq!(strict, format!("{detailed:?}"));
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

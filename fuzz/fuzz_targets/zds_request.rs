//! A ZDS record from the node agent, as the node proxy decodes it (no fd passed).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = ambit_zds::decode_request(data, Vec::new());
});

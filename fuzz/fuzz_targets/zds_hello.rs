//! A ZDS hello from the node proxy, as the node agent decodes it (no fd passed).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = ambit_zds::decode_hello(data, Vec::new());
});

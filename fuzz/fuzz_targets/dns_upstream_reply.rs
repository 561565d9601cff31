//! An upstream resolver's answer, as the DNS proxy checks it before passing it on.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ambit_proxy::dns::fuzzing::upstream_reply(data);
});

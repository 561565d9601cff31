//! An upstream resolver's answer, as the DNS proxy checks it before passing it on.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ambit_proxy::fuzzing::dns_upstream_reply(data);
});

//! An nf_tables netlink datagram from the kernel (tables, chains, rules, set elements), read
//! back and compared with the spec's rule set.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ambit_redirect::fuzzing::nftables_reply(data);
});

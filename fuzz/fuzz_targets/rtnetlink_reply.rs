//! An rtnetlink datagram from the kernel (acks, policy-routing rule and route dumps).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ambit_redirect::fuzzing::rtnetlink_reply(data);
});

//! An xDS `istio.security.Authorization` (protobuf) converted into a policy.
#![no_main]

use prost::Message;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(pb) = ambit_api::security::Authorization::decode(data) else { return };
    let _ = ambit_proxy::fuzzing::Authorization::try_from(&pb);
});

//! An xDS `istio.workload.Address` (protobuf) converted into proxy state.
#![no_main]

use prost::Message;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(pb) = ambit_api::workload::Address::decode(data) else { return };
    let _ = ambit_proxy::fuzzing::Address::try_from(pb);
});

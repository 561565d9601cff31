//! `CNI_ARGS` as the runtime sets it (`K8S_POD_NAME=…;K8S_POD_NAMESPACE=…`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = text.parse::<ambit_cni::args::K8sArgs>();
});

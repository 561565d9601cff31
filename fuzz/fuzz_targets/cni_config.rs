//! The network configuration `ambit-cni` reads on stdin, with its `prevResult`: parsed, then
//! the event addresses taken from it and the result rendered for the configured version.
#![no_main]

use ambit_cni::conf::NetConf;
use ambit_cni::result::PrevResult;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(conf) = NetConf::parse(data) else { return };
    let Some(Ok(prev)) = conf.prev_result.as_deref().map(PrevResult::parse) else { return };
    let _ = prev.event_ips();
    let _ = prev.render(conf.cni_version);
});

//! The local config file (ztunnel's YAML format): parsed, then built into proxy state.
#![no_main]

use ambit_proxy::fuzzing::{LocalConfig, State};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(cfg) = LocalConfig::parse(text) else { return };
    let _ = State::from_config(cfg, Some("node1"));
});

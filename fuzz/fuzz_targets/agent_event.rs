//! The plugin event body (`POST /cmdadd`) as the node agent parses it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = ambit_agent::event::PluginEvent::parse(data);
});

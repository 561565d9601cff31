//! The plugin event body (`POST /cmdadd`) with the plugin's own types: an accepted event
//! survives a round trip through its JSON.
#![no_main]

use ambit_cni::event::PluginEvent;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(event) = PluginEvent::from_json(data) else { return };
    let again = PluginEvent::from_json(event.to_json().as_bytes());
    assert_eq!(again.ok().as_ref(), Some(&event), "event does not survive its own JSON");
});

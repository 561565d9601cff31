//! The plugin event body (`POST /cmdadd`) as the node agent parses it (`PluginEvent::parse`:
//! decoded, the pod's identity present, the netns path of the right form): an accepted event
//! keeps its checks after a round trip through its JSON.
#![no_main]

use ambit_cni::event::PluginEvent;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(event) = PluginEvent::parse(data) else { return };
    let again = PluginEvent::parse(event.to_json().as_bytes());
    assert_eq!(again.ok().as_ref(), Some(&event), "an accepted event is refused after its own JSON");
    let _ = event.pod_ips();
});

//! A SPIFFE id string: an accepted id prints as itself.
#![no_main]

use ambit_identity::Identity;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(id) = text.parse::<Identity>() else { return };
    assert_eq!(id.to_string(), text);
});

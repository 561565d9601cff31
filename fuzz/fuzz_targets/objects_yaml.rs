//! A YAML file of the local-mode folder (what `ambit control` and `ambit agent` read): the
//! parser and the typed decoding of every document never panic, and an object that decodes has
//! a kind and a name (and a namespace where the kind needs one).
#![no_main]

use ambit_objects::file::fuzz_parse;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for object in fuzz_parse(text).into_iter().flatten() {
        let key = object.key();
        assert!(!key.name.is_empty());
        assert_eq!(key.namespace.is_empty(), !key.kind.is_namespaced());
    }
});

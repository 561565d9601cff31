use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;

const OURS: &str = "ambit-cni";

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn entry() -> Map<String, Value> {
    obj(json!({"type": OURS, "name": OURS, "pod_namespace": "ambit-system"}))
}

fn file(kind: Kind, v: Value) -> ConfFile {
    ConfFile { path: PathBuf::from("/x/10-net.conf"), kind, doc: obj(v) }
}

#[test]
fn parse_accepts_what_kubelet_loads() {
    let ok: &[(Kind, &str)] = &[
        (Kind::Conf, r#"{"type":"bridge"}"#),
        (Kind::ConfList, r#"{"name":"n","plugins":[{"type":"a"},{"type":"b"}]}"#),
    ];
    for (kind, text) in ok {
        assert!(parse(*kind, text.as_bytes()).is_ok(), "{text}");
    }
}

#[test]
fn parse_names_what_is_wrong() {
    let cases: &[(Kind, &str, &str)] = &[
        (Kind::Conf, "{", "not valid JSON"),
        (Kind::Conf, "[]", "not a JSON object"),
        (Kind::Conf, r#"{"type":""}"#, "`type`"),
        (Kind::Conf, r#"{"type":7}"#, "`type`"),
        (Kind::ConfList, r#"{"plugins":[{"type":"a"}]}"#, "`name`"),
        (Kind::ConfList, r#"{"name":"n"}"#, "`plugins` is missing"),
        (Kind::ConfList, r#"{"name":"n","plugins":{}}"#, "not an array"),
        (Kind::ConfList, r#"{"name":"n","plugins":[]}"#, "empty"),
        (Kind::ConfList, r#"{"name":"n","plugins":[{"type":"a"},3]}"#, "plugin 1"),
        (Kind::ConfList, r#"{"name":"n","plugins":[{"type":null}]}"#, "plugin 0"),
    ];
    for (kind, text, want) in cases {
        let err = parse(*kind, text.as_bytes()).expect_err(text).to_string();
        assert!(err.contains(want), "{text}: {err}");
    }
}

#[test]
fn chained_state() {
    let desired = entry();
    let list = |plugins: Value| file(Kind::ConfList, json!({"name": "n", "plugins": plugins}));
    let ours = Value::Object(desired.clone());
    let stale = json!({"type": OURS, "pod_namespace": "old"});
    let cases = [
        (list(json!([{"type": "a"}])), Chained::Missing),
        (list(json!([{"type": "a"}, ours.clone()])), Chained::Yes),
        (list(json!([ours.clone(), {"type": "a"}])), Chained::Yes),
        (list(json!([{"type": "a"}, stale])), Chained::Stale),
        (list(json!([{"type": "a"}, ours.clone(), ours.clone()])), Chained::Stale),
        (file(Kind::Conf, json!({"type": OURS})), Chained::Missing),
        (list(json!([{"type": "a"}, {"type": "istio-cni"}])), Chained::Stale),
        (list(json!([{"type": "a"}, {"type": "istio-cni"}, ours])), Chained::Stale),
    ];
    for (f, want) in cases {
        assert_eq!(f.chained(OURS, &desired), want, "{:?}", f.doc);
    }
}

#[test]
fn chain_conf_keeps_name_and_version() {
    let f = file(Kind::Conf, json!({"cniVersion": "0.4.0", "name": "net", "type": "bridge"}));
    let doc = chain(&f, OURS, &entry(), "10-net");
    let want = json!({
        "cniVersion": "0.4.0",
        "name": "net",
        "plugins": [{"name": "net", "type": "bridge"}, entry()],
        CONVERTED_MARKER: true,
    });
    assert_eq!(Value::Object(doc), want);
    // A nameless .conf gets the file stem as list name.
    let f = file(Kind::Conf, json!({"type": "bridge"}));
    let doc = chain(&f, OURS, &entry(), "10-net");
    assert_eq!(doc["name"], json!("10-net"));
    assert!(!doc.contains_key("cniVersion"));
}

#[test]
fn unchain_restores_only_an_untouched_conversion() {
    let f = file(Kind::Conf, json!({"cniVersion": "0.4.0", "name": "net", "type": "bridge"}));
    let doc = chain(&f, OURS, &entry(), "x");
    assert_eq!(unchain(&doc, OURS, true), Unchained::Conf(f.doc.clone()));
    // Told not to restore: a plain list without the marker.
    let Unchained::List(list) = unchain(&doc, OURS, false) else {
        panic!("expected a list");
    };
    assert!(!list.contains_key(CONVERTED_MARKER));
    assert_eq!(list["plugins"], json!([{"name": "net", "type": "bridge"}]));
    // The owner added a plugin since: stays a list.
    let mut grown = doc.clone();
    if let Some(Value::Array(p)) = grown.get_mut("plugins") {
        p.push(json!({"type": "portmap"}));
    }
    assert!(matches!(unchain(&grown, OURS, true), Unchained::List(_)));
    let only = obj(json!({"name": "n", "plugins": [entry()]}));
    assert_eq!(unchain(&only, OURS, true), Unchained::Empty);
    let none = obj(json!({"name": "n", "plugins": [{"type": "a"}]}));
    assert_eq!(unchain(&none, OURS, true), Unchained::Untouched);
}

#[test]
fn render_sorts_keys_and_ends_with_newline() {
    let doc = obj(json!({"b": 1, "a": {"d": [], "c": true}}));
    let text = String::from_utf8(render(&doc).expect("render")).expect("utf8");
    assert_eq!(text, "{\n  \"a\": {\n    \"c\": true,\n    \"d\": []\n  },\n  \"b\": 1\n}\n");
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("type".to_owned()),
        Just("name".to_owned()),
        Just("plugins".to_owned()),
        Just("cniVersion".to_owned()),
        Just(CONVERTED_MARKER.to_owned()),
        "[a-z]{1,4}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        // No floats: serde_json's default float parsing is not exactly round-trip, which would
        // break the equality below without saying anything about our code.
        "[a-z]{0,5}".prop_map(Value::String),
        Just(Value::String(OURS.into())),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn check(kind: Kind, bytes: &[u8]) {
    let Ok(doc) = parse(kind, bytes) else {
        return;
    };
    let f = ConfFile { path: PathBuf::from("/x/a.conf"), kind, doc };
    let _ = (f.types(), f.chained(OURS, &entry()));
    if f.only(OURS) {
        // Not a primary config: the installer never chains into it.
        return;
    }
    // Chaining yields a list kubelet loads, with our entry in it, that survives a round trip.
    let chained = chain(&f, OURS, &entry(), "a");
    let text = render(&chained).expect("render");
    let back = parse(Kind::ConfList, &text).expect("our output must load");
    assert_eq!(back, chained);
    let back = ConfFile { path: f.path.clone(), kind: Kind::ConfList, doc: back };
    assert_eq!(back.chained(OURS, &entry()), Chained::Yes);
    // Removing it gives back the other plugins.
    let others: Vec<&str> = f.types().into_iter().filter(|t| *t != OURS).collect();
    for restore in [true, false] {
        match unchain(&chained, OURS, restore) {
            Unchained::List(list) => {
                let list = ConfFile { path: f.path.clone(), kind: Kind::ConfList, doc: list };
                assert_eq!(list.types(), others);
            }
            Unchained::Conf(conf) => {
                let marked = f.doc.get(CONVERTED_MARKER) == Some(&Value::Bool(true));
                assert!(restore && (f.kind == Kind::Conf || marked));
                if f.kind == Kind::Conf {
                    assert_eq!(conf, f.doc);
                }
            }
            Unchained::Empty => assert!(others.is_empty()),
            Unchained::Untouched => panic!("our entry was not found"),
        }
    }
}

proptest! {
    #[test]
    fn arbitrary_json_never_panics(v in json_value()) {
        let bytes = serde_json::to_vec(&v).expect("serialise");
        check(Kind::Conf, &bytes);
        check(Kind::ConfList, &bytes);
    }

    #[test]
    fn arbitrary_plugin_lists_never_panic(
        name in json_value(),
        plugins in prop::collection::vec(json_value(), 0..5),
        version in json_value(),
    ) {
        let list = json!({"name": name, "cniVersion": version, "plugins": plugins});
        check(Kind::ConfList, list.to_string().as_bytes());
        let conf = json!({"name": name, "cniVersion": version, "type": "bridge"});
        check(Kind::Conf, conf.to_string().as_bytes());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check(Kind::Conf, &bytes);
        check(Kind::ConfList, &bytes);
    }
}

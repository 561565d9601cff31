//! Golden tests: YAML objects in, a readable dump of what the translation published out.
//!
//! Each directory under `tests/golden/` is one case. Its `NN-*.yaml` files are applied in
//! order, one `apply` each, after `tests/golden/common.yaml` (the system namespace carrying the
//! network label). A document `{delete: {kind, namespace, name}}` deletes an object; an
//! optional `settings.yaml` overrides the settings (defaults: control-plane.md §8's test
//! constants, cluster `cluster0`, domain `domain.suffix`). `expected.yaml` holds one document
//! per step with the resources that step changed (`removed` for a deletion), including each
//! waypoint's own configuration (`waypoint_destinations`, `waypoint_policies`), and after each
//! step the waypoints' configuration errors as `/debug/config_errors` shows them.
//!
//! `UPDATE_GOLDEN=1 cargo test -p ambit-control --test golden` rewrites the expected files;
//! check every change by hand against the spec before committing it.

use ambit_control::translate::render;

use std::path::{Path, PathBuf};

use ambit_control::translate::{Settings, Translator};
use ambit_objects::{Change, Kind, Object, ObjectKey};
use serde_json::{Map, Value, json};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn settings(case: &Path) -> Settings {
    let mut s = Settings {
        cluster_id: "cluster0".into(),
        domain_suffix: "domain.suffix".into(),
        ..Settings::default()
    };
    if let Ok(text) = std::fs::read_to_string(case.join("settings.yaml")) {
        let v: Value = serde_saphyr::from_str(&text).expect("settings.yaml");
        let get = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        if let Some(x) = get("cluster_id") {
            s.cluster_id = x;
        }
        if let Some(x) = get("domain_suffix") {
            s.domain_suffix = x;
        }
        if let Some(x) = get("trust_domain") {
            s.trust_domain = x;
        }
        if let Some(x) = get("root_namespace") {
            s.root_namespace = x;
        }
        s.revision = get("revision");
    }
    s
}

pub fn changes(path: &Path) -> Vec<Change> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    docs.into_iter()
        .filter(|d| !d.is_null())
        .map(|d| {
            if let Some(del) = d.get("delete") {
                let kind_name = del.get("kind").and_then(Value::as_str).expect("delete.kind");
                let kind = *Kind::ALL.iter().find(|k| k.name() == kind_name).expect("known kind");
                let s = |k: &str| del.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
                return Change::Delete(ObjectKey::new(kind, s("namespace"), s("name")));
            }
            Change::Upsert(Object::from_value(d).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        })
        .collect()
}

fn run(case: &Path) -> String {
    let mut t = Translator::new(settings(case));
    t.apply(changes(&root().join("common.yaml")));
    let mut steps: Vec<PathBuf> = std::fs::read_dir(case)
        .expect("case dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.ends_with(".yaml") && name.as_bytes().first().is_some_and(u8::is_ascii_digit)
        })
        .collect();
    steps.sort();
    let mut out = String::new();
    for step in steps {
        let o = t.apply(changes(&step));
        let mut addresses = Map::new();
        for (name, a) in &o.addresses {
            addresses.insert(name.clone(), a.as_ref().map_or(json!("removed"), render::address));
        }
        let mut auths = Map::new();
        for (name, a) in &o.authorizations {
            auths.insert(name.clone(), a.as_ref().map_or(json!("removed"), render::authorization));
        }
        let mut destinations = Map::new();
        for (name, d) in &o.destinations {
            destinations.insert(name.clone(), d.as_ref().map_or(json!("removed"), render::destination));
        }
        let mut policies = Map::new();
        for (name, p) in &o.policies {
            policies.insert(name.clone(), p.as_ref().map_or(json!("removed"), render::waypoint_policy));
        }
        let errors: Vec<String> = t.waypoint_errors().iter().map(ToString::to_string).collect();
        let mut doc = Map::new();
        doc.insert("step".into(), json!(step.file_name().and_then(|n| n.to_str())));
        if !addresses.is_empty() {
            doc.insert("addresses".into(), Value::Object(addresses));
        }
        if !auths.is_empty() {
            doc.insert("authorizations".into(), Value::Object(auths));
        }
        if !destinations.is_empty() {
            doc.insert("waypoint_destinations".into(), Value::Object(destinations));
        }
        if !policies.is_empty() {
            doc.insert("waypoint_policies".into(), Value::Object(policies));
        }
        if !errors.is_empty() {
            doc.insert("waypoint_errors".into(), json!(errors));
        }
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&Value::Object(doc)).expect("yaml"));
    }
    out
}

#[test]
fn golden() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(root())
        .expect("golden dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no golden cases");
    let mut failed = Vec::new();
    for case in &cases {
        let got = run(case);
        let path = case.join("expected.yaml");
        if update {
            std::fs::write(&path, &got).expect("write expected");
            continue;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        if want != got {
            eprintln!("=== {} differs; got:\n{got}", case.display());
            failed.push(case.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned());
        }
    }
    assert!(
        failed.is_empty(),
        "golden cases differ (UPDATE_GOLDEN=1 rewrites, then check by hand): {failed:?}"
    );
}

//! The `ambit-crds` chart: the Istio kinds Ambit reads, their served and stored versions, and
//! their schemas against the fields Ambit reads.

use std::collections::BTreeSet;

use ambit_objects::{Kind, istio};

use super::render::render_args;
use crate::args;

#[test]
fn the_crds_chart_defines_the_istio_kinds_ambit_reads() {
    let r = render_args(&args(&["template", "ambit-crds", "deploy/charts/ambit-crds"])).expect("renders");
    let istio: Vec<Kind> = Kind::ALL.iter().copied().filter(|k| k.group().ends_with(".istio.io")).collect();
    assert_eq!(istio.len(), 4, "{istio:?}");
    let got: BTreeSet<String> = r.crds.iter().filter_map(|c| c.metadata.name.clone()).collect();
    let want: BTreeSet<String> = istio.iter().map(|&k| ambit_objects::kube::resource(k)).collect();
    assert_eq!(got, want);
    for &kind in &istio {
        let crd = r
            .crds
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(&ambit_objects::kube::resource(kind)))
            .expect("crd");
        let version = kind.api_version().rsplit('/').next().expect("version");
        assert_eq!(
            (crd.spec.group.as_str(), crd.spec.names.kind.as_str(), crd.spec.scope.as_str()),
            (kind.group(), kind.name(), "Namespaced")
        );
        let v = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == version)
            .unwrap_or_else(|| panic!("{kind:?} has no {version}"));
        assert!(v.served && v.storage, "{kind:?} {version} is not served and stored");
        // Istio's older versions too (each read by `Kind::of`), served with the same schema.
        let served: Vec<(&str, bool, bool)> =
            crd.spec.versions.iter().map(|v| (v.name.as_str(), v.served, v.storage)).collect();
        let want: &[(&str, bool, bool)] = if kind.group() == "networking.istio.io" {
            &[("v1alpha3", true, false), ("v1beta1", true, false), ("v1", true, true)]
        } else {
            &[("v1beta1", true, false), ("v1", true, true)]
        };
        assert_eq!(served, want, "{kind:?}");
        for older in &crd.spec.versions {
            assert_eq!(
                Kind::of(&format!("{}/{}", kind.group(), older.name), kind.name()),
                Some(kind),
                "{kind:?} {} is served but not read",
                older.name
            );
            assert_eq!(older.schema, v.schema, "{kind:?} {} has its own schema", older.name);
        }
        let schema = v.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()).expect("schema");
        let schema = serde_json::to_value(schema).expect("json");
        let spec = &schema["properties"]["spec"];
        assert_eq!(spec["type"], "object", "{kind:?}");
        assert!(spec["properties"].is_object(), "{kind:?} spec has its fields");
        assert_eq!(schema["properties"]["status"]["x-kubernetes-preserve-unknown-fields"], true, "{kind:?}");
        let mut open = Vec::new();
        preserved(spec, "spec", &mut open);
        assert!(open.is_empty(), "{kind:?}: no part of spec keeps unknown fields: {open:?}");
        // The schema's enumerations are the ones the file reader enforces.
        let enums: &[(&str, &[&str])] = match kind {
            Kind::AuthorizationPolicy => &[("/properties/action/enum", istio::ACTIONS)],
            Kind::PeerAuthentication => &[
                ("/properties/mtls/properties/mode/enum", istio::MTLS_MODES),
                ("/properties/portLevelMtls/additionalProperties/properties/mode/enum", istio::MTLS_MODES),
            ],
            Kind::ServiceEntry => &[
                ("/properties/location/enum", istio::LOCATIONS),
                ("/properties/resolution/enum", istio::RESOLUTIONS),
            ],
            _ => &[],
        };
        let mut found = Vec::new();
        every_enum(spec, "", &mut found);
        let want: Vec<(String, serde_json::Value)> =
            enums.iter().map(|(p, values)| ((*p).to_owned(), serde_json::json!(values))).collect();
        assert_eq!(found, want, "{kind:?}: the chart's enumerations and ambit-objects' differ");
        let keep = crd.metadata.annotations.as_ref().and_then(|a| a.get("helm.sh/resource-policy"));
        assert_eq!(
            keep.map(String::as_str),
            Some("keep"),
            "{kind:?}: uninstalling must not delete every object"
        );
    }
}

/// The paths (under `path`) of the schemas in `schema` that keep unknown fields.
fn preserved(schema: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    match schema {
        serde_json::Value::Object(map) => {
            if map.get("x-kubernetes-preserve-unknown-fields") == Some(&serde_json::Value::Bool(true)) {
                out.push(path.to_owned());
            }
            for (k, v) in map {
                preserved(v, &format!("{path}/{k}"), out);
            }
        }
        serde_json::Value::Array(list) => list.iter().for_each(|v| preserved(v, path, out)),
        _ => {}
    }
}

/// Every `enum` of `schema`, with its JSON pointer, in key order.
fn every_enum(schema: &serde_json::Value, path: &str, out: &mut Vec<(String, serde_json::Value)>) {
    if let serde_json::Value::Object(map) = schema {
        for (k, v) in map {
            let here = format!("{path}/{k}");
            if k == "enum" {
                out.push((here, v.clone()));
            } else {
                every_enum(v, &here, out);
            }
        }
    }
}

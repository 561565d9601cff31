//! The xDS `Node` an Istio data-plane process sends (node-proxy.md §1.4): an id in Istio's
//! `type~ip~id~domain` form and metadata from `ISTIO_META_*` / `ISTIO_METAJSON_*` plus what the
//! process adds. The node proxy and the waypoint build theirs with it.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

/// The xDS `Node`: only `id` and `metadata` are set.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeInfo {
    /// `<type>~<ip>~<pod>.<namespace>~<namespace>.svc.cluster.local`.
    pub id: String,
    /// `ISTIO_META_*` (prefix stripped, as strings), `ISTIO_METAJSON_*` (parsed JSON), and the
    /// keys the process sets itself.
    pub metadata: BTreeMap<String, Value>,
}

impl NodeInfo {
    /// The node as the xDS wire message.
    pub fn to_proto(&self) -> ambit_api::xds::Node {
        ambit_api::xds::Node {
            id: self.id.clone(),
            metadata: Some(prost_types::Struct {
                fields: self.metadata.iter().map(|(k, v)| (k.clone(), json_to_value(v))).collect(),
            }),
            ..Default::default()
        }
    }
}

/// The metadata Istio's agents take from the environment: `ISTIO_META_<K>=<V>` as the string
/// `V` under `K`, then `ISTIO_METAJSON_<K>=<json>` parsed (a value that is not JSON is logged
/// and left out).
pub fn istio_metadata(env: &BTreeMap<String, String>) -> BTreeMap<String, Value> {
    let mut metadata = BTreeMap::new();
    for (k, v) in env {
        if let Some(key) = k.strip_prefix("ISTIO_META_").filter(|k| !k.is_empty()) {
            metadata.insert(key.to_owned(), Value::String(v.clone()));
        }
    }
    for (k, v) in env {
        if let Some(key) = k.strip_prefix("ISTIO_METAJSON_").filter(|k| !k.is_empty()) {
            match serde_json::from_str::<Value>(v) {
                Ok(value) => {
                    metadata.insert(key.to_owned(), value);
                }
                Err(e) => tracing::warn!("{k} is not JSON ({e}); not sent in the xDS node metadata"),
            }
        }
    }
    metadata
}

fn json_to_value(v: &Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => {
            Kind::ListValue(prost_types::ListValue { values: items.iter().map(json_to_value).collect() })
        }
        Value::Object(map) => Kind::StructValue(prost_types::Struct {
            fields: map.iter().map(|(k, v)| (k.clone(), json_to_value(v))).collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

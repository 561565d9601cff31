//! Envoy's delta ADS (`AggregatedDiscoveryService/DeltaAggregatedResources`), both sides, generic
//! over resource types.
//!
//! The crate knows type URLs, names, versions and `prost_types::Any` payloads, nothing about
//! workloads or policies. It builds neither TLS nor credentials: its owner passes a
//! [`client::Connector`] (called on every connect, so roots and certificates are rebuilt each
//! time) and a [`client::MetadataSource`] (called for every new stream, so a token file is
//! re-read), and mounts the [`server::AdsServer`] on its own tonic `Server`.
//!
//! * [`client`]: one stream for every subscribed type (wildcard, named or on-demand), initial
//!   requests with `initial_resource_versions`, ACK/NACK after partial application by the
//!   type's [`client::Handler`], on-demand lookups ([`client::ClientHandle::demand`]),
//!   reconnect with jittered backoff and ztunnel's termination reasons, readiness
//!   ([`client::ClientHandle::synced`]) and a serializable status for `/config_dump`.
//! * [`server`]: the owner publishes changes into [`server::Resources`]; every stream keeps its
//!   own subscription per type and receives, after a debounce, only what changed for it. What a
//!   stream holds while its client does not read is bounded by the set of distinct changed
//!   names, never a queue of copies. Streams are admitted through the owner's hooks
//!   (asynchronous authentication, node authorization; [`server::istio`] has istiod's rules),
//!   a readiness gate and a new-stream rate limit; [`server::ServerMetrics`] counts connected
//!   streams, responses, NACKs, push and convergence time and refusals under istiod's names.
//! * [`node`]: the `Node` a data-plane process sends (Istio's id form, `ISTIO_META_*` metadata).
//! * [`XdsMetrics`]: `xds_connection_terminations`, `xds_message`, `xds_message_bytes` as ztunnel
//!   names them (the owner registers them under its `istio_` prefix).
//!
//! * [`parts`]: how a response too large for one message is sent as several, and how a client
//!   tells that more parts follow (so it reports initial sync only once it holds all of them).
//!
//! The wire behaviour follows `node-proxy.md` §1.4 (client) and `control-plane.md` §5 (server).

pub mod client;
mod metrics;
pub mod node;
pub mod parts;
pub mod server;

pub use metrics::{TerminationReason, XdsMetrics};

/// A boxed error from an owner-supplied connector or metadata source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed, sendable future (what handlers and connectors return).
pub type BoxFuture<'a, T> = futures::future::BoxFuture<'a, T>;

/// The version of a resource: lowercase hex (no padding) of xxHash64 over the `Any`'s `value`
/// bytes, as istiod computes it (content-based, identical across replicas).
pub fn resource_version(any: &prost_types::Any) -> String {
    format!("{:x}", xxhash_rust::xxh64::xxh64(&any.value, 0))
}

#[cfg(test)]
mod tests {
    use super::resource_version;

    #[test]
    fn version_is_unpadded_lowercase_xxh64_of_the_payload() {
        let any = |v: &[u8]| prost_types::Any { type_url: "ignored".into(), value: v.to_vec() };
        // XXH64 of the empty input with seed 0 is 0xEF46DB3751D8E999.
        assert_eq!(resource_version(&any(b"")), "ef46db3751d8e999");
        // The type URL is not part of it.
        let other = prost_types::Any { type_url: "other".into(), value: b"x".to_vec() };
        assert_eq!(resource_version(&any(b"x")), resource_version(&other));
        let v = resource_version(&any(b"x"));
        assert!(!v.starts_with('0') && v.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }
}

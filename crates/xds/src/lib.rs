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
//!   names, never a queue of copies.
//! * [`XdsMetrics`]: `xds_connection_terminations`, `xds_message`, `xds_message_bytes` as ztunnel
//!   names them (the owner registers them under its `istio_` prefix).
//!
//! The wire behaviour follows `node-proxy.md` §1.4 (client) and `control-plane.md` §5 (server).

pub mod client;
mod metrics;
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

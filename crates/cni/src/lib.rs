//! `ambit-cni`, the CNI plugin that hands each new pod to the Ambit node agent before the pod's
//! containers start, so an enrolled pod never runs a moment without traffic capture.
//!
//! The plugin is chained after the primary plugin (for example bridge + host-local). It creates
//! nothing itself: on ADD it posts the pod's identity, network namespace path and addresses to
//! the node agent (`POST /cmdadd`, HTTP/1.1 on `<cni_agent_run_dir>/pluginevent.sock`, the body
//! istio-cni sends; see [`event`]) and prints the previous plugin's result unchanged (see
//! [`result`] for what happens per `cniVersion`). It is synchronous, has no async runtime and
//! links three small crates, so an exec costs about a millisecond plus the agent's answer.
//!
//! The library half is also the plugin ⇄ agent contract, defined once and used by both sides (the
//! node agent depends on this crate): the event body and its socket and path ([`event`]), the
//! enrollment cache ([`cache::EnrollmentCache`]), the config keys the agent's installer writes
//! ([`conf::AmbitKeys`]) and the node's own pods ([`system::SystemPod`]).
//!
//! # When ADD succeeds, fails, or does not ask the agent
//!
//! The agent, not the plugin, decides whether a pod is enrolled, so the plugin needs no
//! Kubernetes client. That leaves one question the plugin answers alone: what to do when the
//! agent cannot be asked. The rule, checked in this order:
//!
//! 1. **Not a Kubernetes pod** (`CNI_ARGS` set but without `K8S_POD_NAME` and
//!    `K8S_POD_NAMESPACE`): success at once, agent not contacted.
//! 2. **Namespace in `exclude_namespaces`**: success at once, agent not contacted.
//! 3. **The agent's and the node proxy's own pods** (`system_pods`: a DaemonSet's namespace and
//!    its pods' `generateName`, which the agent's installer writes; see [`system`]): success at
//!    once, agent not contacted; a crashed or upgrading agent's replacement, and the proxy, must
//!    be able to start while no agent runs.
//! 4. **Every other pod**: ask the agent, waiting at most `agent_timeout_ms` (default 10 s: the
//!    agent answers only after capture is installed and the node proxy acknowledged the pod).
//!    - HTTP 200 ⇒ success (the pod is enrolled and captured, or is not to be enrolled).
//!    - Another status ⇒ failure carrying the agent's message (code 11 for 429/503, which the
//!      agent uses for "retry", see [`event::STATUS_RETRY`]; else 999).
//!    - Agent not running (no socket, connection refused) ⇒ the agent's enrollment cache
//!      decides (see [`cache`]): a pod whose namespace the agent last saw as not enrolled, and
//!      that is not itself known as enrolled, starts; every other pod **fails closed**: code 11
//!      "try again later", naming the socket and saying the node agent must be running. The
//!      runtime retries sandbox creation, so such pods start once the agent is back.
//!    - Agent running but not answering in time, or closing mid-request ⇒ fail closed (code
//!      11): it may be setting the pod up.
//!
//! A half-present pod identity (only one of the two `K8S_*` keys) and an unset `CNI_ARGS` are
//! errors (code 4), not "not Kubernetes": a runtime that sets up Kubernetes pods always sends
//! both, so a partial identity means a broken invocation, never a pod that may skip capture.
//! `CNI_NETNS` is checked before the agent is asked (code 8): an absolute path without `.` or `..`
//! components, that exists, and that is not the plugin's own network namespace, so a runtime bug
//! cannot make the agent capture the host. `CNI_NETNS_OVERRIDE=1` skips these checks (libcni's
//! meaning); the agent checks the path again in its own process either way, and also that it is
//! a network namespace, before it enters it.
//!
//! DEL, CHECK (configs 0.4.0 and later) and GC (1.1.0) succeed without contacting the agent: the
//! agent learns of deleted pods from its pod watch and the plugin keeps no state, so DEL also
//! succeeds for a pod that never existed. STATUS (1.1.0) reports code 50 when the agent's socket
//! does not accept a connection within 2 s; runtimes that call STATUS (containerd 2, CRI-O) then
//! report the node's network as not ready until the agent runs, which is the intent; the agent's
//! own DaemonSet pod uses the host network and so still starts. VERSION lists 0.3.0, 0.3.1,
//! 0.4.0, 1.0.0 and 1.1.0. Every error is a CNI error object on stdout
//! (`{"cniVersion","code","msg","details"}`) with exit status 1; a panic becomes code 999.

#![warn(missing_docs)]
pub mod args;
mod base64;
pub mod cache;
pub mod client;
pub mod conf;
pub mod error;
pub mod event;
pub mod plugin;
pub mod result;
pub mod system;
pub mod version;

pub use cache::EnrollmentCache;
pub use conf::AmbitKeys;
pub use error::{CniError, ErrorCode};
pub use event::{EVENT_PATH, EVENT_SOCKET, EventIp, IpNet, PluginEvent, STATUS_RETRY};
pub use system::{SystemPod, SystemRole};
pub use version::CniVersion;

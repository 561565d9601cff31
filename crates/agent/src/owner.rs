//! Whether the agent's stop is an uninstall: its own DaemonSet, watched while the agent runs and
//! asked for once more when it stops.
//!
//! When an agent stops, the plugin must stay in the node's CNI chain if another agent follows
//! (a restart, a rolling upgrade, a node drain): new pods then wait for that agent instead of
//! starting without capture. When nothing follows (`helm uninstall`), the plugin must go, or no
//! new pod of an enrolled namespace could start on the node. istio-cni tells the two apart by
//! asking, on SIGTERM, whether its DaemonSet still exists; so does this module, with two
//! changes:
//!
//! - **Watched, not only asked.** `helm uninstall` deletes the DaemonSet and, in the same
//!   breath, the agent's Role and ServiceAccount; by the time the kubelet stops the agent its
//!   token is refused, so a question asked only then rarely gets an answer. A watch opened at
//!   start (while the Role exists) keeps streaming events after the Role is gone, and sees the
//!   deletion before the pods are stopped (the DaemonSet goes first; its pods follow through
//!   the garbage collector and the kubelet).
//! - **Fail-safe.** Without a clear sign of deletion the plugin stays: an API server that does
//!   not answer, refuses, or answers something unreadable keeps the chain, and the log line says
//!   why. Wrongly keeping costs new pods on that node until an operator removes the entry; wrongly
//!   removing lets new pods of the mesh start uncaptured during an upgrade. A DaemonSet that
//!   this agent never saw present (a wrong `AMBIT_AGENT_DAEMONSET`) is no sign either.
//!
//! [`decide`] is the rule, a pure function of what the watch saw and what the last question
//! got; [`OwnerWatch`] gathers both; [`on_stop`] applies the verdict to the installer.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_objects::k8s_openapi::api::apps::v1::DaemonSet;
use futures::StreamExt;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

use crate::install::Installer;

/// How long the question at stop may take; the kubelet's grace period (30 s by default) must
/// leave time for the uninstall after it.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// What the watch saw of the DaemonSet, last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Nothing yet: not listed, or the watch cannot list.
    Unknown,
    /// Listed, and not there: this agent never saw it present.
    Absent,
    /// Present, not being deleted.
    Present,
    /// Present with a deletionTimestamp: being deleted.
    Deleting,
    /// Deleted after being seen present.
    Deleted,
}

/// The answer to the question at stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Asked {
    /// It exists, not being deleted.
    Present,
    /// It exists, with a deletionTimestamp.
    Deleting,
    /// 404: it does not exist.
    NotFound,
    /// No usable answer.
    Failed(AskError),
}

/// Why the question got no usable answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// The API server refused the agent (401, 403).
    #[error("the API server refused to read it ({code}: {message})")]
    Refused {
        /// HTTP status.
        code: u16,
        /// The server's message.
        message: String,
    },
    /// Another error status.
    #[error("the API server answered {code}: {message}")]
    Status {
        /// HTTP status.
        code: u16,
        /// The server's message.
        message: String,
    },
    /// The API server could not be reached, or its answer could not be read.
    #[error("the API server could not be reached or read ({0})")]
    Unreachable(String),
    /// No answer in time.
    #[error("the API server did not answer within {0:?}")]
    Timeout(Duration),
}

/// What to do with the plugin when the agent stops, and why: its `Display` is the log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Take the plugin out of the chain: `AMBIT_UNINSTALL_ON_EXIT` says so.
    RemoveForced,
    /// Take it out: the DaemonSet (`namespace/name`) is being deleted or is gone.
    Remove { daemonset: String, why: &'static str },
    /// Leave it: the DaemonSet exists, so another agent follows.
    KeepPresent { daemonset: String },
    /// Leave it: no sign of an uninstall (see [`decide`]).
    KeepUnsure { daemonset: String, why: String },
    /// Leave it: the agent does not know its DaemonSet (local mode, or not set).
    KeepNoDaemonSet,
}

impl Verdict {
    /// Whether the plugin is taken out of the chain.
    pub fn removes(&self) -> bool {
        matches!(self, Verdict::RemoveForced | Verdict::Remove { .. })
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::RemoveForced => {
                f.write_str("removing ambit-cni from the node's CNI chain: AMBIT_UNINSTALL_ON_EXIT is set")
            }
            Verdict::Remove { daemonset, why } => {
                write!(
                    f,
                    "removing ambit-cni from the node's CNI chain: DaemonSet {daemonset} {why} (an uninstall)"
                )
            }
            Verdict::KeepPresent { daemonset } => write!(
                f,
                "keeping ambit-cni in the node's CNI chain: DaemonSet {daemonset} still exists (a restart or an \
                 upgrade); new pods wait for the next agent"
            ),
            Verdict::KeepUnsure { daemonset, why } => write!(
                f,
                "keeping ambit-cni in the node's CNI chain: cannot tell an uninstall from an upgrade, because {why} \
                 about DaemonSet {daemonset}; if this is an uninstall, remove the entry by hand (docs/install.md, \
                 \"Uninstall\")"
            ),
            Verdict::KeepNoDaemonSet => f.write_str(
                "keeping ambit-cni in the node's CNI chain: the agent does not know its DaemonSet \
                 (AMBIT_AGENT_DAEMONSET), so it cannot tell an uninstall from a restart",
            ),
        }
    }
}

/// The rule: remove only on a sign of deletion that this agent can trust.
///
/// | asked at stop | the watch saw | verdict |
/// |---|---|---|
/// | present | anything | keep |
/// | being deleted | anything | remove |
/// | not found | it present, deleting or deleted | remove |
/// | not found | nothing, or never present | keep (a wrong name is no sign) |
/// | no answer | it deleting or deleted | remove (the uninstall took the Role away) |
/// | no answer | anything else | keep |
pub fn decide(daemonset: &str, seen: Seen, asked: Asked) -> Verdict {
    let daemonset = daemonset.to_owned();
    let deleted_seen = matches!(seen, Seen::Deleting | Seen::Deleted);
    match asked {
        Asked::Present => Verdict::KeepPresent { daemonset },
        Asked::Deleting => Verdict::Remove { daemonset, why: "is being deleted" },
        Asked::NotFound if deleted_seen || seen == Seen::Present => {
            Verdict::Remove { daemonset, why: "no longer exists" }
        }
        Asked::NotFound => Verdict::KeepUnsure {
            daemonset,
            why:
                "the API server has no such DaemonSet and this agent never saw it (is AMBIT_AGENT_DAEMONSET \
                  its name?)"
                    .to_owned(),
        },
        Asked::Failed(_) if deleted_seen => Verdict::Remove {
            daemonset,
            why: if seen == Seen::Deleting { "is being deleted" } else { "no longer exists" },
        },
        Asked::Failed(e) => Verdict::KeepUnsure { daemonset, why: e.to_string() },
    }
}

/// The agent's DaemonSet, watched from start.
pub struct OwnerWatch {
    api: Api<DaemonSet>,
    namespace: String,
    name: String,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl OwnerWatch {
    /// Starts watching `namespace/name` (list and watch by name: the chart's Role allows exactly
    /// that one DaemonSet).
    pub fn start(client: kube::Client, namespace: &str, name: &str) -> OwnerWatch {
        let api: Api<DaemonSet> = Api::namespaced(client, namespace);
        let seen = Arc::new(Mutex::new(Seen::Unknown));
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher(api.clone(), cfg).default_backoff();
        let (s, what) = (seen.clone(), format!("{namespace}/{name}"));
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let mut listed = false;
            let mut warned = false;
            while let Some(event) = stream.next().await {
                let mut seen = s.lock().unwrap_or_else(|p| p.into_inner());
                match event {
                    Ok(watcher::Event::Init) => listed = false,
                    Ok(watcher::Event::InitApply(ds) | watcher::Event::Apply(ds)) => {
                        listed = true;
                        *seen = state(&ds);
                    }
                    Ok(watcher::Event::InitDone) if !listed => {
                        *seen = if matches!(*seen, Seen::Present | Seen::Deleting) {
                            Seen::Deleted
                        } else {
                            Seen::Absent
                        };
                    }
                    Ok(watcher::Event::InitDone) => {}
                    Ok(watcher::Event::Delete(_)) => *seen = Seen::Deleted,
                    Err(e) if !warned => {
                        warned = true;
                        tracing::warn!(daemonset = %what, error = %e,
                            "cannot watch the agent's own DaemonSet; at stop the agent asks once, and keeps the \
                             plugin in the CNI chain unless the answer shows an uninstall");
                    }
                    Err(e) => {
                        tracing::debug!(daemonset = %what, error = %e, "watching the agent's DaemonSet")
                    }
                }
            }
        });
        OwnerWatch { api, namespace: namespace.to_owned(), name: name.to_owned(), seen, task }
    }

    /// What the watch saw last.
    pub fn seen(&self) -> Seen {
        *self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks once more (within `timeout`) and decides.
    pub async fn verdict(&self, timeout: Duration) -> Verdict {
        let asked = match tokio::time::timeout(timeout, self.api.get_opt(&self.name)).await {
            Err(_) => Asked::Failed(AskError::Timeout(timeout)),
            Ok(Ok(Some(ds))) if ds.metadata.deletion_timestamp.is_some() => Asked::Deleting,
            Ok(Ok(Some(_))) => Asked::Present,
            Ok(Ok(None)) => Asked::NotFound,
            Ok(Err(kube::Error::Api(s))) if matches!(s.code, 401 | 403) => {
                Asked::Failed(AskError::Refused { code: s.code, message: s.message.clone() })
            }
            Ok(Err(kube::Error::Api(s))) => {
                Asked::Failed(AskError::Status { code: s.code, message: s.message.clone() })
            }
            Ok(Err(kube::Error::Service(e))) => Asked::Failed(AskError::Unreachable(chain(e.as_ref()))),
            Ok(Err(e)) => Asked::Failed(AskError::Unreachable(chain(&e))),
        };
        decide(&format!("{}/{}", self.namespace, self.name), self.seen(), asked)
    }
}

impl Drop for OwnerWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An error and its causes, `outer: inner: …`, so the log names the root cause (a refused
/// connection) rather than only the client's summary.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// The state an object of the watch shows.
fn state(ds: &DaemonSet) -> Seen {
    if ds.metadata.deletion_timestamp.is_some() { Seen::Deleting } else { Seen::Present }
}

/// At stop: decides (forced by `AMBIT_UNINSTALL_ON_EXIT`, else by `owner`), logs the verdict,
/// and takes the plugin out of the chain if it says so. Returns the verdict.
pub async fn on_stop(installer: &Installer, owner: Option<&OwnerWatch>, forced: bool) -> Verdict {
    let verdict = match (forced, owner) {
        (true, _) => Verdict::RemoveForced,
        (false, Some(o)) => o.verdict(ASK_TIMEOUT).await,
        (false, None) => Verdict::KeepNoDaemonSet,
    };
    if !verdict.removes() {
        match verdict {
            Verdict::KeepUnsure { .. } => tracing::warn!("{verdict}"),
            _ => tracing::info!("{verdict}"),
        }
        return verdict;
    }
    tracing::info!("{verdict}");
    // Off the runtime's workers: the uninstall writes files and fsyncs.
    let i = installer.clone();
    match tokio::task::spawn_blocking(move || i.uninstall()).await {
        Ok(Ok(())) => {
            tracing::info!("ambit-cni removed: the node's CNI config is as it was before the agent")
        }
        Ok(Err(e)) => tracing::error!(error = %e, "removing ambit-cni failed; remove its entry by hand"),
        Err(e) => tracing::error!(error = %e, "removing ambit-cni failed; remove its entry by hand"),
    }
    verdict
}

#[cfg(test)]
mod tests;

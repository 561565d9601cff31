//! The owner's published set ([`Resources`]): per type URL, each resource with its version,
//! the scope of a scoped type's resources, the node-local index, and the dirty marks a publish
//! leaves for the debouncer.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Sub, lock, merge};
use crate::resource_version;

/// One resource the owner publishes.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerResource {
    /// Its name (unique within its type).
    pub name: String,
    /// Other names it answers to for named/on-demand subscribers (e.g. `<network>/<ip>`).
    pub aliases: Vec<String>,
    /// The payload.
    pub resource: prost_types::Any,
    /// Names sent along when this resource is sent to a named/on-demand subscriber (a Service
    /// brings its workloads); they join that subscription. A publish that changes only this
    /// list pushes nothing: the next subscriber gets the new list.
    pub also: Vec<String>,
    /// The node it lives on (a workload's `node`): an on-demand stream whose node metadata
    /// `NODE_NAME` names this node receives it unrequested, on its first response and on
    /// pushes, and it joins that subscription (control-plane.md §5.3). Wildcard streams get
    /// everything anyway.
    pub node: Option<String>,
}

/// Changes to one type.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    /// The type URL (registered with [`Resources::new`]).
    pub type_url: String,
    /// Added or replaced resources.
    pub upserts: Vec<ServerResource>,
    /// Names removed.
    pub removals: Vec<String>,
}

/// Why a publish was refused (nothing of it was applied).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PublishError {
    /// The type was not registered.
    #[error("type {0} was not registered with Resources::new")]
    UnknownType(String),
}

/// The owner's published set (cheap to clone; clones share it).
#[derive(Clone)]
pub struct Resources {
    pub(super) inner: Arc<ResourcesInner>,
}

pub(super) struct ResourcesInner {
    pub(super) types: Vec<String>,
    pub(super) state: RwLock<Snapshot>,
    /// Debouncers of the servers serving this set.
    pub(super) inboxes: Mutex<Vec<Weak<Inbox>>>,
}

pub(super) struct Snapshot {
    pub(super) version: u64,
    pub(super) sets: Vec<TypeSet>,
}

#[derive(Default)]
pub(super) struct TypeSet {
    /// Whether names are scoped ([`scope_of`]).
    pub(super) scoped: bool,
    pub(super) by_name: HashMap<String, Entry>,
    pub(super) by_alias: HashMap<String, String>,
    /// Names of the resources on each node.
    pub(super) by_node: HashMap<String, HashSet<String>>,
}

impl TypeSet {
    /// Whether the resource `name` may be shown to a stream with `scope`.
    pub(super) fn visible(&self, name: &str, scope: Option<&str>) -> bool {
        !self.scoped || (scope.is_some() && scope_of(name) == scope)
    }

    /// Drops `res`'s aliases and node entry (those that still point at it).
    pub(super) fn unindex(&mut self, res: &ServerResource) {
        for a in &res.aliases {
            if self.by_alias.get(a) == Some(&res.name) {
                self.by_alias.remove(a);
            }
        }
        if let Some(node) = &res.node
            && let Some(names) = self.by_node.get_mut(node)
        {
            names.remove(&res.name);
            if names.is_empty() {
                self.by_node.remove(node);
            }
        }
    }

    /// The names on `node` that `sub` does not hold and `also_asked` does not name.
    pub(super) fn node_local(
        &self,
        node: Option<&str>,
        sub: &Sub,
        also_asked: &[String],
        scope: Option<&str>,
    ) -> Vec<String> {
        let Some(names) = node.and_then(|n| self.by_node.get(n)) else { return Vec::new() };
        let mut out: Vec<String> = names
            .iter()
            .filter(|n| !sub.names.contains_key(*n) && !also_asked.contains(n) && self.visible(n, scope))
            .cloned()
            .collect();
        out.sort();
        out
    }

    /// Whether the resource `name` lives on `node`.
    pub(super) fn is_on(&self, name: &str, node: Option<&str>) -> bool {
        node.is_some_and(|node| self.by_name.get(name).and_then(|e| e.res.node.as_deref()) == Some(node))
    }
}

pub(super) struct Entry {
    pub(super) res: ServerResource,
    pub(super) version: String,
}

/// Changed names per type index, each with the version of its latest change, merged until
/// they are pushed.
pub(super) type Dirty = Vec<HashMap<String, u64>>;

/// Changes waiting to be pushed, and when the first of them was published.
pub(super) struct Pending {
    pub(super) names: Dirty,
    pub(super) since: Option<Instant>,
}

impl Pending {
    pub(super) fn new(width: usize) -> Self {
        Self { names: vec![HashMap::new(); width], since: None }
    }

    /// Adds `names` changed at `since` (the earliest publish wins).
    pub(super) fn merge(&mut self, names: &Dirty, since: Option<Instant>) {
        merge(&mut self.names, names);
        self.since = match (self.since, since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Takes everything, leaving the set empty.
    pub(super) fn take(&mut self) -> Self {
        let width = self.names.len();
        std::mem::replace(self, Self::new(width))
    }
}

pub(super) struct Inbox {
    pub(super) dirty: Mutex<Pending>,
    pub(super) wake: Notify,
}

/// The scope of a resource name of a scoped type: its first two `/`-separated segments
/// (`ns/wp` of `ns/wp/ns/reviews.ns.svc.cluster.local`); `None` when it has fewer than three.
pub fn scope_of(name: &str) -> Option<&str> {
    let first = name.find('/')?;
    let second = first + 1 + name[first + 1..].find('/')?;
    Some(&name[..second])
}

impl Resources {
    /// An empty set serving `type_urls`, in this order.
    pub fn new<S: Into<String>>(type_urls: impl IntoIterator<Item = S>) -> Self {
        Self::with_scoped(type_urls, Vec::<String>::new())
    }

    /// An empty set serving `type_urls`, in this order, of which those in `scoped` are scoped:
    /// each of their resources is visible only to streams whose [`Authorize::scope`] equals
    /// [`scope_of`] its name.
    pub fn with_scoped<S: Into<String>, T: AsRef<str>>(
        type_urls: impl IntoIterator<Item = S>,
        scoped: impl IntoIterator<Item = T>,
    ) -> Self {
        let types: Vec<String> = type_urls.into_iter().map(Into::into).collect();
        let scoped_urls: Vec<T> = scoped.into_iter().collect();
        let scoped: Vec<bool> = types.iter().map(|t| scoped_urls.iter().any(|s| s.as_ref() == t)).collect();
        let sets = scoped.iter().map(|s| TypeSet { scoped: *s, ..TypeSet::default() }).collect();
        Self {
            inner: Arc::new(ResourcesInner {
                types,
                state: RwLock::new(Snapshot { version: 0, sets }),
                inboxes: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Applies `changes` (all or none), bumps the version if anything changed and wakes the
    /// servers' debouncers. A resource whose payload, aliases, `also` and node are unchanged is
    /// not a change. Returns the version after the publish.
    pub fn publish(&self, changes: impl IntoIterator<Item = Changes>) -> Result<u64, PublishError> {
        let mut indexed = Vec::new();
        for c in changes {
            let i = self.index(&c.type_url).ok_or_else(|| PublishError::UnknownType(c.type_url.clone()))?;
            indexed.push((i, c));
        }
        let mut dirty: Dirty = vec![HashMap::new(); self.inner.types.len()];
        let mut state = self.inner.state.write().unwrap_or_else(PoisonError::into_inner);
        let next = state.version + 1;
        for (i, c) in indexed {
            let set = &mut state.sets[i];
            for res in c.upserts {
                let version = resource_version(&res.resource);
                if let Some(old) = set.by_name.get_mut(&res.name)
                    && old.version == version
                    && old.res.aliases == res.aliases
                    && old.res.node == res.node
                {
                    // Only the names sent along changed (a service's members): kept for the
                    // next subscriber, pushed to nobody (istiod: members added later are not
                    // pushed to who subscribed to the service).
                    old.res.also = res.also;
                    continue;
                }
                if let Some(old) = set.by_name.remove(&res.name) {
                    set.unindex(&old.res);
                }
                for a in &res.aliases {
                    set.by_alias.insert(a.clone(), res.name.clone());
                }
                if let Some(node) = &res.node {
                    set.by_node.entry(node.clone()).or_default().insert(res.name.clone());
                }
                dirty[i].insert(res.name.clone(), next);
                set.by_name.insert(res.name.clone(), Entry { res, version });
            }
            for name in c.removals {
                if let Some(old) = set.by_name.remove(&name) {
                    set.unindex(&old.res);
                    dirty[i].insert(name, next);
                }
            }
        }
        if dirty.iter().all(HashMap::is_empty) {
            return Ok(state.version);
        }
        state.version = next;
        let version = next;
        drop(state);
        let now = Instant::now();
        let mut inboxes = lock(&self.inner.inboxes);
        inboxes.retain(|w| w.strong_count() > 0);
        for inbox in inboxes.iter().filter_map(Weak::upgrade) {
            lock(&inbox.dirty).merge(&dirty, Some(now));
            inbox.wake.notify_one();
        }
        Ok(version)
    }

    /// The current version (bumped by every publish that changed something).
    pub fn version(&self) -> u64 {
        self.read().version
    }

    /// Number of resources of `type_url`.
    pub fn len(&self, type_url: &str) -> usize {
        self.index(type_url).map_or(0, |i| self.read().sets[i].by_name.len())
    }

    /// Whether no resource of `type_url` is published.
    pub fn is_empty(&self, type_url: &str) -> bool {
        self.len(type_url) == 0
    }

    pub(super) fn index(&self, type_url: &str) -> Option<usize> {
        self.inner.types.iter().position(|t| t == type_url)
    }

    pub(super) fn read(&self) -> std::sync::RwLockReadGuard<'_, Snapshot> {
        self.inner.state.read().unwrap_or_else(PoisonError::into_inner)
    }
}

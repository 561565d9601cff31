//! A service's endpoints and a workload's service ports: the sets one workload update touches,
//! kept small (no allocation per endpoint in a small service) and persistent (a large service is
//! never copied whole).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::model::HealthStatus;
use crate::name::Name;

/// One endpoint of a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// The workload.
    pub workload_uid: Arc<str>,
    /// This endpoint's service port → target port map.
    #[serde(default)]
    pub port: PortMap,
    /// Health.
    #[serde(default)]
    pub status: HealthStatus,
}

/// A service's endpoints by workload uid.
///
/// Persistent: a copy of a service with one endpoint changed shares every other endpoint with the
/// original. A service of up to [`SMALL_SET`] endpoints (most of them: a deployment's replicas)
/// holds them in one shared, sorted slice that a change copies whole (at most 32 entries of 56
/// bytes, no allocation per endpoint); a larger one in a persistent hash map (O(log n) time and
/// memory per change, so one workload update does not copy a service of 10 000 endpoints).
/// Serialised as a map sorted by uid.
#[derive(Clone)]
pub struct EndpointSet(Set);

/// Most endpoints a service holds in a slice; above it, a map (and back below half of it).
pub const SMALL_SET: usize = 32;

#[derive(Clone)]
enum Set {
    Small(Arc<[(Arc<str>, Endpoint)]>),
    Large(imbl::HashMap<Arc<str>, Endpoint>),
}

impl Default for EndpointSet {
    fn default() -> Self {
        EndpointSet(Set::Small(Arc::new([])))
    }
}

impl EndpointSet {
    /// The endpoint of workload `uid`.
    pub fn get(&self, uid: &str) -> Option<&Endpoint> {
        match &self.0 {
            Set::Small(v) => v.binary_search_by(|(k, _)| (**k).cmp(uid)).ok().map(|i| &v[i].1),
            Set::Large(m) => m.get(uid),
        }
    }

    /// Whether workload `uid` is an endpoint.
    pub fn contains_key(&self, uid: &str) -> bool {
        self.get(uid).is_some()
    }

    /// Adds or replaces the endpoint of workload `uid`; returns the one replaced.
    pub fn insert(&mut self, uid: impl Into<Arc<str>>, endpoint: Endpoint) -> Option<Endpoint> {
        let uid = uid.into();
        match &mut self.0 {
            Set::Small(v) => {
                let mut next = v.to_vec();
                let old = match next.binary_search_by(|(k, _)| k.cmp(&uid)) {
                    Ok(i) => Some(std::mem::replace(&mut next[i].1, endpoint)),
                    Err(i) => {
                        next.insert(i, (uid, endpoint));
                        None
                    }
                };
                self.0 = if next.len() > SMALL_SET {
                    Set::Large(next.into_iter().collect())
                } else {
                    Set::Small(next.into())
                };
                old
            }
            Set::Large(m) => m.insert(uid, endpoint),
        }
    }

    /// Removes the endpoint of workload `uid`.
    pub fn remove(&mut self, uid: &str) -> Option<Endpoint> {
        match &mut self.0 {
            Set::Small(v) => {
                let i = v.binary_search_by(|(k, _)| (**k).cmp(uid)).ok()?;
                let mut next = v.to_vec();
                let (_, old) = next.remove(i);
                *v = next.into();
                Some(old)
            }
            Set::Large(m) => {
                let old = m.remove(uid);
                if m.len() <= SMALL_SET / 2 {
                    let mut small: Vec<_> = m.iter().map(|(k, e)| (k.clone(), e.clone())).collect();
                    small.sort_by(|(a, _), (b, _)| a.cmp(b));
                    self.0 = Set::Small(small.into());
                }
                old
            }
        }
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        match &self.0 {
            Set::Small(v) => v.len(),
            Set::Large(m) => m.len(),
        }
    }

    /// Whether there is no endpoint.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The endpoints' workload uids (unordered).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries().map(|(k, _)| &**k)
    }

    /// The endpoints (unordered).
    pub fn values(&self) -> impl Iterator<Item = &Endpoint> {
        self.entries().map(|(_, e)| e)
    }

    /// `(uid, endpoint)` pairs (unordered).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Endpoint)> {
        self.entries().map(|(k, e)| (&**k, e))
    }

    /// Keeps the endpoints for which `keep` holds.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &Endpoint) -> bool) {
        let drop: Vec<Arc<str>> =
            self.entries().filter(|(k, e)| !keep(k, e)).map(|(k, _)| k.clone()).collect();
        for uid in drop {
            self.remove(&uid);
        }
    }

    /// Whether both hold the same storage (then they are equal without looking further).
    pub(crate) fn ptr_eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Set::Small(a), Set::Small(b)) => Arc::ptr_eq(a, b),
            (Set::Large(a), Set::Large(b)) => a.ptr_eq(b),
            _ => false,
        }
    }

    /// `(uid, endpoint)` pairs (unordered), without an allocation: routing walks them per
    /// connection.
    pub(crate) fn entries(&self) -> Entries<'_> {
        match &self.0 {
            Set::Small(v) => Entries::Small(v.iter()),
            Set::Large(m) => Entries::Large(m.iter()),
        }
    }

    fn sorted(&self) -> BTreeMap<&str, &Endpoint> {
        self.iter().collect()
    }
}

/// The iterator of [`EndpointSet::entries`]. Lives on the stack for one walk; boxing the large
/// variant would allocate per walk, which is what it replaces.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Entries<'a> {
    Small(std::slice::Iter<'a, (Arc<str>, Endpoint)>),
    Large(imbl::hashmap::Iter<'a, Arc<str>, Endpoint, imbl::shared_ptr::DefaultSharedPtr>),
}

impl<'a> Iterator for Entries<'a> {
    type Item = (&'a Arc<str>, &'a Endpoint);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Entries::Small(i) => i.next().map(|(k, e)| (k, e)),
            Entries::Large(i) => i.next(),
        }
    }
}

impl PartialEq for EndpointSet {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other) || (self.len() == other.len() && self.iter().all(|(k, e)| other.get(k) == Some(e)))
    }
}

impl Eq for EndpointSet {}

impl fmt::Debug for EndpointSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.sorted()).finish()
    }
}

impl Serialize for EndpointSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.sorted().serialize(s)
    }
}

impl<'de> Deserialize<'de> for EndpointSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(unique_map::<_, String, Endpoint>(d)?.into_iter().collect())
    }
}

impl<K: Into<Arc<str>>> FromIterator<(K, Endpoint)> for EndpointSet {
    fn from_iter<I: IntoIterator<Item = (K, Endpoint)>>(iter: I) -> Self {
        let mut map: BTreeMap<Arc<str>, Endpoint> = BTreeMap::new();
        for (k, e) in iter {
            map.insert(k.into(), e);
        }
        if map.len() > SMALL_SET {
            EndpointSet(Set::Large(map.into_iter().collect()))
        } else {
            EndpointSet(Set::Small(map.into_iter().collect()))
        }
    }
}

/// Service port → target port (0: the named port, resolved per endpoint), sorted by service
/// port: a workload's few ports in one small shared slice, not a tree (a workload's map and its
/// endpoint's are the same allocation).
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct PortMap(Arc<[(u16, u16)]>);

impl PortMap {
    /// The target port of service port `port`.
    pub fn get(&self, port: &u16) -> Option<&u16> {
        self.0.binary_search_by_key(port, |(s, _)| *s).ok().map(|i| &self.0[i].1)
    }

    /// `(service port, target port)` pairs, by service port.
    pub fn iter(&self) -> impl Iterator<Item = (&u16, &u16)> {
        self.0.iter().map(|(s, t)| (s, t))
    }

    /// The target ports, by service port.
    pub fn values(&self) -> impl Iterator<Item = &u16> {
        self.0.iter().map(|(_, t)| t)
    }

    /// Number of ports.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no port.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<(u16, u16)> for PortMap {
    /// Sorted by service port; the last target of a service port listed twice wins (as a map).
    fn from_iter<I: IntoIterator<Item = (u16, u16)>>(iter: I) -> Self {
        BTreeMap::from_iter(iter).into()
    }
}

impl From<BTreeMap<u16, u16>> for PortMap {
    fn from(map: BTreeMap<u16, u16>) -> Self {
        PortMap(map.into_iter().collect())
    }
}

impl PartialEq<BTreeMap<u16, u16>> for PortMap {
    fn eq(&self, other: &BTreeMap<u16, u16>) -> bool {
        self.len() == other.len() && self.iter().zip(other.iter()).all(|(a, b)| a == b)
    }
}

impl fmt::Debug for PortMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for PortMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for PortMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        unique_map::<_, u16, u16>(d).map(PortMap::from)
    }
}

/// A map that refuses a key given twice, whatever the parser (the JSON parser would keep the
/// last one silently; the YAML parser refuses it).
pub(crate) fn unique_map<'de, D, K, V>(d: D) -> Result<BTreeMap<K, V>, D::Error>
where
    D: Deserializer<'de>,
    K: Deserialize<'de> + Ord + fmt::Debug,
    V: Deserialize<'de>,
{
    struct Visitor<K, V>(std::marker::PhantomData<(K, V)>);
    impl<'de, K: Deserialize<'de> + Ord + fmt::Debug, V: Deserialize<'de>> serde::de::Visitor<'de>
        for Visitor<K, V>
    {
        type Value = BTreeMap<K, V>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
            let mut map = BTreeMap::new();
            while let Some((k, v)) = access.next_entry::<K, V>()? {
                if map.contains_key(&k) {
                    return Err(serde::de::Error::custom(format_args!("duplicate key {k:?} in a map")));
                }
                map.insert(k, v);
            }
            Ok(map)
        }
    }
    d.deserialize_map(Visitor(std::marker::PhantomData))
}

/// The services a workload is an endpoint of: `"<ns>/<hostname>"` (interned: shared by every
/// endpoint of the service) → this workload's port map, sorted by key. A workload is in a
/// handful of services, so a sorted vector, not a tree.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct ServicePorts(Vec<(Name, PortMap)>);

impl ServicePorts {
    /// The port map of service `key`.
    pub fn get(&self, key: &str) -> Option<&PortMap> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    /// Whether the workload is an endpoint of service `key`.
    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Adds or replaces service `key`; returns the port map replaced.
    pub fn insert(&mut self, key: impl Into<Name>, ports: impl Into<PortMap>) -> Option<PortMap> {
        let key = key.into();
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, ports.into())),
            Err(i) => {
                self.0.insert(i, (key, ports.into()));
                None
            }
        }
    }

    /// Removes every service.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// The service keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &Name> {
        self.0.iter().map(|(k, _)| k)
    }

    /// `(service key, port map)` pairs, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&Name, &PortMap)> {
        self.0.iter().map(|(k, p)| (k, p))
    }

    /// Number of services.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the workload is in no service.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }
}

impl std::ops::Index<&str> for ServicePorts {
    type Output = PortMap;

    fn index(&self, key: &str) -> &PortMap {
        self.get(key).expect("no such service key")
    }
}

impl<K: Into<Name>, P: Into<PortMap>> FromIterator<(K, P)> for ServicePorts {
    fn from_iter<I: IntoIterator<Item = (K, P)>>(iter: I) -> Self {
        let mut out = ServicePorts::default();
        for (k, p) in iter {
            out.insert(k, p);
        }
        out.0.shrink_to_fit();
        out
    }
}

impl fmt::Debug for ServicePorts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for ServicePorts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for ServicePorts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(unique_map::<_, String, PortMap>(d)?.into_iter().collect())
    }
}

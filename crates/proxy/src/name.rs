//! Interned names: the strings every workload repeats (namespaces, service accounts, trust
//! domain, nodes, service keys, …) are held once, however many workloads name them.
//!
//! A mesh of 100 000 pods has a few hundred namespaces, a few thousand service accounts and one
//! trust domain; holding each as its own `String` per workload cost about as much as the rest of
//! the workload. [`Name::new`] looks the string up in one process-wide table and returns the
//! shared copy. The table is only touched when resources are converted (the control path: xDS
//! responses, the local file); lookups on the data path compare and hash the string as a `str`.
//! Names nobody holds any more are dropped from the table when it has doubled since the last
//! sweep, so churn of names does not grow it without bound.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An immutable, shared string, interned: equal names share one allocation.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Arc<str>);

/// A process-wide table of shared values: equal values share one allocation. Values only the
/// table still holds are dropped when it has doubled since its last sweep (and holds at least
/// [`MIN_SWEEP`]), so churn does not grow it without bound.
pub(crate) struct Interner<T: ?Sized> {
    table: Mutex<Option<Table<T>>>,
}

/// The values, and their number after the last sweep.
struct Table<T: ?Sized> {
    values: HashSet<Arc<T>>,
    swept_at: usize,
}

/// Below this many values a table is never swept.
const MIN_SWEEP: usize = 1024;

impl<T: ?Sized + Eq + Hash> Interner<T> {
    pub(crate) const fn new() -> Self {
        Interner { table: Mutex::new(None) }
    }

    /// The shared copy of `value`; `make` makes it when the table has none.
    pub(crate) fn intern<Q>(&self, value: &Q, make: impl FnOnce(&Q) -> Arc<T>) -> Arc<T>
    where
        Q: ?Sized + Eq + Hash,
        Arc<T>: Borrow<Q>,
    {
        let mut guard = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let table = guard.get_or_insert_with(|| Table { values: HashSet::new(), swept_at: 0 });
        if let Some(shared) = table.values.get(value) {
            return shared.clone();
        }
        if table.values.len() >= MIN_SWEEP.max(2 * table.swept_at) {
            // Only the table holds these: nobody can ask for them by pointer any more.
            table.values.retain(|v| Arc::strong_count(v) > 1);
            table.swept_at = table.values.len();
        }
        let shared = make(value);
        table.values.insert(shared.clone());
        shared
    }

    /// How many values the table holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map_or(0, |t| t.values.len())
    }
}

static NAMES: Interner<str> = Interner::new();

impl Name {
    /// The shared copy of `s`.
    pub fn new(s: &str) -> Name {
        Name(NAMES.intern(s, |s: &str| Arc::from(s)))
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shared string itself (an index key that costs no copy).
    pub fn shared(&self) -> Arc<str> {
        self.0.clone()
    }
}

impl Default for Name {
    fn default() -> Self {
        Name::new("")
    }
}

impl Deref for Name {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Self {
        Name::new(s)
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Self {
        Name::new(s)
    }
}

impl From<String> for Name {
    fn from(s: String) -> Self {
        Name::new(&s)
    }
}

impl From<Name> for String {
    fn from(n: Name) -> Self {
        n.0.as_ref().to_owned()
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<Name> for str {
    fn eq(&self, other: &Name) -> bool {
        self == &*other.0
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        *self == &*other.0
    }
}

impl PartialEq<Name> for String {
    fn eq(&self, other: &Name) -> bool {
        **self == *other.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Name;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Name, E> {
                Ok(Name::new(s))
            }
        }
        d.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_names_share_one_allocation() {
        let a = Name::new("ns-interned-test");
        let b = Name::from(String::from("ns-interned-test"));
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(a, "ns-interned-test");
        assert_eq!(a.as_str(), "ns-interned-test");
    }

    #[test]
    fn unused_names_are_swept() {
        for i in 0..3 * MIN_SWEEP {
            drop(Name::new(&format!("swept-{i}")));
        }
        let kept = Name::new("kept-across-sweeps");
        for i in 0..3 * MIN_SWEEP {
            drop(Name::new(&format!("swept-again-{i}")));
        }
        let len = NAMES.len();
        assert!(len < 3 * MIN_SWEEP, "the table holds {len} names");
        assert!(Arc::ptr_eq(&kept.0, &Name::new("kept-across-sweeps").0));
    }
}

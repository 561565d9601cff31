//! Readiness: the proxy is ready when no registered task is pending.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Pending tasks by name (a name may be held several times).
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    pending: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

/// Holds readiness back until dropped.
#[derive(Debug)]
pub struct Pending {
    name: &'static str,
    readiness: Readiness,
}

impl Readiness {
    /// A readiness with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks `name` as pending until the returned guard is dropped.
    pub fn pending(&self, name: &'static str) -> Pending {
        *self.lock().entry(name).or_default() += 1;
        Pending { name, readiness: self.clone() }
    }

    /// `Ok` when ready, else the sorted names of pending tasks.
    pub fn status(&self) -> Result<(), Vec<&'static str>> {
        let p = self.lock();
        if p.is_empty() { Ok(()) } else { Err(p.keys().copied().collect()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, usize>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut p = self.readiness.lock();
        if let Some(n) = p.get_mut(self.name) {
            *n -= 1;
            if *n == 0 {
                p.remove(self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_until_dropped() {
        let r = Readiness::new();
        assert_eq!(r.status(), Ok(()));
        let a = r.pending("proxy");
        let b = r.pending("state manager");
        let a2 = r.pending("proxy");
        assert_eq!(r.status(), Err(vec!["proxy", "state manager"]));
        drop(a);
        drop(b);
        assert_eq!(r.status(), Err(vec!["proxy"]));
        drop(a2);
        assert_eq!(r.status(), Ok(()));
    }
}

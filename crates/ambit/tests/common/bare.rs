//! Many bare network namespaces at once (only `lo`, up): pods for a proxy's ZDS Adds when the
//! test needs their number, not their network.

use std::path::PathBuf;
use std::process::Command;

use super::netns::NETNS_DIR;

/// `<prefix>-0 … <prefix>-(n-1)`, created with one `ip -batch`, deleted on drop (also on panic).
pub struct BareNamespaces {
    names: Vec<String>,
}

impl BareNamespaces {
    /// Creates `n` namespaces named `amb<pid>-<tag>-<i>` (the harness's prefix, so a killed run's
    /// leftovers are found and removed).
    pub fn create(tag: &str, n: usize) -> BareNamespaces {
        let prefix = format!("amb{}-{tag}", std::process::id());
        let ns = BareNamespaces { names: (0..n).map(|i| format!("{prefix}-{i}")).collect() };
        let batch: String = ns.names.iter().map(|n| format!("netns add {n}\n")).collect();
        let path = std::env::temp_dir().join(format!("{prefix}.batch"));
        std::fs::write(&path, batch).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        let out = Command::new("ip").arg("-batch").arg(&path).output().expect("run ip -batch");
        let _ = std::fs::remove_file(&path);
        assert!(out.status.success(), "ip -batch failed: {}", String::from_utf8_lossy(&out.stderr));
        for name in &ns.names {
            let out = Command::new("ip").args(["-n", name, "link", "set", "lo", "up"]).output();
            assert!(out.as_ref().is_ok_and(|o| o.status.success()), "cannot set lo up in {name}: {out:?}");
        }
        ns
    }

    /// The `ip netns` names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The bind-mount path of namespace `i`.
    pub fn path(&self, i: usize) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.names[i])
    }
}

impl Drop for BareNamespaces {
    fn drop(&mut self) {
        let batch: String = self.names.iter().map(|n| format!("netns del {n}\n")).collect();
        let path = std::env::temp_dir().join(format!(
            "amb{}-del-{}.batch",
            std::process::id(),
            rand::random::<u32>()
        ));
        if std::fs::write(&path, batch).is_ok() {
            let _ = Command::new("ip").args(["-force", "-batch"]).arg(&path).output();
            let _ = std::fs::remove_file(&path);
        }
    }
}

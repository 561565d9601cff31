//! Local-mode node tokens: with no API server to review service-account tokens, the control
//! plane writes one random token per node (`<dir>/<node>.token`, 0600) at start; the node
//! proxy on that node sends it as its bearer token (`AUTH_TOKEN=<dir>/<node>.token`) and is
//! authenticated as the node proxy identity, a trusted node account on that node.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use base64::Engine;

use super::{AuthMethod, Caller};

/// File name suffix of a node token.
pub const TOKEN_SUFFIX: &str = ".token";
/// Random bytes in a token (256 bits).
const TOKEN_BYTES: usize = 32;
/// Longest node name (a DNS-1123 subdomain).
const MAX_NODE_NAME: usize = 253;

/// The node tokens written at start, and the identity they authenticate as.
pub struct NodeTokens {
    dir: PathBuf,
    identity: String,
    tokens: RwLock<Vec<(String, String)>>,
}

/// Why node tokens cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum NodeTokenError {
    /// The node name cannot be a file name (or a Kubernetes node name).
    #[error("node name {0:?} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')")]
    NodeName(String),
    /// A file or the directory cannot be written.
    #[error("cannot write the node token {}: {source}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

impl NodeTokens {
    /// Writes a fresh random token for each of `nodes` into `dir` (created 0700), replacing
    /// any token from an earlier run. Callers presenting one are authenticated as `identity`
    /// (the node proxy's SPIFFE id) on that node.
    pub fn create(
        dir: &Path,
        nodes: impl IntoIterator<Item = String>,
        identity: &ambit_identity::Identity,
    ) -> Result<Self, NodeTokenError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| NodeTokenError::Write { path: dir.to_owned(), source })?;
        let tokens =
            NodeTokens { dir: dir.to_owned(), identity: identity.to_string(), tokens: RwLock::default() };
        for node in nodes {
            tokens.add(&node)?;
        }
        Ok(tokens)
    }

    /// Writes a token for `node` if it has none yet (a node that appeared after start);
    /// returns its file.
    pub fn add(&self, node: &str) -> Result<PathBuf, NodeTokenError> {
        check_node_name(node)?;
        let path = self.path(node);
        let mut tokens = self.tokens.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if tokens.iter().any(|(n, _)| n == node) {
            return Ok(path);
        }
        let token =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; TOKEN_BYTES]>());
        write_private(&path, token.as_bytes())?;
        tokens.push((node.to_owned(), token));
        Ok(path)
    }

    /// The token file of `node`.
    pub fn path(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}{TOKEN_SUFFIX}"))
    }

    /// The caller a token names: the node proxy of the node it was written for.
    pub fn authenticate(&self, token: &str) -> Option<Caller> {
        let tokens = self.tokens.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Compare against every token in constant time per token, so timing does not tell how
        // much of a guess was right. Local mode has a handful of nodes.
        let mut found = None;
        for (node, known) in tokens.iter() {
            if constant_time_eq(known.as_bytes(), token.as_bytes()) {
                found = Some(node.clone());
            }
        }
        let node = found?;
        Some(Caller { identities: vec![self.identity.clone()], method: AuthMethod::NodeToken { node } })
    }
}

fn check_node_name(node: &str) -> Result<(), NodeTokenError> {
    let ok = !node.is_empty()
        && node.len() <= MAX_NODE_NAME
        && node.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && node.split('.').all(|label| {
            !label.is_empty() && !label.starts_with('-') && !label.ends_with('-') && label.len() <= 63
        });
    if ok { Ok(()) } else { Err(NodeTokenError::NodeName(node.to_owned())) }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Writes a 0600 file through a temporary file and a rename (a proxy re-reading the token
/// sees the old or the new one, never half).
fn write_private(path: &Path, contents: &[u8]) -> Result<(), NodeTokenError> {
    let err = |source| NodeTokenError::Write { path: path.to_owned(), source };
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(err)?;
    file.set_permissions(fs::Permissions::from_mode(0o600)).map_err(err)?;
    file.write_all(contents).and_then(|()| file.sync_all()).map_err(err)?;
    fs::rename(&tmp, path).map_err(err)
}

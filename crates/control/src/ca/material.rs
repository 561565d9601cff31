//! The CA's key material at start (control-plane.md §6.6): a plugged-in CA from Istio's
//! `cacerts` directory in either layout, else a self-signed root kept in a state directory
//! (generated on first start, reused afterwards).

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ambit_identity::{AuthorityError, KeyAlgorithm, SELF_SIGNED_ROOT_TTL, SigningAuthority};

/// Largest key-material file read.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// `cacerts` files, Istio layout: signing certificate, key, roots, chain.
pub const CA_CERT: &str = "ca-cert.pem";
/// Signing key (Istio layout; also the self-signed root's key in the state directory).
pub const CA_KEY: &str = "ca-key.pem";
/// Root bundle (Istio layout; also written beside a self-signed root for distribution).
pub const ROOT_CERT: &str = "root-cert.pem";
/// Chain appended after every leaf (Istio layout).
pub const CERT_CHAIN: &str = "cert-chain.pem";
/// `cacerts` files, Kubernetes TLS-secret layout: signing certificate, key, roots.
pub const TLS_CRT: &str = "tls.crt";
/// Signing key (TLS-secret layout).
pub const TLS_KEY: &str = "tls.key";
/// Root bundle (TLS-secret layout).
pub const CA_CRT: &str = "ca.crt";

/// Where the key material comes from.
#[derive(Clone, Debug)]
pub struct MaterialConfig {
    /// Istio's `ROOT_CA_DIR` (`cacerts`): all files of one layout there ⇒ plugged-in CA.
    pub cacerts_dir: PathBuf,
    /// Where a self-signed root is kept; `None` keeps it in memory only (tests, throwaway runs).
    pub state_dir: Option<PathBuf>,
    /// Written into a generated root's subject (`O=<trust domain>`).
    pub trust_domain: String,
    /// Key type of a generated root.
    pub algorithm: KeyAlgorithm,
}

/// Which key material was selected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MaterialSource {
    /// A plugged-in CA from `cacerts`.
    Plugged {
        /// The directory.
        dir: PathBuf,
        /// The files used (signing cert, key, roots, chain files).
        files: Vec<PathBuf>,
    },
    /// A self-signed root loaded from the state directory.
    Loaded(PathBuf),
    /// A self-signed root created now (and written to the directory, if any).
    Generated(Option<PathBuf>),
}

/// Why the CA cannot start with the key material found.
#[derive(Debug, thiserror::Error)]
pub enum MaterialError {
    /// Some but not all files of a `cacerts` layout exist.
    #[error(
        "incomplete signing CA bundle in {}: missing {}; provide all of {CA_CERT}, {CA_KEY}, {ROOT_CERT} and {CERT_CHAIN} (or {TLS_CRT}, {TLS_KEY} and {CA_CRT}), or none of them to use a self-signed root",
        dir.display(),
        missing.join(", ")
    )]
    Incomplete {
        /// The `cacerts` directory.
        dir: PathBuf,
        /// The files that are missing.
        missing: Vec<&'static str>,
    },
    /// A file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file is larger than [`MAX_FILE_BYTES`].
    #[error("{} is larger than {MAX_FILE_BYTES} bytes; is it the right file?", .0.display())]
    TooLarge(PathBuf),
    /// A file cannot be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The files do not make a usable CA.
    #[error("cannot use the CA in {}: {source}", dir.display())]
    Unusable {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        source: AuthorityError,
    },
    /// The state directory has the root certificate but lost its key.
    #[error(
        "{} exists but {} does not: certificates were issued under that root; restore the key, or remove {} to start over with a new root (every workload then needs new certificates)",
        cert.display(),
        key.display(),
        cert.display()
    )]
    KeyLost {
        /// The certificate file.
        cert: PathBuf,
        /// The missing key file.
        key: PathBuf,
    },
    /// A new root could not be generated.
    #[error("cannot generate a self-signed root: {0}")]
    Generate(AuthorityError),
}

/// Selects and loads the key material: a plugged-in CA if `cacerts` holds all files of a
/// layout, an error if it holds some of them, else the state directory's self-signed root
/// (created on first start).
pub fn load(cfg: &MaterialConfig) -> Result<(SigningAuthority, MaterialSource), MaterialError> {
    if let Some((authority, files)) = load_plugged(&cfg.cacerts_dir)? {
        return Ok((authority, MaterialSource::Plugged { dir: cfg.cacerts_dir.clone(), files }));
    }
    match &cfg.state_dir {
        Some(dir) => load_or_create(dir, &cfg.trust_domain, cfg.algorithm),
        None => {
            let (authority, _, _) =
                SigningAuthority::self_signed(&cfg.trust_domain, cfg.algorithm, SELF_SIGNED_ROOT_TTL)
                    .map_err(MaterialError::Generate)?;
            Ok((authority, MaterialSource::Generated(None)))
        }
    }
}

/// The plugged-in CA in `dir`, `None` if no file of either layout exists.
fn load_plugged(dir: &Path) -> Result<Option<(SigningAuthority, Vec<PathBuf>)>, MaterialError> {
    let exists = |name: &str| dir.join(name).exists();
    // Kubernetes TLS-secret layout: chosen by tls.crt alone, as istiod does.
    let (cert, key, roots, chain): (&'static str, &'static str, &'static str, &[&'static str]) =
        if exists(TLS_CRT) {
            (TLS_CRT, TLS_KEY, CA_CRT, &[TLS_CRT, CA_CRT])
        } else {
            (CA_CERT, CA_KEY, ROOT_CERT, &[CERT_CHAIN])
        };
    let mut wanted = vec![cert, key, roots];
    wanted.extend(chain.iter().filter(|c| **c != cert && **c != roots));
    let missing: Vec<&'static str> = wanted.iter().copied().filter(|f| !exists(f)).collect();
    if missing.len() == wanted.len() {
        return Ok(None);
    }
    if !missing.is_empty() {
        return Err(MaterialError::Incomplete { dir: dir.to_owned(), missing });
    }
    let cert_pem = read(&dir.join(cert))?;
    let key_pem = read(&dir.join(key))?;
    let roots_pem = read(&dir.join(roots))?;
    let mut chain_pem = String::new();
    for file in chain {
        let mut text = read(&dir.join(file))?;
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        chain_pem.push_str(&text);
    }
    let authority = SigningAuthority::from_pem(&cert_pem, &key_pem, &chain_pem, &roots_pem)
        .map_err(|source| MaterialError::Unusable { dir: dir.to_owned(), source })?;
    let mut files: Vec<PathBuf> = vec![dir.join(cert), dir.join(key), dir.join(roots)];
    files.extend(chain.iter().map(|c| dir.join(c)));
    files.dedup();
    Ok(Some((authority, files)))
}

/// The self-signed root in `dir`: loaded if there, created (key 0600) if not.
fn load_or_create(
    dir: &Path,
    trust_domain: &str,
    algorithm: KeyAlgorithm,
) -> Result<(SigningAuthority, MaterialSource), MaterialError> {
    let cert_path = dir.join(CA_CERT);
    let key_path = dir.join(CA_KEY);
    match (cert_path.exists(), key_path.exists()) {
        (true, true) => {
            let cert_pem = read(&cert_path)?;
            let key_pem = read(&key_path)?;
            if let Ok(meta) = fs::metadata(&key_path)
                && meta.permissions().mode() & 0o077 != 0
            {
                tracing::warn!(
                    path = %key_path.display(),
                    mode = format!("{:o}", meta.permissions().mode() & 0o777),
                    "the CA key is readable by other users; make it 0600"
                );
            }
            let authority = SigningAuthority::from_pem(&cert_pem, &key_pem, "", &cert_pem)
                .map_err(|source| MaterialError::Unusable { dir: dir.to_owned(), source })?;
            // root-cert.pem is for distribution; keep it in step with the root.
            write_if_changed(&dir.join(ROOT_CERT), &cert_pem, 0o644)?;
            Ok((authority, MaterialSource::Loaded(dir.to_owned())))
        }
        (true, false) => Err(MaterialError::KeyLost { cert: cert_path, key: key_path }),
        // A key without a certificate is what a crash between the two renames below leaves:
        // nothing was ever signed with it, so a new root is safe.
        (false, _) => {
            let (authority, cert_pem, key_pem) =
                SigningAuthority::self_signed(trust_domain, algorithm, SELF_SIGNED_ROOT_TTL)
                    .map_err(MaterialError::Generate)?;
            let write_err = |path: &Path| {
                let path = path.to_owned();
                move |source| MaterialError::Write { path, source }
            };
            fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(write_err(dir))?;
            // Key first, certificate last: the certificate's presence means "complete".
            write_atomic(&key_path, key_pem.as_bytes(), 0o600)?;
            write_atomic(&cert_path, cert_pem.as_bytes(), 0o644)?;
            write_atomic(&dir.join(ROOT_CERT), cert_pem.as_bytes(), 0o644)?;
            fs::File::open(dir).and_then(|d| d.sync_all()).map_err(write_err(dir))?;
            tracing::info!(dir = %dir.display(), "generated a self-signed CA root");
            Ok((authority, MaterialSource::Generated(Some(dir.to_owned()))))
        }
    }
}

fn read(path: &Path) -> Result<String, MaterialError> {
    let err = |source| MaterialError::Read { path: path.to_owned(), source };
    let file = fs::File::open(path).map_err(err)?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text).map_err(err)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(MaterialError::TooLarge(path.to_owned()));
    }
    Ok(text)
}

fn write_if_changed(path: &Path, contents: &str, mode: u32) -> Result<(), MaterialError> {
    if fs::read_to_string(path).is_ok_and(|old| old == contents) {
        return Ok(());
    }
    write_atomic(path, contents.as_bytes(), mode)
}

/// Writes `path` through a temporary file in the same directory and a rename, so a reader (or
/// a restart after a crash) sees the old content or the new, never half of it.
fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), MaterialError> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let err = |source| MaterialError::Write { path: path.to_owned(), source };
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp).map_err(err)?;
    file.set_permissions(fs::Permissions::from_mode(mode)).map_err(err)?;
    file.write_all(contents).and_then(|()| file.sync_all()).map_err(err)?;
    fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests;

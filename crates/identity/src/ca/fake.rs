//! The in-process CA (`FAKE_CA=true`) and the dev root it can share between processes.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use futures::future::BoxFuture;
use time::OffsetDateTime;

use super::authority::{AuthorityError, KeyAlgorithm, SignError, SigningAuthority, Validity};
use super::{CaError, CertSigner};
use crate::cert::WorkloadCertificate;
use crate::{Identity, csr};

/// File name of the dev root certificate.
const ROOT_CERT: &str = "root-cert.pem";
/// File name of the dev root key.
const ROOT_KEY: &str = "root-key.pem";
/// Lifetime of a root made by [`dev_ca_init`] or [`FakeCa::generate`].
const ROOT_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Trust domain written into the dev root's subject.
const DEV_ROOT_ORG: &str = "Ambit";

/// In-process CA (FAKE_CA=true) signing with a root from a directory or a fresh in-memory ECDSA
/// root, through the same [`SigningAuthority`] as the control plane's CA. Unlike that CA it
/// issues exactly the lifetime asked for, starting now (tests rely on exact lifetimes).
pub struct FakeCa {
    authority: SigningAuthority,
}

impl FakeCa {
    /// Loads `DIR/root-cert.pem` and `DIR/root-key.pem` (any PEM RSA or ECDSA root and key).
    pub fn from_dir(dir: &Path) -> Result<Self, CaError> {
        let cert_path = dir.join(ROOT_CERT);
        let key_path = dir.join(ROOT_KEY);
        let read = |path: &Path| {
            fs::read_to_string(path).map_err(|source| CaError::ReadFile { path: path.to_owned(), source })
        };
        let cert_pem = read(&cert_path)?;
        let key_pem = read(&key_path)?;
        let authority = SigningAuthority::from_pem(&cert_pem, &key_pem, "", &cert_pem).map_err(|e| {
            let path = match e {
                AuthorityError::Key(_) | AuthorityError::KeyMismatch => &key_path,
                _ => &cert_path,
            };
            CaError::InvalidRoot { path: path.clone(), reason: e.to_string() }
        })?;
        Ok(FakeCa { authority })
    }

    /// Creates a CA with a fresh in-memory ECDSA P-256 root.
    pub fn generate() -> Self {
        // Generating a P-256 key and self-signing fixed, valid parameters cannot fail.
        let (authority, _, _) =
            SigningAuthority::self_signed(DEV_ROOT_ORG, KeyAlgorithm::EcdsaP256, ROOT_LIFETIME)
                .expect("self-signed P-256 root");
        FakeCa { authority }
    }

    /// The root certificate (PEM) that certificates from this CA chain to.
    pub fn root_pem(&self) -> &str {
        self.authority.root_bundle_pem()
    }

    /// The signing authority behind this CA.
    pub fn authority(&self) -> &SigningAuthority {
        &self.authority
    }

    /// Signs a PEM CSR for `identity`, returning `[leaf, root]` as the Istio CA does.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        identity: &Identity,
        ttl: Duration,
    ) -> Result<Vec<String>, CaError> {
        let now = OffsetDateTime::now_utc();
        let not_after = time::Duration::try_from(ttl)
            .ok()
            .and_then(|ttl| now.checked_add(ttl))
            .ok_or(CaError::Ttl(ttl))?;
        let validity = Validity { not_before: now, not_after };
        self.authority.sign(csr_pem, &[identity.to_string()], validity).map_err(|e| match e {
            SignError::Csr(e) => CaError::InvalidCsr(e),
            other => CaError::Signing(other),
        })
    }

    /// Mints a certificate for `identity` directly (fresh key, CSR, signature).
    pub fn issue(&self, identity: &Identity, ttl: Duration) -> Result<WorkloadCertificate, CaError> {
        let csr = csr::generate(identity)?;
        let chain = self.sign_csr(&csr.pem, identity, ttl)?;
        Ok(WorkloadCertificate::new(csr.key, &chain)?)
    }
}

impl CertSigner for FakeCa {
    fn sign(
        &self,
        csr_pem: String,
        identity: &Identity,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Vec<String>, CaError>> {
        let result = self.sign_csr(&csr_pem, identity, ttl);
        Box::pin(std::future::ready(result))
    }
}

/// Creates DIR/root-cert.pem and DIR/root-key.pem (ECDSA P-256 self-signed CA, 10 years, key 0600).
/// Refuses to overwrite existing files unless `force`.
pub fn dev_ca_init(dir: &Path, force: bool) -> Result<(), CaError> {
    let cert_path = dir.join(ROOT_CERT);
    let key_path = dir.join(ROOT_KEY);
    if !force {
        for path in [&cert_path, &key_path] {
            if path.exists() {
                return Err(CaError::Exists(path.clone()));
            }
        }
    }
    fs::create_dir_all(dir).map_err(|source| CaError::WriteFile { path: dir.to_owned(), source })?;
    let (_, cert_pem, key_pem) =
        SigningAuthority::self_signed(DEV_ROOT_ORG, KeyAlgorithm::EcdsaP256, ROOT_LIFETIME)
            .map_err(|e| CaError::InvalidRoot { path: cert_path.clone(), reason: e.to_string() })?;
    // Key first: a directory with a certificate but no key is useless, the reverse is harmless.
    write_file(&key_path, key_pem.as_bytes(), 0o600, force)?;
    write_file(&cert_path, cert_pem.as_bytes(), 0o644, force)?;
    Ok(())
}

fn write_file(path: &Path, contents: &[u8], mode: u32, force: bool) -> Result<(), CaError> {
    let err = |source| CaError::WriteFile { path: path.to_owned(), source };
    let mut options = fs::OpenOptions::new();
    options.write(true).mode(mode);
    if force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut file = options.open(path).map_err(err)?;
    // `mode` only applies to new files; an overwritten key must not stay world-readable.
    file.set_permissions(fs::Permissions::from_mode(mode)).map_err(err)?;
    file.write_all(contents).map_err(err)?;
    file.sync_all().map_err(err)
}

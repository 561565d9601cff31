//! The in-process CA (`FAKE_CA=true`) and the dev root it can share between processes.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use futures::future::BoxFuture;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PublicKeyData,
    SanType, SerialNumber,
};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{CaError, CertSigner};
use crate::cert::WorkloadCertificate;
use crate::{Identity, csr};

/// File name of the dev root certificate.
const ROOT_CERT: &str = "root-cert.pem";
/// File name of the dev root key.
const ROOT_KEY: &str = "root-key.pem";
/// Lifetime of a root made by [`dev_ca_init`] or [`FakeCa::generate`].
const ROOT_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// In-process CA (FAKE_CA=true) signing with a root from a directory or a fresh in-memory ECDSA root.
pub struct FakeCa {
    issuer: Issuer<'static, KeyPair>,
    root_pem: String,
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
        let invalid = |path: &Path, reason: String| CaError::InvalidRoot { path: path.to_owned(), reason };
        let key = KeyPair::from_pem(&key_pem)
            .map_err(|e| invalid(&key_path, format!("not a PEM RSA or ECDSA private key: {e}")))?;

        let cert_der = rustls_pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| invalid(&cert_path, format!("no PEM certificate: {e}")))?;
        let cert_der: rustls_pki_types::CertificateDer<'static> = cert_der;
        let (_, cert) = X509Certificate::from_der(&cert_der)
            .map_err(|e| invalid(&cert_path, format!("not an X.509 certificate: {e}")))?;
        if cert.tbs_certificate.subject_pki.raw != key.subject_public_key_info().as_slice() {
            return Err(invalid(
                &key_path,
                format!("the key does not belong to the certificate in {}", cert_path.display()),
            ));
        }
        if !cert.is_ca() {
            return Err(invalid(&cert_path, "not a CA certificate".to_owned()));
        }
        let issuer =
            Issuer::from_ca_cert_der(&cert_der, key).map_err(|e| invalid(&cert_path, e.to_string()))?;
        let mut root_pem = cert_pem;
        if !root_pem.ends_with('\n') {
            root_pem.push('\n');
        }
        Ok(FakeCa { issuer, root_pem })
    }

    /// Creates a CA with a fresh in-memory ECDSA P-256 root.
    pub fn generate() -> Self {
        // Generating a P-256 key and self-signing fixed, valid parameters cannot fail.
        let (key, params, cert) = new_root().expect("self-signed P-256 root");
        FakeCa { issuer: Issuer::new(params, key), root_pem: cert }
    }

    /// The root certificate (PEM) that certificates from this CA chain to.
    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// Signs a PEM CSR for `identity`, returning `[leaf, root]` as the Istio CA does.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        identity: &Identity,
        ttl: Duration,
    ) -> Result<Vec<String>, CaError> {
        let request = CertificateSigningRequestParams::from_pem(csr_pem).map_err(CaError::InvalidCsr)?;
        let now = OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        let uri = identity.to_string().try_into().map_err(CaError::Signing)?;
        params.subject_alt_names = vec![SanType::URI(uri)];
        params.not_before = now;
        params.not_after = time::Duration::try_from(ttl)
            .ok()
            .and_then(|ttl| now.checked_add(ttl))
            .ok_or(CaError::Ttl(ttl))?;
        params.serial_number = Some(random_serial());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let leaf = CertificateSigningRequestParams { params, public_key: request.public_key }
            .signed_by(&self.issuer)
            .map_err(CaError::Signing)?;
        Ok(vec![leaf.pem(), self.root_pem.clone()])
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
    let (key, _, cert_pem) = new_root().map_err(CaError::Signing)?;
    // Key first: a directory with a certificate but no key is useless, the reverse is harmless.
    write_file(&key_path, key.serialize_pem().as_bytes(), 0o600, force)?;
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

/// A self-signed ECDSA P-256 CA: key, parameters (for an [`Issuer`]) and PEM certificate.
fn new_root() -> Result<(KeyPair, CertificateParams, String), rcgen::Error> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Ambit");
    dn.push(DnType::CommonName, "Ambit dev root CA");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + ROOT_LIFETIME;
    params.serial_number = Some(random_serial());
    let cert = params.self_signed(&key)?;
    Ok((key, params, cert.pem()))
}

/// A positive 128-bit serial number.
fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

//! The TLS peer suite: tlsfuzzer's TLS 1.3 record-layer conversations (key updates, padding,
//! empty records, size limits, alerts, ChangeCipherSpec, content types) rewritten for an HBONE
//! server — mesh client certificate, HTTP/2 instead of HTTP/1 — by the probe scripts in
//! `tests/tls_peer/` (see its README), run with python3 against a real `ambit proxy`'s port
//! 15008 from another pod's network namespace, one test per probe script.
//!
//! A case fails unless the proxy does what the case expects (answers the PING sent after the
//! records under test, or refuses them with the alert RFC 8446 requires, or closes without
//! one where rustls 0.23 does too). Cases the proxy fails today are in [`KNOWN_DEFECTS`]: the
//! probes expect them to fail, and one that passes fails the test until it leaves the list.
//! [`rustls_reference_meets_the_probes`] runs the same probes against rustls (tokio-rustls and
//! h2, the stack Istio's HBONE peers build on): what the cases take as rustls's behaviour is
//! checked there, and where rustls itself misses RFC 8446 it is in [`RUSTLS_DEVIATIONS`].
//!
//! Needs python3 with tlslite-ng and ecdsa (`.ci/run` makes a venv and exports
//! `AMBIT_TLS_PEER_PYTHON`) and tlsfuzzer (`TLSFUZZER_DIR`, else `<repo>/../shared/tools/
//! tlsfuzzer`); the proxy tests need root. Under `CI=true` anything missing fails the test;
//! otherwise it is skipped with the reason.

mod common;
mod mesh;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ambit_identity::{FakeCa, Identity, WorkloadCertificate};
use common::*;
use mesh::*;

#[allow(dead_code)]
const MARKER: &[u8] = b"AMBIT-TLS-PEER-MARKER-5e21";

/// One probe run may take this long (its cases take well under a second each; each receive
/// is bounded to 5 s and each case to 60 s by the script itself).
const PROBE_BOUND: Duration = Duration::from_secs(300);

/// A case that is expected to fail: probe script, case name (fnmatch pattern), and why.
struct Known {
    probe: &'static str,
    case: &'static str,
    why: &'static str,
}

/// The proxy's defects the probes show, as (probe, case, why). None today: the suite's report
/// found D1 to D12 (issue 24, "A peer's test suite"), and the record layer's fixes closed them
/// all. A defect found later goes here until its fix makes the case pass: the test fails while a
/// listed case passes.
const KNOWN_DEFECTS: &[Known] = &[];

/// Where rustls 0.23 itself does not do what the case expects, so the reference run expects
/// these cases to fail.
const RUSTLS_DEVIATIONS: &[Known] = &[
    Known {
        probe: "record_layer_limits",
        case: "too big ciphertext with size 2**14 + 256 and fuzzed tag *",
        why: "rustls decrypts records up to 2^14 + 2047 bytes and sends bad_record_mac, not record_overflow",
    },
    Known {
        probe: "record_layer_limits",
        case: "too big ClientHello msg (a 2**14 + 1 byte record)",
        why: "rustls takes plaintext records up to 2^14 + 2047 bytes (msgs/message/outbound.rs MAX_PAYLOAD)",
    },
    Known {
        probe: "zero_length_data",
        case: "zero-length handshake record after the handshake*",
        why: "rustls takes an empty handshake record (RFC 8446 §5.1 forbids only sending one)",
    },
];

/// The probe scripts, in `tests/tls_peer/`.
const PROBES: [&str; 10] = [
    "keyupdate",
    "keyupdate_from_server",
    "record_padding",
    "zero_length_data",
    "record_layer_limits",
    "unencrypted_alert",
    "ccs",
    "multiple_ccs",
    "empty_alert",
    "zero_content_type",
];

#[test]
fn keyupdate() {
    against_the_proxy("keyupdate");
}

#[test]
fn keyupdate_from_server() {
    against_the_proxy("keyupdate_from_server");
}

#[test]
fn record_padding() {
    against_the_proxy("record_padding");
}

#[test]
fn zero_length_data() {
    against_the_proxy("zero_length_data");
}

#[test]
fn record_layer_limits() {
    against_the_proxy("record_layer_limits");
}

#[test]
fn unencrypted_alert() {
    against_the_proxy("unencrypted_alert");
}

#[test]
fn ccs() {
    against_the_proxy("ccs");
}

#[test]
fn multiple_ccs() {
    against_the_proxy("multiple_ccs");
}

#[test]
fn empty_alert() {
    against_the_proxy("empty_alert");
}

#[test]
fn zero_content_type() {
    against_the_proxy("zero_content_type");
}

/// Every probe against rustls: the cases' expectations are ones rustls meets, apart from the
/// listed deviations (no root needed: the reference listens on loopback in this process).
#[test]
fn rustls_reference_meets_the_probes() {
    let Some(tools) = Tools::require() else { return };
    let ca = FakeCa::generate();
    let server = ca.issue(&Identity::new("cluster.local", "default", "server"), Duration::from_secs(3600));
    let server = server.unwrap_or_else(|e| panic!("issue the reference server's certificate: {e}"));
    let files = ClientFiles::new(&ca);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"));
    let addr = rt.block_on(reference::serve(&server));
    let mut failures = Vec::new();
    for probe in PROBES {
        let cmd = tools.command(None, probe, addr, &files, RUSTLS_DEVIATIONS);
        if let Err(report) = run_probe(probe, cmd, RUSTLS_DEVIATIONS, || None) {
            failures.push(report);
        }
    }
    drop(rt);
    assert!(failures.is_empty(), "rustls (the reference) fails probes:\n{}", failures.join("\n\n"));
}

/// Runs one probe script against a dedicated proxy in its pod, from an outside pod.
fn against_the_proxy(probe: &str) {
    if !require_root() {
        return;
    }
    let Some(tools) = Tools::require() else { return };
    let mesh = Mesh::new();
    let server = mesh.pod("server", "server");
    let peer = mesh.outside_pod("peer");
    mesh.write_config(&[&server], &[], &[]);
    let mut proxy = mesh.start_proxy(&server);
    let ca = FakeCa::from_dir(&mesh.ca_dir()).unwrap_or_else(|e| panic!("the mesh's dev CA: {e}"));
    let files = ClientFiles::new(&ca);
    let hbone = server.pod.addr4(INBOUND_HBONE_PORT);
    let cmd = tools.command(Some(&peer), probe, hbone, &files, KNOWN_DEFECTS);
    // On a panic the proxy's guard prints its log.
    let result = run_probe(probe, cmd, KNOWN_DEFECTS, || {
        proxy.try_wait().map(|status| format!("the proxy exited ({status})"))
    });
    if let Err(report) = result {
        panic!("{report}");
    }
    if let Some(status) = proxy.try_wait() {
        panic!("the proxy exited ({status}) during probe {probe}");
    }
}

/// Runs a probe to its end (at most [`PROBE_BOUND`]); `Err` with a report naming every case
/// that failed or unexpectedly passed (with the `known` entry it passed despite), followed by
/// the script's whole output. `dead` reports the server's death, checked while the probe runs.
fn run_probe(
    probe: &str,
    cmd: Command,
    known: &[Known],
    mut dead: impl FnMut() -> Option<String>,
) -> Result<(), String> {
    let t0 = Instant::now();
    let mut child = ChildGuard::spawn(&format!("probe {probe}"), cmd);
    let mut status = None;
    let mut died = None;
    while t0.elapsed() < PROBE_BOUND {
        status = child.wait_timeout(Duration::from_millis(200));
        if status.is_some() {
            break;
        }
        if let Some(why) = dead() {
            died = Some(why);
            break;
        }
    }
    let Some(status) = status else {
        child.kill();
        let why = died.unwrap_or_else(|| format!("did not finish within {PROBE_BOUND:?}"));
        return Err(format!("probe {probe}: {why}; its output so far:\n{}", child.logs()));
    };
    let _ = child.stop(Duration::from_secs(1));
    let output = child.logs();
    if std::env::var_os("AMBIT_TLS_PEER_VERBOSE").is_some() {
        eprintln!("{output}");
    }
    let summary = output.lines().find(|l| l.starts_with("summary ")).map(str::to_owned);
    eprintln!("{} ({:.1} s)", summary.as_deref().unwrap_or("no summary"), t0.elapsed().as_secs_f64());
    let failed: Vec<String> = output
        .lines()
        .filter(|l| l.starts_with("FAIL: ") || l.starts_with("XPASS: "))
        .map(|l| {
            let case =
                l.strip_prefix("XPASS: ").and_then(|rest| rest.split_once(": passes now")).map(|(c, _)| c);
            match case.and_then(|c| known.iter().find(|k| k.probe == probe && glob(k.case, c))) {
                Some(k) => format!("{l} (listed as \"{}\")", k.why),
                None => l.to_owned(),
            }
        })
        .collect();
    if status.success() && failed.is_empty() && summary.is_some() {
        return Ok(());
    }
    let what = if failed.is_empty() {
        format!("probe {probe} did not run to its end (exit status {status})")
    } else {
        format!("probe {probe}: {} case(s) failed:\n  {}", failed.len(), failed.join("\n  "))
    };
    Err(format!("{what}\n--- output of probe {probe} ---\n{output}"))
}

/// fnmatch's `*` and `?` (what the probes' `-x` takes; case names hold no `[`).
fn glob(pattern: &str, name: &str) -> bool {
    fn matches(p: &[char], n: &[char]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some(('*', rest)) => (0..=n.len()).any(|i| matches(rest, &n[i..])),
            Some(('?', rest)) => !n.is_empty() && matches(rest, &n[1..]),
            Some((c, rest)) => n.first() == Some(c) && matches(rest, &n[1..]),
        }
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    matches(&p, &n)
}

/// python3 with tlslite-ng and ecdsa, and tlsfuzzer.
struct Tools {
    python: PathBuf,
    tlsfuzzer: PathBuf,
    scripts: PathBuf,
}

impl Tools {
    /// The tools, or `None` (skip) when they are missing outside CI; a panic in CI.
    fn require() -> Option<Tools> {
        match Tools::find() {
            Ok(tools) => Some(tools),
            Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("the TLS peer suite cannot run in CI: {why}")
            }
            Err(why) => {
                eprintln!("skipping: {why}");
                None
            }
        }
    }

    fn find() -> Result<Tools, String> {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls_peer");
        // TLSFUZZER_DIR, when set, is the only place looked at.
        let candidates: Vec<PathBuf> = match std::env::var_os("TLSFUZZER_DIR") {
            Some(dir) => vec![PathBuf::from(dir)],
            None => {
                vec![repo.join("../shared/tools/tlsfuzzer"), PathBuf::from("/work/shared/tools/tlsfuzzer")]
            }
        };
        let tlsfuzzer = candidates
            .iter()
            .find(|d| d.join("tlsfuzzer/runner.py").is_file())
            .cloned()
            .ok_or_else(|| {
                format!(
                    "tlsfuzzer not found (tried {candidates:?}); set TLSFUZZER_DIR to a tlsfuzzer checkout"
                )
            })?;
        let python = match std::env::var_os("AMBIT_TLS_PEER_PYTHON") {
            Some(p) => PathBuf::from(p),
            None if Path::new(DEFAULT_VENV_PYTHON).is_file() => PathBuf::from(DEFAULT_VENV_PYTHON),
            None => PathBuf::from("python3"),
        };
        let check = "import sys; sys.path.insert(0, sys.argv[1]); import ecdsa, tlslite, tlsfuzzer.runner; \
                     print(tlslite.__version__)";
        let out = Command::new(&python)
            .args(["-c", check])
            .arg(&tlsfuzzer)
            .output()
            .map_err(|e| format!("cannot run {} ({e}); set AMBIT_TLS_PEER_PYTHON", python.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} cannot import tlslite-ng, ecdsa and tlsfuzzer ({}); install them with \
                 `pip install --pre tlslite-ng==0.9.0b2 ecdsa` (.ci/run: {DEFAULT_VENV})",
                python.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tools { python, tlsfuzzer, scripts })
    }

    /// The command that runs `probe` (in `netns`'s network namespace, else in this one) against
    /// `addr`, expecting `known` cases to fail.
    fn command(
        &self,
        netns: Option<&Pod>,
        probe: &str,
        addr: SocketAddr,
        files: &ClientFiles,
        known: &[Known],
    ) -> Command {
        // `ip netns exec` keeps the environment set here.
        let mut cmd = match netns {
            Some(pod) => pod.exec(&self.python, &[]),
            None => Command::new(&self.python),
        };
        cmd.arg(self.scripts.join(format!("{probe}.py")))
            .args(["--host", &addr.ip().to_string(), "--port", &addr.port().to_string()])
            .arg("--cert")
            .arg(&files.cert)
            .arg("--key")
            .arg(&files.key)
            .env("TLSFUZZER_DIR", &self.tlsfuzzer)
            // No __pycache__ next to the scripts.
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONUNBUFFERED", "1");
        for k in known.iter().filter(|k| k.probe == probe) {
            cmd.args(["-x", k.case]);
        }
        cmd
    }
}

/// The venv `.ci/run` makes when `AMBIT_TLS_PEER_PYTHON` is not set.
const DEFAULT_VENV: &str = "/opt/ambit-tlsfuzzer";
const DEFAULT_VENV_PYTHON: &str = "/opt/ambit-tlsfuzzer/bin/python3";

/// The probes' client identity, default/probe, from the CA the server trusts: its leaf and
/// key as PEM files.
struct ClientFiles {
    _dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
}

impl ClientFiles {
    fn new(ca: &FakeCa) -> ClientFiles {
        let identity = Identity::new("cluster.local", "default", "probe");
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .unwrap_or_else(|e| panic!("client key: {e}"));
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        let uri = identity.to_string().try_into().unwrap_or_else(|e| panic!("SAN URI: {e}"));
        params.subject_alt_names = vec![rcgen::SanType::URI(uri)];
        let csr = params
            .serialize_request(&key)
            .and_then(|csr| csr.pem())
            .unwrap_or_else(|e| panic!("client CSR: {e}"));
        let chain =
            ca.sign_csr(&csr, &identity, Duration::from_secs(3600)).unwrap_or_else(|e| panic!("sign: {e}"));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (cert, key_path) = (dir.path().join("client-cert.pem"), dir.path().join("client-key.pem"));
        // The leaf only: the server holds the root.
        std::fs::write(&cert, &chain[0]).unwrap_or_else(|e| panic!("write {}: {e}", cert.display()));
        std::fs::write(&key_path, key.serialize_pem()).unwrap_or_else(|e| panic!("write key: {e}"));
        ClientFiles { _dir: dir, cert, key: key_path }
    }
}

/// The reference server: rustls through tokio-rustls with the proxy's server config, h2 on
/// top, answering PINGs (h2 does) and any request with 200.
mod reference {
    use super::*;

    /// Listens on an ephemeral loopback port; serves until the runtime is dropped.
    pub async fn serve(cert: &WorkloadCertificate) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("reference listener: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("reference address: {e}"));
        let acceptor = tokio_rustls::TlsAcceptor::from(cert.server_config());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(connection(tcp, acceptor.clone()));
            }
        });
        addr
    }

    async fn connection(tcp: tokio::net::TcpStream, acceptor: tokio_rustls::TlsAcceptor) {
        let _ = tcp.set_nodelay(true);
        let Ok(tls) = acceptor.accept(tcp).await else { return };
        let Ok(mut h2) = h2::server::handshake(tls).await else { return };
        while let Some(Ok((_, mut respond))) = h2.accept().await {
            let _ = respond.send_response(http::Response::new(()), true);
        }
    }
}

"""The HBONE peer: shared machinery of the TLS peer probes.

Each probe script (keyupdate.py, record_padding.py, ...) is the HBONE equivalent of one of
tlsfuzzer's TLS 1.3 scripts. tlsfuzzer's scripts talk to a server that asks for no client
certificate and speaks HTTP/1; an HBONE server (port 15008) requires a mesh client certificate
and speaks HTTP/2. So every conversation built here answers the server's CertificateRequest
with the mesh certificate (Certificate + CertificateVerify), and the HTTP/1 request is replaced
by an HTTP/2 exchange: the client preface, an empty SETTINGS and a PING with a payload unique
to the conversation, answered by the server's SETTINGS, its SETTINGS ACK and the PING ACK with
that payload (decrypted, so the server's keys are checked too).

tlsfuzzer and tlslite-ng are used as libraries (the conversation tree, the runner, the message
generators and expectations); nothing of them is copied here. The directory of tlsfuzzer comes
from TLSFUZZER_DIR, else the usual places next to this repository.

Outcomes a case can expect:
- the server keeps working: the PING sent after the records under test is answered;
- the server refuses: the fatal alert RFC 8446 requires, then the close. A close without any
  alert passes only in a case that says why it is right (rustls 0.23, the bar for the proxy's
  record layer, does the same; or the RFC asks for no alert there), and the case's result line
  repeats that reason. A PING ACK for the PING sent after the records under test means the
  server accepted them: that fails the case at once.

Output, one line per case: "ok: NAME", "FAIL: NAME: why" (then the details, indented),
"xfail: NAME: why" (a known defect, passed with -x), "XPASS: NAME" (a known defect that no
longer shows: the list naming it must be updated). Exit status 0 when nothing failed and nothing
passed unexpectedly, 1 otherwise, 2 for a usage or setup error.
"""

import argparse
import contextlib
import fnmatch
import io
import os
import signal
import sys
import time
import traceback


def _tlsfuzzer_dir():
    """TLSFUZZER_DIR when set (and then only it), else <repo>/../shared/tools/tlsfuzzer, else
    /work/shared/tools/tlsfuzzer."""
    if os.environ.get("TLSFUZZER_DIR"):
        candidates = [os.environ["TLSFUZZER_DIR"]]
    else:
        here = os.path.dirname(os.path.abspath(__file__))
        # <repo>/crates/ambit/tests/tls_peer -> <repo>/../shared/tools/tlsfuzzer
        repo = os.path.normpath(os.path.join(here, "..", "..", "..", ".."))
        candidates = [os.path.join(os.path.dirname(repo), "shared", "tools", "tlsfuzzer"),
                      "/work/shared/tools/tlsfuzzer"]
    for c in candidates:
        if os.path.isfile(os.path.join(c, "tlsfuzzer", "runner.py")):
            return c
    sys.stderr.write(
        "error: tlsfuzzer not found (tried {0}); set TLSFUZZER_DIR to a checkout of "
        "https://github.com/tlsfuzzer/tlsfuzzer\n".format(", ".join(candidates)))
    sys.exit(2)


sys.path.insert(0, _tlsfuzzer_dir())

try:
    from tlsfuzzer.runner import Runner
    from tlsfuzzer.messages import Command, Connect, ClientHelloGenerator, \
        CertificateGenerator, CertificateVerifyGenerator, FinishedGenerator, \
        ApplicationDataGenerator, AlertGenerator
    from tlsfuzzer.expect import Expect, ExpectServerHello, ExpectChangeCipherSpec, \
        ExpectEncryptedExtensions, ExpectCertificateRequest, ExpectCertificate, \
        ExpectCertificateVerify, ExpectFinished, ExpectNewSessionTicket, ExpectAlert, \
        ExpectClose, ExpectKeyUpdate
    from tlsfuzzer.helpers import key_share_gen, SIG_ALL
    from tlslite.constants import CipherSuite, ContentType, AlertLevel, AlertDescription, \
        ExtensionType, GroupName, SignatureScheme, KeyUpdateMessageType
    from tlslite.extensions import ClientKeyShareExtension, SupportedVersionsExtension, \
        SupportedGroupsExtension, SignatureAlgorithmsExtension, \
        SignatureAlgorithmsCertExtension, ALPNExtension
    from tlslite.utils.keyfactory import parsePEMKey
    from tlslite.x509 import X509
    from tlslite.x509certchain import X509CertChain
except ImportError as exc:
    sys.stderr.write(
        "error: cannot import tlsfuzzer/tlslite-ng ({0}); install them with "
        "`pip install --pre tlslite-ng==0.9.0b2 ecdsa` (.ci/run does, into "
        "/opt/ambit-tlsfuzzer)\n".format(exc))
    sys.exit(2)

AES_128 = CipherSuite.TLS_AES_128_GCM_SHA256
AES_256 = CipherSuite.TLS_AES_256_GCM_SHA384

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_DATA, FRAME_HEADERS, FRAME_RST_STREAM, FRAME_SETTINGS, FRAME_PING, FRAME_GOAWAY, \
    FRAME_WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
FLAG_ACK = 1

# How long one receive may wait (tlsfuzzer's Connect timeout) and one case may take.
RECV_TIMEOUT = 5
CASE_TIMEOUT = 60


def frame(typ, flags, stream, payload=b""):
    """An HTTP/2 frame (RFC 9113 §4.1)."""
    return len(payload).to_bytes(3, "big") + bytes([typ, flags]) + \
        stream.to_bytes(4, "big") + payload


def settings(ack=False):
    """An empty SETTINGS frame (or its ACK)."""
    return frame(FRAME_SETTINGS, FLAG_ACK if ack else 0, 0)


def ping(payload):
    """A PING frame with an 8-byte payload."""
    assert len(payload) == 8
    return frame(FRAME_PING, 0, 0, payload)


def opening(ping_payload):
    """The client's HTTP/2 start: preface, empty SETTINGS, a PING."""
    return PREFACE + settings() + ping(ping_payload)


class H2(object):
    """What the server sent over HTTP/2, parsed from the decrypted application data."""

    def __init__(self):
        self.buf = bytearray()
        self.frames = 0
        self.server_settings = False
        self.settings_acks = 0
        self.ping_acks = []
        self.key_updates = 0
        self.outcome = None
        self.expected_alert = None
        # PING payloads whose ACK proves the server took what was sent before them.
        self.forbidden_acks = set()

    def feed(self, data):
        self.buf += data
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[0:3], "big")
            if len(self.buf) < 9 + length:
                break
            typ, flags = self.buf[3], self.buf[4]
            stream = int.from_bytes(self.buf[5:9], "big") & 0x7fffffff
            payload = bytes(self.buf[9:9 + length])
            del self.buf[:9 + length]
            self._frame(typ, flags, stream, payload)

    def _frame(self, typ, flags, stream, payload):
        if self.frames == 0 and (typ != FRAME_SETTINGS or flags & FLAG_ACK):
            raise AssertionError(
                "the server's HTTP/2 preface must start with SETTINGS (RFC 9113 §3.4); first "
                "frame had type {0} flags {1}".format(typ, flags))
        self.frames += 1
        if typ == FRAME_SETTINGS:
            if flags & FLAG_ACK:
                self.settings_acks += 1
            else:
                if len(payload) % 6:
                    raise AssertionError("SETTINGS of {0} bytes".format(len(payload)))
                self.server_settings = True
        elif typ == FRAME_PING:
            if not flags & FLAG_ACK:
                return
            if payload in self.forbidden_acks:
                raise AssertionError(
                    "the server answered PING {0!r}, sent after the records under test: it "
                    "accepted what it should have refused".format(payload))
            self.ping_acks.append(payload)
        elif typ == FRAME_GOAWAY:
            code = int.from_bytes(payload[4:8], "big") if len(payload) >= 8 else None
            raise AssertionError("the server sent GOAWAY (error code {0}, debug {1!r})".format(
                code, payload[8:]))
        elif typ not in (FRAME_WINDOW_UPDATE,):
            raise AssertionError("unexpected HTTP/2 frame type {0} on stream {1}".format(
                typ, stream))


def h2(state):
    """The HTTP/2 view of a conversation, kept on tlsfuzzer's connection state."""
    if not hasattr(state, "hbone_h2"):
        state.hbone_h2 = H2()
    return state.hbone_h2


class ExpectH2(Expect):
    """One application data record from the server, fed to the HTTP/2 view."""

    def __init__(self):
        super(ExpectH2, self).__init__(ContentType.application_data)

    def process(self, state, msg):
        h2(state).feed(msg.write())

    def __repr__(self):
        return "ExpectH2()"


class CountedKeyUpdate(ExpectKeyUpdate):
    """A KeyUpdate from the server (update_not_requested): new server keys from here on."""

    def __init__(self):
        super(CountedKeyUpdate, self).__init__(KeyUpdateMessageType.update_not_requested)

    def process(self, state, msg):
        super(CountedKeyUpdate, self).process(state, msg)
        h2(state).key_updates += 1


class Gate(Command):
    """Continues with its child once `goal(h2)` holds; until then it receives (HTTP/2 records,
    server KeyUpdates, session tickets) and checks again. Anything else from the server, or a
    close, fails the conversation with tlsfuzzer's message plus what was awaited."""

    def __init__(self, goal, what):
        self._next = None
        super(Gate, self).__init__()
        self.goal = goal
        self.what = what
        self.done = False
        self.wait = ExpectH2()
        ku = CountedKeyUpdate()
        nst = ExpectNewSessionTicket()
        self.wait.next_sibling = ku
        ku.next_sibling = nst
        for n in (self.wait, ku, nst):
            n.add_child(self)

    @property
    def child(self):
        return self._next if self.done else self.wait

    @child.setter
    def child(self, node):
        self._next = node

    def add_child(self, child):
        self._next = child
        return child

    def process(self, state):
        self.done = bool(self.goal(h2(state)))
        state.hbone_waiting_for = None if self.done else self.what

    def __repr__(self):
        return "Gate({0})".format(self.what)


class Check(Command):
    """Fails the conversation unless `pred(h2)` holds."""

    def __init__(self, pred, what):
        super(Check, self).__init__()
        self.pred = pred
        self.what = what

    def process(self, state):
        if not self.pred(h2(state)):
            raise AssertionError(self.what(h2(state)) if callable(self.what) else self.what)


class Buffer(Command):
    """Starts collecting what is sent into one TCP write (see Flush)."""

    def process(self, state):
        state.msg_sock.sock.buffer_writes = True


class Flush(Command):
    """Sends what Buffer collected in one write. The server may close while it arrives (it
    refused the start of it): that is no failure here, the expectations that follow judge what
    the server sent back."""

    def process(self, state):
        sock = state.msg_sock.sock
        sock.buffer_writes = False
        try:
            sock.flush()
        except (BrokenPipeError, ConnectionResetError):
            h2(state).outcome = "the server closed while the records were being sent"


class Forbid(Command):
    """Marks a PING payload whose ACK would prove the records before it were accepted."""

    def __init__(self, payload):
        super(Forbid, self).__init__()
        self.payload = payload

    def process(self, state):
        h2(state).forbidden_acks.add(self.payload)


class Alerted(ExpectAlert):
    """The server's alert; remembered for the case's report."""

    def process(self, state, msg):
        data = msg.write()
        super(Alerted, self).process(state, msg)
        h2(state).outcome = "alert {0}".format(
            AlertDescription.toStr(data[1]) if len(data) > 1 else "?")


SILENT = "closed without an alert"


class Closed(ExpectClose):
    """The server's close (EOF or reset). `refusal`: the close ends a refusal, so a close with
    no alert before it is remembered as such (see Case.silent)."""

    def __init__(self, refusal):
        super(Closed, self).__init__()
        self.refusal = refusal

    def process(self, state, msg):
        super(Closed, self).process(state, msg)
        s = h2(state)
        if self.refusal and (s.outcome is None or s.outcome.startswith("the server closed")):
            s.outcome = SILENT
        elif s.outcome is None:
            s.outcome = "closed"


class Expecting(Command):
    """Records the alert a refusal is expected to bring (for the failure message)."""

    def __init__(self, alert):
        super(Expecting, self).__init__()
        self.alert = alert

    def process(self, state):
        h2(state).expected_alert = self.alert


class Peer(object):
    """How to reach the server and who we are."""

    def __init__(self, host, port, cert_path, key_path):
        self.host = host
        self.port = port
        with open(key_path) as f:
            self.key = parsePEMKey(f.read(), private=True)
        chain = []
        with open(cert_path) as f:
            text = f.read()
        marker = "-----END CERTIFICATE-----"
        for block in text.split(marker)[:-1]:
            cert = X509()
            cert.parse(block + marker)
            chain.append(cert)
        if not chain:
            raise ValueError("no certificate in {0}".format(cert_path))
        self.chain = X509CertChain(chain)

    def hello_extensions(self, groups=None):
        groups = groups or [GroupName.secp256r1]
        ext = {}
        ext[ExtensionType.key_share] = ClientKeyShareExtension().create(
            [key_share_gen(g) for g in groups])
        ext[ExtensionType.supported_versions] = SupportedVersionsExtension().create([(3, 4)])
        ext[ExtensionType.supported_groups] = SupportedGroupsExtension().create(groups)
        ext[ExtensionType.signature_algorithms] = SignatureAlgorithmsExtension().create(
            [SignatureScheme.ecdsa_secp256r1_sha256, SignatureScheme.ecdsa_secp384r1_sha384,
             SignatureScheme.rsa_pss_rsae_sha256])
        ext[ExtensionType.signature_algorithms_cert] = \
            SignatureAlgorithmsCertExtension().create(SIG_ALL)
        ext[ExtensionType.alpn] = ALPNExtension().create([bytearray(b"h2")])
        return ext

    def hello(self, node, cipher=AES_128, ext=None):
        """The ClientHello (as a generator the caller may wrap)."""
        return node.add_child(ClientHelloGenerator(
            [cipher], extensions=ext if ext is not None else self.hello_extensions()))

    def server_flight(self, node, may_close=False):
        """The server's flight: ServerHello up to its Finished, a client certificate requested.
        With `may_close`, the server may instead close at any point of it without an alert (it
        refused what came with the ClientHello before sending it all)."""
        for expect in (ExpectServerHello(), ExpectChangeCipherSpec(),
                       ExpectEncryptedExtensions(), ExpectCertificateRequest(),
                       ExpectCertificate(), ExpectCertificateVerify(), ExpectFinished()):
            if may_close:
                expect.next_sibling = Closed(refusal=True)
            node = node.add_child(expect)
        return node

    def start(self, cipher=AES_128, before_hello=()):
        """Connect, ClientHello, the server's flight: (conversation, node after its Finished)."""
        conversation = Connect(self.host, self.port, timeout=RECV_TIMEOUT)
        node = conversation
        for n in before_hello:
            node = node.add_child(n)
        node = self.hello(node, cipher)
        return conversation, self.server_flight(node)

    def authenticate(self, node):
        """The client's Certificate and CertificateVerify (the mesh identity)."""
        node = node.add_child(CertificateGenerator(self.chain))
        return node.add_child(CertificateVerifyGenerator(self.key))

    def established(self, cipher=AES_128):
        """A finished handshake with client authentication: (conversation, node)."""
        conversation, node = self.start(cipher)
        node = self.authenticate(node)
        return conversation, node.add_child(FinishedGenerator())


def send(node, *generators):
    """Chains generators (and commands) after `node`."""
    for g in generators:
        node = node.add_child(g)
    return node


def data(payload):
    return ApplicationDataGenerator(bytearray(payload))


def answered(node, payload, key_updates=(0, 0)):
    """Waits for the PING ACK with `payload` (after the server's SETTINGS and its ACK of ours),
    then checks how many KeyUpdates the server sent on the way (inclusive range)."""
    lo, hi = key_updates

    def goal(s):
        return payload in s.ping_acks

    node = node.add_child(Gate(goal, "the PING ACK with payload {0!r}".format(payload)))
    return node.add_child(Check(
        lambda s: s.server_settings and s.settings_acks >= 1 and lo <= s.key_updates <= hi,
        lambda s: "before the PING ACK the server sent SETTINGS: {0}, SETTINGS ACKs: {1}, "
                  "KeyUpdates: {2} (expected {3}..{4})".format(
                      s.server_settings, s.settings_acks, s.key_updates, lo, hi)))


def close(node):
    """close_notify from us; the server answers with close_notify, or just closes."""
    node = node.add_child(AlertGenerator(AlertLevel.warning, AlertDescription.close_notify))
    absorb = ExpectH2()
    absorb.add_child(absorb)
    alert = Alerted(description=AlertDescription.close_notify)
    alert.add_child(Closed(refusal=False))
    absorb.next_sibling = alert
    alert.next_sibling = Closed(refusal=False)
    return node.add_child(absorb)


def rejected(node, alert):
    """The server refuses: the fatal `alert` (None: any fatal alert), then the close; or a close
    without any alert, which passes only for a case whose `silent` says rustls 0.23 does the
    same (see main). HTTP/2 records, KeyUpdates and tickets sent before the refusal are taken
    in; a PING ACK for a payload marked with Forbid fails the case."""
    node = node.add_child(Expecting(alert))
    absorb = ExpectH2()
    absorb.add_child(absorb)
    ku = CountedKeyUpdate()
    ku.add_child(absorb)
    nst = ExpectNewSessionTicket()
    nst.add_child(absorb)
    expect_alert = Alerted(AlertLevel.fatal, alert)
    expect_alert.add_child(Closed(refusal=False))
    absorb.next_sibling = ku
    ku.next_sibling = nst
    nst.next_sibling = expect_alert
    expect_alert.next_sibling = Closed(refusal=True)
    return node.add_child(absorb)


def ended(node):
    """The server stops: a fatal alert (any) then the close, or a close without an alert (for a
    case whose `silent` explains why that is right); no PING marked with Forbid answered."""
    return rejected(node, None)


def settled(node):
    """Waits for the server's SETTINGS: it sends them once its handshake is done and its own
    record layer has taken over, so what is sent next is handled by that record layer (not by
    rustls, which would also see records that arrive together with the client's Finished)."""
    return node.add_child(Gate(lambda s: s.server_settings,
                               "the server's SETTINGS (sent once its handshake is done)"))


def probe_ping(payload, first=True):
    """The PING (after the preface and SETTINGS when `first`) whose ACK proves the server took
    everything sent before it; marked so that a refusal case fails on its ACK."""
    return [Forbid(payload), data(opening(payload) if first else ping(payload))]


def refusal(node, records, payload, alert, first=True):
    """The usual refusal case once the handshake is done: the records under test and then the
    probe PING, in one TCP write; then the refusal (see `rejected`)."""
    node = send(node, Buffer(), *records)
    node = send(node, *probe_ping(payload, first))
    node = send(node, Flush())
    return rejected(node, alert)


def sanity(peer):
    """The conversation every probe starts and ends with: handshake with the mesh
    certificate, HTTP/2 start, PING answered, close_notify."""
    def build():
        conversation, node = peer.established()
        node = send(node, data(opening(b"sanity-1")))
        node = answered(node, b"sanity-1")
        close(node)
        return conversation
    return Case("sanity", build, origin="sanity")


def alert_name(desc):
    """An alert description, or a choice of them, by name."""
    if isinstance(desc, (tuple, list)):
        return " or ".join(AlertDescription.toStr(d) for d in desc)
    return AlertDescription.toStr(desc)


class Case(object):
    """One conversation.

    name: unique; build: returns the conversation; origin: the tlsfuzzer case this is the
    equivalent of (None: added here); silent: for a refusal case where a close without any
    alert is right, why (None: an alert is required)."""

    def __init__(self, name, build, origin=None, silent=None):
        self.name = name
        self.build = build
        self.origin = origin
        self.silent = silent


class _CaseTimeout(Exception):
    pass


def _on_alarm(signum, frame_):
    raise _CaseTimeout("case took longer than {0} s".format(CASE_TIMEOUT))


def run_case(case):
    """Runs one case: (passed, why it failed, what the server did, the runner's output)."""
    conversation = case.build()
    runner = Runner(conversation)
    out = io.StringIO()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(CASE_TIMEOUT)
    try:
        with contextlib.redirect_stdout(out):
            runner.run()
        ok, why = True, None
    except Exception as exc:  # any failure of the conversation is the case's result
        waiting = getattr(runner.state, "hbone_waiting_for", None)
        why = "{0}: {1}".format(type(exc).__name__, exc)
        if waiting:
            why += " (while waiting for {0})".format(waiting)
        out.write(traceback.format_exc())
        ok = False
    finally:
        signal.alarm(0)
        sock = getattr(runner.state.msg_sock, "sock", None) if runner.state.msg_sock else None
        if sock is not None:
            with contextlib.suppress(Exception):
                sock.socket.close()
    s = h2(runner.state)
    if ok and s.outcome == SILENT and case.silent is None:
        # A refusal without an alert passes only where the case says rustls does the same.
        ok = False
        why = "the server closed the connection without an alert; RFC 8446 requires {0}".format(
            "a fatal alert" if s.expected_alert is None
            else "a fatal {0} alert".format(alert_name(s.expected_alert)))
    return ok, why, s.outcome, out.getvalue()


def main(probe, original, build_cases, not_applicable):
    """Command line of a probe script.

    probe: this script's name; original: the tlsfuzzer script it is the equivalent of;
    build_cases(peer) -> [Case]; not_applicable: {original case: reason} for the original's
    cases that have no equivalent (also listed in TESTING.md)."""
    parser = argparse.ArgumentParser(
        description="HBONE equivalent of tlsfuzzer's {0}".format(original))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=15008)
    parser.add_argument("--cert", help="client certificate chain (PEM), leaf first")
    parser.add_argument("--key", help="client private key (PEM, PKCS#8)")
    parser.add_argument("-x", "--known-defect", action="append", default=[], metavar="PATTERN",
                        help="a case (fnmatch pattern) that is expected to fail: a known defect")
    parser.add_argument("--only", action="append", default=[], metavar="PATTERN",
                        help="run only the cases matching (sanity still runs first and last)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args()

    if args.list:
        peer = None
    else:
        if not args.cert or not args.key:
            parser.error("--cert and --key are required")
        peer = Peer(args.host, args.port, args.cert, args.key)
    cases = build_cases(peer if peer else _ListingPeer())
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        sys.stderr.write("error: duplicate case names in {0}\n".format(probe))
        return 2
    for pattern in args.known_defect + args.only:
        if not fnmatch.filter(names, pattern):
            sys.stderr.write("error: {0}: no case matches {1!r}\n".format(probe, pattern))
            return 2
    if args.list:
        for c in cases:
            print("{0}\t{1}".format(c.name, c.origin or "(added)"))
        for name, reason in not_applicable.items():
            print("n/a\t{0}\t{1}".format(name, reason))
        return 0

    sanity = [c for c in cases if c.name == "sanity"]
    rest = [c for c in cases if c.name != "sanity"]
    if args.only:
        rest = [c for c in rest if any(fnmatch.fnmatch(c.name, p) for p in args.only)]
    order = sanity + rest + sanity
    print("probe {0}: HBONE equivalent of tlsfuzzer {1}; {2} cases against {3}:{4}".format(
        probe, original, len(cases), args.host, args.port))
    counts = {"ok": 0, "xfail": 0, "FAIL": 0, "XPASS": 0}
    started = time.monotonic()
    for case in order:
        known = any(fnmatch.fnmatch(case.name, p) for p in args.known_defect)
        t0 = time.monotonic()
        passed, why, outcome, details = run_case(case)
        took = time.monotonic() - t0
        note = ""
        if passed and outcome == SILENT:
            note = " [closed without an alert: {0}]".format(case.silent)
        elif outcome and passed:
            note = " [{0}]".format(outcome)
        if passed and not known:
            verdict, line = "ok", "ok: {0}{1} ({2:.2f} s)".format(case.name, note, took)
        elif passed and known:
            verdict, line = "XPASS", "XPASS: {0}: passes now; remove it from the known " \
                "defects{1}".format(case.name, note)
        elif known:
            verdict, line = "xfail", "xfail: {0}: {1}".format(case.name, why)
        else:
            verdict, line = "FAIL", "FAIL: {0}: {1}".format(case.name, why)
        counts[verdict] += 1
        print(line)
        if verdict == "FAIL":
            for detail in details.rstrip().splitlines():
                print("    " + detail)
        sys.stdout.flush()
    for name, reason in not_applicable.items():
        print("n/a: {0}: {1}".format(name, reason))
    print("summary {0}: {1} runs, ok {2}, xfail {3}, FAIL {4}, XPASS {5}, not applicable {6} "
          "({7:.1f} s)".format(
              probe, len(order), counts["ok"], counts["xfail"], counts["FAIL"], counts["XPASS"],
              len(not_applicable), time.monotonic() - started))
    return 1 if counts["FAIL"] or counts["XPASS"] else 0


class _ListingPeer(Peer):
    """Builds cases for --list without certificates (the conversations are never run)."""

    def __init__(self):
        self.host, self.port, self.key, self.chain = "127.0.0.1", 0, None, None

"""Alerts the client sends in plaintext or encrypted (RFC 8446 §5, §6): HBONE equivalent of
tlsfuzzer's test-tls13-unencrypted-alert.py. The original's cases end the handshake at the
client's second flight (before its Certificate here); the added cases send the same alerts
once the handshake is done, to the server's own record layer."""

import sys

import hbone_peer as hp
from hbone_peer import Case, send, data, settled, ended, Buffer, Flush, probe_ping
from tlsfuzzer.messages import PlaintextMessageGenerator, AlertGenerator
from tlslite.constants import AlertDescription, AlertLevel, ContentType

NOT_APPLICABLE = {}

FATAL_UNKNOWN_CA = bytearray([AlertLevel.fatal, AlertDescription.unknown_ca])
# The client's fatal alert ends the connection: the server owes no alert in reply.
NO_REPLY = "the client's fatal alert ended the connection; RFC 8446 §6.2 asks for no reply"


def cases(peer):
    out = [hp.sanity(peer)]

    def quietly(node):
        """The server closes without sending anything (the original's expectation)."""
        return node.add_child(hp.Closed(refusal=False))

    def unencrypted():
        conversation, node = peer.start()
        node = send(node, PlaintextMessageGenerator(ContentType.alert, FATAL_UNKNOWN_CA))
        quietly(node)
        return conversation
    out.append(Case("unencrypted Alert", unencrypted, "unencrypted Alert"))

    def encrypted():
        conversation, node = peer.start()
        node = send(node, AlertGenerator(AlertLevel.fatal, AlertDescription.unknown_ca))
        quietly(node)
        return conversation
    out.append(Case("encrypted Alert", encrypted, "encrypted Alert"))

    def after(generator):
        def build():
            conversation, node = peer.established()
            node = settled(node)
            node = send(node, Buffer(), generator(), *probe_ping(b"alert-01"))
            ended(send(node, Flush()))
            return conversation
        return build
    out.append(Case("unencrypted Alert after the handshake", after(
        lambda: PlaintextMessageGenerator(ContentType.alert, FATAL_UNKNOWN_CA)), silent=NO_REPLY))
    out.append(Case("encrypted Alert after the handshake", after(
        lambda: AlertGenerator(AlertLevel.fatal, AlertDescription.unknown_ca)), silent=NO_REPLY))

    # Added: RFC 8446 §6.1, "Each party MUST send a close_notify alert before closing its
    # write side of the connection, unless it has already sent some error alert" (rustls with
    # h2 does). HTTP/2 first, so the server has an open connection to close.
    def answered_close():
        conversation, node = peer.established()
        node = send(node, data(hp.opening(b"close-01")))
        node = hp.answered(node, b"close-01")
        node = send(node, AlertGenerator(AlertLevel.warning, AlertDescription.close_notify))
        absorb = hp.ExpectH2()
        absorb.add_child(absorb)
        notify = hp.Alerted(None, AlertDescription.close_notify)
        notify.add_child(hp.Closed(refusal=False))
        absorb.next_sibling = notify
        node.add_child(absorb)
        return conversation
    out.append(Case("close_notify answered with close_notify", answered_close))
    return out


if __name__ == "__main__":
    sys.exit(hp.main("unencrypted_alert", "test-tls13-unencrypted-alert.py", cases,
                     NOT_APPLICABLE))

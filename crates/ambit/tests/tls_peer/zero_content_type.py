"""Records whose TLSInnerPlaintext has no content type (RFC 8446 §5.4: "If a receiving
implementation does not find a non-zero octet in the cleartext, it MUST terminate the
connection with an unexpected_message alert"): HBONE equivalent of tlsfuzzer's
test-tls13-zero-content-type.py. rustls 0.23 ends such a connection with no alert
(PeerMisbehaved::IllegalTlsInnerPlaintext, which conn.rs handle_deframe_error does not map to
an alert): a close without an alert is taken, as the bar for our record layer is rustls."""

import sys

import hbone_peer as hp
from hbone_peer import Case, send, data, settled, rejected, refusal, PREFACE
from tlsfuzzer.messages import RawMessageGenerator
from tlslite.constants import AlertDescription

NOT_APPLICABLE = {}

SILENT = ("rustls 0.23 ends the connection with no alert "
          "(PeerMisbehaved::IllegalTlsInnerPlaintext)")


def zero(padding):
    return RawMessageGenerator(content_type=0, data=bytearray(padding))


def cases(peer):
    out = [hp.sanity(peer)]
    for padding, label in ((0, ""), (42, " with padding")):
        def after(padding=padding):
            conversation, node = peer.established()
            node = settled(node)
            refusal(node, [zero(padding)], b"zero-ct1", AlertDescription.unexpected_message)
            return conversation
        name = "zero content type{0} after handshake".format(label)
        out.append(Case(name, after, name, SILENT))

        def during(padding=padding):
            conversation, node = peer.start()
            node = send(node, zero(padding))
            rejected(node, AlertDescription.unexpected_message)
            return conversation
        name = "zero content type{0} during handshake".format(label)
        out.append(Case(name, during, name, SILENT))

        def in_data(padding=padding):
            conversation, node = peer.established()
            node = settled(node)
            # Part of the HTTP/2 preface, then the record without a type.
            refusal(node, [data(PREFACE[:5]), zero(padding)], b"zero-ct2",
                    AlertDescription.unexpected_message)
            return conversation
        name = "zero content type{0} during application data".format(
            " and padding" if padding else "")
        out.append(Case(name, in_data, name, SILENT))
    return out


if __name__ == "__main__":
    sys.exit(hp.main("zero_content_type", "test-tls13-zero-content-type.py", cases,
                     NOT_APPLICABLE))

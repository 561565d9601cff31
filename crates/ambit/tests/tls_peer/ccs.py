"""ChangeCipherSpec in TLS 1.3 (RFC 8446 §5, Appendix D.4): HBONE equivalent of tlsfuzzer's
test-tls13-ccs.py. A CCS of the single byte 1 between the ClientHello and the client's Finished
is dropped; one after the Finished, or of another value, is an unexpected_message. The CCS
after the Finished is sent twice: once the server's SETTINGS arrived (the server's own record
layer) and in the TCP write of the Finished (rustls, finishing the handshake)."""

import sys

import hbone_peer as hp
from hbone_peer import Case, send, data, opening, answered, settled, rejected, refusal, close, \
    Buffer, Flush, probe_ping
from tlsfuzzer.messages import ChangeCipherSpecGenerator, FinishedGenerator, RawMessageGenerator
from tlslite.constants import AlertDescription, ContentType

NOT_APPLICABLE = {}


def cases(peer):
    out = [hp.sanity(peer)]

    def both():
        conversation, node = peer.start()
        node = send(node, ChangeCipherSpecGenerator())
        node = peer.authenticate(node)
        node = send(node, FinishedGenerator(), data(opening(b"ccs-both")))
        node = answered(node, b"ccs-both")
        close(node)
        return conversation
    out.append(Case("both client and server send CCS", both, "both client and server send CCS"))

    def after_finished():
        conversation, node = peer.established()
        node = settled(node)
        refusal(node, [ChangeCipherSpecGenerator()], b"ccs-aftr",
                AlertDescription.unexpected_message)
        return conversation
    out.append(Case("CCS message after Finished message", after_finished,
                    "CCS message after Finished message"))

    def with_finished():
        conversation, node = peer.start()
        node = peer.authenticate(node)
        node = send(node, Buffer(), FinishedGenerator(), ChangeCipherSpecGenerator(),
                    *probe_ping(b"ccs-with"))
        rejected(send(node, Flush()), AlertDescription.unexpected_message)
        return conversation
    out.append(Case("CCS message in the TCP write of the client Finished", with_finished))

    def two_bytes():
        conversation, node = peer.start()
        node = send(node, RawMessageGenerator(ContentType.change_cipher_spec, b"\x01\x01"))
        # The original allows any fatal alert; RFC 8446 §5 names unexpected_message.
        rejected(node, None)
        return conversation
    out.append(Case("two byte long CCS", two_bytes, "two byte long CCS"))
    return out


if __name__ == "__main__":
    sys.exit(hp.main("ccs", "test-tls13-ccs.py", cases, NOT_APPLICABLE))

"""Zero-length application data (RFC 8446 §5.1: "Zero-length fragments of Application Data MAY
be sent"): HBONE equivalent of tlsfuzzer's test-tls13-zero-length-data.py. After the handshake
they must be taken (and the HTTP/2 bytes around them joined); before it they are an
unexpected message. Added for parity with rustls: its limit of 32 consecutive empty records."""

import sys

import hbone_peer as hp
from hbone_peer import Case, send, data, opening, ping, answered, settled, refusal, rejected, \
    close, PREFACE, settings, AES_128, Buffer, Flush
from tlsfuzzer.messages import Connect, ClientHelloGenerator, SetPaddingCallback, \
    split_message, PopMessageFromList, RawMessageGenerator, FinishedGenerator
from tlslite.constants import AlertDescription, ContentType

# rustls 0.23: conn.rs ALLOWED_CONSECUTIVE_EMPTY_FRAGMENTS_MAX.
RUSTLS_EMPTY = 32

NOT_APPLICABLE = {}

PADDINGS = [
    ("", None),
    (" with padding", SetPaddingCallback.fixed_length_cb(30)),
    (" with large padding", SetPaddingCallback.fill_padding_cb),
]


def empty():
    return data(b"")


def cases(peer):
    out = [hp.sanity(peer)]

    for suffix, pad in PADDINGS:
        def between(pad=pad):
            conversation, node = peer.established()
            node = settled(node)
            if pad:
                node = send(node, SetPaddingCallback(pad))
            node = send(node, empty(), data(PREFACE), empty(), data(settings()), empty(),
                        data(ping(b"zero-len")))
            node = answered(node, b"zero-len")
            close(node)
            return conversation
        name = "zero-length app data" + suffix
        out.append(Case(name, between, name))

    # Before the client's Finished (here: before its Certificate) the server expects handshake
    # messages: application data is an unexpected_message (RFC 8446 §6.2).
    for suffix, pad in PADDINGS:
        def during(pad=pad):
            conversation, node = peer.start()
            if pad:
                node = send(node, SetPaddingCallback(pad))
            node = send(node, empty())
            rejected(node, AlertDescription.unexpected_message)
            return conversation
        name = {"": "zero-length app data during handshake",
                " with padding": "zero-length app data with padding during handshake",
                " with large padding": "zero-len app data with large padding during handshake"
                }[suffix]
        out.append(Case(name, during, name))

    # A record of another type in the middle of a fragmented handshake message (RFC 8446 §5.1).
    for suffix, pad in PADDINGS:
        def interleaved(pad=pad):
            conversation = Connect(peer.host, peer.port, timeout=hp.RECV_TIMEOUT)
            fragments = []
            hello = ClientHelloGenerator([AES_128], extensions=peer.hello_extensions())
            node = send(conversation, split_message(hello, fragments, 2),
                        PopMessageFromList(fragments))
            if pad:
                node = send(node, SetPaddingCallback(pad))
            node = send(node, empty())
            rejected(node, AlertDescription.unexpected_message)
            return conversation
        name = {"": "zero-length app data interleaved in handshake",
                " with padding": "zero-len app data with padding interleaved in handshake",
                " with large padding":
                    "zero-len app data with large padding interleaved in handshake"}[suffix]
        out.append(Case(name, interleaved, name, silent=(
            "rustls 0.23 refuses the interleaving with no alert "
            "(PeerMisbehaved::MessageInterleavedWithHandshakeMessage)")))

    # Added: the same records in the TCP write of the client's Finished, which rustls reads
    # while it finishes the handshake and hands over with the keys.
    def with_finished():
        conversation, node = peer.start()
        node = peer.authenticate(node)
        node = send(node, Buffer(), FinishedGenerator(), empty(), data(PREFACE), empty(),
                    data(settings()), empty(), data(ping(b"zero-fin")), Flush())
        close(answered(node, b"zero-fin"))
        return conversation
    out.append(Case("zero-length app data in the TCP write of the client Finished", with_finished))

    # Added: rustls takes 32 consecutive empty records and refuses the 33rd.
    def consecutive(count):
        def build():
            conversation, node = peer.established()
            node = settled(node)
            node = send(node, *[empty() for _ in range(count)])
            node = send(node, data(opening(b"zero-32x")))
            node = answered(node, b"zero-32x")
            close(node)
            return conversation
        return build
    out.append(Case("32 consecutive zero-length records", consecutive(RUSTLS_EMPTY)))

    def too_many():
        conversation, node = peer.established()
        node = settled(node)
        refusal(node, [empty() for _ in range(RUSTLS_EMPTY + 1)], b"zero-33x", None)
        return conversation
    out.append(Case("33 consecutive zero-length records", too_many, silent=(
        "rustls 0.23 refuses the 33rd with no alert (PeerMisbehaved::TooManyEmptyFragments)")))

    # Added: RFC 8446 §5.1, "Implementations MUST NOT send zero-length fragments of Handshake
    # types, even if those fragments contain padding".
    for suffix, pad in PADDINGS[:2]:
        def empty_handshake(pad=pad):
            conversation, node = peer.established()
            node = settled(node)
            if pad:
                node = send(node, SetPaddingCallback(pad))
            refusal(node, [RawMessageGenerator(ContentType.handshake, bytearray())], b"zero-hs1",
                    AlertDescription.unexpected_message)
            return conversation
        out.append(Case("zero-length handshake record after the handshake" + suffix,
                        empty_handshake, silent=(
                            "RFC 8446 §5.1 forbids sending it and names no alert; rustls 0.23 "
                            "even takes it")))
    return out


if __name__ == "__main__":
    sys.exit(hp.main("zero_length_data", "test-tls13-zero-length-data.py", cases,
                     NOT_APPLICABLE))

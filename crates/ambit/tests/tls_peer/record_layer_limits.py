"""Record size limits (RFC 8446 §5.1, §5.2, §5.4): HBONE equivalent of tlsfuzzer's
test-tls13-record-layer-limits.py. A record's plaintext holds at most 2^14 bytes, its
TLSInnerPlaintext (content, type, padding) at most 2^14 + 1, its ciphertext at most
2^14 + 256; beyond that: record_overflow. The original runs each cipher case for
TLS_AES_128_GCM_SHA256 and TLS_CHACHA20_POLY1305_SHA256; HBONE speaks AES-GCM only, so its
two suites stand in. Application data records hold valid HTTP/2: the client's start and an
extension frame (RFC 9113 §5.5: ignored) filling the record."""

import sys

import hbone_peer as hp
from hbone_peer import Case, send, data, opening, frame, answered, settled, rejected, close, \
    Buffer, Flush, AES_128, AES_256
from tlsfuzzer.messages import Connect, ClientHelloGenerator, FinishedGenerator, \
    SetMaxRecordSize, SetPaddingCallback, fuzz_encrypted_message
from tlsfuzzer.runner import ConnectionState
from tlslite.constants import AlertDescription, CipherSuite, ExtensionType
from tlslite.extensions import PaddingExtension

NOT_APPLICABLE = {
    "every case \"..., cipher TLS_CHACHA20_POLY1305_SHA256\"":
        "HBONE's TLS offers only the AES-GCM suites (ztunnel's, see the proxy's TLS config); "
        "the same cases run with TLS_AES_256_GCM_SHA384 instead",
}

CIPHERS = [AES_128, AES_256]
EXTENSION_FRAME = 0xf0
OVERFLOW = AlertDescription.record_overflow


def h2_record(size, payload):
    """`size` bytes of HTTP/2: the client's start with a PING, then an extension frame."""
    start = opening(payload)
    filler = size - len(start) - 9
    assert filler >= 0
    return start + frame(EXTENSION_FRAME, 0, 0, b"\xa5" * filler)


def cases(peer):
    out = [hp.sanity(peer)]

    def established(cipher):
        conversation, node = peer.start(cipher, before_hello=[SetMaxRecordSize(2 ** 16 - 1)])
        node = peer.authenticate(node)
        node = send(node, FinishedGenerator())
        return conversation, settled(node)

    for cipher in CIPHERS:
        suite = CipherSuite.ietfNames[cipher]
        # The original case each one stands for: AES-256 takes ChaCha20's place, and the
        # original's sizes are for a 32-byte Finished.
        original = suite if cipher == AES_128 else "TLS_CHACHA20_POLY1305_SHA256"
        o_left, o_pad = 2 ** 14 - 32 - 4, 2 ** 14 + 256 - 32 - 16 - 5

        def max_payload(cipher=cipher):
            conversation, node = established(cipher)
            node = send(node, data(h2_record(2 ** 14, b"max-size")))
            node = answered(node, b"max-size")
            close(node)
            return conversation
        name = "max size payload in app_data, cipher {0}"
        out.append(Case(name.format(suite), max_payload, name.format(original)))

        def too_big(cipher=cipher):
            conversation, node = established(cipher)
            node = send(node, Buffer(), hp.Forbid(b"big-data"),
                        data(h2_record(2 ** 14 + 1, b"big-data")), Flush())
            rejected(node, OVERFLOW)
            return conversation
        name = "too big payload in app_data, data size: 2**14 + 1, cipher {0}"
        out.append(Case(name.format(suite), too_big, name.format(original)))

        content = 2 ** 14 - 8
        padding = 2 ** 14 + 2 - content - 1

        def too_much_padding(cipher=cipher, padding=padding):
            conversation, node = established(cipher)
            node = send(node, Buffer(), SetPaddingCallback(
                SetPaddingCallback.add_fixed_padding_cb(padding)), hp.Forbid(b"big-pad1"),
                data(h2_record(content, b"big-pad1")), Flush())
            rejected(node, OVERFLOW)
            return conversation
        name = "too big plaintext, size: 2**14 - 8, with an additional {0} bytes of padding, " \
            "cipher {1}"
        out.append(Case(name.format(padding, suite), too_much_padding,
                        name.format(padding, original)))

        # The client's Finished, grown to fill a record: the server's handshake (rustls) judges.
        def big_finished(pad_left, alert, cipher=cipher):
            def build():
                conversation, node = peer.start(cipher,
                                                before_hello=[SetMaxRecordSize(2 ** 16 - 1)])
                node = peer.authenticate(node)
                node = send(node, FinishedGenerator(pad_left=pad_left))
                rejected(node, alert)
                return conversation
            return build
        # verify_data is as long as the suite's hash; the original's suites both hash with
        # SHA-256. A Finished of the wrong length: decode_error (RFC 8446 §6.2), or
        # decrypt_error as for any Finished that does not verify (§4.4.4; what rustls sends).
        hash_len = 48 if cipher == AES_256 else 32
        left = 2 ** 14 - hash_len - 4
        name = "max size payload (2**14) of Finished msg, with {0} bytes of left padding, " \
            "cipher {1}"
        out.append(Case(name.format(left, suite), big_finished(left, (
            AlertDescription.decode_error, AlertDescription.decrypt_error)),
            name.format(o_left, original)))
        name = "too big payload (2**14 + 1) of Finished msg, with {0} bytes of left padding, " \
            "cipher {1}"
        out.append(Case(name.format(left + 1, suite), big_finished(left + 1, OVERFLOW),
                        name.format(o_left + 1, original)))

        def padded_finished(padding, cipher=cipher):
            def build():
                conversation, node = peer.start(cipher,
                                                before_hello=[SetMaxRecordSize(2 ** 16 - 1)])
                node = peer.authenticate(node)
                node = send(node, SetPaddingCallback(
                    SetPaddingCallback.add_fixed_padding_cb(padding)), FinishedGenerator())
                rejected(node, OVERFLOW)
                return conversation
            return build
        padding = 2 ** 14 + 256 - hash_len - 16 - 5
        name = "max size of Finished msg, with {0} bytes of record layer padding, cipher {1}"
        out.append(Case(name.format(padding, suite), padded_finished(padding),
                        name.format(o_pad, original)))
        name = "too big Finished msg, with {0} bytes of record layer padding, cipher {1}"
        out.append(Case(name.format(padding + 1, suite), padded_finished(padding + 1),
                        name.format(o_pad + 1, original)))

    # A ciphertext of 2^14 + 257 bytes with a damaged tag: its size alone is an overflow
    # (RFC 8446 §5.2), whatever its tag.
    for val in [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80]:
        for pos in range(-1, -17, -1):
            def fuzzed(val=val, pos=pos):
                conversation, node = established(AES_128)
                record = h2_record(2 ** 14 + 256 - 16, b"big-tag1")
                node = send(node, Buffer(), hp.Forbid(b"big-tag1"),
                            fuzz_encrypted_message(data(record), xors={pos: val}), Flush())
                rejected(node, OVERFLOW)
                return conversation
            name = "too big ciphertext with size 2**14 + 256 and fuzzed tag with {0} on pos " \
                "{1}".format(val, pos)
            origin = "too big ciphertext with size 2**14 + 256 andfuzzed tag with {0} on pos " \
                "{1}".format(val, pos)
            out.append(Case(name, fuzzed, origin))

    def hello_of(record_len):
        """A ClientHello whose record is `record_len` bytes (padding extension, RFC 7685)."""
        ext = peer.hello_extensions()
        plain = ClientHelloGenerator([AES_128], extensions=dict(ext))
        size = len(plain.generate(ConnectionState()).write())
        ext[ExtensionType.client_hello_padding] = PaddingExtension().create(
            record_len - size - 4)
        return ClientHelloGenerator([AES_128], extensions=ext)

    def max_hello():
        conversation = Connect(peer.host, peer.port, timeout=hp.RECV_TIMEOUT)
        hello = hello_of(2 ** 14)
        node = send(conversation, SetMaxRecordSize(2 ** 16 - 1), hello)
        node = peer.server_flight(node)
        node = peer.authenticate(node)
        node = send(node, FinishedGenerator(), data(opening(b"max-hell")))
        node = answered(node, b"max-hell")
        close(node)
        return conversation
    out.append(Case("max size of ClientHello msg (a 2**14 byte record)", max_hello,
                    "max size of ClientHello msg, with N bytes of padding"))

    def big_hello():
        conversation = Connect(peer.host, peer.port, timeout=hp.RECV_TIMEOUT)
        hello = hello_of(2 ** 14 + 1)
        node = send(conversation, SetMaxRecordSize(2 ** 16 - 1), hello)
        rejected(node, OVERFLOW)
        return conversation
    out.append(Case("too big ClientHello msg (a 2**14 + 1 byte record)", big_hello,
                    "too big ClientHello msg, with N bytes of padding"))
    return out


if __name__ == "__main__":
    sys.exit(hp.main("record_layer_limits", "test-tls13-record-layer-limits.py", cases,
                     NOT_APPLICABLE))

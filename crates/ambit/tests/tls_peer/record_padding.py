"""Record padding (RFC 8446 §5.4): HBONE equivalent of tlsfuzzer's
test-tls13-record-padding.py. Padding applies to every record sent after it is set, the
close_notify at the end included. Padding that takes TLSInnerPlaintext over 2^14 + 1 bytes is
refused in record_layer_limits.py, as in the original suite."""

import sys

import hbone_peer as hp
from hbone_peer import Case, send, data, opening, answered, settled, close
from tlsfuzzer.messages import SetPaddingCallback, KeyUpdateGenerator
from tlslite.constants import KeyUpdateMessageType

NOT_APPLICABLE = {}


def to_limit(length, content_type, max_padding):
    """Padding that makes TLSInnerPlaintext (content, type, zeros) exactly 2^14 + 1 bytes;
    `length` counts the content and its type byte."""
    return 2 ** 14 + 1 - length


def cases(peer):
    out = [hp.sanity(peer)]

    def padded(name, callback, origin=None, key_update=False):
        def build():
            conversation, node = peer.established()
            node = settled(node)
            node = send(node, SetPaddingCallback(callback))
            if key_update:
                node = send(node, KeyUpdateGenerator(
                    message_type=KeyUpdateMessageType.update_requested))
            node = send(node, data(opening(b"pad-pin1")))
            node = answered(node, b"pad-pin1", (1, 1) if key_update else (0, 0))
            close(node)
            return conversation
        out.append(Case(name, build, origin))

    padded("set-fixed-length-padding", SetPaddingCallback.fixed_length_cb(30),
           "set-fixed-length-padding")
    padded("set-max-length-padding", SetPaddingCallback.fill_padding_cb,
           "set-max-length-padding")
    padded("padding up to the TLSInnerPlaintext limit (2^14 + 1 bytes)", to_limit)
    padded("padded KeyUpdate (30 bytes of padding)", SetPaddingCallback.fixed_length_cb(30),
           key_update=True)
    return out


if __name__ == "__main__":
    sys.exit(hp.main("record_padding", "test-tls13-record-padding.py", cases, NOT_APPLICABLE))

"""KeyUpdate from the client (RFC 8446 §4.6.3): HBONE equivalent of tlsfuzzer's
test-tls13-keyupdate.py. Every KeyUpdate is sent once the server's SETTINGS arrived, so the
server's own record layer handles it; one case sends it with the client Finished instead (the
hand-over from rustls to that record layer)."""

import sys

import hbone_peer as hp
from hbone_peer import Case, send, data, opening, ping, answered, settled, refusal, close, \
    Buffer, Flush
from tlsfuzzer.messages import KeyUpdateGenerator, FinishedGenerator, split_message, \
    FlushMessageList, truncate_handshake, pad_handshake, queue_message, skip_post_send
from tlslite.constants import AlertDescription, KeyUpdateMessageType

REQUESTED = KeyUpdateMessageType.update_requested
NOT_REQUESTED = KeyUpdateMessageType.update_not_requested
# rustls 0.23 refuses a KeyUpdate after 32 without application data in between
# (common_state.rs, TemperCounters::allowed_key_update_requests), with no alert.
RUSTLS_KEY_UPDATES = 32

NOT_APPLICABLE = {}


def ku(message_type):
    return KeyUpdateGenerator(message_type=message_type)


def cases(peer):
    out = [hp.sanity(peer)]

    def established():
        conversation, node = peer.established()
        return conversation, settled(node)

    def updated(name, message_type, key_updates, origin):
        def build():
            conversation, node = established()
            node = send(node, ku(message_type), data(opening(b"ku-ping1")))
            node = answered(node, b"ku-ping1", key_updates)
            close(node)
            return conversation
        out.append(Case(name, build, origin))

    updated("post-handshake KeyUpdate msg with update_request", REQUESTED, (1, 1),
            "post-handshake KeyUpdate msg with update_request")
    updated("post-handshake KeyUpdate msg with update_not_request", NOT_REQUESTED, (0, 0),
            "post-handshake KeyUpdate msg with update_not_request")

    def refused(name, records, alert, origin, silent=None):
        def build():
            conversation, node = established()
            refusal(node, records(), b"ku-bad-1", alert)
            return conversation
        out.append(Case(name, build, origin, silent))

    # RFC 8446 §6: a message that cannot be parsed (a KeyUpdate body is one byte): decode_error.
    refused("empty KeyUpdate message",
            lambda: [truncate_handshake(ku(REQUESTED), 1)],
            AlertDescription.decode_error, "empty KeyUpdate message")
    refused("large KeyUpdate message",
            lambda: [pad_handshake(ku(REQUESTED), 1)],
            AlertDescription.decode_error, "large KeyUpdate message")
    # Both KeyUpdates in one record, protected with the keys after the first: the server,
    # still on the old keys, cannot open it (RFC 8446 §5.2: bad_record_mac).
    refused("two KeyUpdates in one record with future keys",
            lambda: [queue_message(ku(NOT_REQUESTED)), ku(REQUESTED)],
            AlertDescription.bad_record_mac, "two KeyUpdates in one record with future keys")

    def split_then_next():
        fragments = []
        return [split_message(ku(NOT_REQUESTED), fragments, 1),
                queue_message(FlushMessageList(fragments)), ku(REQUESTED)]
    refused("two KeyUpdates, first fragmented, second fragment under new keys together with "
            "second KeyUpdate", split_then_next, AlertDescription.bad_record_mac,
            "two KeyUpdates, first fragmented, second fragment under new keys together with "
            "second KeyUpdate")
    # A KeyUpdate must end its record (RFC 8446 §5.1: keys change at a record boundary).
    refused("two KeyUpdates in one record",
            lambda: [queue_message(skip_post_send(ku(NOT_REQUESTED))), ku(REQUESTED)],
            AlertDescription.unexpected_message, "two KeyUpdates in one record")
    # RFC 8446 §4.6.3: any other request_update value: illegal_parameter.
    for msg_type in range(2, 256):
        refused("invalid message_type - {0}, in KeyUpdate msg".format(msg_type),
                lambda t=msg_type: [ku(t)], AlertDescription.illegal_parameter,
                "invalid message_type - {0}, in KeyUpdate msg".format(msg_type))

    # The original waits for the server's KeyUpdate before sending the rest of its request.
    # RFC 8446 §4.6.3 has that KeyUpdate sent "prior to sending its next Application Data
    # record", not at once (rustls sends it with its next record), so the rest follows at once
    # and the KeyUpdate must come before the PING ACK.
    def split_preface():
        conversation, node = established()
        first = opening(b"ku-split")
        node = send(node, data(first[:10]), ku(REQUESTED), data(first[10:]))
        node = answered(node, b"ku-split", (1, 1))
        close(node)
        return conversation
    out.append(Case("app data split, conversation with KeyUpdate msg", split_preface,
                    "app data split, conversation with KeyUpdate msg"))

    def many(count, key_updates):
        def build():
            conversation, node = established()
            node = send(node, *[ku(REQUESTED) for _ in range(count)])
            node = send(node, data(opening(b"ku-many1")))
            node = answered(node, b"ku-many1", key_updates)
            close(node)
            return conversation
        return build
    # The server may answer each request or coalesce them (RFC 8446 §4.6.3 allows both).
    out.append(Case("multiple KeyUpdate messages", many(32, (1, 32)),
                    "multiple KeyUpdate messages"))

    def fragmented():
        conversation, node = established()
        fragments = []
        node = send(node, split_message(ku(REQUESTED), fragments, 2),
                    FlushMessageList(fragments), data(opening(b"ku-frag1")))
        node = answered(node, b"ku-frag1", (1, 1))
        close(node)
        return conversation
    out.append(Case("fragmented keyupdate msg", fragmented, "fragmented keyupdate msg"))

    # RFC 8446 §5.1: handshake messages MUST NOT be interleaved with other record types.
    for first in range(1, 5):
        name = "{0}/{1} fragmented keyupdate msg, appdata between".format(first, 5 - first)

        def interleaved(first=first):
            conversation, node = established()
            fragments = []
            node = send(node, Buffer(), split_message(ku(REQUESTED), fragments, first))
            node = send(node, *hp.probe_ping(b"ku-intl1"))
            node = send(node, FlushMessageList(fragments), Flush())
            hp.rejected(node, AlertDescription.unexpected_message)
            return conversation
        out.append(Case(name, interleaved, name, silent=(
            "rustls 0.23 refuses the interleaving with no alert "
            "(PeerMisbehaved::MessageInterleavedWithHandshakeMessage)")))

    # Added for parity with rustls: its limit on KeyUpdates without application data between.
    def too_many():
        conversation, node = established()
        refusal(node, [ku(NOT_REQUESTED) for _ in range(RUSTLS_KEY_UPDATES + 1)], b"ku-33-01",
                None)
        return conversation
    out.append(Case("33 KeyUpdate messages without application data", too_many, None, silent=(
        "rustls 0.23 refuses the 33rd with no alert (PeerMisbehaved::TooManyKeyUpdateRequests)")))

    def limit_resets():
        conversation, node = established()
        node = send(node, *[ku(NOT_REQUESTED) for _ in range(RUSTLS_KEY_UPDATES)])
        node = send(node, data(opening(b"ku-32-01")))
        node = answered(node, b"ku-32-01")
        node = send(node, *[ku(NOT_REQUESTED) for _ in range(RUSTLS_KEY_UPDATES)])
        node = send(node, data(ping(b"ku-32-02")))
        node = answered(node, b"ku-32-02")
        close(node)
        return conversation
    out.append(Case("32 KeyUpdate messages, PING, 32 more", limit_resets))

    # Added: records that arrive with the client's Finished are read by rustls, which finishes
    # the handshake, and handed over to the proxy's record layer with the keys.
    def with_finished(message_type, payload, key_updates):
        def build():
            conversation, node = peer.start()
            node = peer.authenticate(node)
            node = send(node, Buffer(), FinishedGenerator(), ku(message_type),
                        data(opening(payload)), Flush())
            node = answered(node, payload, key_updates)
            close(node)
            return conversation
        return build
    out.append(Case("KeyUpdate with update_request in the TCP write of the client Finished",
                    with_finished(REQUESTED, b"ku-fin-1", (1, 1))))
    out.append(Case("KeyUpdate with update_not_request in the TCP write of the client Finished",
                    with_finished(NOT_REQUESTED, b"ku-fin-2", (0, 0))))
    return out


if __name__ == "__main__":
    sys.exit(hp.main("keyupdate", "test-tls13-keyupdate.py", cases, NOT_APPLICABLE))

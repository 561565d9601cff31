"""KeyUpdate from the server (RFC 8446 §4.6.3): HBONE equivalent of tlsfuzzer's
test-tls13-keyupdate-from-server.py.

tlsfuzzer's server starts a KeyUpdate (update_requested) when asked for "GET /keyupdate". An
HBONE server starts one on its own only after 2^23 records under one key (KEY_UPDATE_AFTER in
the record layer, below AES-GCM's limit of RFC 8446 §5.5), and then with update_not_requested.
Here the server's KeyUpdate is the one it owes the client's update_requested (sent before its
next application data record, RFC 8446 §4.6.3: the PING ACK); what the original checks after
it is checked the same way: the client moves to the server's new keys, answers with its own
KeyUpdate(update_not_requested) as the original's client does, and data keeps flowing both
ways under the new keys."""

import sys

import hbone_peer as hp
from hbone_peer import Case, send, data, opening, ping, answered, settled, close
from tlsfuzzer.messages import KeyUpdateGenerator
from tlslite.constants import KeyUpdateMessageType

REQUESTED = KeyUpdateMessageType.update_requested
NOT_REQUESTED = KeyUpdateMessageType.update_not_requested

NOT_APPLICABLE = {
    "post-handshake KeyUpdate msg from server (started by the server, update_requested)":
        "an HBONE server starts a KeyUpdate only after 2^23 records under one key, with "
        "update_not_requested (RFC 8446 §4.6.3 leaves request_update to the sender); its "
        "KeyUpdate is exercised as the answer to the client's update_requested instead",
}


def cases(peer):
    out = [hp.sanity(peer)]

    def from_server():
        conversation, node = peer.established()
        node = settled(node)
        node = send(node, KeyUpdateGenerator(message_type=REQUESTED), data(opening(b"srv-ku-1")))
        node = answered(node, b"srv-ku-1", (1, 1))
        node = send(node, KeyUpdateGenerator(message_type=NOT_REQUESTED),
                    data(ping(b"srv-ku-2")))
        # No KeyUpdate beyond the one requested: the client's own did not ask for one.
        node = answered(node, b"srv-ku-2", (1, 1))
        close(node)
        return conversation
    out.append(Case("post-handshake KeyUpdate msg from server", from_server,
                    "post-handshake KeyUpdate msg from server"))

    def round_trips():
        conversation, node = peer.established()
        node = settled(node)
        node = send(node, KeyUpdateGenerator(message_type=REQUESTED), data(opening(b"srv-rt-0")))
        node = answered(node, b"srv-rt-0", (1, 1))
        for i in range(1, 6):
            payload = "srv-rt-{0}".format(i).encode()
            node = send(node, data(ping(payload)))
            node = answered(node, payload, (1, 1))
        close(node)
        return conversation
    out.append(Case("server KeyUpdate, then five PING round trips under the new keys",
                    round_trips))

    def twice():
        conversation, node = peer.established()
        node = settled(node)
        node = send(node, KeyUpdateGenerator(message_type=REQUESTED), data(opening(b"srv-2x-1")))
        node = answered(node, b"srv-2x-1", (1, 1))
        node = send(node, KeyUpdateGenerator(message_type=REQUESTED), data(ping(b"srv-2x-2")))
        node = answered(node, b"srv-2x-2", (2, 2))
        close(node)
        return conversation
    out.append(Case("two server KeyUpdates, each requested after data", twice))
    return out


if __name__ == "__main__":
    sys.exit(hp.main("keyupdate_from_server", "test-tls13-keyupdate-from-server.py", cases,
                     NOT_APPLICABLE))

"""Several ChangeCipherSpec messages (RFC 8446 §5, Appendix D.4): HBONE equivalent of
tlsfuzzer's test-tls13-multiple-ccs-messages.py. The RFC has a CCS "at any time after the first
ClientHello ... and before the peer's Finished" dropped, without a count; rustls 0.23 drops at
most two (one after each ClientHello, common_state.rs allowed_middlebox_ccs) and refuses the
third with unexpected_message. The original sends two (its --ccs default) and expects the
refusal, which an RFC-following server need not send: here two must be dropped and three must
be refused, the bar rustls sets."""

import sys

import hbone_peer as hp
from hbone_peer import Case, send, data, opening, answered, rejected, close
from tlsfuzzer.messages import ChangeCipherSpecGenerator, FinishedGenerator, \
    RawMessageGenerator, TCPBufferingEnable, TCPBufferingDisable, TCPBufferingFlush
from tlslite.constants import AlertDescription, ContentType

RUSTLS_CCS = 2

NOT_APPLICABLE = {}


def ccs():
    return ChangeCipherSpecGenerator(fake=True)


def cases(peer):
    out = [hp.sanity(peer)]

    def working(before_hello, after_hello, before_client_flight, ping_payload):
        def build():
            conversation, node = peer.start(before_hello=before_hello())
            node = send(node, *before_client_flight())
            node = peer.authenticate(node)
            node = send(node, FinishedGenerator(), data(opening(ping_payload)))
            node = answered(node, ping_payload)
            close(node)
            return conversation
        return build

    def after_hello(count, buffered):
        """CCS messages right after the ClientHello, in the ClientHello's TCP write or not."""
        def build_(expect):
            def build():
                conversation = hp.Connect(peer.host, peer.port, timeout=hp.RECV_TIMEOUT)
                node = conversation
                if buffered == "with hello":
                    node = send(node, TCPBufferingEnable())
                node = peer.hello(node)
                if buffered == "after hello":
                    node = send(node, TCPBufferingEnable())
                node = send(node, *[ccs() for _ in range(count)])
                if buffered:
                    node = send(node, TCPBufferingDisable(), TCPBufferingFlush())
                return expect(conversation, node)
            return build
        return build_

    def keeps_working(conversation, node):
        node = peer.server_flight(node)
        node = peer.authenticate(node)
        node = send(node, FinishedGenerator(), data(opening(b"ccs-many")))
        close(answered(node, b"ccs-many"))
        return conversation

    def refuses(conversation, node):
        node = peer.server_flight(node, may_close=True)
        rejected(node, AlertDescription.unexpected_message)
        return conversation

    silent = ("rustls 0.23 refuses the third CCS with no alert "
              "(PeerMisbehaved::IllegalMiddleboxChangeCipherSpec from its TemperCounters)")

    out.append(Case("sanity with one CCS message", after_hello(1, None)(keeps_working),
                    "sanity with one CCS message"))

    def second_before_client_flight():
        conversation = hp.Connect(peer.host, peer.port, timeout=hp.RECV_TIMEOUT)
        node = send(peer.hello(conversation), ccs())
        node = peer.server_flight(node)
        node = send(node, ccs())
        node = peer.authenticate(node)
        node = send(node, FinishedGenerator(), data(opening(b"ccs-2nd1")))
        close(answered(node, b"ccs-2nd1"))
        return conversation
    out.append(Case("second CCS before client finished (dropped)", second_before_client_flight,
                    "second CCS before client finished"))

    def third_before_client_flight():
        conversation = hp.Connect(peer.host, peer.port, timeout=hp.RECV_TIMEOUT)
        node = send(peer.hello(conversation), ccs())
        node = peer.server_flight(node)
        node = send(node, ccs(), ccs())
        rejected(node, AlertDescription.unexpected_message)
        return conversation
    out.append(Case("third CCS before client finished", third_before_client_flight,
                    "second CCS before client finished", silent))

    out.append(Case("multiple CCS Messages in one TCP packet (2, dropped)",
                    after_hello(RUSTLS_CCS, "after hello")(keeps_working),
                    "multiple CCS Messages in one TCP packet"))
    out.append(Case("multiple CCS Messages in one TCP packet (3)",
                    after_hello(RUSTLS_CCS + 1, "after hello")(refuses),
                    "multiple CCS Messages in one TCP packet", silent))
    out.append(Case("CH and multiple CCS Messages in one TCP packet (2, dropped)",
                    after_hello(RUSTLS_CCS, "with hello")(keeps_working),
                    "CH and multiple CCS Messages in one TCP packet"))
    out.append(Case("CH and multiple CCS Messages in one TCP packet (3)",
                    after_hello(RUSTLS_CCS + 1, "with hello")(refuses),
                    "CH and multiple CCS Messages in one TCP packet", silent))

    # The original sends the record right after the ClientHello, so whether the server reads
    # both at once depends on timing: here it comes once the server's flight is in (as in
    # ccs.py's "two byte long CCS"), and in the ClientHello's TCP write.
    def in_one_record(with_hello):
        def build():
            conversation = hp.Connect(peer.host, peer.port, timeout=hp.RECV_TIMEOUT)
            node = conversation
            if with_hello:
                node = send(node, TCPBufferingEnable())
            node = peer.hello(node)
            if not with_hello:
                node = peer.server_flight(node)
            node = send(node, RawMessageGenerator(ContentType.change_cipher_spec,
                                                  b"\x01" * RUSTLS_CCS))
            if with_hello:
                node = send(node, TCPBufferingDisable(), TCPBufferingFlush())
                node = peer.server_flight(node)
            rejected(node, AlertDescription.unexpected_message)
            return conversation
        return build
    out.append(Case("multiple CCS Messages in one TLS record", in_one_record(False),
                    "multiple CCS Messages in one TLS record"))
    out.append(Case("multiple CCS Messages in one TLS record, in the TCP write of the "
                    "ClientHello", in_one_record(True)))
    return out


if __name__ == "__main__":
    sys.exit(hp.main("multiple_ccs", "test-tls13-multiple-ccs-messages.py", cases,
                     NOT_APPLICABLE))

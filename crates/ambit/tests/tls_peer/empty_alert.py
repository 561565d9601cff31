"""Alert records of the wrong shape (RFC 8446 §5.1, §6): HBONE equivalent of tlsfuzzer's
test-tls13-empty-alert.py, plus what rustls 0.23 limits about alerts (added): an alert record
holds exactly one alert (level, description); in TLS 1.3 a warning other than close_notify and
user_canceled is an error, and rustls takes at most 4 warnings (user_canceled) in all."""

import sys

import hbone_peer as hp
from hbone_peer import Case, send, data, opening, answered, settled, rejected, refusal, ended, \
    close, Buffer, Flush, probe_ping
from tlsfuzzer.messages import RawMessageGenerator, SetPaddingCallback, AlertGenerator
from tlslite.constants import AlertDescription, AlertLevel, ContentType

NOT_APPLICABLE = {}

# An alert record that cannot be parsed: RFC 8446 §6.2 names decode_error for a message of the
# wrong length; the original expects unexpected_message (a record no TLS 1.3 peer sends).
MALFORMED = (AlertDescription.unexpected_message, AlertDescription.decode_error)
# rustls 0.23: common_state.rs TemperCounters::allowed_warning_alerts.
RUSTLS_WARNINGS = 4


def alert(level, description):
    return AlertGenerator(level, description)


def cases(peer):
    out = [hp.sanity(peer)]

    for keys in ("handshake", "application"):
        for padding in (0, 2, 5, 30):
            def build(keys=keys, padding=padding):
                if keys == "handshake":
                    conversation, node = peer.start()
                    if padding:
                        node = send(node, SetPaddingCallback(
                            SetPaddingCallback.fixed_length_cb(padding)))
                    node = send(node, RawMessageGenerator(ContentType.alert, bytearray()))
                    rejected(node, MALFORMED)
                    return conversation
                conversation, node = peer.established()
                node = settled(node)
                if padding:
                    node = send(node, SetPaddingCallback(
                        SetPaddingCallback.fixed_length_cb(padding)))
                refusal(node, [RawMessageGenerator(ContentType.alert, bytearray())], b"empty-al",
                        MALFORMED)
                return conversation
            name = "empty alert with {0} using {1} keys".format(
                "{0} bytes of padding".format(padding) if padding else "no padding", keys)
            out.append(Case(name, build, name))

    def malformed(payload):
        def build():
            conversation, node = peer.established()
            node = settled(node)
            refusal(node, [RawMessageGenerator(ContentType.alert, bytearray(payload))],
                    b"bad-alrt", MALFORMED)
            return conversation
        return build
    out.append(Case("one-byte alert using application keys", malformed([AlertLevel.fatal])))
    out.append(Case("two alerts in one record using application keys",
                    malformed([AlertLevel.warning, AlertDescription.user_canceled,
                               AlertLevel.warning, AlertDescription.user_canceled])))

    def warnings(count):
        def build():
            conversation, node = peer.established()
            node = settled(node)
            node = send(node, *[alert(AlertLevel.warning, AlertDescription.user_canceled)
                                for _ in range(count)])
            node = send(node, data(opening(b"warn-ok1")))
            close(answered(node, b"warn-ok1"))
            return conversation
        return build
    out.append(Case("4 user_canceled warnings", warnings(RUSTLS_WARNINGS)))

    def too_many_warnings():
        conversation, node = peer.established()
        node = settled(node)
        refusal(node, [alert(AlertLevel.warning, AlertDescription.user_canceled)
                       for _ in range(RUSTLS_WARNINGS + 1)], b"warn-5x1", None)
        return conversation
    out.append(Case("5 user_canceled warnings", too_many_warnings, silent=(
        "rustls 0.23 refuses the 5th with no alert "
        "(PeerMisbehaved::TooManyWarningAlertsReceived)")))

    # RFC 8446 §6: all alerts but close_notify and user_canceled are errors whatever their
    # level; the connection ends (rustls also sends decode_error for such a warning).
    def error_alert(level, description, payload):
        def build():
            conversation, node = peer.established()
            node = settled(node)
            node = send(node, Buffer(), alert(level, description), *probe_ping(payload))
            ended(send(node, Flush()))
            return conversation
        return build
    ends = "the client's error alert ended the connection; RFC 8446 §6.2 asks for no reply"
    out.append(Case("warning unexpected_message alert", error_alert(
        AlertLevel.warning, AlertDescription.unexpected_message, b"warn-err"), silent=ends))
    # rustls treats every fatal alert but close_notify as the end (common_state.rs
    # process_alert), user_canceled included.
    out.append(Case("fatal user_canceled alert", error_alert(
        AlertLevel.fatal, AlertDescription.user_canceled, b"fatal-uc"), silent=(
            "rustls 0.23 ends the connection on a fatal alert with no alert in reply")))
    return out


if __name__ == "__main__":
    sys.exit(hp.main("empty_alert", "test-tls13-empty-alert.py", cases, NOT_APPLICABLE))

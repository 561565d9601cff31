//! Entry points for the fuzz targets in `fuzz/`.

use super::driver::deliver;
use super::*;

/// Feeds `data` to one side's protocol machinery as the plaintext it receives after the TLS
/// handshake: a server when the first byte is even, a client otherwise; the next byte sizes
/// the pieces it arrives in. Stops at the first connection error, as a connection does.
pub fn plaintext(data: &[u8]) {
    let [first, step, rest @ ..] = data else { return };
    let role = if first % 2 == 0 { Role::Server } else { Role::Client };
    let cfg = Config {
        stream_window: 1 << 16,
        connection_window: 1 << 17,
        max_frame_size: frame::DEFAULT_MAX_FRAME,
        max_concurrent_streams: Some(100),
        max_header_list_size: 16 * 1024,
        keepalive: None,
    };
    let mut st = State::new(role, tls::Sealer::for_fuzzing(), &cfg);
    if role == Role::Client {
        // Streams 1, 3 and 5 are open and waiting for their response.
        for id in [1, 3, 5] {
            st.streams.insert(id, Stream { send_window: 65_535, recv_window: 65_535, ..Stream::default() });
        }
        st.next_id = 7;
    }
    let max_block = Proto::max_block(&cfg);
    let mut reader = frame::Reader::new(cfg.max_frame_size, max_block);
    let mut proto = Proto::new(role, &cfg, max_block);
    for piece in rest.chunks(usize::from(*step).max(1)) {
        let mut input = piece;
        if proto.preface_left > 0 {
            let n = proto.preface_left.min(input.len());
            let expect = &frame::PREFACE[frame::PREFACE.len() - proto.preface_left..][..n];
            if &input[..n] != expect {
                return;
            }
            proto.preface_left -= n;
            input = &input[n..];
        }
        let mut pending = Vec::new();
        while let Some(ev) = reader.next(&mut input) {
            let Ok(ev) = ev else { return };
            if proto.event(&mut st, ev, &mut pending).is_err() {
                return;
            }
        }
        deliver(&mut st, &pending);
        // Streams the peer opened are answered and dropped, as a handler would.
        while let Some((id, _)) = proto.incoming.pop_front() {
            st.streams.remove(&id);
        }
        if st.seal_control().is_err() {
            return;
        }
        let n = st.out.len();
        st.out.advance(n);
    }
}

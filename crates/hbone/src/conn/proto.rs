//! The HTTP/2 protocol machine: frames in, stream and connection state changed, answers queued;
//! and the flood counters.

use super::*;

impl Windowed {
    /// Counts one event; whether more than `max` happened in the current interval.
    pub(super) fn over(&mut self, max: u32) -> bool {
        let now = Instant::now();
        if self.since.is_none_or(|s| now.duration_since(s) > FLOOD_WINDOW) {
            *self = Windowed { since: Some(now), n: 0 };
        }
        self.n += 1;
        self.n > max
    }
}

impl Flood {
    /// A frame that carries nothing or that we must answer.
    pub(super) fn chatter(&mut self) -> Result<(), ConnError> {
        if self.chatter.over(MAX_CHATTER) {
            return Err(ConnError::protocol(Reason::ENHANCE_YOUR_CALM, "too many control frames"));
        }
        Ok(())
    }

    /// A stream the client reset before we answered it.
    pub(super) fn early_reset(&mut self) -> Result<(), ConnError> {
        if self.early_resets.over(MAX_EARLY_RESETS) {
            return Err(ConnError::protocol(
                Reason::ENHANCE_YOUR_CALM,
                "too many streams reset before their response",
            ));
        }
        Ok(())
    }
}

/// The stream a PRIORITY block (of a PRIORITY or HEADERS frame) depends on.
fn dependency(block: &[u8]) -> u32 {
    u32::from_be_bytes([block[0], block[1], block[2], block[3]]) & 0x7fff_ffff
}

impl Proto {
    pub(super) fn new(role: Role, cfg: &Config, max_block: usize) -> Proto {
        let frames_for_list = (cfg.max_header_list_size / cfg.max_frame_size.max(1)).max(1) as usize;
        Proto {
            role,
            decoder: hpack::Decoder::default(),
            block: None,
            max_block,
            max_header_list: cfg.max_header_list_size as usize,
            max_continuations: (frames_for_list + frames_for_list / 4).max(5),
            data_target: None,
            data_flow: 0,
            preface_left: if role == Role::Server { frame::PREFACE.len() } else { 0 },
            settings_seen: false,
            preface_done_at: None,
            incoming: VecDeque::new(),
            flood: Flood::default(),
            pong: None,
        }
    }

    /// The largest header block a connection assembles: twice its header list limit.
    pub(super) fn max_block(cfg: &Config) -> usize {
        (cfg.max_header_list_size as usize).saturating_mul(2).clamp(16 * 1024, 1 << 20)
    }

    pub(super) fn event<'i>(
        &mut self,
        st: &mut State,
        ev: Event<'_, 'i>,
        pending: &mut Vec<(u32, &'i [u8])>,
    ) -> Result<(), ConnError> {
        if !self.settings_seen {
            match ev {
                Event::Frame(h, _) if h.kind == kind::SETTINGS && h.flags & flag::ACK == 0 => {
                    self.settings_seen = true;
                    self.preface_done_at = Some(Instant::now());
                }
                _ => {
                    return Err(ConnError::protocol(
                        Reason::PROTOCOL_ERROR,
                        "the first frame is not SETTINGS",
                    ));
                }
            }
        }
        if let Some(b) = &self.block {
            let continuation =
                matches!(ev, Event::Frame(h, _) if h.kind == kind::CONTINUATION && h.stream == b.stream);
            if !continuation {
                return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "frame inside a header block"));
            }
        }
        match ev {
            Event::DataStart { stream, flow } => self.data_start(st, stream, flow),
            Event::Data { stream: _, bytes } => {
                if let Some(DataTarget::Stream(id)) = self.data_target {
                    pending.push((id, bytes));
                }
                Ok(())
            }
            Event::DataEnd { stream, undelivered, end_stream } => {
                if self.data_flow == 0 && !end_stream {
                    // An empty DATA frame that does not end its stream carries nothing: chatter.
                    // (An empty one with END_STREAM is how a stream's sender ends it.)
                    self.flood.chatter()?;
                }
                let target = self.data_target.take();
                if let Some(DataTarget::Stream(id)) = target {
                    debug_assert_eq!(id, stream);
                    st.release(Some(id), undelivered as usize);
                    if end_stream && let Some(s) = st.streams.get_mut(&id) {
                        s.recv_done = true;
                        // Data of this read still to deliver goes first (`deliver` ends it).
                        if !pending.iter().any(|(p, _)| *p == id) {
                            s.fin_to_app();
                        }
                        s.wake();
                    }
                }
                Ok(())
            }
            Event::Frame(h, payload) => self.frame(st, h, payload),
        }
    }

    pub(super) fn data_start(&mut self, st: &mut State, id: u32, flow: u32) -> Result<(), ConnError> {
        self.data_flow = flow;
        st.conn_recv -= i64::from(flow);
        if st.conn_recv < 0 {
            return Err(ConnError::protocol(Reason::FLOW_CONTROL_ERROR, "DATA beyond the connection window"));
        }
        if self.is_idle(st, id) {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "DATA on an idle stream"));
        }
        let target = match st.streams.get_mut(&id) {
            None => {
                // A stream already closed and forgotten.
                self.flood.chatter()?;
                None
            }
            Some(s) if s.reset.is_some() || s.local_reset => None,
            Some(s) if s.recv_done => {
                st.reset_stream(id, Reason::STREAM_CLOSED, ResetCause::Fault)?;
                None
            }
            Some(s) => {
                s.recv_window -= i64::from(flow);
                if s.recv_window < 0 {
                    st.reset_stream(id, Reason::FLOW_CONTROL_ERROR, ResetCause::Fault)?;
                    None
                } else {
                    Some(id)
                }
            }
        };
        match target {
            Some(id) => self.data_target = Some(DataTarget::Stream(id)),
            None => {
                // Nobody takes these bytes: their connection window comes back at once.
                st.release(None, flow as usize);
                self.data_target = Some(DataTarget::Drop);
            }
        }
        Ok(())
    }

    /// A stream id the peer may not use yet (RFC 9113 §5.1: idle).
    pub(super) fn is_idle(&self, st: &State, id: u32) -> bool {
        match self.role {
            Role::Client => id.is_multiple_of(2) || id >= st.next_id,
            Role::Server => id.is_multiple_of(2) || id > st.last_peer_id,
        }
    }

    pub(super) fn frame(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        match h.kind {
            kind::HEADERS => self.headers(st, h, p),
            kind::CONTINUATION => self.continuation(st, h, p),
            kind::PRIORITY => {
                if h.stream == 0 {
                    return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "PRIORITY on stream 0"));
                }
                if p.len() != 5 {
                    return Err(ConnError::protocol(Reason::FRAME_SIZE_ERROR, "PRIORITY of the wrong size"));
                }
                self.flood.chatter()?;
                if dependency(p) == h.stream {
                    // RFC 9113 §5.3.1: a stream cannot depend on itself.
                    st.reset_stream(h.stream, Reason::PROTOCOL_ERROR, ResetCause::Fault)?;
                }
                Ok(())
            }
            kind::RST_STREAM => self.rst_stream(st, h, p),
            kind::SETTINGS => self.settings(st, h, p),
            kind::PUSH_PROMISE => {
                Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "PUSH_PROMISE (push is disabled)"))
            }
            kind::PING => {
                if h.stream != 0 {
                    return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "PING on a stream"));
                }
                let payload: [u8; 8] = p
                    .try_into()
                    .map_err(|_| ConnError::protocol(Reason::FRAME_SIZE_ERROR, "PING of the wrong size"))?;
                self.flood.chatter()?;
                if h.flags & flag::ACK != 0 {
                    if payload == DRAIN_PING && st.goaway_sent && st.final_goaway.is_none() {
                        // Streams the client opened before it saw our first GOAWAY are in.
                        let last = st.last_peer_id;
                        st.final_goaway = Some(last);
                        frame::goaway(&mut st.ctl, last, Reason::NO_ERROR);
                    } else {
                        self.pong = Some(payload);
                    }
                } else {
                    frame::ping(&mut st.ctl, payload, true);
                }
                Ok(())
            }
            kind::GOAWAY => self.goaway(st, h, p),
            kind::WINDOW_UPDATE => self.window_update(st, h, p),
            _ => self.flood.chatter(),
        }
    }

    pub(super) fn headers(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        if h.stream == 0 {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "HEADERS on stream 0"));
        }
        let mut p = p;
        let mut pad = 0usize;
        if h.flags & flag::PADDED != 0 {
            let [n, rest @ ..] = p else {
                return Err(ConnError::protocol(
                    Reason::FRAME_SIZE_ERROR,
                    "padded HEADERS without a pad length",
                ));
            };
            pad = usize::from(*n);
            p = rest;
        }
        let mut self_dependent = false;
        if h.flags & flag::PRIORITY != 0 {
            let Some(priority) = p.get(..5) else {
                return Err(ConnError::protocol(
                    Reason::FRAME_SIZE_ERROR,
                    "HEADERS shorter than its priority",
                ));
            };
            self_dependent = dependency(priority) == h.stream;
            p = &p[5..];
        }
        if pad > p.len() {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "HEADERS padding longer than the frame"));
        }
        let fragment = &p[..p.len() - pad];
        let block = Block {
            stream: h.stream,
            end_stream: h.flags & flag::END_STREAM != 0,
            self_dependent,
            buf: fragment.to_vec(),
            continuations: 0,
        };
        if h.flags & flag::END_HEADERS != 0 {
            self.header_block(st, block)
        } else {
            self.block = Some(block);
            Ok(())
        }
    }

    fn continuation(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        let Some(b) = &mut self.block else {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "CONTINUATION without HEADERS"));
        };
        if b.buf.len() + p.len() > self.max_block {
            return Err(ConnError::protocol(Reason::ENHANCE_YOUR_CALM, "header block too large"));
        }
        let end = h.flags & flag::END_HEADERS != 0;
        if !end {
            b.continuations += 1;
            if b.continuations > self.max_continuations {
                return Err(ConnError::protocol(
                    Reason::ENHANCE_YOUR_CALM,
                    "too many CONTINUATION frames in one header block",
                ));
            }
        }
        b.buf.extend_from_slice(p);
        if p.is_empty() {
            self.flood.chatter()?;
        }
        match self.block.take() {
            Some(b) if end => self.header_block(st, b),
            b => {
                self.block = b;
                Ok(())
            }
        }
    }

    pub(super) fn header_block(&mut self, st: &mut State, b: Block) -> Result<(), ConnError> {
        let id = b.stream;
        // Decoded whatever becomes of the stream: the table must follow the peer's.
        let decoded = match self.decoder.decode(&b.buf, self.max_header_list) {
            Err(HeaderError::Compression(e)) => {
                return Err(ConnError::protocol(Reason::COMPRESSION_ERROR, format!("header block: {e}")));
            }
            other => other,
        };
        drop(b.buf);
        if st.streams.contains_key(&id) {
            if b.self_dependent {
                return st.reset_stream(id, Reason::PROTOCOL_ERROR, ResetCause::Fault);
            }
            return self.stream_headers(st, id, b.end_stream, decoded);
        }
        match self.role {
            Role::Client => {
                if self.is_idle(st, id) {
                    return Err(ConnError::protocol(
                        Reason::PROTOCOL_ERROR,
                        "HEADERS on a stream we did not open",
                    ));
                }
                // A stream we already closed: nothing to do.
                self.flood.chatter()
            }
            Role::Server => {
                if id.is_multiple_of(2) || id <= st.last_peer_id {
                    return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "HEADERS reusing a stream id"));
                }
                st.last_peer_id = id;
                if st.final_goaway.is_some() || st.closed.is_some() {
                    // Past our final GOAWAY: ignored; the client retries elsewhere.
                    return self.flood.chatter();
                }
                // A request that breaks HTTP/2's rules for its head (RFC 9113 §8.3.1, §8.5) is
                // malformed: a stream error, as h2 answers it.
                let head = match decoded.and_then(|h| h.check_request().map(|()| h)) {
                    Ok(h) if !b.self_dependent => h,
                    _ => return st.reset_stream(id, Reason::PROTOCOL_ERROR, ResetCause::Fault),
                };
                if st.streams.len() >= st.local_max_concurrent as usize {
                    return st.reset_stream(id, Reason::REFUSED_STREAM, ResetCause::Refusal);
                }
                let stream = Stream {
                    send_window: i64::from(st.peer.initial_window),
                    recv_window: i64::from(st.local_window),
                    recv_done: b.end_stream,
                    ..Stream::default()
                };
                st.streams.insert(id, stream);
                self.incoming.push_back((id, head));
                Ok(())
            }
        }
    }

    /// A header block on a stream that exists: a client's response head (after informational
    /// ones), or trailers.
    pub(super) fn stream_headers(
        &mut self,
        st: &mut State,
        id: u32,
        end_stream: bool,
        decoded: Result<Decoded, HeaderError>,
    ) -> Result<(), ConnError> {
        let role = self.role;
        let Some(s) = st.streams.get_mut(&id) else { return Ok(()) };
        if s.reset.is_some() || s.local_reset {
            // Frames in flight when the stream was reset.
            return self.flood.chatter();
        }
        if s.recv_done {
            // RFC 9113 §5.1: a frame other than WINDOW_UPDATE, PRIORITY or RST_STREAM on a
            // half-closed (remote) stream.
            return st.reset_stream(id, Reason::STREAM_CLOSED, ResetCause::Fault);
        }
        let awaiting = role == Role::Client && s.head.is_none() && !s.responded;
        if awaiting {
            match decoded.and_then(|h| h.check_response().map(|()| h)) {
                Ok(head) if head.status.is_some_and(|c| (100..200).contains(&c)) => {
                    // Informational: the final response follows; it cannot end the stream.
                    if end_stream {
                        return st.reset_stream(id, Reason::PROTOCOL_ERROR, ResetCause::Fault);
                    }
                    return Ok(());
                }
                Ok(head) => s.head = Some(Ok(head)),
                Err(e) => {
                    s.head = Some(Err(e));
                    // Mark that a head arrived even after it is taken.
                    s.responded = true;
                    return st.reset_stream(id, Reason::PROTOCOL_ERROR, ResetCause::Fault);
                }
            }
            // Mark that a head arrived even after it is taken.
            s.responded = true;
        } else if !end_stream || decoded.and_then(|h| h.check_trailers()).is_err() {
            // Trailers end the stream and carry no pseudo-header (RFC 9113 §8.1).
            return st.reset_stream(id, Reason::PROTOCOL_ERROR, ResetCause::Fault);
        }
        if end_stream {
            s.recv_done = true;
        }
        s.wake();
        Ok(())
    }

    pub(super) fn rst_stream(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        if h.stream == 0 {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "RST_STREAM on stream 0"));
        }
        let code: [u8; 4] = p
            .try_into()
            .map_err(|_| ConnError::protocol(Reason::FRAME_SIZE_ERROR, "RST_STREAM of the wrong size"))?;
        if self.is_idle(st, h.stream) {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "RST_STREAM on an idle stream"));
        }
        let reason = Reason(u32::from_be_bytes(code));
        let role = self.role;
        let Some(s) = st.streams.get_mut(&h.stream) else {
            // A stream already closed and forgotten.
            return self.flood.chatter();
        };
        if role == Role::Server && !s.responded {
            self.flood.early_reset()?;
        }
        if s.reset.is_some() {
            return self.flood.chatter();
        }
        s.reset = Some(reason);
        if reason == Reason::NO_ERROR && s.recv_done {
            // The peer sent its whole side and only asks us to stop sending (RFC 9113 §8.1: a
            // complete response is not discarded): what is queued stays readable.
            s.wake();
            st.wake_senders();
            return Ok(());
        }
        // Queued bytes will never be written: their window goes back.
        let queued = std::mem::take(&mut s.queued);
        s.queue.clear();
        s.wake();
        st.release(None, queued);
        st.wake_senders();
        Ok(())
    }

    pub(super) fn settings(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        if h.stream != 0 {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "SETTINGS on a stream"));
        }
        self.flood.chatter()?;
        if h.flags & flag::ACK != 0 {
            if !p.is_empty() {
                return Err(ConnError::protocol(
                    Reason::FRAME_SIZE_ERROR,
                    "SETTINGS acknowledgement with a payload",
                ));
            }
            return Ok(());
        }
        let entries = frame::parse_settings(p).map_err(|r| ConnError::protocol(r, "invalid SETTINGS"))?;
        for (id, v) in entries {
            match id {
                setting::HEADER_TABLE_SIZE if v != st.peer.header_table => {
                    st.peer.header_table = v;
                    st.encoder.table_size_changed();
                }
                setting::ENABLE_PUSH if self.role == Role::Client && v != 0 => {
                    return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "a server enabled push"));
                }
                setting::MAX_CONCURRENT_STREAMS => st.peer.max_concurrent = v,
                setting::INITIAL_WINDOW_SIZE => {
                    let delta = i64::from(v) - i64::from(st.peer.initial_window);
                    st.peer.initial_window = v;
                    for s in st.streams.values_mut() {
                        s.send_window += delta;
                        if s.send_window > frame::MAX_WINDOW {
                            return Err(ConnError::protocol(
                                Reason::FLOW_CONTROL_ERROR,
                                "a stream window over 2^31-1",
                            ));
                        }
                        if delta > 0 {
                            s.wake();
                        }
                    }
                }
                setting::MAX_FRAME_SIZE => st.peer.max_frame = v,
                _ => {}
            }
        }
        frame::settings_ack(&mut st.ctl);
        st.wake_senders();
        Ok(())
    }

    pub(super) fn goaway(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        if h.stream != 0 {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "GOAWAY on a stream"));
        }
        let Some(head) = p.get(..8) else {
            return Err(ConnError::protocol(Reason::FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes"));
        };
        self.flood.chatter()?;
        let last = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) & 0x7fff_ffff;
        let reason = Reason(u32::from_be_bytes([head[4], head[5], head[6], head[7]]));
        let last = st.goaway_received.map_or(last, |(prev, _)| prev.min(last));
        st.goaway_received = Some((last, reason));
        let ours = |id: u32| (id % 2 == 1) == (self.role == Role::Client);
        for (id, s) in st.streams.iter_mut() {
            if ours(*id) && *id > last && !s.responded {
                s.refused = true;
                s.wake();
            }
        }
        if reason != Reason::NO_ERROR {
            tracing::debug!(%reason, last_stream = last, "the HBONE peer sent GOAWAY with an error");
        }
        st.wake_senders();
        Ok(())
    }

    pub(super) fn window_update(&mut self, st: &mut State, h: Head, p: &[u8]) -> Result<(), ConnError> {
        let inc: [u8; 4] = p
            .try_into()
            .map_err(|_| ConnError::protocol(Reason::FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size"))?;
        let inc = i64::from(u32::from_be_bytes(inc) & 0x7fff_ffff);
        if h.stream == 0 {
            if inc == 0 {
                return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE of 0"));
            }
            st.conn_send += inc;
            if st.conn_send > frame::MAX_WINDOW {
                return Err(ConnError::protocol(
                    Reason::FLOW_CONTROL_ERROR,
                    "the connection window over 2^31-1",
                ));
            }
            st.wake_senders();
            return Ok(());
        }
        if self.is_idle(st, h.stream) {
            return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream"));
        }
        let Some(s) = st.streams.get_mut(&h.stream) else {
            // A stream already closed and forgotten.
            return self.flood.chatter();
        };
        if s.local_reset || s.send_done {
            // Nothing more will be sent on it: the update is moot.
            return self.flood.chatter();
        }
        if inc == 0 {
            return st.reset_stream(h.stream, Reason::PROTOCOL_ERROR, ResetCause::Fault);
        }
        s.send_window += inc;
        if s.send_window > frame::MAX_WINDOW {
            return st.reset_stream(h.stream, Reason::FLOW_CONTROL_ERROR, ResetCause::Fault);
        }
        s.wake();
        Ok(())
    }
}

//! The connection state under its lock: control frames, sealing and flow-control releases.

use super::*;

impl State {
    pub(super) fn new(role: Role, sealer: Sealer, cfg: &Config) -> State {
        State {
            role,
            sealer,
            out: Out::default(),
            ctl: Vec::new(),
            driver: None,
            streams: HashMap::new(),
            next_id: 1,
            last_peer_id: 0,
            peer: PeerSettings::default(),
            local_window: cfg.stream_window,
            local_max_concurrent: cfg.max_concurrent_streams.unwrap_or(u32::MAX),
            conn_send: i64::from(frame::DEFAULT_WINDOW),
            conn_recv: i64::from(cfg.connection_window),
            conn_unacked: 0,
            conn_target: cfg.connection_window,
            encoder: hpack::Encoder::default(),
            goaway_received: None,
            goaway_sent: false,
            final_goaway: None,
            closed: None,
            send_waiters: Vec::new(),
            handles: usize::from(role == Role::Client),
            reserved: 0,
            fault_resets: 0,
            refusals: Windowed::default(),
            writing: false,
            in_flight: 0,
            driver_after_write: false,
            woken: Vec::new(),
        }
    }

    pub(super) fn fail(&mut self, e: ConnError) {
        if self.closed.is_none() {
            self.closed = Some(e);
        }
        for s in self.streams.values_mut() {
            s.wake();
        }
        self.wake_senders();
        if let Some(w) = self.driver.take() {
            w.wake();
        }
    }

    pub(super) fn wake_senders(&mut self) {
        for w in self.send_waiters.drain(..) {
            w.wake();
        }
    }

    /// Seals the pending control frames into records, after the KeyUpdate the peer asked for if
    /// one is owed (it is answered at the next write, whether or not anything else goes out).
    pub(super) fn seal_control(&mut self) -> Result<(), ConnError> {
        if self.ctl.is_empty() {
            return self.key_update_if_due();
        }
        let ctl = std::mem::take(&mut self.ctl);
        let r = self.seal_plain(&ctl);
        self.ctl = ctl;
        self.ctl.clear();
        r
    }

    fn seal_plain(&mut self, plain: &[u8]) -> Result<(), ConnError> {
        for chunk in plain.chunks(tls::MAX_CONTENT) {
            self.key_update_if_due()?;
            let start = self.out.buf.len();
            self.out.buf.resize(start + tls::OVERHEAD + chunk.len(), 0);
            self.out.buf[start + tls::HEADER_LEN..start + tls::HEADER_LEN + chunk.len()]
                .copy_from_slice(chunk);
            self.sealer.seal(&mut self.out.buf[start..])?;
        }
        self.check_out()
    }

    /// A KeyUpdate before the next record, when the peer asked for one or the key is worn.
    pub(super) fn key_update_if_due(&mut self) -> Result<(), ConnError> {
        if self.sealer.wants_key_update() {
            self.sealer.key_update(&mut self.out.buf)?;
            self.check_out()?;
        }
        Ok(())
    }

    /// The cap on queued bytes ([`OUT_MAX`]), checked wherever bytes are queued.
    pub(super) fn check_out(&self) -> Result<(), ConnError> {
        if self.out.len() + self.in_flight > OUT_MAX {
            return Err(ConnError::protocol(
                Reason::ENHANCE_YOUR_CALM,
                "the peer does not read what it makes us send",
            ));
        }
        Ok(())
    }

    /// Resets stream `id` with `reason` (it may be known or not): RST_STREAM goes out, nothing
    /// more is sent or delivered on it, and what it held goes back to the connection window. A
    /// reset the peer caused counts toward its limit; past it the connection fails.
    pub(super) fn reset_stream(
        &mut self,
        id: u32,
        reason: Reason,
        cause: ResetCause,
    ) -> Result<(), ConnError> {
        match cause {
            ResetCause::Fault => {
                self.fault_resets += 1;
                if self.fault_resets > MAX_FAULT_RESETS {
                    return Err(ConnError::protocol(
                        Reason::ENHANCE_YOUR_CALM,
                        "too many streams reset because of the peer's frames",
                    ));
                }
            }
            ResetCause::Refusal => {
                if self.refusals.over(MAX_REFUSALS) {
                    return Err(ConnError::protocol(
                        Reason::ENHANCE_YOUR_CALM,
                        "too many streams refused or answered before the peer finished",
                    ));
                }
            }
            ResetCause::Ours => {}
        }
        frame::rst_stream(&mut self.ctl, id, reason);
        if let Some(s) = self.streams.get_mut(&id) {
            s.local_reset = true;
            s.send_done = true;
            if s.reset.is_none() {
                s.reset = Some(reason);
            }
            let queued = std::mem::take(&mut s.queued);
            s.queue.clear();
            s.wake();
            self.release(None, queued);
            self.wake_senders();
        }
        Ok(())
    }

    /// `n` bytes of `id` reached the app (or were dropped): their window goes back to the peer
    /// when enough has gathered.
    pub(super) fn release(&mut self, id: Option<u32>, n: usize) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        if n == 0 {
            return;
        }
        self.conn_unacked = self.conn_unacked.saturating_add(n);
        if self.conn_unacked >= (self.conn_target / 2).max(1) {
            frame::window_update(&mut self.ctl, 0, self.conn_unacked);
            self.conn_recv += i64::from(self.conn_unacked);
            self.conn_unacked = 0;
        }
        let threshold = (self.local_window / 2).max(1);
        if let Some(s) = id.and_then(|id| self.streams.get_mut(&id).map(|s| (id, s))) {
            let (id, s) = s;
            if s.recv_done || s.reset.is_some() || s.local_reset {
                return;
            }
            s.recv_unacked = s.recv_unacked.saturating_add(n);
            if s.recv_unacked >= threshold {
                frame::window_update(&mut self.ctl, id, s.recv_unacked);
                s.recv_window += i64::from(s.recv_unacked);
                s.recv_unacked = 0;
            }
        }
    }

    /// Whether the connection accepts new streams from us.
    pub(super) fn open_for_streams(&self) -> bool {
        self.closed.is_none()
            && self.goaway_received.is_none()
            && !self.goaway_sent
            && self.next_id < (1 << 31)
    }
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The initial frames of a connection (after the client's preface).
pub(super) fn initial_frames(cfg: &Config, role: Role, ctl: &mut Vec<u8>) {
    let mut s = Vec::new();
    if role == Role::Client {
        s.push((setting::ENABLE_PUSH, 0));
    }
    if let Some(m) = cfg.max_concurrent_streams {
        s.push((setting::MAX_CONCURRENT_STREAMS, m));
    }
    if cfg.stream_window != frame::DEFAULT_WINDOW {
        s.push((setting::INITIAL_WINDOW_SIZE, cfg.stream_window));
    }
    if cfg.max_frame_size != frame::DEFAULT_MAX_FRAME {
        s.push((setting::MAX_FRAME_SIZE, cfg.max_frame_size));
    }
    s.push((setting::MAX_HEADER_LIST_SIZE, cfg.max_header_list_size));
    frame::settings(ctl, &s);
    if cfg.connection_window > frame::DEFAULT_WINDOW {
        frame::window_update(ctl, 0, cfg.connection_window - frame::DEFAULT_WINDOW);
    }
}

pub(super) fn new_connection(
    tcp: TcpStream,
    tls: Established,
    cfg: Config,
    role: Role,
) -> Result<(Arc<Shared>, Driver), ConnError> {
    let cfg = Config {
        max_frame_size: cfg.max_frame_size.clamp(frame::DEFAULT_MAX_FRAME, frame::MAX_MAX_FRAME),
        stream_window: cfg.stream_window.min(frame::MAX_WINDOW as u32),
        connection_window: cfg.connection_window.clamp(frame::DEFAULT_WINDOW, frame::MAX_WINDOW as u32),
        ..cfg
    };
    let Established { session, sealer, leftover, .. } = tls;
    let mut st = State::new(role, sealer, &cfg);
    if role == Role::Client {
        st.ctl.extend_from_slice(frame::PREFACE);
    }
    initial_frames(&cfg, role, &mut st.ctl);
    let shared = Arc::new(Shared {
        tcp,
        state: Mutex::new(st),
        #[cfg(test)]
        writes: std::sync::atomic::AtomicUsize::new(0),
    });
    {
        let mut st = shared.lock();
        shared.flush(&mut st);
        if let Some(e) = &st.closed {
            return Err(e.clone());
        }
    }
    let max_block = Proto::max_block(&cfg);
    let driver = Driver {
        shared: shared.clone(),
        session,
        reader: frame::Reader::new(cfg.max_frame_size, max_block),
        proto: Proto::new(role, &cfg, max_block),
        leftover,
        stash: Vec::new(),
        stashed: 0,
        lowat: 1,
        woken: Vec::new(),
        keepalive: cfg.keepalive.map(|k| KeepaliveState {
            cfg: k,
            timer: Box::pin(tokio::time::sleep(k.interval)),
            outstanding: None,
            next_payload: 1,
        }),
        eof: false,
        close_notify: false,
        done: None,
    };
    Ok((shared, driver))
}

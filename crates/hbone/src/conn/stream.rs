//! One stream: its head, resets, and the relay between the stream and an app socket, with the
//! send path that reads the app straight into TLS records.

use super::*;

/// Where a relay counts the bytes it moves, as they move (so metrics change while a tunnel is
/// open).
pub trait RelayCounters: Send + Sync {
    /// `n` bytes read from the app went into the stream.
    fn app_to_stream(&self, n: usize);
    /// `n` bytes from the stream were written to the app.
    fn stream_to_app(&self, n: usize);
}

impl StreamHandle {
    /// The stream id.
    pub fn id(&self) -> u32 {
        self.id
    }

    pub(super) fn poll_response(&self, cx: &mut Context<'_>) -> Poll<Result<Decoded, StreamError>> {
        let mut st = self.shared.lock();
        let closed = st.closed.clone();
        let Some(s) = st.streams.get_mut(&self.id) else { return Poll::Ready(Err(StreamError::Closed)) };
        if let Some(head) = s.head.take() {
            return Poll::Ready(head.map_err(StreamError::Headers));
        }
        if s.refused {
            return Poll::Ready(Err(StreamError::Refused));
        }
        if let Some(r) = s.reset {
            return Poll::Ready(Err(StreamError::Reset(r)));
        }
        if let Some(e) = closed {
            return Poll::Ready(Err(StreamError::Connection(e)));
        }
        s.recv_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Runs `f` while our side of the stream is open (the connection up, no reset, no
    /// END_STREAM sent yet), then writes what it queued.
    pub(super) fn while_open(
        &self,
        f: impl FnOnce(&mut State) -> Result<(), StreamError>,
    ) -> Result<(), StreamError> {
        let mut st = self.shared.lock();
        if let Some(e) = &st.closed {
            return Err(StreamError::Connection(e.clone()));
        }
        let st = &mut *st;
        let Some(s) = st.streams.get_mut(&self.id) else { return Err(StreamError::Closed) };
        if let Some(r) = s.reset {
            return Err(StreamError::Reset(r));
        }
        if s.send_done {
            return Err(StreamError::Closed);
        }
        let r = f(st);
        self.shared.flush(st);
        r
    }

    /// Sends the response head (server side); `end_stream` ends our side with it.
    pub fn respond(&self, status: u16, headers: &HeaderMap, end_stream: bool) -> Result<(), StreamError> {
        let id = self.id;
        self.while_open(|st| {
            let Some(s) = st.streams.get_mut(&id) else { return Err(StreamError::Closed) };
            if s.responded {
                return Err(StreamError::Closed);
            }
            s.responded = true;
            s.send_done = end_stream;
            s.error_answer = !(200..300).contains(&status);
            let mut block = Vec::with_capacity(128);
            st.encoder.response(&mut block, status, headers);
            frame::headers(&mut st.ctl, id, &block, end_stream, st.peer.max_frame);
            Ok(())
        })
    }

    /// Resets the stream with `reason` (REFUSED_STREAM counts as a refusal of the peer's request,
    /// see [`MAX_REFUSALS`]).
    pub fn reset(&self, reason: Reason) {
        let mut st = self.shared.lock();
        let st = &mut *st;
        let open = st.streams.get(&self.id).is_some_and(|s| !s.local_reset && s.reset.is_none());
        if !open || st.closed.is_some() {
            return;
        }
        let cause = if reason == Reason::REFUSED_STREAM { ResetCause::Refusal } else { ResetCause::Ours };
        if let Err(e) = st.reset_stream(self.id, reason, cause) {
            st.fail(e);
        }
        self.shared.flush(st);
    }

    /// Ends our side of the stream (END_STREAM).
    pub fn finish(&self) -> Result<(), StreamError> {
        let id = self.id;
        self.while_open(|st| {
            if let Some(s) = st.streams.get_mut(&id) {
                s.send_done = true;
            }
            frame::data_end(&mut st.ctl, id);
            Ok(())
        })
    }

    /// Whether the peer ended its side and then reset the stream with NO_ERROR: a complete
    /// answer, and a request to stop sending.
    pub(super) fn answered_and_stopped(&self) -> bool {
        let st = self.shared.lock();
        st.streams.get(&self.id).is_some_and(|s| s.recv_done && s.reset == Some(Reason::NO_ERROR))
    }

    /// Resolves when the peer resets the stream or the connection ends, with why.
    pub fn poll_gone(&self, cx: &mut Context<'_>) -> Poll<StreamError> {
        let mut st = self.shared.lock();
        let closed = st.closed.clone();
        let Some(s) = st.streams.get_mut(&self.id) else { return Poll::Ready(StreamError::Closed) };
        if let Some(r) = s.reset {
            return Poll::Ready(StreamError::Reset(r));
        }
        if let Some(e) = closed {
            return Poll::Ready(StreamError::Connection(e));
        }
        s.send_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Reserves send capacity: up to `want` bytes within both windows while the socket keeps
    /// up; registers the waker otherwise.
    pub(super) fn poll_capacity(
        &self,
        cx: &mut Context<'_>,
        want: usize,
    ) -> Poll<Result<usize, StreamError>> {
        let mut st = self.shared.lock();
        match reserve(&mut st, self.id, want, Some(cx))? {
            Capacity::Bytes(n) => Poll::Ready(Ok(n)),
            Capacity::Wait => Poll::Pending,
        }
    }

    /// Sends `data` as DATA frames, waiting for flow-control capacity (a copy into the records;
    /// relays read into the records directly instead, see [`StreamHandle::relay`]).
    pub async fn send(&self, mut data: &[u8]) -> Result<(), StreamError> {
        while !data.is_empty() {
            let cap = std::future::poll_fn(|cx| self.poll_capacity(cx, data.len().min(SLOTS * SLOT_PAYLOAD)))
                .await?;
            let (now, rest) = data.split_at(cap);
            SEND_BUF.with_borrow_mut(|buf| {
                let buf = send_buf(buf);
                fill_slots(buf, now);
                send_slots(&self.shared, self.shared.lock(), self.id, buf, cap, cap, false)
            })?;
            data = rest;
        }
        Ok(())
    }

    /// The next received bytes (`None` at END_STREAM); their window goes back to the peer.
    pub async fn recv(&self) -> Option<Result<Bytes, StreamError>> {
        std::future::poll_fn(|cx| {
            let mut st = self.shared.lock();
            let st = &mut *st;
            let closed = st.closed.clone();
            let Some(s) = st.streams.get_mut(&self.id) else {
                return Poll::Ready(Some(Err(StreamError::Closed)));
            };
            if let Some(b) = s.queue.pop_front() {
                s.queued -= b.len();
                let n = b.len();
                st.release(Some(self.id), n);
                self.shared.flush(st);
                return Poll::Ready(Some(Ok(b)));
            }
            if s.recv_done {
                return Poll::Ready(None);
            }
            if let Some(r) = s.reset {
                return Poll::Ready(Some(Err(StreamError::Reset(r))));
            }
            if let Some(e) = closed {
                return Poll::Ready(Some(Err(StreamError::Connection(e))));
            }
            s.recv_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Relays between the stream and `app` until both directions end, counting bytes in
    /// `counters` as they move. Half-closes pass
    /// through (END_STREAM ⇄ FIN). A reset stream or a dead connection ends the relay at once
    /// and resets the app's connection; an app that fails resets the stream.
    pub async fn relay(self, app: TcpStream, counters: Arc<dyn RelayCounters>) -> io::Result<()> {
        let app = Arc::new(app);
        {
            let mut st = self.shared.lock();
            if let Some(s) = st.streams.get_mut(&self.id) {
                s.app = Some(app.clone());
                s.counters = Some(counters.clone());
            }
        }
        let up = async {
            match self.app_to_stream(&app, &*counters).await {
                // The peer answered in full and asked us to stop sending (RST_STREAM NO_ERROR
                // after END_STREAM, RFC 9113 §8.1): the upload is over, not failed, and the
                // answer still goes to the app.
                Err(e) if e.kind() == crate::GONE && self.answered_and_stopped() => Ok(()),
                r => r,
            }
        };
        let down = self.stream_to_app(&app);
        let res = tokio::try_join!(up, down).map(|_| ());
        {
            let mut st = self.shared.lock();
            if let Some(s) = st.streams.get_mut(&self.id) {
                s.app = None;
                s.counters = None;
            }
        }
        if let Err(e) = &res
            && e.kind() == crate::GONE
        {
            // The other side is gone: reset the app rather than leave unsent bytes queued to it.
            let _ = socket2::SockRef::from(&*app).set_linger(Some(Duration::ZERO));
        }
        res
    }

    pub(super) async fn app_to_stream(
        &self,
        app: &TcpStream,
        counters: &dyn RelayCounters,
    ) -> io::Result<()> {
        loop {
            // Wait for the app, watching for the stream to go (only while waiting: a stream
            // gone while the app has data shows when capacity is reserved).
            std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = app.poll_read_ready(cx) {
                    return Poll::Ready(r);
                }
                match self.poll_gone(cx) {
                    Poll::Ready(e) => Poll::Ready(Err(gone(e))),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await?;
            let cap =
                std::future::poll_fn(|cx| self.poll_capacity(cx, SLOTS * SLOT_PAYLOAD).map_err(gone)).await?;
            let read = SEND_BUF.with_borrow_mut(|buf| {
                let buf = send_buf(buf);
                let n = {
                    let mut slices: [io::IoSliceMut<'_>; SLOTS] =
                        std::array::from_fn(|_| io::IoSliceMut::new(&mut []));
                    let mut left = cap;
                    let mut used = 0;
                    for (slot, slice) in buf.chunks_mut(SLOT).zip(slices.iter_mut()) {
                        if left == 0 {
                            break;
                        }
                        let len = left.min(SLOT_PAYLOAD);
                        left -= len;
                        let at = tls::HEADER_LEN + frame::HEADER_LEN;
                        *slice = io::IoSliceMut::new(&mut slot[at..at + len]);
                        used += 1;
                    }
                    read_drained(app, &mut slices[..used], cap)
                };
                // The app's FIN already behind these bytes ends the stream in their frame.
                let end = matches!(n, Ok(n) if n > 0 && n < cap && read_closed(app));
                let mut st = self.shared.lock();
                match n {
                    Ok(0) => {
                        unreserve(&mut st, self.id, cap, 0);
                        Ok((0, false))
                    }
                    Ok(n) => send_slots(&self.shared, st, self.id, buf, n, cap, end)
                        .map(|_| (n, end))
                        .map_err(gone),
                    Err(e) => {
                        unreserve(&mut st, self.id, cap, 0);
                        Err(e)
                    }
                }
            });
            match read {
                Ok((0, _)) => {
                    return match self.finish() {
                        Ok(()) | Err(StreamError::Closed) => Ok(()),
                        Err(e) => Err(gone(e)),
                    };
                }
                Ok((n, end)) => {
                    counters.app_to_stream(n);
                    if end {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if crate::is_benign(&e) => {
                    let _ = self.finish();
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub(super) async fn stream_to_app(&self, app: &TcpStream) -> io::Result<()> {
        let fin_owed = match std::future::poll_fn(|cx| self.poll_to_app(app, cx)).await {
            // The app went away (reset, broken pipe): this direction is over, not failed, as
            // in the plain relays; the stream is reset when the relay ends.
            Err(e) if crate::is_benign(&e) => return Ok(()),
            r => r?,
        };
        if !fin_owed {
            return Ok(());
        }
        // END_STREAM, and everything before it written: FIN to the app.
        match socket2::SockRef::from(app).shutdown(std::net::Shutdown::Write) {
            Err(e) if !crate::is_benign(&e) => Err(e),
            _ => Ok(()),
        }
    }

    /// Writes the stream's queue to the app; ready at END_STREAM with the queue written, with
    /// whether the app's FIN is still to be sent.
    pub(super) fn poll_to_app(&self, app: &TcpStream, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        let mut st = self.shared.lock();
        let st = &mut *st;
        let closed = st.closed.clone();
        let id = self.id;
        loop {
            let Some(s) = st.streams.get_mut(&id) else { return Poll::Ready(Err(gone(StreamError::Closed))) };
            if s.app_failed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "writing to the app failed",
                )));
            }
            // The last bytes of an ended stream go with MSG_MORE, which holds their segment for
            // the FIN right behind them, as the driver sends them (the answer can be queued before
            // the relay began: early data brings it back that fast).
            let flags = if s.recv_done && s.queue.len() == 1 { libc::MSG_MORE } else { 0 };
            if let Some(front) = s.queue.front_mut() {
                let written = app.try_io(tokio::io::Interest::WRITABLE, || {
                    socket2::SockRef::from(app).send_with_flags(front, flags)
                });
                match written {
                    Ok(n) => {
                        let _ = front.split_to(n);
                        if front.is_empty() {
                            s.queue.pop_front();
                        }
                        s.queued -= n;
                        s.count_received(n);
                        st.release(Some(id), n);
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.shared.flush(st);
                        let Some(s) = st.streams.get_mut(&id) else { continue };
                        // A NO_ERROR reset after the peer's END_STREAM leaves its bytes to write.
                        if let Some(r) = s.reset
                            && !(r == Reason::NO_ERROR && s.recv_done)
                        {
                            return Poll::Ready(Err(gone(StreamError::Reset(r))));
                        }
                        if let Some(e) = &closed {
                            return Poll::Ready(Err(gone(StreamError::Connection(e.clone()))));
                        }
                        s.recv_waker = Some(cx.waker().clone());
                        match app.poll_write_ready(cx) {
                            Poll::Ready(Ok(())) => continue,
                            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                            Poll::Pending => return Poll::Pending,
                        }
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            self.shared.flush(st);
            let Some(s) = st.streams.get_mut(&id) else { return Poll::Ready(Err(gone(StreamError::Closed))) };
            if s.recv_done {
                // Everything written: the FIN now, in the same go (unless the driver, having
                // written the last bytes itself, sent it already).
                s.fin_to_app();
                // Whether the FIN is still the caller's to send (no app attached to the stream).
                return Poll::Ready(Ok(!std::mem::replace(&mut s.app_fin, true)));
            }
            if let Some(r) = s.reset {
                return Poll::Ready(Err(gone(StreamError::Reset(r))));
            }
            if let Some(e) = &closed {
                return Poll::Ready(Err(gone(StreamError::Connection(e.clone()))));
            }
            s.recv_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        let st = &mut *st;
        let Some(s) = st.streams.remove(&self.id) else { return };
        let ended = s.local_reset || s.reset.is_some() || (s.send_done && s.recv_done);
        if !ended && st.closed.is_none() {
            // A complete answer before the peer finished asks it to stop sending, without an
            // error (RFC 9113 §8.1); an error answer so given counts as a refusal.
            let (reason, cause) = match (s.responded && s.send_done, s.error_answer) {
                (true, true) => (Reason::NO_ERROR, ResetCause::Refusal),
                (true, false) => (Reason::NO_ERROR, ResetCause::Ours),
                (false, _) => (Reason::CANCEL, ResetCause::Ours),
            };
            if let Err(e) = st.reset_stream(self.id, reason, cause) {
                st.fail(e);
            }
        }
        // What the stream still held goes back to the connection window.
        st.release(None, s.queued);
        if st.streams.is_empty() && st.streams.capacity() > 16 {
            // A burst of streams is over: the map's room goes back.
            st.streams = HashMap::new();
        }
        self.shared.flush(st);
        if st.streams.is_empty()
            && let Some(w) = &st.driver
        {
            w.wake_by_ref();
        }
    }
}

/// The "gone" error of the relays (see [`crate::GONE`]).
pub(super) fn gone(e: StreamError) -> io::Error {
    let what = match &e {
        StreamError::Reset(r) => format!("the HBONE stream was reset by the peer: {r}"),
        other => format!("the HBONE stream is gone: {other}"),
    };
    io::Error::new(crate::GONE, what)
}

/// Reads from `sock` into `bufs` (`want` bytes of room). A short read means the socket's queue
/// was emptied: its readiness is cleared then, as tokio's own reads do, so the next wait needs no
/// extra read that would only find nothing.
pub(super) fn read_drained(
    sock: &TcpStream,
    bufs: &mut [io::IoSliceMut<'_>],
    want: usize,
) -> io::Result<usize> {
    use std::io::Read;
    let mut n = 0;
    let r = sock.try_io(tokio::io::Interest::READABLE, || {
        n = (&*socket2::SockRef::from(sock)).read_vectored(bufs)?;
        if n > 0 && n < want { Err(io::ErrorKind::WouldBlock.into()) } else { Ok(n) }
    });
    match r {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && n > 0 => Ok(n),
        r => r,
    }
}

/// Whether the app's FIN has arrived and nothing after it: its readiness tells at no cost when
/// nothing did (a short read cleared it), and a peek then tells the FIN from new bytes.
fn read_closed(app: &TcpStream) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    if app.poll_read_ready(&mut cx).is_pending() {
        return false;
    }
    let mut one = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    let peeked = app.try_io(tokio::io::Interest::READABLE, || socket2::SockRef::from(app).peek(&mut one));
    matches!(peeked, Ok(0))
}

pub(super) fn send_buf(buf: &mut Vec<u8>) -> &mut [u8] {
    if buf.len() < SLOTS * SLOT {
        buf.resize(SLOTS * SLOT, 0);
    }
    &mut buf[..SLOTS * SLOT]
}

/// Reserves up to `want` bytes of both windows for stream `id`.
pub(super) fn reserve(
    st: &mut State,
    id: u32,
    want: usize,
    cx: Option<&mut Context<'_>>,
) -> Result<Capacity, StreamError> {
    if let Some(e) = &st.closed {
        return Err(StreamError::Connection(e.clone()));
    }
    let conn_send = st.conn_send;
    let out_full = st.out.len() + st.in_flight + st.reserved >= OUT_HIGH;
    let Some(s) = st.streams.get_mut(&id) else { return Err(StreamError::Closed) };
    if let Some(r) = s.reset {
        return Err(StreamError::Reset(r));
    }
    if s.send_done {
        return Err(StreamError::Closed);
    }
    let cap = s.send_window.min(conn_send).min(want as i64);
    if cap > 0 && !out_full {
        s.send_window -= cap;
        st.conn_send -= cap;
        st.reserved += cap as usize;
        return Ok(Capacity::Bytes(cap as usize));
    }
    if let Some(cx) = cx {
        s.send_waker = Some(cx.waker().clone());
        if conn_send <= 0 || out_full {
            st.send_waiters.push(cx.waker().clone());
        }
    }
    Ok(Capacity::Wait)
}

/// Copies `data` into the payloads of the send buffer's slots.
fn fill_slots(buf: &mut [u8], data: &[u8]) {
    for (i, part) in data.chunks(SLOT_PAYLOAD).enumerate() {
        let at = i * SLOT + tls::HEADER_LEN + frame::HEADER_LEN;
        buf[at..at + part.len()].copy_from_slice(part);
    }
}

/// Sends what of `data` stream `id`'s windows take now, without waiting, in one write with the
/// control frames queued before it (a new stream's HEADERS); writes the queue alone when
/// nothing fits. Returns how many bytes went.
pub(super) fn send_now(
    shared: &Shared,
    mut st: MutexGuard<'_, State>,
    id: u32,
    data: &[u8],
) -> Result<usize, StreamError> {
    let n = match reserve(&mut st, id, data.len().min(SLOTS * SLOT_PAYLOAD), None) {
        Ok(Capacity::Bytes(n)) => n,
        other => {
            shared.flush(&mut st);
            return other.map(|_| 0);
        }
    };
    SEND_BUF.with_borrow_mut(|buf| {
        let buf = send_buf(buf);
        fill_slots(buf, &data[..n]);
        send_slots(shared, st, id, buf, n, n, false)
    })?;
    Ok(n)
}

/// Ends a reservation of `reserved` bytes of which `used` were sent: the rest goes back to the
/// windows.
pub(super) fn unreserve(st: &mut State, id: u32, reserved: usize, used: usize) {
    st.reserved = st.reserved.saturating_sub(reserved);
    let n = (reserved - used) as i64;
    st.conn_send += n;
    if let Some(s) = st.streams.get_mut(&id) {
        s.send_window += n;
    }
    // Senders waiting for window or for the queue (which counts reservations) may go on.
    if reserved > 0 {
        st.wake_senders();
    }
}

/// Frames and seals the first `n` payload bytes sitting in `buf`'s slots (capacity `reserved`
/// was taken for them) and writes the records (the lock is released for the write, see
/// [`Shared::write_records`]); `end` ends our side of the stream with them (END_STREAM on the
/// last frame).
pub(super) fn send_slots(
    shared: &Shared,
    mut st: MutexGuard<'_, State>,
    id: u32,
    buf: &mut [u8],
    n: usize,
    reserved: usize,
    end: bool,
) -> Result<(), StreamError> {
    unreserve(&mut st, id, reserved, n);
    if let Some(e) = &st.closed {
        return Err(StreamError::Connection(e.clone()));
    }
    match st.streams.get(&id) {
        None => return Err(StreamError::Closed),
        Some(s) if s.reset.is_some() || s.send_done => {
            return Err(s.reset.map(StreamError::Reset).unwrap_or(StreamError::Closed));
        }
        Some(_) => {}
    }
    // Control frames queued before these records go first.
    if let Err(e) = st.seal_control().and_then(|()| st.key_update_if_due()) {
        st.fail(e.clone());
        return Err(StreamError::Connection(e));
    }
    let mut used = 0;
    let mut left = n;
    for slot in buf.chunks_mut(SLOT) {
        if left == 0 {
            break;
        }
        let len = left.min(SLOT_PAYLOAD);
        left -= len;
        let rec_len = tls::OVERHEAD + frame::HEADER_LEN + len;
        let flags = if end && left == 0 { flag::END_STREAM } else { 0 };
        Head { len: len as u32, kind: kind::DATA, flags, stream: id }
            .encode(&mut slot[tls::HEADER_LEN..tls::HEADER_LEN + frame::HEADER_LEN]);
        if let Err(e) = st.sealer.seal(&mut slot[..rec_len]) {
            let e = ConnError::from(e);
            st.fail(e.clone());
            return Err(StreamError::Connection(e));
        }
        used += rec_len;
    }
    if end && let Some(s) = st.streams.get_mut(&id) {
        s.send_done = true;
    }
    shared.write_records(st, &buf[..used]);
    Ok(())
}

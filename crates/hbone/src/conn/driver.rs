//! The driver: reads, decrypts and dispatches what the peer sends, writes what is queued, and
//! runs the keepalive.

use super::*;

impl Driver {
    pub(super) fn finish(&mut self, e: ConnError) {
        let mut st = self.shared.lock();
        st.fail(e);
        drop(st);
        let _ = socket2::SockRef::from(&self.shared.tcp).shutdown(std::net::Shutdown::Both);
    }

    pub(super) fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnError>> {
        if let Some(r) = &self.done {
            return Poll::Ready(r.clone());
        }
        match self.drive(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                match &r {
                    Ok(()) => self.finish(ConnError::closed()),
                    Err(e) => {
                        // Tell the peer why, best effort: GOAWAY for an HTTP/2 error, the alert
                        // `tls_failure` queued for a TLS one.
                        let mut st = self.shared.lock();
                        match e.kind {
                            ConnErrorKind::Protocol(reason) => {
                                // After what was queued (the resets that led here, say).
                                let last = st.last_peer_id;
                                frame::goaway(&mut st.ctl, last, reason);
                                if st.seal_control().is_ok() && !st.writing {
                                    let _ = self.shared.send(st.out.pending());
                                }
                            }
                            // A writer writing now sends these after its bytes.
                            ConnErrorKind::Tls if !st.writing => {
                                let _ = self.shared.send(st.out.pending());
                            }
                            _ => {}
                        }
                        drop(st);
                        self.finish(e.clone());
                    }
                }
                self.done = Some(r.clone());
                Poll::Ready(r)
            }
        }
    }

    pub(super) fn drive(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnError>> {
        {
            let mut st = self.shared.lock();
            if !st.driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                st.driver = Some(cx.waker().clone());
            }
            if let Some(e) = &st.closed {
                return Poll::Ready(Err(e.clone()));
            }
        }
        if !self.leftover.is_empty() {
            // Records the peer sent right behind its handshake.
            let mut leftover = std::mem::take(&mut self.leftover);
            let shared = self.shared.clone();
            let mut st = shared.lock();
            let r = self.records(&mut st, &mut leftover);
            if let Ok(used) = r {
                self.keep_partial(&leftover[used..]);
            }
            shared.flush(&mut st);
            self.wake_delivered(st);
            if let Err(e) = r {
                return Poll::Ready(Err(e));
            }
        }
        if let Err(e) = self.poll_keepalive(cx) {
            return Poll::Ready(Err(e));
        }
        if !self.eof && !self.close_notify {
            match self.poll_read(cx) {
                Poll::Ready(Ok(Read::Eof)) => self.eof = true,
                Poll::Ready(Ok(Read::Data)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
        }
        // After close_notify nothing more comes, whether or not the peer closes its socket.
        self.eof |= self.close_notify;
        if let Poll::Ready(Err(e)) = self.poll_flush(cx) {
            return Poll::Ready(Err(e));
        }
        let mut st = self.shared.lock();
        if let Some(e) = &st.closed {
            return Poll::Ready(Err(e.clone()));
        }
        if st.writing {
            // Nothing is written under the writer's feet; it wakes us when it is done.
            st.driver_after_write = true;
            return Poll::Pending;
        }
        if self.eof {
            // The peer closed its side: nothing more will come. Its close_notify is answered
            // with ours (RFC 8446 §6.1), after what was still queued.
            if self.close_notify {
                drop(st);
                let mut st = self.shared.lock();
                let st = &mut *st;
                if st.seal_control().is_ok() && st.sealer.close_notify(&mut st.out.buf).is_ok() && !st.writing
                {
                    let _ = self.shared.send(st.out.pending());
                }
                return Poll::Ready(Ok(()));
            }
            return Poll::Ready(if st.streams.is_empty() {
                Ok(())
            } else {
                Err(ConnError::new(ConnErrorKind::Io, "connection closed by the peer"))
            });
        }
        let idle = st.streams.is_empty() && self.proto.incoming.is_empty();
        let client_gone = st.role == Role::Client && st.handles == 0;
        // A server's shutdown waits for its final GOAWAY: streams in flight still come in.
        let ours_done = match st.role {
            Role::Client => st.goaway_sent,
            Role::Server => st.final_goaway.is_some(),
        };
        let going_away = ours_done || st.goaway_received.is_some();
        if idle && (client_gone || going_away) && st.out.is_empty() {
            drop(st);
            return Poll::Ready(self.close_gracefully(client_gone));
        }
        Poll::Pending
    }

    /// Ends an idle connection: GOAWAY (unless sent), close_notify, FIN.
    pub(super) fn close_gracefully(&mut self, send_goaway: bool) -> Result<(), ConnError> {
        let mut st = self.shared.lock();
        let st = &mut *st;
        if send_goaway && !st.goaway_sent {
            st.goaway_sent = true;
            let last = st.last_peer_id;
            frame::goaway(&mut st.ctl, last, Reason::NO_ERROR);
        }
        st.seal_control()?;
        st.sealer.close_notify(&mut st.out.buf)?;
        let _ = self.shared.send(st.out.pending());
        Ok(())
    }

    pub(super) fn poll_keepalive(&mut self, cx: &mut Context<'_>) -> Result<(), ConnError> {
        if let Some(p) = self.proto.pong.take()
            && let Some(k) = &mut self.keepalive
            && k.outstanding == Some(p)
        {
            k.outstanding = None;
            k.timer.as_mut().reset(Instant::now() + k.cfg.interval);
        }
        let Some(k) = &mut self.keepalive else { return Ok(()) };
        while k.timer.as_mut().poll(cx).is_ready() {
            if k.outstanding.is_some() {
                return Err(ConnError::new(ConnErrorKind::PeerDead, "the peer stopped answering PINGs"));
            }
            let payload = k.next_payload.to_be_bytes();
            k.next_payload += 1;
            k.outstanding = Some(payload);
            k.timer.as_mut().reset(Instant::now() + k.cfg.timeout);
            let mut st = self.shared.lock();
            frame::ping(&mut st.ctl, payload, false);
            self.shared.flush(&mut st);
        }
        Ok(())
    }

    pub(super) fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnError>> {
        let mut st = self.shared.lock();
        if let Err(e) = st.seal_control() {
            return Poll::Ready(Err(e));
        }
        if st.writing {
            // A writer takes what is queued; it wakes us when it is done.
            st.driver_after_write = true;
            return Poll::Ready(Ok(()));
        }
        while !st.out.is_empty() {
            if let Err(e) = ready!(self.shared.tcp.poll_write_ready(cx)) {
                return Poll::Ready(Err(ConnError::io(&e)));
            }
            match self.shared.send(st.out.pending()) {
                Ok(n) => st.out.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(ConnError::io(&e))),
            }
        }
        if !st.send_waiters.is_empty() {
            st.wake_senders();
        }
        Poll::Ready(Ok(()))
    }

    /// Reads what the peer sent and dispatches its whole records. A record that arrived in part
    /// waits in the stash, sized to the whole record once its header is in; the next read
    /// puts the missing bytes straight into the stash's tail (and the rest into the receive
    /// buffer, in the same call), so a record costs one copy however small the pieces it came in.
    pub(super) fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Result<Read, ConnError>> {
        let shared = self.shared.clone();
        for _ in 0..READS_PER_POLL {
            if let Err(e) = ready!(shared.tcp.poll_read_ready(cx)) {
                return Poll::Ready(Err(ConnError::io(&e)));
            }
            let r = RECV.with_borrow_mut(|buf| {
                if buf.len() < RECV_BUF {
                    buf.resize(RECV_BUF, 0);
                }
                let missing = self.stash.len() - self.stashed;
                let read = {
                    let tail = &mut self.stash[self.stashed..];
                    let mut iov = [io::IoSliceMut::new(tail), io::IoSliceMut::new(&mut buf[..])];
                    let iov = if missing > 0 { &mut iov[..] } else { &mut iov[1..] };
                    read_drained(&shared.tcp, iov, missing + RECV_BUF)
                };
                let n = match read {
                    Ok(0) => return Ok(Some(Read::Eof)),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                    Err(e) => return Err(ConnError::io(&e)),
                };
                let mut st = shared.lock();
                let r = self.received(&mut st, buf, n);
                shared.flush(&mut st);
                self.wake_delivered(st);
                self.tune_lowat(n);
                r.map(|()| Some(Read::Data))
            });
            match r {
                Ok(None) => {}
                Ok(Some(Read::Eof)) => {
                    if !self.stash.is_empty() && !self.close_notify {
                        return Poll::Ready(Err(ConnError::new(
                            ConnErrorKind::Io,
                            "connection closed inside a TLS record",
                        )));
                    }
                    return Poll::Ready(Ok(Read::Eof));
                }
                Ok(Some(Read::Data)) => {
                    if self.close_notify {
                        return Poll::Ready(Ok(Read::Eof));
                    }
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        // Fair to other tasks: come back after they ran.
        cx.waker().wake_by_ref();
        Poll::Ready(Ok(Read::Data))
    }

    /// Releases the lock, then wakes the streams that were delivered to under it.
    fn wake_delivered(&mut self, mut st: MutexGuard<'_, State>) {
        if st.woken.is_empty() {
            return;
        }
        std::mem::swap(&mut st.woken, &mut self.woken);
        drop(st);
        for w in self.woken.drain(..) {
            w.wake();
        }
    }

    /// Handles `n` bytes just read: the first go to the stash's tail (as many as it was
    /// missing), the rest are at the start of `buf`.
    fn received(&mut self, st: &mut State, buf: &mut [u8], n: usize) -> Result<(), ConnError> {
        let into_stash = n.min(self.stash.len() - self.stashed);
        self.stashed += into_stash;
        let mut rest = &mut buf[..n - into_stash];
        if !self.stash.is_empty() {
            if self.stashed == self.stash.len() && self.stash.len() == tls::HEADER_LEN {
                // The header is in: size the stash to the whole record.
                let len = match tls::record_len(&self.stash) {
                    Ok(Some(len)) => len,
                    // A complete stash holds a header at least.
                    Ok(None) => return Ok(()),
                    Err(e) => return Err(self.tls_failure(st, e)),
                };
                self.stash.resize(len, 0);
                let take = (len - self.stashed).min(rest.len());
                self.stash[self.stashed..self.stashed + take].copy_from_slice(&rest[..take]);
                self.stashed += take;
                rest = &mut rest[take..];
            }
            if self.stashed < self.stash.len() {
                // Still waiting for the rest of the record (the read ended inside it).
                return Ok(());
            }
            let mut rec = std::mem::take(&mut self.stash);
            self.stashed = 0;
            self.records(st, &mut rec)?;
            // Reused for the next partial record, if there is one.
            rec.clear();
            self.stash = rec;
        }
        let used = self.records(st, rest)?;
        self.keep_partial(&rest[used..]);
        Ok(())
    }

    /// A peer trickling a record in small pieces would wake us for every piece: after a small
    /// read that ended inside a record, the socket reads as ready only once the rest of the
    /// record is in (SO_RCVLOWAT), and back at one byte once it was read.
    fn tune_lowat(&mut self, read: usize) {
        let missing = self.stash.len() - self.stashed;
        let want = if missing > 1 && read < TRICKLE_READ { missing } else { 1 };
        if want != self.lowat && crate::lowat::set(&self.shared.tcp, want).is_ok() {
            self.lowat = want;
        }
    }

    /// Keeps `bytes`, the start of a record, until the rest arrives.
    fn keep_partial(&mut self, bytes: &[u8]) {
        if bytes.is_empty() || self.close_notify {
            // Nothing partial: the connection keeps no buffer.
            self.stash = Vec::new();
            self.stashed = 0;
            return;
        }
        // `records` refused a bad header, so a header here is a good one.
        let size = match tls::record_len(bytes) {
            Ok(Some(len)) => len,
            _ => tls::HEADER_LEN,
        };
        self.stash.clear();
        self.stash.extend_from_slice(bytes);
        self.stash.resize(size.max(bytes.len()), 0);
        self.stashed = bytes.len();
    }

    /// Opens and dispatches the whole records at the start of `buf`; returns the bytes used.
    pub(super) fn records(&mut self, st: &mut State, buf: &mut [u8]) -> Result<usize, ConnError> {
        let mut at = 0;
        let mut rest = buf;
        // DATA payloads of this read, written to their apps once the read is dispatched: one
        // write per stream and read, not one per record.
        let mut pending: Vec<(u32, &[u8])> = Vec::new();
        let r = loop {
            if self.close_notify {
                break Ok(());
            }
            let len = match tls::record_len(rest) {
                Ok(Some(len)) if len <= rest.len() => len,
                Ok(_) => break Ok(()),
                Err(e) => break Err(self.tls_failure(st, e)),
            };
            let (rec, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            at += len;
            let content = match self.session.open(rec) {
                Ok(c) => c,
                Err(e) => break Err(self.tls_failure(st, e)),
            };
            let rec: &[u8] = rec;
            let step = match content {
                Content::Data(r) => self.plaintext(st, &rec[r], &mut pending),
                // A KeyUpdate the peer asked for is owed: it goes out before our next record.
                Content::Handshake(r) => match self.session.handshake(&rec[r], &mut st.sealer) {
                    Ok(()) => Ok(()),
                    Err(e) => Err(self.tls_failure(st, e)),
                },
                Content::CloseNotify => {
                    self.close_notify = true;
                    Ok(())
                }
                Content::UserCanceled => Ok(()),
            };
            if let Err(e) = step {
                break Err(e);
            }
        };
        deliver(st, &pending);
        r.map(|()| at)
    }

    /// The connection fails with `e`: when the peer broke the record protocol, its alert is
    /// queued to go out before the connection closes (RFC 8446 §6.2).
    fn tls_failure(&self, st: &mut State, e: TlsError) -> ConnError {
        if let Some(alert) = e.alert() {
            st.ctl.clear();
            let _ = st.sealer.fatal_alert(&mut st.out.buf, alert);
        }
        e.into()
    }

    /// Dispatches decrypted HTTP/2 bytes; DATA payloads are added to `pending`.
    pub(super) fn plaintext<'i>(
        &mut self,
        st: &mut State,
        mut input: &'i [u8],
        pending: &mut Vec<(u32, &'i [u8])>,
    ) -> Result<(), ConnError> {
        let proto = &mut self.proto;
        if proto.preface_left > 0 {
            let n = proto.preface_left.min(input.len());
            let expect = &frame::PREFACE[frame::PREFACE.len() - proto.preface_left..][..n];
            if &input[..n] != expect {
                return Err(ConnError::protocol(Reason::PROTOCOL_ERROR, "not an HTTP/2 connection preface"));
            }
            proto.preface_left -= n;
            input = &input[n..];
        }
        while let Some(ev) = self.reader.next(&mut input) {
            proto.event(st, ev?, pending)?;
        }
        Ok(())
    }
}

/// Writes the DATA payloads of one read to their streams' apps, in order: each run of one
/// stream's payloads with one vectored write, straight from the receive buffer, when the stream
/// has an app and nothing queued; what the app does not take, and payloads of streams without
/// an app yet, are copied into the stream's queue.
pub(super) fn deliver(st: &mut State, pending: &[(u32, &[u8])]) {
    let mut i = 0;
    while i < pending.len() {
        let id = pending[i].0;
        let mut j = i + 1;
        while j < pending.len() && pending[j].0 == id {
            j += 1;
        }
        deliver_run(st, id, &pending[i..j]);
        i = j;
    }
}

pub(super) fn deliver_run(st: &mut State, id: u32, run: &[(u32, &[u8])]) {
    let total: usize = run.iter().map(|(_, b)| b.len()).sum();
    let Some(s) = st.streams.get_mut(&id) else {
        st.release(None, total);
        return;
    };
    // A RST_STREAM(NO_ERROR) after the peer's END_STREAM, read in the same batch as this data,
    // ends nothing the peer sent (see `Proto::rst_stream`): the data is still delivered.
    let complete = s.reset == Some(Reason::NO_ERROR) && s.recv_done;
    if (s.reset.is_some() && !complete) || s.local_reset || s.app_failed {
        st.release(None, total);
        return;
    }
    let mut written = 0;
    if s.queue.is_empty()
        && let Some(app) = &s.app
    {
        const MAX_IOV: usize = 64;
        let mut slices = [io::IoSlice::new(&[]); MAX_IOV];
        let mut at = 0;
        while at < run.len() {
            let part = &run[at..(at + MAX_IOV).min(run.len())];
            for (slot, (_, b)) in slices.iter_mut().zip(part) {
                *slot = io::IoSlice::new(b);
            }
            let want: usize = part.iter().map(|(_, b)| b.len()).sum();
            // With the stream ended, the FIN follows at once: MSG_MORE holds the data's last
            // segment so that the FIN goes out in it.
            let flags = if s.recv_done { libc::MSG_MORE } else { 0 };
            let sent = app.try_io(tokio::io::Interest::WRITABLE, || {
                socket2::SockRef::from(&**app).send_vectored_with_flags(&slices[..part.len()], flags)
            });
            match sent {
                Ok(n) => {
                    written += n;
                    if n < want {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    // The relay learns of it and ends; the bytes are dropped (those written
                    // before still count).
                    s.count_received(written);
                    s.app_failed = true;
                    s.wake();
                    st.release(None, total);
                    return;
                }
            }
            at += part.len();
        }
    }
    if written > 0 {
        s.count_received(written);
    }
    if written < total {
        let mut rest = bytes::BytesMut::with_capacity(total - written);
        let mut skip = written;
        for (_, b) in run {
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            rest.extend_from_slice(&b[skip..]);
            skip = 0;
        }
        s.queued += rest.len();
        s.queue.push_back(rest.freeze());
        if let Some(w) = s.recv_waker.take() {
            // Woken once the driver released the lock (see `Driver::wake_delivered`).
            st.woken.push(w);
        }
    }
    s.fin_to_app();
    if written > 0 {
        st.release(Some(id), written);
    }
}

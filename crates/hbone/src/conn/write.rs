//! The socket writes every task of a connection shares.
//!
//! Records are sealed under the connection's lock (their sequence numbers are the order they
//! must go out in), but a stream's records are written to the socket outside it: a `send` to a
//! peer on the same host runs the peer's whole receive path in the kernel (the veth, bridge,
//! netfilter and TCP), so a lock held across it made every other task of the connection wait
//! for it on a futex. Instead one task at a time is the writer ([`State::writing`]): records
//! sealed while it writes are queued, and it writes them, all in one `send`, right after its
//! own; the task that queued them goes on at once. Nothing waits for more to come: a record is
//! written when its task writes it, or by the writer that is already writing, and only what is
//! ready while a write is in progress is coalesced.

use super::*;

/// Writes one writer makes for other tasks before it hands the rest to the driver.
const WRITES_PER_TURN: usize = 8;

impl Shared {
    /// One write to the socket.
    pub(super) fn send(&self, bytes: &[u8]) -> io::Result<usize> {
        #[cfg(test)]
        self.writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.tcp.try_write(bytes)
    }

    fn send_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        #[cfg(test)]
        self.writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.tcp.try_write_vectored(bufs)
    }

    /// Seals pending control frames and writes what is queued, now if the socket takes it (the
    /// driver finishes what it does not); while a writer is writing, it takes them with its next
    /// write.
    pub(super) fn flush(&self, st: &mut State) {
        if let Err(e) = st.seal_control() {
            st.fail(e);
            return;
        }
        if st.out.is_empty() || st.writing {
            return;
        }
        match self.send(st.out.pending()) {
            Ok(n) => st.out.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                st.fail(ConnError::io(&e));
                return;
            }
        }
        if !st.out.is_empty()
            && let Some(w) = &st.driver
        {
            w.wake_by_ref();
        }
    }

    /// Writes sealed records `recs` after whatever is queued. With no writer, this task becomes
    /// the writer: what is queued (control frames sealed before these records, or what a full
    /// socket left) and `recs` go to the socket in one write, `recs` straight from the caller's
    /// buffer, with the lock released; then whatever other tasks queued meanwhile. Otherwise
    /// they are queued, for the writer's next write.
    pub(super) fn write_records(&self, mut st: MutexGuard<'_, State>, recs: &[u8]) {
        if st.writing {
            st.out.buf.extend_from_slice(recs);
            if let Err(e) = st.check_out() {
                st.fail(e);
            }
            return;
        }
        st.writing = true;
        let mut batch = std::mem::take(&mut st.out);
        st.in_flight = batch.len() + recs.len();
        drop(st);
        let r = if batch.is_empty() {
            self.send(recs)
        } else {
            self.send_vectored(&[io::IoSlice::new(batch.pending()), io::IoSlice::new(recs)])
        };
        let mut st = self.lock();
        st.in_flight = 0;
        let n = match r {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => {
                st.writing = false;
                st.fail(ConnError::io(&e));
                return;
            }
        };
        let from_batch = n.min(batch.len());
        batch.advance(from_batch);
        let unsent = &recs[n - from_batch..];
        if !batch.is_empty() || !unsent.is_empty() {
            // The socket is full: what it did not take goes before what was queued meanwhile.
            let queued = std::mem::take(&mut st.out);
            batch.buf.extend_from_slice(unsent);
            batch.buf.extend_from_slice(queued.pending());
            st.out = batch;
            return self.stop_writing(st, true);
        }
        if st.out.is_empty() {
            // Keeps the queue's (small) allocation for the next burst.
            st.out = batch;
        }
        self.write_queued(st);
    }

    /// As the writer: writes what is queued, outside the lock, until the queue is empty or the
    /// socket is full, then gives the role up.
    pub(super) fn write_queued<'a>(&'a self, mut st: MutexGuard<'a, State>) {
        for _ in 0..WRITES_PER_TURN {
            if st.out.is_empty() {
                return self.stop_writing(st, false);
            }
            let mut batch = std::mem::take(&mut st.out);
            st.in_flight = batch.len();
            drop(st);
            let r = self.send(batch.pending());
            st = self.lock();
            st.in_flight = 0;
            match r {
                Ok(n) => batch.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    st.writing = false;
                    st.fail(ConnError::io(&e));
                    return;
                }
            }
            if !batch.is_empty() {
                // The socket is full: the rest of the batch goes before what was queued
                // meanwhile.
                let queued = std::mem::take(&mut st.out);
                batch.buf.extend_from_slice(queued.pending());
                st.out = batch;
                return self.stop_writing(st, true);
            }
            if st.out.is_empty() {
                // Keeps the queue's (small) allocation for the next burst.
                st.out = batch;
            }
        }
        // Other tasks keep queueing: the driver writes the rest, this task goes on with its own
        // work.
        self.stop_writing(st, true);
    }

    /// The writer is done: the driver takes over what a full socket left queued (or was waiting
    /// for the writer), and senders waiting for the queue to drain may go on.
    fn stop_writing(&self, mut st: MutexGuard<'_, State>, blocked: bool) {
        st.writing = false;
        let waiting = std::mem::take(&mut st.driver_after_write);
        if (blocked || waiting)
            && let Some(w) = &st.driver
        {
            w.wake_by_ref();
        }
        if !st.send_waiters.is_empty() {
            st.wake_senders();
        }
    }
}

//! The handles of a connection: the client side that opens CONNECT streams, and the server side
//! that accepts them.

use super::*;

/// The client side of a connection: opens CONNECT streams. Cheap to clone; the connection closes
/// (GOAWAY) once every handle and stream is gone.
pub struct Client {
    shared: Arc<Shared>,
}

impl Clone for Client {
    fn clone(&self) -> Client {
        self.shared.lock().handles += 1;
        Client { shared: self.shared.clone() }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.handles = st.handles.saturating_sub(1);
        if st.handles == 0
            && let Some(w) = &st.driver
        {
            w.wake_by_ref();
        }
    }
}

/// Starts the client side over an established TLS session: sends the preface and our settings.
/// The returned driver must be polled (spawned) for the connection to make progress.
pub fn client(tcp: TcpStream, tls: Established, cfg: Config) -> Result<(Client, Driver), ConnError> {
    let (shared, driver) = new_connection(tcp, tls, cfg, Role::Client)?;
    Ok((Client { shared }, driver))
}

impl Client {
    /// Opens a CONNECT stream to `authority` and waits for the response head. `early`, the app's
    /// first bytes if any, goes right behind the request head, before the response: in the same
    /// write as the HEADERS when the windows take it, so a connection whose client speaks first
    /// costs one record and one round trip less. A peer that refuses the stream never processes
    /// it; one that answers other than 200 discards it. Returns how many of `early` went: the
    /// caller sends the rest after a 200.
    pub async fn connect(
        &self,
        authority: &str,
        headers: &HeaderMap,
        early: &[u8],
    ) -> Result<(StreamHandle, Decoded, usize), StreamError> {
        let (id, sent) = {
            let mut st = self.shared.lock();
            if let Some(e) = &st.closed {
                return Err(StreamError::Connection(e.clone()));
            }
            if !st.open_for_streams() {
                return Err(StreamError::NoNewStreams);
            }
            let id = st.next_id;
            st.next_id += 2;
            let mut block = Vec::with_capacity(256);
            st.encoder.connect(&mut block, authority, headers);
            let max_frame = st.peer.max_frame;
            frame::headers(&mut st.ctl, id, &block, false, max_frame);
            let stream = Stream {
                send_window: i64::from(st.peer.initial_window),
                recv_window: i64::from(st.local_window),
                ..Stream::default()
            };
            st.streams.insert(id, stream);
            if early.is_empty() {
                self.shared.flush(&mut st);
                (id, 0)
            } else {
                (id, super::stream::send_now(&self.shared, st, id, early)?)
            }
        };
        let handle = StreamHandle { shared: self.shared.clone(), id };
        let head = std::future::poll_fn(|cx| handle.poll_response(cx)).await?;
        Ok((handle, head, sent))
    }

    /// Whether the connection takes no more streams (closed, or GOAWAY either way).
    pub fn is_closed(&self) -> bool {
        !self.shared.lock().open_for_streams()
    }

    /// The peer's SETTINGS_MAX_CONCURRENT_STREAMS.
    pub fn max_concurrent_streams(&self) -> u32 {
        self.shared.lock().peer.max_concurrent
    }
}

/// A new stream the peer opened.
pub struct Incoming {
    /// The request head.
    pub head: Decoded,
    /// The stream.
    pub stream: StreamHandle,
}

/// The server side of a connection.
pub struct Server {
    shared: Arc<Shared>,
    driver: Driver,
}

/// Starts the server side over an established TLS session: sends our settings. Poll
/// [`Server::poll_accept`] to drive the connection.
pub fn server(tcp: TcpStream, tls: Established, cfg: Config) -> Result<Server, ConnError> {
    let (shared, driver) = new_connection(tcp, tls, cfg, Role::Server)?;
    Ok(Server { shared, driver })
}

impl Server {
    /// Drives the connection; yields the streams the peer opens. `None` once the connection
    /// closed cleanly; an error once it failed.
    pub fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Incoming, ConnError>>> {
        if let Some(i) = self.next_incoming() {
            return Poll::Ready(Some(Ok(i)));
        }
        let r = self.driver.poll_drive(cx);
        if let Some(i) = self.next_incoming() {
            return Poll::Ready(Some(Ok(i)));
        }
        match r {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => Poll::Ready(None),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
        }
    }

    pub(super) fn next_incoming(&mut self) -> Option<Incoming> {
        let (id, head) = self.driver.proto.incoming.pop_front()?;
        Some(Incoming { head, stream: StreamHandle { shared: self.shared.clone(), id } })
    }

    /// The next stream the peer opens (see [`Server::poll_accept`]).
    pub async fn accept(&mut self) -> Option<Result<Incoming, ConnError>> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// When the client's preface and first SETTINGS arrived.
    pub fn preface_received_at(&self) -> Option<Instant> {
        self.driver.proto.preface_done_at
    }

    /// Starts a graceful shutdown (RFC 9113 §6.8): a GOAWAY that stops new streams while
    /// admitting those already in flight, and a PING; when the PING comes back, the final
    /// GOAWAY names the last stream processed. The connection closes once its streams are done.
    pub fn graceful_shutdown(&self) {
        let mut st = self.shared.lock();
        if !st.goaway_sent && st.closed.is_none() {
            st.goaway_sent = true;
            frame::goaway(&mut st.ctl, MAX_STREAM_ID, Reason::NO_ERROR);
            frame::ping(&mut st.ctl, DRAIN_PING, false);
            self.shared.flush(&mut st);
            if let Some(w) = &st.driver {
                w.wake_by_ref();
            }
        }
    }

    /// Grows the windows granted to the peer (never shrinks them).
    pub fn grow_windows(&self, stream: u32, connection: u32) {
        let mut st = self.shared.lock();
        let stream = stream.min(frame::MAX_WINDOW as u32);
        if stream > st.local_window {
            let delta = i64::from(stream - st.local_window);
            st.local_window = stream;
            for s in st.streams.values_mut() {
                s.recv_window += delta;
            }
            frame::settings(&mut st.ctl, &[(setting::INITIAL_WINDOW_SIZE, stream)]);
        }
        let connection = connection.min(frame::MAX_WINDOW as u32);
        if connection > st.conn_target {
            let inc = connection - st.conn_target;
            st.conn_target = connection;
            st.conn_recv += i64::from(inc);
            frame::window_update(&mut st.ctl, 0, inc);
        }
        self.shared.flush(&mut st);
    }
}

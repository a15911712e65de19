// A connection's time bounds. Keep-alive (uvicorn's `timeout_keep_alive` on the Python data path):
// once no request is open on it, no write of a reply waits on the client, and nothing was read or
// written for `idle`, its reads end as if the client had closed, and hyper closes it. A request's
// head (`head`, CADENCERL_READ_TIMEOUT_S): bytes read with no request open begin one, which must
// become a request within `head` of its first byte, else a 408 is written and the reads end.
// hyper 0.14.19 (Debian's) arms its own header timeout but never polls it (hyper #2888).
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use hyper::body::{Bytes, HttpBody};
use hyper::Body;
use tokio::time::{Instant, Sleep};

/// The requests open on a connection, how many began, and when it last read, wrote or ended one.
pub struct Clock { open: AtomicUsize, begun: AtomicU64, last_ms: AtomicU64, start: Instant }

impl Clock {
    fn stamp(&self) { self.last_ms.store(self.start.elapsed().as_millis() as u64, Relaxed); }

    fn idle_until(&self, idle: Duration) -> Option<Instant> {
        if self.open.load(Relaxed) > 0 { return None; }
        Some(later(self.start + Duration::from_millis(self.last_ms.load(Relaxed)), idle))
    }
}

/// One request open on a connection: from its head until its reply's body is dropped (the relay,
/// or a reply of the router's own app, holds it).
pub struct Open(Arc<Clock>);

impl Open {
    pub fn new(clock: &Arc<Clock>) -> Open {
        clock.open.fetch_add(1, Relaxed);
        clock.begun.fetch_add(1, Relaxed);
        Open(clock.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.stamp();
        self.0.open.fetch_sub(1, Relaxed);
    }
}

/// An accepted connection with its clock. `blocked`: its last write waits on the client (a reply,
/// its request ended, still in hyper's buffer for a client that does not read). The timer is
/// re-armed only when it fires early (a request came meanwhile), not on every read.
pub struct Idle {
    io: TcpStream,
    pub clock: Arc<Clock>,
    idle: Duration,
    head: Duration,
    head_since: Option<(Instant, u64)>,    // the first byte of a head not yet a request, and `begun` then
    timer: Pin<Box<Sleep>>,
    blocked: bool,
}

impl Idle {
    pub fn new(io: TcpStream, idle: Duration, head: Duration) -> Idle {
        let start = Instant::now();
        let clock = Arc::new(Clock { open: AtomicUsize::new(0), begun: AtomicU64::new(0), last_ms: AtomicU64::new(0),
                                     start });
        Idle { io, clock, idle, head, head_since: None, timer: Box::pin(tokio::time::sleep_until(later(start, idle))),
               blocked: false }
    }

    /// When the timer should look again: the keep-alive's deadline, or the head's if sooner.
    fn deadline(&mut self) -> Option<Instant> {
        if matches!(self.head_since, Some((_, n)) if n != self.clock.begun.load(Relaxed)) {
            self.head_since = None;     // it became a request
        }
        let head = self.head_since.map(|(t, _)| later(t, self.head));
        match (self.clock.idle_until(self.idle), head) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A head past its bound: a 408 if nothing of a reply waits to be written, then the reads end.
    fn head_too_slow(&mut self) -> bool {
        let Some((since, _)) = self.head_since else { return false };
        if Instant::now() < later(since, self.head) { return false; }
        if !self.blocked {
            let why = format!("the request head did not arrive within {} s", self.head.as_secs_f64());
            let json = crate::error_json(408, "request_timeout", &why);
            let _ = self.io.try_write(format!("HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n\
                connection: close\r\ncontent-length: {}\r\n\r\n{}", json.len(), json).as_bytes());
        }
        true
    }

    fn wrote(&mut self, result: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        self.blocked = result.is_pending();
        if let Poll::Ready(Ok(n)) = result {
            if n > 0 { self.clock.stamp(); }
        }
        result
    }
}

/// `at + by`, or far ahead where that is past what an Instant holds (an unbounded keep-alive).
fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by).unwrap_or_else(|| at + Duration::from_secs(86_400 * 365 * 30))
}

impl AsyncRead for Idle {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        if let Poll::Ready(read) = Pin::new(&mut this.io).poll_read(cx, buf) {
            if buf.filled().len() > before {
                this.clock.stamp();
                if this.head_since.is_none() && this.clock.open.load(Relaxed) == 0 {
                    this.head_since = Some((Instant::now(), this.clock.begun.load(Relaxed)));
                    this.timer.as_mut().reset(later(Instant::now(), this.head.min(this.idle)));
                }
            }
            return Poll::Ready(read);
        }
        while this.timer.as_mut().poll(cx).is_ready() {
            let deadline = this.deadline();
            if this.head_too_slow() { return Poll::Ready(Ok(())); }    // EOF
            match deadline {
                Some(at) if Instant::now() >= at && !this.blocked => return Poll::Ready(Ok(())),  // EOF
                Some(at) if Instant::now() < at => this.timer.as_mut().reset(at),
                _ => this.timer.as_mut().reset(later(Instant::now(), this.idle)),   // open or blocked: looked at again then
            }
        }
        Poll::Pending
    }
}

impl AsyncWrite for Idle {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(result)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>])
                           -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(result)
    }

    fn is_write_vectored(&self) -> bool { self.io.is_write_vectored() }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The connections `listener` accepts, each with its keep-alive bound. A failed accept is tried
/// again, not the server's end: at once for a connection that went before it was taken, else (out
/// of file descriptors) after 50 ms, said on stderr at most once a second while they keep failing.
pub fn connections(listener: tokio::net::TcpListener, idle: Duration, head: Duration)
                   -> impl futures_util::Stream<Item = Result<Idle, io::Error>> {
    let mut said: Option<Instant> = None;
    futures_util::stream::unfold(listener, move |listener| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    return Some((Ok(Idle::new(stream, idle, head)), listener));
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset) => {}
                Err(e) => {
                    if said.map_or(true, |t| t.elapsed() >= Duration::from_secs(1)) {
                        eprintln!("router data path: accepting a connection failed ({e}); trying again");
                        said = Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    })
}

/// A reply of the router's own app as it goes back, holding its request open.
pub struct Held { pub body: Body, pub _open: Open }

impl futures_util::Stream for Held {
    type Item = Result<Bytes, hyper::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.body).poll_data(cx)
    }
}

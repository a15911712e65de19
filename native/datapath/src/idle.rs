// A connection's keep-alive bound (uvicorn's `timeout_keep_alive` on the Python data path): once no
// request is open on it and nothing was read for `idle`, its reads end as if the client had closed,
// and hyper closes it. hyper 0.14 times a request head only from its first byte, so a client that
// opened connections and sent nothing held each one for good.
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

/// The requests open on a connection, and when it last read or ended one.
pub struct Clock { open: AtomicUsize, last_ms: AtomicU64, start: Instant }

impl Clock {
    fn stamp(&self) { self.last_ms.store(self.start.elapsed().as_millis() as u64, Relaxed); }

    fn idle_until(&self, idle: Duration) -> Option<Instant> {
        if self.open.load(Relaxed) > 0 { return None; }
        Some(self.start + Duration::from_millis(self.last_ms.load(Relaxed)) + idle)
    }
}

/// One request open on a connection: from its head until its reply's body is dropped (the relay,
/// or a reply of the router's own app, holds it).
pub struct Open(Arc<Clock>);

impl Open {
    pub fn new(clock: &Arc<Clock>) -> Open {
        clock.open.fetch_add(1, Relaxed);
        Open(clock.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.stamp();
        self.0.open.fetch_sub(1, Relaxed);
    }
}

/// An accepted connection with its clock. The timer is re-armed only when it fires early (a request
/// came meanwhile), not on every read.
pub struct Idle { io: TcpStream, pub clock: Arc<Clock>, idle: Duration, timer: Pin<Box<Sleep>> }

impl Idle {
    pub fn new(io: TcpStream, idle: Duration) -> Idle {
        let start = Instant::now();
        let clock = Arc::new(Clock { open: AtomicUsize::new(0), last_ms: AtomicU64::new(0), start });
        Idle { io, clock, idle, timer: Box::pin(tokio::time::sleep_until(start + idle)) }
    }
}

impl AsyncRead for Idle {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        if let Poll::Ready(read) = Pin::new(&mut this.io).poll_read(cx, buf) {
            if buf.filled().len() > before { this.clock.stamp(); }
            return Poll::Ready(read);
        }
        while this.timer.as_mut().poll(cx).is_ready() {
            match this.clock.idle_until(this.idle) {
                Some(deadline) if Instant::now() >= deadline => return Poll::Ready(Ok(())),   // read as EOF
                Some(deadline) => this.timer.as_mut().reset(deadline),
                None => this.timer.as_mut().reset(Instant::now() + this.idle),    // open: looked at again then
            }
        }
        Poll::Pending
    }
}

impl AsyncWrite for Idle {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>])
                           -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool { self.io.is_write_vectored() }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The connections `listener` accepts, each with its keep-alive bound. A failed accept (out of file
/// descriptors) is tried again shortly, as hyper's own accept loop does, not the server's end.
pub fn connections(listener: tokio::net::TcpListener, idle: Duration)
                   -> impl futures_util::Stream<Item = Result<Idle, io::Error>> {
    futures_util::stream::unfold(listener, move |listener| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    return Some((Ok(Idle::new(stream, idle)), listener));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
}

/// A reply of the router's own app as it goes back, holding its request open.
pub struct Held { pub body: Body, pub open: Open }

impl futures_util::Stream for Held {
    type Item = Result<Bytes, hyper::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.body).poll_data(cx)
    }
}

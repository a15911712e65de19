// The router's data path in Rust (`cadencerl router --data-path rust`; its Python side is
// cadencerl/router/rust_path.py). hyper serves the port. The two generating routes are read whole
// and queued for Python, which decides each (forward to a server, or reply); hyper relays the
// server's reply and queues the request's end: an SSE stream's tokens counted from its events (its
// end queued before its `[DONE]` goes out, so a client's next turn finds its session parked), a
// JSON reply's body for Python to read its usage (queued before the reply goes out). A server that
// fails before its first byte is reported, and Python places the request again or refuses it; a
// stream that breaks ends with an error event and `[DONE]`. Every other route goes to the router's
// own Python app on a private port (`rest`).
use hyper::body::{Bytes, HttpBody};
use hyper::header::{HeaderName, HeaderValue};
use hyper::server::accept;
use hyper::service::{make_service_fn, service_fn};
use hyper::{Body, Client, Request, Response, Server, Uri};
use pyo3::prelude::*;
use pyo3::intern;
use pyo3::types::{PyBytes, PyDict, PyString};
use std::collections::HashMap;
use std::convert::Infallible;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{oneshot, watch};

mod idle;
mod relay;
use idle::{connections, Clock, Held, Idle, Open};
use relay::{usage_tokens, Relay};

enum Answer { Forward(String, String), Reply(u16, Vec<(String, String)>, Vec<u8>) }

/// What Python is told, in the order it happened.
enum Ev {
    Ask(u64, String, Vec<(String, String)>, Bytes),
    Failed(u64, &'static str, bool),         // no byte came back: what failed, and is the server down
    Done(u64, u16, i64, Option<Bytes>, bool),  // status, tokens counted (-1: read the body), the body, broke
    Refused(&'static str),                   // a body refused here (413, 408): the error kind Python's path counts
}

struct Shared {
    queue: Mutex<Vec<Ev>>,          // Python takes it whole when the bell rings (`take`)
    bell: UnixStream,               // one byte when the queue becomes non-empty; Python's end is on its loop
    waiting: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    stop: watch::Sender<bool>,
}
static SHARED: OnceLock<Shared> = OnceLock::new();
static NEXT: AtomicU64 = AtomicU64::new(0);
static IN_FLIGHT: AtomicI64 = AtomicI64::new(0);

struct Ctx {
    client: Client<hyper::client::HttpConnector>,
    rest: String,
    max_body: usize,
    too_large: Vec<u8>,
    max_head: usize,
    timeout: Duration,       // --request-timeout-secs: for the reply's head, and between its chunks
    read_timeout: Duration,  // CADENCERL_READ_TIMEOUT_S: for the request's head, and between its body's reads
}

/// Queues `Done` once: when fired, or when dropped (the client left at any point after its ask:
/// 499 unless a status came back), so that Python releases or withdraws every request it saw. It
/// holds the request open on its connection (`idle.rs`) until it is dropped: with a relayed
/// stream's body, else as the reply goes to hyper (whose unsent bytes keep the connection then).
struct EndGuard { id: u64, status: u16, armed: bool, broke: bool, _open: Open }

impl EndGuard {
    fn fire(&mut self, tokens: i64, body: Option<Bytes>) {
        if self.armed {
            self.armed = false;
            tell(Ev::Done(self.id, self.status, tokens, body, self.broke));
        }
    }
}

impl Drop for EndGuard {
    fn drop(&mut self) { self.fire(0, None); IN_FLIGHT.fetch_sub(1, Ordering::Relaxed); }
}

/// Queue `ev` for Python, ringing its bell when the queue was empty: Python reads the bell, then
/// takes the queue whole, so an event queued after its take rings again.
fn tell(ev: Ev) {
    let Some(s) = SHARED.get() else { return };
    let first = match s.queue.lock() {
        Ok(mut queue) => { queue.push(ev); queue.len() == 1 }
        Err(_) => return,
    };
    if first { let _ = (&s.bell).write(&[1]); }     // full (WouldBlock): a ring is pending already
}

fn new_request_id() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(NEXT.load(Ordering::Relaxed));
    let a = h.finish();
    h.write_u64(a);
    format!("{:016x}{:016x}", a, h.finish())
}

fn plain(status: u16, headers: Vec<(String, String)>, body: Vec<u8>) -> Response<Body> {
    let mut out = Response::builder().status(status);
    for (k, v) in headers { out = out.header(k, v); }
    out.body(Body::from(body)).unwrap_or_else(|_| Response::new(Body::empty()))
}

/// The router's refusal of a request it did not read whole: a JSON error, and the connection closed.
fn refused(status: u16, kind: &str, message: &str) -> Response<Body> {
    closing(status, error_json(status, kind, message).into_bytes())
}

/// An OpenAI-style error body, as the router's Python side writes them.
pub(crate) fn error_json(status: u16, kind: &str, message: &str) -> String {
    format!("{{\"error\":{{\"message\":\"{message}\",\"type\":\"{kind}\",\"param\":null,\"code\":{status}}}}}")
}

fn closing(status: u16, json: Vec<u8>) -> Response<Body> {
    plain(status, vec![("content-type".into(), "application/json".into()), ("connection".into(), "close".into())], json)
}

fn too_large(ctx: &Ctx) -> Response<Body> {
    tell(Ev::Refused("bad_request"));
    closing(413, ctx.too_large.clone())
}

const NOT_SENT: [&str; 4] = ["host", "content-length", "content-type", "accept-encoding"];
const HOP_BY_HOP: [&str; 9] = ["connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                                "trailer", "transfer-encoding", "upgrade", "proxy-connection"];

async fn handle(req: Request<Body>, ctx: Arc<Ctx>, clock: Arc<Clock>) -> Result<Response<Body>, Infallible> {
    let open = Open::new(&clock);
    let (parts, mut body) = req.into_parts();
    let fast = parts.method == hyper::Method::POST && parts.uri.query().is_none()
        && (parts.uri.path() == "/v1/completions" || parts.uri.path() == "/v1/chat/completions");
    if !fast {
        return Ok(rest(parts, body, &ctx, open).await);
    }
    // hyper refuses a head past its read buffer (about twice `max_head` as it reads); this is the bound
    let head: usize = parts.headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
    if head > ctx.max_head {
        let why = format!("the request head is over {} bytes", ctx.max_head);
        return Ok(refused(431, "request_header_fields_too_large", &why));
    }
    if let Some(v) = parts.headers.get("content-length") {
        if v.to_str().ok().and_then(|s| s.parse::<usize>().ok()).map_or(true, |n| n > ctx.max_body) {
            return Ok(too_large(&ctx));
        }
    }
    let mut raw = Vec::new();
    loop {
        match tokio::time::timeout(ctx.read_timeout, body.data()).await {
            Ok(None) => break,
            Ok(Some(Ok(c))) if raw.len() + c.len() <= ctx.max_body => raw.extend_from_slice(&c),
            Ok(Some(Ok(_))) => return Ok(too_large(&ctx)),
            Ok(Some(Err(_))) => return Ok(plain(400, vec![], vec![])),
            Err(_) => {
                let why = format!("the request body sent nothing within {} s", ctx.read_timeout.as_secs_f64());
                tell(Ev::Refused("client_disconnect"));     // as the Python path counts a body that stalls
                return Ok(refused(408, "request_timeout", &why));
            }
        }
    }
    let rid = parts.headers.get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_owned)
        .unwrap_or_else(new_request_id);
    let mut headers: Vec<(String, String)> = parts.headers.iter()
        .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect();
    if !parts.headers.contains_key("x-request-id") { headers.push(("x-request-id".into(), rid.clone())); }
    let raw = Bytes::from(raw);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
    let mut guard = EndGuard { id, status: 499, armed: true, broke: false, _open: open };
    let mut answer = ask(Ev::Ask(id, parts.uri.path().to_owned(), headers.clone(), raw.clone()), id).await;
    loop {
        let (url, worker) = match answer {
            Some(Answer::Forward(url, worker)) => (url, worker),
            Some(Answer::Reply(status, headers, body)) => {
                guard.armed = false;        // refused (or failed): Python holds nothing placed for it
                return Ok(with_id(plain(status, headers, body), &rid));
            }
            None => { guard.armed = false; return Ok(plain(503, vec![], vec![])); }
        };
        let mut out = Request::builder().method("POST").uri(url.as_str());
        for (k, v) in headers.iter() {
            if !NOT_SENT.contains(&k.as_str()) && !HOP_BY_HOP.contains(&k.as_str()) { out = out.header(k, v); }
        }
        let out = out.header("content-type", "application/json").body(Body::from(raw.clone()));
        // the router's own app (worker ""), which may hold the request, is not bounded by the servers' timeout
        let timeout = if worker.is_empty() { Duration::MAX } else { ctx.timeout };
        let failed = match tokio::time::timeout(timeout, ctx.client.request(out.unwrap_or_default())).await {
            Ok(Ok(resp)) => match answered(resp, guard, &worker, &rid, timeout).await {
                Ok(resp) => return Ok(resp),
                Err((g, what)) => { guard = g; (what, false) }
            },
            Ok(Err(e)) => (if e.is_connect() { "connect" } else { "send" }, e.is_connect()),
            Err(_) => ("timeout", false),
        };
        answer = ask(Ev::Failed(id, failed.0, failed.1), id).await;
    }
}

/// Tell Python `ev` about request `id` and wait for its answer (None: Python is gone).
async fn ask(ev: Ev, id: u64) -> Option<Answer> {
    let (otx, orx) = oneshot::channel();
    SHARED.get()?.waiting.lock().ok()?.insert(id, otx);
    let _unanswered = Waiting(id);
    tell(ev);
    orx.await.ok()
}

/// Takes a request's answer slot out when its wait ends, answered or not (its client left).
struct Waiting(u64);

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(Ok(mut waiting)) = SHARED.get().map(|s| s.waiting.lock()) { waiting.remove(&self.0); }
    }
}

/// The server's reply as it goes back; Err (with the guard, and what failed) when its body failed
/// before any of it went.
async fn answered(resp: Response<Body>, mut guard: EndGuard, worker: &str, rid: &str, timeout: Duration)
                  -> Result<Response<Body>, (EndGuard, &'static str)> {
    let (mut head, body) = resp.into_parts();
    guard.status = head.status.as_u16();
    for name in HOP_BY_HOP.iter().chain(["content-encoding", "date", "server"].iter()) { head.headers.remove(*name); }
    if let (false, Ok(v)) = (worker.is_empty(), HeaderValue::from_str(worker)) {
        head.headers.insert(HeaderName::from_static("x-cadencerl-worker"), v);
    }
    let sse = head.status == 200 && head.headers.get("content-type")
        .map_or(false, |v| v.as_bytes().starts_with(b"text/event-stream"));
    if sse {     // its first chunk read first: a server that fails before it is retried, as before the head
        let mut body = body;
        let first = match tokio::time::timeout(timeout, body.data()).await {
            Ok(Some(Ok(chunk))) => Some(chunk),
            Ok(None) => None,
            Ok(Some(Err(_))) => return Err((guard, "stream_start")),
            Err(_) => return Err((guard, "timeout")),
        };
        head.headers.remove("content-length");      // whole events only, and an error event may end it
        let relay = Relay::new(body, guard, timeout, first);
        return Ok(with_id(Response::from_parts(head, Body::wrap_stream(relay)), rid));
    }
    let bytes = match tokio::time::timeout(timeout, hyper::body::to_bytes(body)).await {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return Err((guard, "read")),
        Err(_) => return Err((guard, "timeout")),
    };
    let tokens = if head.status == 200 { usage_tokens(&bytes) } else { 0 };
    guard.fire(tokens, if tokens < 0 { Some(bytes.clone()) } else { None });
    head.headers.remove("content-length");
    Ok(with_id(Response::from_parts(head, Body::from(bytes)), rid))
}

fn with_id(mut resp: Response<Body>, rid: &str) -> Response<Body> {
    if !resp.headers().contains_key("x-request-id") {
        if let Ok(v) = HeaderValue::from_str(rid) { resp.headers_mut().insert("x-request-id", v); }
    }
    resp
}

/// Any other route: the router's own app, as it answers (the request open until its reply's body ends).
async fn rest(parts: hyper::http::request::Parts, body: Body, ctx: &Ctx, open: Open) -> Response<Body> {
    let mut out = Request::builder().method(parts.method.clone());
    for (k, v) in parts.headers.iter() {
        if k != "host" { out = out.header(k, v); }
    }
    let uri: Result<Uri, _> = format!("{}{}", ctx.rest, parts.uri).parse();
    match uri.map(|uri| out.uri(uri).body(body)) {
        Ok(Ok(req)) => match ctx.client.request(req).await {
            Ok(resp) => resp.map(|body| Body::wrap_stream(Held { body, _open: open })),
            Err(_) => plain(502, vec![], vec![]),
        },
        _ => plain(400, vec![], vec![]),
    }
}


/// Serve the listening sockets `fds` (this takes them) on `threads` threads until `stop`. Returns the
/// bell's Python end, a non-blocking socket's fd: readable when events wait (`take`).
#[pyfunction]
fn serve(fds: Vec<i32>, rest: String, threads: usize, max_body: usize, too_large: Vec<u8>, max_head: usize,
         read_timeout_s: f64, timeout_s: f64, keep_alive_s: f64) -> PyResult<i32> {
    let (bell, theirs) = UnixStream::pair()?;
    bell.set_nonblocking(true)?;
    theirs.set_nonblocking(true)?;
    let (stop, stopped) = watch::channel(false);
    SHARED.set(Shared { queue: Mutex::new(Vec::new()), bell, waiting: Mutex::new(HashMap::new()), stop })
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("the data path serves already"))?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(threads.max(1)).enable_all().build()?;
    let mut listeners = Vec::new();
    for fd in fds {
        let l = unsafe { std::net::TcpListener::from_raw_fd(fd) };
        l.set_nonblocking(true)?;
        listeners.push(l);
    }
    std::thread::spawn(move || {
        rt.block_on(async move {
            let mut conn = hyper::client::HttpConnector::new();
            conn.set_nodelay(true);
            conn.set_connect_timeout(Some(Duration::from_secs(10)));     // the Python path's
            let client = Client::builder().build::<_, Body>(conn);
            let ctx = Arc::new(Ctx { client, rest, max_body, too_large, max_head, timeout: seconds(timeout_s),
                                     read_timeout: seconds(read_timeout_s) });
            let mut servers = Vec::new();
            for l in listeners {
                let ctx = ctx.clone();
                let make = make_service_fn(move |conn: &Idle| {
                    let (ctx, clock) = (ctx.clone(), conn.clock.clone());
                    async move { Ok::<_, Infallible>(service_fn(move |req| handle(req, ctx.clone(), clock.clone()))) }
                });
                let mut stopped = stopped.clone();
                let Ok(listener) = tokio::net::TcpListener::from_std(l) else { continue };
                // idle.rs times heads: Debian's hyper 0.14.19 arms its header timeout but never polls it
                let accepted = connections(listener, seconds(keep_alive_s), seconds(read_timeout_s));
                servers.push(tokio::spawn(Server::builder(accept::from_stream(accepted)).http1_max_buf_size(max_head)
                    .serve(make)
                    .with_graceful_shutdown(async move { let _ = stopped.changed().await; })));
            }
            for s in servers { let _ = s.await; }
        });
    });
    Ok(theirs.into_raw_fd())
}

fn seconds(s: f64) -> Duration { Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX) }

/// Stop accepting; connections in flight finish (`in_flight` counts their generating requests).
#[pyfunction]
fn stop() {
    if let Some(s) = SHARED.get() { let _ = s.stop.send(true); }
}

#[pyfunction]
fn in_flight() -> i64 { IN_FLIGHT.load(Ordering::Relaxed) }

type PyEvent<'py> = (&'py PyString, u64, PyObject);

/// Every event waiting, in order (none, after a ring whose events an earlier take had): ("a", id,
/// (path, headers, body)), headers a dict of the first of each name; ("f", id, (what, down)), ("d",
/// id, (status, tokens, body or None, broke)), ("r", 0, (kind,)): a body refused here, and the error
/// kind it counts as.
/// Read the bell first.
#[pyfunction]
fn take(py: Python<'_>) -> PyResult<Vec<PyEvent<'_>>> {
    let shared = SHARED.get().ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("not serving"))?;
    let evs = std::mem::take(&mut *shared.queue.lock().unwrap());
    let mut out = Vec::with_capacity(evs.len());
    for ev in evs {
        out.push(match ev {
            Ev::Ask(id, path, headers, b) => {
                let names = PyDict::new(py);
                for (k, v) in headers.iter() {
                    if !names.contains(k)? { names.set_item(k, v)?; }
                }
                (intern!(py, "a"), id, (route(py, &path), names, PyBytes::new(py, &b)).into_py(py))
            }
            Ev::Failed(id, what, down) => (intern!(py, "f"), id, (what, down).into_py(py)),
            Ev::Refused(kind) => (intern!(py, "r"), 0, (kind,).into_py(py)),
            Ev::Done(id, status, tokens, body, broke) => (intern!(py, "d"), id,
                (status, tokens, body.map(|b| PyBytes::new(py, &b).to_object(py)), broke).into_py(py)),
        });
    }
    Ok(out)
}

/// A generating route's path, the same string object each time.
fn route<'py>(py: Python<'py>, path: &str) -> &'py PyString {
    match path {
        "/v1/completions" => intern!(py, "/v1/completions"),
        "/v1/chat/completions" => intern!(py, "/v1/chat/completions"),
        other => PyString::new(py, other),
    }
}

/// Forward request `id` to `url` (the server's endpoint), answered by worker `worker`.
#[pyfunction]
fn forward(id: u64, url: String, worker: String) {
    if let Some(s) = SHARED.get().and_then(|s| s.waiting.lock().ok()?.remove(&id)) { let _ = s.send(Answer::Forward(url, worker)); }
}

/// Answer request `id` with `status`, `headers` and `body` (the router's own reply: a refusal).
#[pyfunction]
fn reply(id: u64, status: u16, headers: Vec<(String, String)>, body: Vec<u8>) {
    if let Some(s) = SHARED.get().and_then(|s| s.waiting.lock().ok()?.remove(&id)) {
        let _ = s.send(Answer::Reply(status, headers, body));
    }
}

#[pymodule]
fn _datapath(_py: Python<'_>, m: &PyModule) -> PyResult<()> {
    for f in [wrap_pyfunction!(serve, m)?, wrap_pyfunction!(stop, m)?, wrap_pyfunction!(in_flight, m)?,
              wrap_pyfunction!(take, m)?, wrap_pyfunction!(forward, m)?, wrap_pyfunction!(reply, m)?] {
        m.add_function(f)?;
    }
    Ok(())
}

// A measurement, not the product (README.md): a hyper data path whose requests are decided by
// Python in batches. Python takes every request and completion waiting in one call (the GIL
// released while none is) and answers each request once it is decided: forward it to this server,
// or reply with this status, headers and body. Every other route goes to the Python router's own
// server (`rest`).
use futures_util::StreamExt;
use hyper::service::{make_service_fn, service_fn};
use hyper::{Body, Client, Request, Response, Server, Uri};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use tokio::sync::{mpsc, oneshot};

enum Answer { Forward(String), Reply(u16, Vec<(String, String)>, Vec<u8>) }
enum Ev { Ask(u64, String, Vec<(String, String)>, hyper::body::Bytes), Done(u64, u16) }

/// Says `Done` when dropped: when a forwarded reply's body has been sent, or the client left at any
/// point after the ask (status 499), so that Python releases (or withdraws) every request it saw.
struct DoneGuard { id: u64, status: u16, tx: mpsc::UnboundedSender<Ev>, armed: bool }

impl Drop for DoneGuard {
    fn drop(&mut self) {
        if self.armed { let _ = self.tx.send(Ev::Done(self.id, self.status)); }
    }
}

struct Shared {
    rx: Mutex<mpsc::UnboundedReceiver<Ev>>,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
}
static SHARED: OnceLock<Shared> = OnceLock::new();
static NEXT: AtomicU64 = AtomicU64::new(0);

async fn handle(req: Request<Body>, client: Client<hyper::client::HttpConnector>, tx: mpsc::UnboundedSender<Ev>,
                rest: String) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let fast = parts.method == hyper::Method::POST
        && (parts.uri.path() == "/v1/completions" || parts.uri.path() == "/v1/chat/completions");
    let mut out = Request::builder().method(parts.method.clone());
    for (k, v) in parts.headers.iter() {
        if k != "host" { out = out.header(k, v); }
    }
    if !fast {      // every other route: the Python router's own server
        let uri: Uri = format!("{}{}", rest, parts.uri).parse().unwrap();
        return Ok(client.request(out.uri(uri).body(body).unwrap()).await
            .unwrap_or_else(|_| Response::builder().status(502).body(Body::empty()).unwrap()));
    }
    let bytes = hyper::body::to_bytes(body).await.unwrap_or_default();
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let headers = parts.headers.iter()
        .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect();
    let (otx, orx) = oneshot::channel();
    SHARED.get().unwrap().waiting.lock().unwrap().insert(id, otx);
    let _ = tx.send(Ev::Ask(id, parts.uri.path().to_owned(), headers, bytes.clone()));
    let mut guard = DoneGuard { id, status: 499, tx: tx.clone(), armed: true };
    let url = match orx.await {
        Ok(Answer::Forward(url)) => url,
        Ok(Answer::Reply(status, headers, body)) => {
            guard.armed = false;            // refused: Python has nothing placed
            let mut out = Response::builder().status(status);
            for (k, v) in headers { out = out.header(k, v); }
            return Ok(out.body(Body::from(body)).unwrap());
        }
        Err(_) => return Ok(Response::builder().status(503).body(Body::empty()).unwrap()),
    };
    let uri: Uri = format!("{}{}", url, parts.uri.path()).parse().unwrap();
    let resp = client.request(out.uri(uri).body(Body::from(bytes)).unwrap()).await;
    guard.status = resp.as_ref().map(|r| r.status().as_u16()).unwrap_or(502);
    Ok(match resp {
        Ok(r) => {      // the guard goes with the body: Done once it is all sent (or the client left)
            let (head, body) = r.into_parts();
            let body = body.map(move |chunk| { let _ = &guard; chunk });
            Response::from_parts(head, Body::wrap_stream(body))
        }
        Err(_) => Response::builder().status(502).body(Body::empty()).unwrap(),
    })
}

/// Serve `port` on `threads` Rust threads; every route but the two generating ones goes to `rest`.
#[pyfunction]
fn serve(port: u16, rest: String, threads: usize) {
    let (tx, rx) = mpsc::unbounded_channel::<Ev>();
    let _ = SHARED.set(Shared { rx: Mutex::new(rx), waiting: Mutex::new(HashMap::new()) });
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build().unwrap();
        rt.block_on(async move {
            let mut conn = hyper::client::HttpConnector::new();
            conn.set_nodelay(true);
            let client = Client::builder().build::<_, Body>(conn);
            let make = make_service_fn(move |_| {
                let (client, tx, rest) = (client.clone(), tx.clone(), rest.clone());
                async move {
                    Ok::<_, Infallible>(service_fn(move |req| handle(req, client.clone(), tx.clone(), rest.clone())))
                }
            });
            Server::bind(&([127, 0, 0, 1], port).into()).tcp_nodelay(true).serve(make).await.unwrap();
        });
    });
}

/// Every request and completion waiting (at least one): ([(id, path, headers, body)], [(id, status)]).
#[pyfunction]
fn take(py: Python<'_>) -> (Vec<(u64, String, Vec<(String, String)>, PyObject)>, Vec<(u64, u16)>) {
    let shared = SHARED.get().unwrap();
    let evs: Vec<Ev> = py.allow_threads(|| {
        let mut rx = shared.rx.lock().unwrap();
        let mut evs = vec![rx.blocking_recv().unwrap()];
        while let Ok(ev) = rx.try_recv() { evs.push(ev); }
        evs
    });
    let (mut asks, mut dones) = (Vec::new(), Vec::new());
    for ev in evs {
        match ev {
            Ev::Ask(id, path, headers, b) => asks.push((id, path, headers, PyBytes::new(py, &b).into())),
            Ev::Done(id, status) => dones.push((id, status)),
        }
    }
    (asks, dones)
}

/// Forward request `id` to `url`.
#[pyfunction]
fn forward(id: u64, url: String) {
    if let Some(s) = SHARED.get().unwrap().waiting.lock().unwrap().remove(&id) { let _ = s.send(Answer::Forward(url)); }
}

/// Answer request `id` with `status`, `headers` and `body` (a refusal: the router's own error reply).
#[pyfunction]
fn reply(id: u64, status: u16, headers: Vec<(String, String)>, body: Vec<u8>) {
    if let Some(s) = SHARED.get().unwrap().waiting.lock().unwrap().remove(&id) {
        let _ = s.send(Answer::Reply(status, headers, body));
    }
}

#[pymodule]
fn native_datapath(_py: Python<'_>, m: &PyModule) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(serve, m)?)?;
    m.add_function(wrap_pyfunction!(take, m)?)?;
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(reply, m)?)?;
    Ok(())
}

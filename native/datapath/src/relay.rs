// A relayed reply's accounting (lib.rs): an SSE stream's tokens counted from its events as it
// passes, in whole events, ending with an error event if it breaks or stalls; a JSON reply's usage.
use crate::EndGuard;
use futures_util::Stream;
use hyper::body::Bytes;
use hyper::Body;
use memchr::memmem;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

const EVENT: &[u8] = b"\ndata: ";
const END: &[u8] = b"\ndata: [DONE]";

/// Tokens of an SSE stream: its `data:` events less `[DONE]`, each found at a line's start, across
/// chunk boundaries too (proxy.py's EventCount).
struct EventCount { events: i64, done: i64, tail: Vec<u8> }

impl EventCount {
    fn feed(&mut self, chunk: &[u8]) {
        let head = &chunk[..chunk.len().min(END.len())];   // a match across the boundary starts in the tail
        let mut seam = self.tail.clone();
        seam.extend_from_slice(head);
        for (needle, n) in [(EVENT, &mut self.events), (END, &mut self.done)] {
            *n += count(chunk, needle) + count(&seam, needle) - count(&self.tail, needle) - count(head, needle);
        }
        if chunk.len() >= END.len() {
            self.tail = chunk[chunk.len() - END.len()..].to_vec();
        } else {
            seam.truncate(self.tail.len() + chunk.len());
            self.tail = seam[seam.len().saturating_sub(END.len())..].to_vec();
        }
    }
}

/// `usage.completion_tokens` (or `output_tokens`) of a JSON reply, found without parsing the rest;
/// -1 where it is not plainly there (Python then reads the body).
pub fn usage_tokens(body: &[u8]) -> i64 {
    let at = match memmem::rfind(body, b"\"usage\"") { Some(i) => i, None => return -1 };
    for key in [&b"\"completion_tokens\""[..], &b"\"output_tokens\""[..]] {
        if let Some(i) = memmem::find(&body[at..], key) {
            let rest = &body[at + i + key.len()..];
            let rest = &rest[rest.iter().take_while(|c| c.is_ascii_whitespace() || **c == b':').count()..];
            let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
            if let Some(n) = std::str::from_utf8(&rest[..digits]).ok().and_then(|d| d.parse().ok()) { return n; }
        }
    }
    -1
}

fn count(hay: &[u8], needle: &[u8]) -> i64 { memmem::find_iter(hay, needle).count() as i64 }

/// A server's SSE stream as it goes to the client: whole events only (a partial one waits for its
/// end), counted as they pass; a break after the last whole event ends with an error event.
pub struct Relay { body: Body, guard: EndGuard, count: EventCount, partial: Vec<u8>, finished: bool,
               idle: Pin<Box<tokio::time::Sleep>>, timeout: Duration, first: Option<Bytes> }

/// An event longer than this is passed on as it comes (framing.py's bound, stored.MAX_EVENT_BYTES).
const MAX_EVENT_BYTES: usize = 1 << 20;

/// Where the last whole event of `data` ends (0: none), searching from `start`: an event ends at two
/// line endings in a row, each CRLF, LF or a CR alone (framing.py's `whole_events_end`).
fn whole_events_end(data: &[u8], start: usize) -> usize {
    let (mut end, mut i, mut after_ending) = (0, start, usize::MAX);
    while i < data.len() {
        let n = match data[i] {
            b'\r' if data.get(i + 1) == Some(&b'\n') => 2,
            b'\r' | b'\n' => 1,
            _ => { i += 1; continue; }
        };
        if after_ending == i {
            end = i + n;
            after_ending = usize::MAX;
        } else {
            after_ending = i + n;
        }
        i += n;
    }
    end
}

impl Relay {
    /// `first`: the stream's first chunk, read before the reply was given (a failure there is retried).
    pub fn new(body: Body, guard: EndGuard, timeout: Duration, first: Option<Bytes>) -> Relay {
        Relay { body, guard, count: EventCount { events: 0, done: 0, tail: b"\n".to_vec() }, partial: Vec::new(),
                finished: first.is_none(), idle: Box::pin(tokio::time::sleep(timeout)), timeout, first }
    }

    fn whole(&mut self, chunk: Bytes) -> Bytes {
        if self.partial.is_empty() && chunk.ends_with(b"\n\n") {     // the usual case: whole events
            return chunk;
        }
        let start = self.partial.len().saturating_sub(3);   // the kept start holds no blank line but at its end
        self.partial.extend_from_slice(&chunk);
        let mut end = whole_events_end(&self.partial, start);
        if end == 0 && self.partial.len() > MAX_EVENT_BYTES {
            end = self.partial.len();
        }
        let rest = self.partial.split_off(end);
        Bytes::from(std::mem::replace(&mut self.partial, rest))
    }

    fn pass(&mut self, out: Bytes) -> Poll<Option<Result<Bytes, Infallible>>> {
        self.count.feed(&out);
        if self.count.done > 0 {       // released before the end goes out
            self.guard.fire(self.count.events - self.count.done, None);
        }
        Poll::Ready(Some(Ok(out)))
    }
}

impl Stream for Relay {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(first) = this.first.take() {
            let out = this.whole(first);
            if !out.is_empty() { return this.pass(out); }
        }
        while !this.finished {
            let polled = match Pin::new(&mut this.body).poll_next(cx) {
                Poll::Pending if this.idle.as_mut().poll(cx).is_ready() => {
                    Poll::Ready(Some(Err(format!("no byte for {:?}", this.timeout))))
                }
                Poll::Pending => return Poll::Pending,
                Poll::Ready(item) => Poll::Ready(item.map(|r| r.map_err(|e| e.to_string()))),
            };
            match polled {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    let now = tokio::time::Instant::now();     // (a timeout past the clock's range: a year)
                    let deadline = now.checked_add(this.timeout).unwrap_or(now + Duration::from_secs(31_536_000));
                    this.idle.as_mut().reset(deadline);
                    let out = this.whole(chunk);
                    if !out.is_empty() { return this.pass(out); }
                }
                Poll::Ready(Some(Err(e))) => {
                    this.finished = true;
                    let tokens = this.count.events - this.count.done;
                    this.guard.broke = true;
                    this.guard.fire(tokens, None);
                    if this.count.done == 0 {
                        let msg: String = format!("the upstream stream broke: {}", e).chars()
                            .map(|c| if c == '"' || c == '\\' || c.is_control() { '\'' } else { c }).collect();
                        return Poll::Ready(Some(Ok(Bytes::from(format!(
                            "data: {{\"error\": {{\"message\": \"{}\", \"type\": \"upstream_error\", \"param\": null, \
                             \"code\": 502}}}}\n\ndata: [DONE]\n\n", msg)))));
                    }
                }
                Poll::Ready(None) => {
                    this.finished = true;
                    let rest = Bytes::from(std::mem::take(&mut this.partial));
                    this.count.feed(&rest);
                    this.guard.fire(this.count.events - this.count.done, None);
                    if !rest.is_empty() { return Poll::Ready(Some(Ok(rest))); }
                }
            }
        }
        Poll::Ready(None)
    }
}

impl Drop for Relay {
    /// A client that leaves mid-stream: released with the tokens it was sent (the guard fires once).
    fn drop(&mut self) {
        self.guard.fire(self.count.events - self.count.done, None);
    }
}

//! The edges of the connection loop: what is refused before the router,
//! and hyper's own refusals answered as problem details.
//!
//! - [`guard`]: a method the server does not implement (`TRACE`,
//!   `CONNECT`, any extension method) is **405**, a request target longer
//!   than [`MAX_URI_BYTES`] is **414**, and a bare 405 of the router (a
//!   route without that method) becomes a problem; all RFC 9457 problem
//!   details, like every other refusal.
//! - [`configure`]: hyper refuses a request head larger than
//!   [`MAX_HEAD_BYTES`] or with more than 100 header fields (431), a target
//!   longer than 64 KiB (414) and a head it cannot parse (400: a malformed
//!   request line or header field, `Content-Length` headers that
//!   disagree). It answers those itself, before any service runs, with an
//!   empty body and closes the connection.
//! - [`connection`]: wraps the socket so that those answers of hyper's go
//!   out as problem details too ([`ProblemIo`]). hyper writes nothing but
//!   the answers of the service and those refusals; the socket tells them
//!   apart by counting: a write that starts when every request handed to
//!   the service has been answered and every byte of those answers has
//!   been flushed is hyper's own. Its head (`HTTP/1.1 431 …`,
//!   `content-length: 0`, `date`, `connection: close`) is replaced by the
//!   same status with a problem body. A refusal that does not fit that
//!   shape exactly is passed on as hyper wrote it (the safe side: an empty
//!   body, never a wrong one).
//!
//! The one case left bare: a refusal of a request that was pipelined
//! behind a request whose body the handler did not read, before that
//! answer's flush (hyper then buffers the two answers together); the
//! client still gets the right status and the connection closed.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::problem::{Problem, ProblemType, PROBLEM_JSON};

/// The longest request target (path and query) accepted, in bytes: 414
/// above it. The API's longest URL (ids of at most 128 bytes, a listing
/// cursor) is well under 1 KiB.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// The largest request head (request line and header fields) accepted, in
/// bytes: 431 above it (and above 100 header fields, hyper's limit).
pub const MAX_HEAD_BYTES: usize = 32 * 1024;

/// What `Allow` says for a method the server does not implement: every
/// method some route of the API takes.
const IMPLEMENTED: &str = "GET, HEAD, POST, PUT, DELETE";

/// Sets hyper's limit on the request head ([`MAX_HEAD_BYTES`]).
pub(crate) fn configure(http: &mut hyper::server::conn::http1::Builder) {
    // Never `pipeline_flush(true)`: [`ProblemIo`] relies on hyper writing
    // every buffered byte before it flushes the socket.
    http.max_header_size(MAX_HEAD_BYTES);
}

/// Puts every route of `router` (and its fallback) behind the method and
/// target checks (module doc).
pub(crate) fn guard(router: Router) -> Router {
    router.layer(middleware::from_fn(edge_guard))
}

/// A method some route could take; anything else is refused before
/// routing.
fn implemented(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET
            | Method::HEAD
            | Method::POST
            | Method::PUT
            | Method::PATCH
            | Method::DELETE
            | Method::OPTIONS
    )
}

fn target_len(req: &Request) -> usize {
    let uri = req.uri();
    uri.scheme_str().map_or(0, str::len)
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path_and_query().map_or(0, |p| p.as_str().len())
}

fn is_problem(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()))
}

async fn edge_guard(req: Request, next: Next) -> Response {
    if !implemented(req.method()) {
        tracing::debug!("refused a method the server does not implement");
        let mut r = Problem::new(
            ProblemType::MethodNotAllowed,
            format!("this method is not implemented by this server; it serves {IMPLEMENTED}"),
        )
        .into_response();
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(IMPLEMENTED));
        return r;
    }
    let len = target_len(&req);
    if len > MAX_URI_BYTES {
        tracing::debug!(len, "refused a request target that is too long");
        let mut p = Problem::new(
            ProblemType::InvalidInput,
            format!(
                "the request target is {len} bytes long; this server accepts at most {MAX_URI_BYTES}"
            ),
        );
        p.status = StatusCode::URI_TOO_LONG.as_u16();
        let mut r = p.into_response();
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    let path = req.uri().path().to_string();
    let response = next.run(req).await;
    if response.status() != StatusCode::METHOD_NOT_ALLOWED || is_problem(&response) {
        return response;
    }
    // A route of the router that does not take this method (axum's bare 405).
    let allow = response.headers().get(header::ALLOW).cloned();
    let mut r = Problem::new(
        ProblemType::MethodNotAllowed,
        "this method is not allowed on this route; Allow lists the ones that are",
    )
    .with_instance(path)
    .into_response();
    if let Some(allow) = allow {
        r.headers_mut().insert(header::ALLOW, allow);
    }
    r
}

/// What a connection's service and its socket share: requests handed to
/// the service, and answers whose body hyper is done with.
#[derive(Debug, Default)]
struct Exchange {
    calls: AtomicU64,
    answered: AtomicU64,
}

impl Exchange {
    /// The number of requests, when every one of them has been answered.
    fn idle(&self) -> Option<u64> {
        let calls = self.calls.load(Ordering::Acquire);
        (self.answered.load(Ordering::Acquire) == calls).then_some(calls)
    }
}

/// The socket and the service of one connection: the service counts
/// requests and answers, the socket turns hyper's own refusals into
/// problem details ([`ProblemIo`]).
pub(crate) fn connection<T>(
    router: &Router,
    io: T,
) -> (TokioIo<ProblemIo<T>>, Counted<TowerToHyperService<Router>>)
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let exchange = Arc::new(Exchange::default());
    let io = ProblemIo {
        inner: io,
        exchange: exchange.clone(),
        idle_at: Some(0),
        state: Rewrite::Passing,
    };
    let service = Counted {
        inner: TowerToHyperService::new(router.clone()),
        exchange,
    };
    (TokioIo::new(io), service)
}

/// A hyper service that counts the requests it is handed and the answers
/// hyper is done with (their bodies dropped).
#[derive(Debug)]
pub(crate) struct Counted<S> {
    inner: S,
    exchange: Arc<Exchange>,
}

impl<S> hyper::service::Service<hyper::Request<Incoming>> for Counted<S>
where
    S: hyper::service::Service<hyper::Request<Incoming>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<CountedBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        self.exchange.calls.fetch_add(1, Ordering::AcqRel);
        // Counted as answered when the body is dropped, whatever happens to
        // the future; a future dropped unanswered (the connection ended)
        // leaves the count behind, so nothing more is rewritten on it.
        let exchange = self.exchange.clone();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|inner| CountedBody { inner, exchange }))
        })
    }
}

/// An answer's body that counts itself answered when hyper drops it (it
/// has buffered every byte of it by then).
#[derive(Debug)]
pub(crate) struct CountedBody {
    inner: Body,
    exchange: Arc<Exchange>,
}

impl Drop for CountedBody {
    fn drop(&mut self) {
        self.exchange.answered.fetch_add(1, Ordering::AcqRel);
    }
}

impl http_body::Body for CountedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The longest head of hyper's own that is looked for.
const MAX_REFUSAL_HEAD: usize = 1024;

#[derive(Debug)]
enum Rewrite {
    /// Bytes go to the socket as written.
    Passing,
    /// A write of hyper's own started: its head is collected.
    Capturing(Vec<u8>),
    /// What goes out instead, and how much of it has.
    Sending(Vec<u8>, usize),
}

/// The socket of a connection, answering hyper's own refusals (400, 414,
/// 431) with problem details (module doc).
#[derive(Debug)]
pub(crate) struct ProblemIo<T> {
    inner: T,
    exchange: Arc<Exchange>,
    /// The request count at the last completed flush, when every request
    /// had been answered by then.
    idle_at: Option<u64>,
    state: Rewrite,
}

impl<T: AsyncWrite + Unpin> ProblemIo<T> {
    /// True when a write starting now is hyper's own: nothing was handed
    /// to the service since a flush that found every answer written.
    fn hypers_own(&self) -> bool {
        self.idle_at.is_some() && self.exchange.idle() == self.idle_at
    }

    /// Sends what replaces hyper's refusal; `Ready(Ok)` once all of it is
    /// out (or there is none).
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Rewrite::Sending(bytes, sent) = &mut self.state {
            if *sent == bytes.len() {
                self.state = Rewrite::Passing;
                break;
            }
            let n = match Pin::new(&mut self.inner).poll_write(cx, &bytes[*sent..]) {
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *sent += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Takes `buf` as (more of) hyper's refusal: how much of it was taken.
    fn capture(&mut self, buf: &[u8]) -> usize {
        let Rewrite::Capturing(head) = &mut self.state else {
            return 0;
        };
        let before = head.len();
        head.extend_from_slice(buf);
        match find_end(head) {
            Some(end) => {
                // Only the head is taken; what follows (nothing, for hyper's
                // refusals) goes out as it is on the next write.
                let taken = end - before;
                head.truncate(end);
                let out = replacement(head).unwrap_or_else(|| head.clone());
                self.state = Rewrite::Sending(out, 0);
                taken
            }
            None if head.len() > MAX_REFUSAL_HEAD => {
                let out = std::mem::take(head);
                self.state = Rewrite::Sending(out, 0);
                buf.len()
            }
            None => buf.len(),
        }
    }
}

/// The end of a response head (after its blank line), if `bytes` holds it.
fn find_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4)
}

/// The problem-details answer for hyper's refusal `head`, or `None` when
/// it is not exactly one of hyper's refusals (then it goes out as it is).
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let mut lines = text.strip_suffix("\r\n\r\n")?.split("\r\n");
    let status_line = lines.next()?;
    let mut words = status_line.splitn(3, ' ');
    let version = words.next()?;
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return None;
    }
    let status: u16 = words.next()?.parse().ok()?;
    let mut date = None;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" if value == "0" => {}
            "connection" if value.eq_ignore_ascii_case("close") => {}
            "date" => date = Some(value),
            _ => return None,
        }
    }
    let detail = match status {
        400 => "the request is not valid HTTP/1.1 (a malformed request line or header field, or Content-Length headers that disagree); the connection is closed".to_string(),
        414 => format!("the request target is longer than this server accepts ({MAX_URI_BYTES} bytes); the connection is closed"),
        431 => format!("the request head is larger than this server accepts ({MAX_HEAD_BYTES} bytes of request line and header fields, at most 100 header fields); the connection is closed"),
        _ => return None,
    };
    let mut problem = Problem::new(ProblemType::InvalidInput, detail);
    problem.status = status;
    let body = serde_json::to_vec(&problem).ok()?;
    let mut out = format!(
        "{status_line}\r\ncontent-type: {PROBLEM_JSON}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    if let Some(date) = date {
        out.push_str(&format!("date: {date}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(&body);
    tracing::debug!(status, "refused a request hyper could not take");
    Some(out)
}

impl<T: AsyncRead + Unpin> AsyncRead for ProblemIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ProblemIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        if matches!(me.state, Rewrite::Passing) && !buf.is_empty() && me.hypers_own() {
            me.state = Rewrite::Capturing(Vec::new());
        }
        if matches!(me.state, Rewrite::Capturing(_)) {
            let taken = me.capture(buf);
            // Best effort now; a flush finishes it.
            if let Poll::Ready(Err(e)) = me.poll_send(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(taken));
        }
        match me.poll_send(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        Pin::new(&mut me.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = &mut *self;
        let passing = matches!(me.state, Rewrite::Passing)
            && !(bufs.iter().any(|b| !b.is_empty()) && me.hypers_own());
        if passing {
            return Pin::new(&mut me.inner).poll_write_vectored(cx, bufs);
        }
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &**b);
        Pin::new(me).poll_write(cx, first)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = &mut *self;
        if let Rewrite::Capturing(head) = &mut me.state {
            // A flush before the head's end: it was not a head after all.
            let out = std::mem::take(head);
            me.state = Rewrite::Sending(out, 0);
        }
        match me.poll_send(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        match Pin::new(&mut me.inner).poll_flush(cx) {
            Poll::Ready(Ok(())) => {
                // hyper flushes the socket only once it has written every
                // byte it buffered: every answer finished by now is out.
                me.idle_at = me.exchange.idle();
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = &mut *self;
        if let Rewrite::Capturing(head) = &mut me.state {
            let out = std::mem::take(head);
            me.state = Rewrite::Sending(out, 0);
        }
        match me.poll_send(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        Pin::new(&mut me.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_refusal_heads_are_replaced_and_nothing_else_is() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Wed, 02 Dec 2026 21:46:43 GMT\r\n\r\n";
        let out = String::from_utf8(replacement(head).unwrap()).unwrap();
        assert!(out.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(out.contains("content-type: application/problem+json\r\n"));
        assert!(out.contains("date: Wed, 02 Dec 2026 21:46:43 GMT\r\n"));
        let body = out.split("\r\n\r\n").nth(1).unwrap();
        let p: Problem = serde_json::from_str(body).unwrap();
        assert_eq!(p.status, 431);
        assert!(out.contains(&format!("content-length: {}\r\n", body.len())));
        for other in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n",
            b"HTTP/2 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
        ] {
            assert!(replacement(other).is_none(), "{:?}", String::from_utf8_lossy(other));
        }
    }
}

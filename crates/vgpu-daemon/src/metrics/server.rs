//! The metrics endpoint (`[watch] listen`): `GET /metrics` (or `HEAD`) answers with the
//! latest rendering, in OpenMetrics when the scraper's `Accept` prefers it (Prometheus does)
//! and in the classic text format otherwise; any other path is 404, any other method 405.
//!
//! Any local user can connect to it, so nothing a client does may cost the watch more than
//! a bounded share of its descriptors, memory and time, nor ever make the enforcement loop
//! wait (SPEC 4.7):
//!
//! * It runs on its own thread, on a current-thread tokio runtime, with hyper's HTTP/1
//!   server (a crate made for hostile clients: the request head is bounded by
//!   [`MAX_HEAD_BYTES`] and [`MAX_HEADERS`], a longer one is answered 431 and the connection
//!   closed; conflicting `Content-Length`/`Transfer-Encoding` are refused or end the
//!   connection). One connection is one descriptor and a small task, not a thread.
//! * Connections are capped in all and per peer address ([`Limits`], `[watch]
//!   metrics_max_connections`, `metrics_max_connections_per_peer`); the cap in all is
//!   lowered so that [`vgpu_host::fdlimit::RESERVE`] descriptors always stay for enforcement.
//!   A connection over a cap is answered 503 at once and closed.
//! * Every connection is timed ([`Timed`]): a request's head must be complete
//!   `metrics_header_timeout` after its first byte; a connection with no request under way
//!   is closed after `metrics_idle_timeout`; a response the client does not read (no byte
//!   written) for `metrics_write_timeout` ends the connection — so a client that pipelines
//!   requests and never reads holds one connection for that long, and nothing else.
//! * An accept that fails for want of descriptors or memory (`EMFILE`, `ENFILE`,
//!   `ENOBUFS`, `ENOMEM`) is tried again after [`ACCEPT_BACKOFF`]; the endpoint never stops
//!   accepting. What went wrong is reported to the watch ([`Endpoint::take_problems`]),
//!   which logs each once.
//! * Dropping an [`Endpoint`] (SIGHUP moved or removed `listen`, the watch stops) sends its
//!   thread a stop and returns at once: nothing joins it. The thread closes the listening
//!   socket as soon as it sees the stop (the port can be bound again), then drops every
//!   connection.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::future::Future as _;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderMap, HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

use super::exposition::{Exposition, OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE};
use vgpu_host::config::watch::WatchConfig;

/// The path the figures are served at.
pub const PATH: &str = "/metrics";

/// The longest request head read (request line and headers, and what a client pipelines
/// after them): a longer one is answered 431 and the connection closed.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// The most header fields a request may have.
pub const MAX_HEADERS: usize = 64;

/// How long the endpoint waits before accepting again after an accept failed for want of
/// descriptors or memory.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Refused connections kept open at once for a moment, so that their client reads the 503
/// (closing a socket with its request unread would reset it); more are closed at once.
pub const REFUSALS_AT_ONCE: usize = 16;

/// How long a refused connection is kept open for its client to read the 503.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// What a connection over a cap is told before it is closed.
const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 21\r\n\r\ntoo many connections\n";

#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {addr} ([watch] listen): {message}")]
pub struct BindError {
    pub addr: SocketAddr,
    pub message: String,
}

/// The endpoint's caps and timeouts (`[watch] metrics_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections at once, from all peers (already lowered to what the descriptor limit
    /// leaves after the reserve).
    pub max_connections: usize,
    pub max_per_peer: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub write_timeout: Duration,
}

impl Limits {
    /// The config's, the cap in all lowered to what `soft_limit` descriptors leave after
    /// [`vgpu_host::fdlimit::RESERVE`].
    pub fn of(config: &WatchConfig, soft_limit: u64) -> Limits {
        Limits {
            max_connections: vgpu_host::fdlimit::connection_cap(config.metrics_max_connections, soft_limit),
            max_per_peer: config.metrics_max_connections_per_peer,
            header_timeout: config.metrics_header_timeout,
            idle_timeout: config.metrics_idle_timeout,
            write_timeout: config.metrics_write_timeout,
        }
    }
}

/// One rendering and its bodies, ready to be sent (a clone of `Bytes` copies nothing).
#[derive(Debug)]
struct Rendered {
    exposition: Arc<Exposition>,
    text: Bytes,
    openmetrics: Bytes,
}

/// The latest rendering, shared between the watch (which replaces it) and the endpoint.
#[derive(Debug, Clone, Default)]
pub struct Latest(Arc<Mutex<Option<Arc<Rendered>>>>);

impl Latest {
    pub fn set(&self, exposition: Exposition) {
        let rendered = Rendered {
            text: Bytes::from(exposition.text.clone()),
            openmetrics: Bytes::from(exposition.openmetrics.clone()),
            exposition: Arc::new(exposition),
        };
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Arc::new(rendered));
    }

    /// None before the first round.
    pub fn get(&self) -> Option<Arc<Exposition>> {
        self.rendered().map(|r| Arc::clone(&r.exposition))
    }

    fn rendered(&self) -> Option<Arc<Rendered>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

/// What the endpoint's thread found wrong since the watch last asked (each kind of problem
/// once, however often it happened).
#[derive(Debug, Default)]
struct Problems(Mutex<BTreeSet<String>>);

impl Problems {
    fn add(&self, problem: String) {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(problem);
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())).into_iter().collect()
    }
}

/// What the endpoint's thread shares with the watch.
#[derive(Debug)]
struct Shared {
    latest: Latest,
    limits: Mutex<Limits>,
    problems: Problems,
}

impl Shared {
    fn limits(&self) -> Limits {
        *self.limits.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A bound endpoint; dropping it stops serving (without waiting for its thread).
pub struct Endpoint {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Bind `addr` (port 0: any free port; [`Endpoint::addr`] says which) and serve `latest`
    /// from a thread of its own. The socket is bound here, so that a port in use is this
    /// call's error.
    pub fn bind(addr: SocketAddr, latest: Latest, limits: Limits) -> Result<Endpoint, BindError> {
        let fail = |message: String| BindError { addr, message };
        let listener = std::net::TcpListener::bind(addr).map_err(|e| fail(one_line(&e.to_string())))?;
        listener.set_nonblocking(true).map_err(|e| fail(e.to_string()))?;
        let bound = listener.local_addr().unwrap_or(addr);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| fail(format!("cannot start its runtime: {e}")))?;
        let shared = Arc::new(Shared { latest, limits: Mutex::new(limits), problems: Problems::default() });
        let (stop, stopped) = oneshot::channel();
        let serving = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("vgpu-metrics".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => serve(listener, serving, stopped).await,
                        Err(e) => serving.problems.add(format!("metrics endpoint: cannot serve: {e}")),
                    }
                });
                // Dropping the runtime here drops every connection still open.
            })
            .map_err(|e| fail(format!("cannot start its thread: {e}")))?;
        Ok(Endpoint { addr: bound, shared, stop: Some(stop) })
    }

    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// New caps and timeouts (SIGHUP): for connections accepted from now on.
    pub fn set_limits(&self, limits: Limits) {
        *self.shared.limits.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = limits;
    }

    pub fn limits(&self) -> Limits {
        self.shared.limits()
    }

    /// What went wrong since the last call (each kind once).
    pub fn take_problems(&self) -> Vec<String> {
        self.shared.problems.take()
    }
}

impl Drop for Endpoint {
    /// A stop sent, nothing waited for: the thread closes the port when it sees it.
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Accept until stopped; each connection a task of its own.
async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let counts = Arc::new(Mutex::new(Counts::default()));
    let refusing = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        let accepted = tokio::select! {
            biased;
            _ = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let limits = shared.limits();
                match Counts::admit(&counts, peer.ip(), &limits) {
                    Ok(slot) => {
                        tokio::spawn(connection(stream, shared.latest.clone(), limits, slot));
                    }
                    Err(refusal) => {
                        shared.problems.add(refusal);
                        refuse(stream, &refusing);
                    }
                }
            }
            Err(e) if out_of_resources(&e) => {
                shared.problems.add(format!(
                    "metrics endpoint: cannot accept a connection: {e}; accepting again every {} ms meanwhile",
                    ACCEPT_BACKOFF.as_millis()
                ));
                tokio::select! {
                    biased;
                    _ = &mut stop => break,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                }
            }
            // The peer went away before it was accepted (ECONNABORTED, …): the next one.
            Err(_) => {}
        }
    }
    // The port is released now, before the connections are dropped with the runtime.
    drop(listener);
}

/// Answer 503 and close: after a moment for the client to read it (at most
/// [`REFUSALS_AT_ONCE`] at a time), else at once.
fn refuse(stream: TcpStream, refusing: &Arc<std::sync::atomic::AtomicUsize>) {
    // Best effort: a fresh socket's send buffer is empty.
    let _ = stream.try_write(REFUSED);
    if refusing.fetch_add(1, Ordering::Relaxed) >= REFUSALS_AT_ONCE {
        refusing.fetch_sub(1, Ordering::Relaxed);
        // What the client sent already is read, so that the close is a FIN, not a reset
        // that could overtake the 503.
        let mut sink = [0u8; 4096];
        while matches!(stream.try_read(&mut sink), Ok(n) if n > 0) {}
        return;
    }
    let refusing = Arc::clone(refusing);
    tokio::spawn(async move {
        let mut stream = stream;
        let _ = tokio::time::timeout(REFUSAL_LINGER, async {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let _ = stream.shutdown().await;
            let mut sink = [0u8; 4096];
            while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
        })
        .await;
        refusing.fetch_sub(1, Ordering::Relaxed);
    });
}

fn out_of_resources(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// Connections held, in all and per peer address.
#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// One admitted connection; its count is given back when it is dropped.
struct Slot {
    counts: Arc<Mutex<Counts>>,
    peer: IpAddr,
}

impl Counts {
    /// A slot for a connection from `peer`, or why not (the problem the watch logs).
    fn admit(counts: &Arc<Mutex<Counts>>, peer: IpAddr, limits: &Limits) -> Result<Slot, String> {
        let mut c = counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if c.total >= limits.max_connections {
            return Err(format!(
                "metrics endpoint: {} connections open, its cap ([watch] metrics_max_connections, lowered to keep {} descriptors for enforcement): refusing more with 503 until some close",
                limits.max_connections,
                vgpu_host::fdlimit::RESERVE
            ));
        }
        let mine = c.per_peer.get(&peer).copied().unwrap_or(0);
        if mine >= limits.max_per_peer {
            return Err(format!(
                "metrics endpoint: {peer} holds {} connections, the cap per peer ([watch] metrics_max_connections_per_peer): refusing more from it with 503",
                limits.max_per_peer
            ));
        }
        c.total += 1;
        c.per_peer.insert(peer, mine + 1);
        Ok(Slot { counts: Arc::clone(counts), peer })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_peer.remove(&self.peer);
            }
        }
    }
}

/// Serve one connection (keep-alive, pipelined requests answered in order) until the client
/// closes it, a timeout ends it, or the endpoint stops.
async fn connection(stream: TcpStream, latest: Latest, limits: Limits, slot: Slot) {
    let _slot = slot;
    let _ = stream.set_nodelay(true);
    let head_done = Arc::new(AtomicBool::new(false));
    let io = TokioIo::new(Timed::new(stream, limits, Arc::clone(&head_done)));
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        // The head is complete: from now on the connection is timed as idle until the
        // next request's first byte.
        head_done.store(true, Ordering::Relaxed);
        let response = answer(&request, &latest);
        std::future::ready(Ok::<_, Infallible>(response))
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.max_buf_size(MAX_HEAD_BYTES).max_header_size(MAX_HEAD_BYTES).max_headers(MAX_HEADERS).header_read_timeout(None).keep_alive(true);
    // An error is the client's (a malformed request, already answered 400, a timeout, a
    // reset): the connection ends, nothing more to do.
    let _ = http.serve_connection(io, service).await;
}

/// A TCP stream whose reads and writes fail with `TimedOut` when the client keeps them
/// waiting too long (see the module's documentation): a read waits at most until
/// `header_timeout` after the first byte of a request whose head is not complete yet, else
/// `idle_timeout` after the last byte read or written; a write waits at most
/// `write_timeout` for the client to read.
struct Timed {
    stream: TcpStream,
    limits: Limits,
    /// Set by the service when a request's head is complete.
    head_done: Arc<AtomicBool>,
    /// The first byte of the request whose head is being read.
    head_since: Option<Instant>,
    /// The last byte read or written.
    last_progress: Instant,
    /// Since when the current write has been waiting for room.
    write_since: Option<Instant>,
    read_timer: Pin<Box<Sleep>>,
    write_timer: Pin<Box<Sleep>>,
}

impl Timed {
    fn new(stream: TcpStream, limits: Limits, head_done: Arc<AtomicBool>) -> Timed {
        let now = Instant::now();
        Timed {
            stream,
            limits,
            head_done,
            head_since: None,
            last_progress: now,
            write_since: None,
            read_timer: Box::pin(tokio::time::sleep_until(now + limits.idle_timeout)),
            write_timer: Box::pin(tokio::time::sleep_until(now + limits.write_timeout)),
        }
    }
}

fn timed_out(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, what.to_string())
}

/// Whether `timer`, set to `deadline`, has fired (registering the task's wake-up if not).
fn expired(timer: &mut Pin<Box<Sleep>>, deadline: Instant, cx: &mut Context<'_>) -> bool {
    if Instant::now() >= deadline {
        return true;
    }
    if timer.deadline() != deadline {
        timer.as_mut().reset(deadline);
    }
    timer.as_mut().poll(cx).is_ready()
}

impl AsyncRead for Timed {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.head_done.swap(false, Ordering::Relaxed) {
            this.head_since = None;
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    let now = Instant::now();
                    this.last_progress = now;
                    this.head_since.get_or_insert(now);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let (deadline, what) = match this.head_since {
                    Some(since) => (since + this.limits.header_timeout, "request head not complete in time ([watch] metrics_header_timeout)"),
                    None => (this.last_progress + this.limits.idle_timeout, "idle ([watch] metrics_idle_timeout)"),
                };
                if expired(&mut this.read_timer, deadline, cx) {
                    return Poll::Ready(Err(timed_out(what)));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for Timed {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.stream).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => {
                this.write_since = None;
                if n > 0 {
                    this.last_progress = Instant::now();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let since = *this.write_since.get_or_insert_with(Instant::now);
                if expired(&mut this.write_timer, since + this.limits.write_timeout, cx) {
                    return Poll::Ready(Err(timed_out("the client does not read ([watch] metrics_write_timeout)")));
                }
                Poll::Pending
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

fn answer(request: &Request<hyper::body::Incoming>, latest: &Latest) -> Response<Full<Bytes>> {
    let is_get = matches!(*request.method(), Method::GET | Method::HEAD);
    match (is_get, request.uri().path()) {
        (true, PATH) => match latest.rendered() {
            Some(rendered) => {
                let (body, content_type) = if prefers_openmetrics(request.headers()) {
                    (rendered.openmetrics.clone(), OPENMETRICS_CONTENT_TYPE)
                } else {
                    (rendered.text.clone(), TEXT_CONTENT_TYPE)
                };
                respond(StatusCode::OK, content_type, body)
            }
            None => plain(StatusCode::SERVICE_UNAVAILABLE, "vgpu watch has not finished its first round yet\n"),
        },
        (true, _) => plain(StatusCode::NOT_FOUND, "not found: vgpu's metrics are at /metrics\n"),
        (false, _) => {
            let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
            response.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            response
        }
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    respond(status, "text/plain; charset=utf-8", Bytes::from_static(text.as_bytes()))
}

fn prefers_openmetrics(headers: &HeaderMap) -> bool {
    let accept: Vec<&str> = headers.get_all(ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
    accept_prefers_openmetrics(&accept.join(","))
}

/// Whether an `Accept` header ranks `application/openmetrics-text` at least as high as
/// `text/plain` (and above zero). Prometheus asks for OpenMetrics first; curl and most
/// clients send `*/*` and get the classic text format.
pub fn accept_prefers_openmetrics(accept: &str) -> bool {
    let mut openmetrics: f64 = 0.0;
    let mut text: f64 = 0.0;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.strip_prefix("q="))
            .find_map(|q| q.parse::<f64>().ok())
            .unwrap_or(1.0);
        match media.as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(q),
            "text/plain" | "text/*" | "*/*" => text = text.max(q),
            _ => {}
        }
    }
    openmetrics > 0.0 && openmetrics >= text
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::net::TcpStream;

    use super::accept_prefers_openmetrics as om;
    use super::*;

    #[test]
    fn prometheus_gets_openmetrics_and_everybody_else_text() {
        assert!(om("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"));
        assert!(om("application/openmetrics-text"));
        assert!(!om("*/*"));
        assert!(!om(""));
        assert!(!om("text/plain;version=0.0.4"));
        assert!(!om("application/openmetrics-text;q=0.1, text/plain"));
        assert!(!om("application/openmetrics-text;q=0"));
    }

    fn limits(max: usize, per_peer: usize) -> Limits {
        Limits {
            max_connections: max,
            max_per_peer: per_peer,
            header_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(500),
            write_timeout: Duration::from_millis(300),
        }
    }

    fn endpoint(limits: Limits) -> Endpoint {
        let latest = Latest::default();
        latest.set(Exposition { openmetrics: "# EOF\n".into(), text: "a 1\n".into() });
        Endpoint::bind("127.0.0.1:0".parse().unwrap(), latest, limits).unwrap()
    }

    /// Everything the server sends until it closes the connection (a test timeout of 10 s).
    fn read_to_close(stream: &mut TcpStream) -> String {
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn caps_connections_per_peer_and_in_all_and_gives_the_slots_back() {
        let ep = endpoint(limits(3, 2));
        let addr = ep.addr();
        let get = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(get).unwrap();
            let mut buf = [0u8; 12];
            s.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"HTTP/1.1 200");
            held.push(s);
        }
        // A third from the same peer is refused, and can read why.
        let mut third = TcpStream::connect(addr).unwrap();
        third.write_all(get).unwrap();
        assert!(read_to_close(&mut third).starts_with("HTTP/1.1 503"));
        // Another peer address (the loopback has them all) gets the last slot…
        let other = || {
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            socket.bind(&"127.0.0.2:0".parse::<SocketAddr>().unwrap().into()).unwrap();
            socket.connect(&addr.into()).unwrap();
            TcpStream::from(socket)
        };
        let mut fourth = other();
        fourth.write_all(get).unwrap();
        let mut buf = [0u8; 12];
        fourth.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"HTTP/1.1 200");
        // … and then the cap in all is reached.
        assert!(read_to_close(&mut other()).starts_with("HTTP/1.1 503"));
        assert!(ep.take_problems().iter().any(|p| p.contains("metrics_max_connections_per_peer")));
        // Closed connections give their slots back.
        drop(held);
        drop(fourth);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
            if read_to_close(&mut s).starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the slots never came back");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn idle_slow_and_oversized_clients_are_closed() {
        let ep = endpoint(limits(8, 8));
        let addr = ep.addr();
        // Idle: closed without a byte.
        let mut idle = TcpStream::connect(addr).unwrap();
        assert_eq!(read_to_close(&mut idle), "");
        // A head that never ends (one byte at a time, faster than the idle timeout).
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\nX: ").unwrap();
        let started = std::time::Instant::now();
        while slow.write_all(b"a").is_ok() && started.elapsed() < Duration::from_secs(10) {
            let mut probe = [0u8; 1];
            slow.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            match slow.read(&mut probe) {
                Ok(0) => break,
                Ok(_) => break,
                Err(_) => {}
            }
        }
        assert!(started.elapsed() < Duration::from_secs(10), "a trickled head was never cut off");
        // A header line longer than the bound: 431, closed.
        let mut long = TcpStream::connect(addr).unwrap();
        let mut head = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        head.resize(MAX_HEAD_BYTES * 2, b'a');
        let _ = long.write_all(&head);
        let answer = read_to_close(&mut long);
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 431"), "{answer}");
    }

    #[test]
    fn dropping_the_endpoint_releases_the_port_without_waiting_for_a_client() {
        let ep = endpoint(limits(8, 8));
        let addr = ep.addr();
        // A client that pipelines and never reads keeps the connection busy writing.
        let mut hog = TcpStream::connect(addr).unwrap();
        hog.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
        for _ in 0..5000 {
            if hog.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").is_err() {
                break;
            }
        }
        let started = std::time::Instant::now();
        drop(ep);
        assert!(started.elapsed() < Duration::from_secs(1), "dropping waited for the client");
        // The port can be bound again as soon as the thread has seen the stop.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match std::net::TcpListener::bind(addr) {
                Ok(_) => break,
                Err(e) => assert!(std::time::Instant::now() < deadline, "the port stayed bound: {e}"),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

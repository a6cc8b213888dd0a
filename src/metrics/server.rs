//! The metrics endpoint (`[watch] listen`): `GET /metrics` (or `HEAD`) answers with the
//! latest rendering, in OpenMetrics when the scraper's `Accept` prefers it (Prometheus does)
//! and in the classic text format otherwise; any other path is 404, any other method 405.
//! Served by `tiny_http` from one thread; the watch swaps in a new rendering each round.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tiny_http::{Header, Method, Request, Response, Server};

use super::exposition::{Exposition, OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE};

/// The path the figures are served at.
pub const PATH: &str = "/metrics";

#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {addr} ([watch] listen): {message}")]
pub struct BindError {
    pub addr: SocketAddr,
    pub message: String,
}

/// The latest rendering, shared between the watch (which replaces it) and the endpoint.
#[derive(Debug, Clone, Default)]
pub struct Latest(Arc<Mutex<Option<Arc<Exposition>>>>);

impl Latest {
    pub fn set(&self, exposition: Exposition) {
        *self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Arc::new(exposition));
    }

    /// None before the first round.
    pub fn get(&self) -> Option<Arc<Exposition>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

/// A bound endpoint; dropping it stops serving and closes the port.
pub struct Endpoint {
    server: Arc<Server>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Bind `addr` (port 0: any free port; [`Endpoint::addr`] says which) and serve `latest`.
    pub fn bind(addr: SocketAddr, latest: Latest) -> Result<Endpoint, BindError> {
        let server = Server::http(addr).map_err(|e| BindError { addr, message: one_line(&e.to_string()) })?;
        let bound = server.server_addr().to_ip().unwrap_or(addr);
        let server = Arc::new(server);
        let serving = Arc::clone(&server);
        let thread = std::thread::Builder::new()
            .name("vgpu-metrics".into())
            .spawn(move || {
                for request in serving.incoming_requests() {
                    answer(request, &latest);
                }
            })
            .map_err(|e| BindError { addr, message: format!("cannot start its thread: {e}") })?;
        Ok(Endpoint { server, addr: bound, thread: Some(thread) })
    }

    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn answer(request: Request, latest: &Latest) {
    let path = request.url().split('?').next().unwrap_or_default();
    let response = match (request.method(), path) {
        (Method::Get | Method::Head, PATH) => match latest.get() {
            Some(exposition) => {
                let openmetrics = prefers_openmetrics(&request);
                let (body, content_type) = if openmetrics {
                    (exposition.openmetrics.clone(), OPENMETRICS_CONTENT_TYPE)
                } else {
                    (exposition.text.clone(), TEXT_CONTENT_TYPE)
                };
                with_header(Response::from_string(body), "Content-Type", content_type)
            }
            None => plain(503, "vgpu watch has not finished its first round yet\n"),
        },
        (Method::Get | Method::Head, _) => plain(404, "not found: vgpu's metrics are at /metrics\n"),
        _ => with_header(plain(405, "only GET and HEAD\n"), "Allow", "GET, HEAD"),
    };
    // A scraper that went away is nobody's problem.
    let _ = request.respond(response);
}

fn plain(status: u16, text: &str) -> Response<std::io::Cursor<Vec<u8>>> {
    with_header(Response::from_string(text).with_status_code(status), "Content-Type", "text/plain; charset=utf-8")
}

fn with_header<R: std::io::Read>(response: Response<R>, name: &str, value: &str) -> Response<R> {
    match Header::from_bytes(name.as_bytes(), value.as_bytes()) {
        Ok(header) => response.with_header(header),
        Err(()) => response,
    }
}

fn prefers_openmetrics(request: &Request) -> bool {
    let accept: Vec<&str> = request.headers().iter().filter(|h| h.field.equiv("Accept")).map(|h| h.value.as_str()).collect();
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
    use super::accept_prefers_openmetrics as om;

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
}

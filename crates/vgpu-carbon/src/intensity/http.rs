//! The HTTP GET both APIs need: a timeout, and errors that say what went wrong in one line.

use std::io::Read as _;
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::SourceError;

/// Bodies larger than this are not an intensity reading.
const MAX_BODY: u64 = 1 << 20;

/// GET `url` and decode its JSON body as `T`.
pub fn get_json<T: DeserializeOwned>(url: &str, headers: &[(&str, &str)], timeout: Duration) -> Result<T, SourceError> {
    let agent = ureq::AgentBuilder::new().timeout(timeout).redirects(2).build();
    let mut request = agent.get(url).set("Accept", "application/json");
    for (name, value) in headers {
        request = request.set(name, value);
    }
    let response = match request.call() {
        Ok(response) => response,
        Err(ureq::Error::Status(status, response)) => {
            let body = read_body(response).unwrap_or_default();
            return Err(SourceError::Http { url: url.to_string(), status, detail: error_detail(&body) });
        }
        Err(ureq::Error::Transport(transport)) => return Err(transport_error(url, &transport, timeout)),
    };
    let body = read_body(response).map_err(|e| {
        if is_timeout(&e) {
            SourceError::Timeout { url: url.to_string(), timeout }
        } else {
            SourceError::Unreachable { url: url.to_string(), message: format!("reading the answer: {e}") }
        }
    })?;
    serde_json::from_str(&body).map_err(|e| SourceError::Malformed { url: url.to_string(), message: e.to_string() })
}

fn read_body(response: ureq::Response) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    response.into_reader().take(MAX_BODY).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock)
}

fn transport_error(url: &str, transport: &ureq::Transport, timeout: Duration) -> SourceError {
    let io_timeout =
        std::error::Error::source(transport).and_then(|s| s.downcast_ref::<std::io::Error>()).is_some_and(is_timeout);
    if io_timeout {
        return SourceError::Timeout { url: url.to_string(), timeout };
    }
    let message = match transport.kind() {
        ureq::ErrorKind::UnknownScheme if url.starts_with("https://") => {
            "this build of vgpu has no TLS support; point base_url at an http:// proxy".to_string()
        }
        _ => transport.message().map_or_else(|| transport.kind().to_string(), str::to_string),
    };
    SourceError::Unreachable { url: url.to_string(), message }
}

/// The message of an API error body: Electricity Maps `{"error": …, "message": …}`, the UK
/// API `{"error": {"code": …, "message": …}}`; else the start of the text. One line of at
/// most 200 characters either way (the server chooses the text).
pub fn error_detail(body: &str) -> String {
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
    if let Ok(json) = serde_json::from_str::<serde_json::Value>(body) {
        let error = &json["error"];
        let parts: Vec<String> = [text(error), text(&error["code"]), text(&error["message"]), text(&json["message"])]
            .into_iter()
            .flatten()
            .collect();
        if !parts.is_empty() {
            return one_line(&parts.join(": "));
        }
    }
    one_line(body)
}

/// Whitespace runs as one space, other control characters as `?`, at most 200 characters.
fn one_line(text: &str) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    flat.chars().take(200).map(|c| if c.is_control() { '?' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_of_both_apis() {
        assert_eq!(
            error_detail(r#"{"error":"Invalid auth-token","message":"The provided token is invalid."}"#),
            "Invalid auth-token: The provided token is invalid."
        );
        assert_eq!(
            error_detail(r#"{"error":{"code":"400 Bad Request","message":"Please enter a valid postcode."}}"#),
            "400 Bad Request: Please enter a valid postcode."
        );
        assert_eq!(error_detail("<html>\n<b>Bad   gateway</b></html>"), "<html> <b>Bad gateway</b></html>");
        assert_eq!(error_detail(""), "");
        // Caught by the `intensity_response` fuzz check: a message with line breaks made a
        // multi-line error.
        assert_eq!(error_detail("{\"error\":\"bad\\nthing\",\"message\":\"one\\r\\n\\u001b[2Jtwo\"}"), "bad thing: one ?[2Jtwo");
        assert_eq!(error_detail(&format!("{{\"message\":\"{}\"}}", "x".repeat(300))).len(), 200);
    }
}

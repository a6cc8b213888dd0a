//! `--watch`: a listing redrawn every interval until SIGINT or SIGTERM (then exit 0), like
//! `watch`, `nvidia-smi -l` and `gpustat -i`. On a terminal each refresh replaces the last
//! (clear the screen, cursor home, a header line); otherwise refreshes follow each other:
//! tables separated by a blank line and a header with the time, JSON one document per line
//! (JSON Lines). The loop itself takes no lock and waits for nothing but the interval and the
//! signals; each refresh is one listing, exactly as without `--watch`.

use std::fmt::Display;
use std::io::{IsTerminal as _, Write as _};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use thiserror::Error;

/// The interval when `--watch` is given without one, seconds.
pub const DEFAULT_SECONDS: &str = "2";
/// The shortest interval, seconds.
pub const MIN_SECONDS: f64 = 0.1;
/// The longest interval, seconds (a day).
pub const MAX_SECONDS: f64 = 86_400.0;

/// How refreshes are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Tables: in place on a terminal, one after the other otherwise.
    Table,
    /// One JSON document per line per refresh (the frame must be one line).
    JsonLines,
}

#[derive(Debug, Error)]
pub enum RefreshError {
    #[error("--watch cannot catch SIGINT and SIGTERM: {0}")]
    Signals(std::io::Error),
    #[error("cannot write the listing: {0}")]
    Output(std::io::Error),
}

/// `--watch`'s value: seconds, [`MIN_SECONDS`] to [`MAX_SECONDS`] (clap's value parser).
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !seconds.is_finite() || !(MIN_SECONDS..=MAX_SECONDS).contains(&seconds) {
        return Err(format!("the interval must be from {MIN_SECONDS} to {MAX_SECONDS} seconds, got {text}"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Print one frame (`frame(true)`: pretty JSON allowed), or with `watch` refresh it every
/// interval until a signal ([`run`]; `frame(false)`: one line of JSON when `json`).
pub fn once_or_every<E, F>(watch: Option<Duration>, json: bool, title: &str, mut frame: F) -> Result<(), E>
where
    E: Display + From<RefreshError>,
    F: FnMut(bool) -> Result<String, E>,
{
    match watch {
        None => {
            println!("{}", frame(true)?);
            Ok(())
        }
        Some(interval) => {
            let style = if json { Style::JsonLines } else { Style::Table };
            run(interval, title, style, || frame(false))
        }
    }
}

/// Write `frame()` every `interval` until SIGINT or SIGTERM, or until stdout is closed
/// (`| head`); both end it with `Ok`. `title` heads each table (`vgpu ps`). An error of the
/// first frame ends the loop with it (nothing was ever shown); a later one is one line on
/// stderr and the next refresh tries again.
pub fn run<E, F>(interval: Duration, title: &str, style: Style, mut frame: F) -> Result<(), E>
where
    E: Display + From<RefreshError>,
    F: FnMut() -> Result<String, E>,
{
    let stop = stop_on_signals().map_err(RefreshError::Signals)?;
    let tty = std::io::stdout().is_terminal();
    let mut first = true;
    loop {
        let started = Instant::now();
        match frame() {
            Ok(text) => {
                let out = compose(&text, title, interval, style, tty, first);
                let mut stdout = std::io::stdout().lock();
                match stdout.write_all(out.as_bytes()).and_then(|()| stdout.flush()) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                    Err(e) => return Err(RefreshError::Output(e).into()),
                }
            }
            Err(e) if first => return Err(e),
            Err(e) => eprintln!("vgpu: error: {e:#}"),
        }
        first = false;
        match stop.recv_timeout(interval.saturating_sub(started.elapsed())) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
        }
    }
}

/// A channel that receives once SIGINT or SIGTERM arrives (they no longer terminate the
/// process: the loop ends itself).
fn stop_on_signals() -> std::io::Result<mpsc::Receiver<()>> {
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new().name("watch-signals".into()).spawn(move || {
        if signals.forever().next().is_some() {
            let _ = tx.send(());
        }
    })?;
    Ok(rx)
}

/// What one refresh writes.
fn compose(text: &str, title: &str, interval: Duration, style: Style, tty: bool, first: bool) -> String {
    let text = text.trim_end_matches('\n');
    if style == Style::JsonLines {
        return format!("{text}\n");
    }
    let header = format!(
        "Every {}: {title}    {}",
        humantime::format_duration(interval),
        chrono::Local::now().format("%Y-%m-%d %H:%M:%S")
    );
    match (tty, first) {
        // Clear the screen and put the cursor home, as `watch` does.
        (true, _) => format!("\x1b[H\x1b[2J{header}\n\n{text}\n"),
        (false, true) => format!("{header}\n{text}\n"),
        (false, false) => format!("\n{header}\n{text}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_seconds_from_a_tenth_to_a_day() {
        assert_eq!(parse_interval("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_interval("0.2"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_interval(DEFAULT_SECONDS), Ok(Duration::from_secs(2)));
        for bad in ["0.05", "0", "-1", "nan", "inf", "1e9", "2s", ""] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tables_get_a_header_and_json_one_line() {
        let second = compose("T\n", "vgpu ps", Duration::from_secs(2), Style::Table, false, false);
        assert!(second.starts_with("\nEvery 2s: vgpu ps    "), "{second:?}");
        assert!(second.ends_with("\nT\n"), "{second:?}");
        let first = compose("T", "vgpu ps", Duration::from_secs(2), Style::Table, false, true);
        assert!(first.starts_with("Every 2s: vgpu ps"), "{first:?}");
        let tty = compose("T", "vgpu ps", Duration::from_millis(500), Style::Table, true, false);
        assert!(tty.starts_with("\x1b[H\x1b[2JEvery 500ms: vgpu ps"), "{tty:?}");
        assert_eq!(compose("[1]\n", "x", Duration::from_secs(1), Style::JsonLines, true, false), "[1]\n");
    }
}

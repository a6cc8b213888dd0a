//! The watch's log: one line per event on stderr, `vgpu watch: …` (`vgpu watch: warning: …`).
//! Under systemd, where stderr is the journal's stream (`JOURNAL_STREAM` names its device
//! and inode), each line starts with its syslog priority (`<4>` warning, `<6>` info, `<7>`
//! debug), which journald strips and keeps as the entry's priority
//! (`journalctl -u vgpu-watch -p warning`). A line that cannot be written is dropped: the
//! daemon never stops over its log.

use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::sync::OnceLock;

use super::Level;

/// The line as written, without the journal's priority prefix.
pub fn format(level: Level, message: &str) -> String {
    match level {
        Level::Warn => format!("vgpu watch: warning: {message}"),
        Level::Info | Level::Debug => format!("vgpu watch: {message}"),
    }
}

/// Write one line to stderr.
pub fn write(level: Level, message: &str) {
    write_line(&format(level, &message.replace(|c: char| c.is_control(), " ")), level);
}

/// Write one line of another daemon (`vgpu service run: …`) to stderr, as the watch's.
pub fn write_as(daemon: &str, level: Level, message: &str) {
    let message = message.replace(|c: char| c.is_control(), " ");
    match level {
        Level::Warn => write_line(&format!("{daemon}: warning: {message}"), level),
        Level::Info | Level::Debug => write_line(&format!("{daemon}: {message}"), level),
    }
}

fn write_line(text: &str, level: Level) {
    let mut line = String::new();
    if to_journal() {
        line.push_str(priority(level));
    }
    // One line whatever the message holds.
    line.push_str(text);
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

fn priority(level: Level) -> &'static str {
    match level {
        Level::Warn => "<4>",
        Level::Info => "<6>",
        Level::Debug => "<7>",
    }
}

/// Whether stderr is the journal stream systemd handed us (not merely inherited by a child
/// whose stderr was redirected since).
fn to_journal() -> bool {
    static IT: OnceLock<bool> = OnceLock::new();
    *IT.get_or_init(|| {
        let Some(stream) = std::env::var_os("JOURNAL_STREAM") else { return false };
        let Ok(stderr) = std::fs::metadata("/proc/self/fd/2") else { return false };
        stream.to_str().is_some_and(|s| names(s, stderr.dev(), stderr.ino()))
    })
}

/// `JOURNAL_STREAM`'s `DEVICE:INODE` (decimal) names this device and inode.
fn names(stream: &str, dev: u64, ino: u64) -> bool {
    stream
        .split_once(':')
        .and_then(|(d, i)| Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?)))
        .is_some_and(|(d, i)| d == dev && i == ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_priorities() {
        assert_eq!(format(Level::Warn, "x"), "vgpu watch: warning: x");
        assert_eq!(format(Level::Info, "ready"), "vgpu watch: ready");
        assert_eq!(priority(Level::Warn), "<4>");
        assert_eq!(priority(Level::Info), "<6>");
    }

    #[test]
    fn journal_stream_must_name_this_stderr() {
        assert!(names("8:1234", 8, 1234));
        assert!(!names("8:1234", 8, 1235));
        assert!(!names("8:1234", 9, 1234));
        for bad in ["", "8", "8:", ":1", "x:1", "8:1:2", "-8:1"] {
            assert!(!names(bad, 8, 1), "{bad:?}");
        }
    }
}

//! Exit codes and the one error type that changes them. [`EXIT_STATUS_DOC`] is the one list
//! of them: the man pages' EXIT STATUS and the user guide (docs/scripting.md) use it; `tests/scripting.rs` makes
//! each happen.

use std::fmt;

pub const EXIT_OK: u8 = 0;
pub const EXIT_FAILURE: u8 = 1;
pub const EXIT_USAGE: u8 = 2;

/// Which commands an exit status of [`EXIT_STATUS_DOC`] applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitScope {
    /// Every command.
    All,
    /// `vgpu run` only (the workload's own status).
    Run,
    /// Every command but `run` and `watch` (which keep running when their output closes).
    NotRunOrWatch,
}

/// The exit statuses, as the man pages (EXIT STATUS) document them: status, meaning, and
/// the commands it applies to.
pub const EXIT_STATUS_DOC: &[(&str, &str, ExitScope)] = &[
    ("0", "Success. doctor: every check passed or only warned.", ExitScope::All),
    (
        "1",
        "A runtime failure: something on the host or in the state went wrong (no driver, a GPU or the pool without room, a damaged record). doctor: a check failed. kill, suspend, resume of several workloads: one of them failed (the others were acted on, each says how).",
        ExitScope::All,
    ),
    (
        "2",
        "A usage error: a bad flag or value, an invalid config file or one that cannot be read, an unknown or ambiguous workload ID or partition, a request this host can never meet. Nothing was changed.",
        ExitScope::All,
    ),
    ("N", "The workload's own exit status, when it exits.", ExitScope::Run),
    ("128+N", "The workload was killed by signal N (137: SIGKILL, e.g. by the OOM killer at its --memory limit).", ExitScope::Run),
    ("126", "The command was found but cannot be executed.", ExitScope::Run),
    ("127", "The command was not found.", ExitScope::Run),
    ("141", "The output was closed early (piped into head(1)): vgpu ends on SIGPIPE, as coreutils do; a shell reports 128+13.", ExitScope::NotRunOrWatch),
];

/// An error the user caused by what they asked for; `main` exits 2 on it.
/// Wrap it in `anyhow::Error` (`UsageError::new(..).into()` or `usage!(..)`).
#[derive(Debug)]
pub struct UsageError(pub String);

impl UsageError {
    pub fn new(message: impl Into<String>) -> Self {
        UsageError(message.into())
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// `bail!` for usage errors: `usage!("--mem must be positive, got {v}")`.
#[macro_export]
macro_rules! usage {
    ($($arg:tt)*) => {
        return Err(anyhow::Error::from($crate::error::UsageError::new(format!($($arg)*))))
    };
}

/// The exit code for an error: 2 if any cause in its chain is a usage error, else 1.
pub fn exit_code_for(err: &anyhow::Error) -> u8 {
    if let Some(e) = err.chain().find_map(|cause| cause.downcast_ref::<NotRunnable>()) {
        return e.exit_code();
    }
    if err.chain().any(|cause| cause.is::<UsageError>()) {
        EXIT_USAGE
    } else {
        EXIT_FAILURE
    }
}

/// clap's rendered parse error on one line: its `error:` line, and its tip if it gives one
/// (`unexpected argument '-1' found; tip: to pass '-1' as a value, use '-- -1'`); the usage
/// and "For more information" lines are left out.
pub fn one_line_clap_error(rendered: &str) -> String {
    // The first paragraph is the message (a list of missing arguments continues it).
    let mut paragraphs = rendered.split("\n\n");
    let first: Vec<&str> = paragraphs.next().unwrap_or_default().lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let first = first.join(" ");
    let mut out = first.strip_prefix("error:").unwrap_or(&first).trim().to_string();
    if out.is_empty() {
        out.push_str("invalid command line");
    }
    for tip in paragraphs.flat_map(str::lines).map(str::trim).filter(|l| l.starts_with("tip:")) {
        out.push_str("; ");
        out.push_str(tip);
    }
    if !out.contains("--help") {
        out.push_str(" (see --help)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_errors_become_one_line() {
        let rendered = "error: unexpected argument '-1' found\n\n  tip: to pass '-1' as a value, use '-- -1'\n\nUsage: vgpu run [OPTIONS] <CMD>...\n\nFor more information, try '--help'.\n";
        assert_eq!(one_line_clap_error(rendered), "unexpected argument '-1' found; tip: to pass '-1' as a value, use '-- -1' (see --help)");
        let rendered = "error: invalid value '0' for '--compute <PCT>': 0 is not in 1..=100\n\nFor more information, try '--help'.\n";
        assert_eq!(one_line_clap_error(rendered), "invalid value '0' for '--compute <PCT>': 0 is not in 1..=100 (see --help)");
        let rendered = "error: the following required arguments were not provided:\n  <CMD>...\n\nUsage: vgpu run [OPTIONS] <CMD>...\n\nFor more information, try '--help'.\n";
        assert_eq!(one_line_clap_error(rendered), "the following required arguments were not provided: <CMD>... (see --help)");
    }
}

/// The workload's command could not be executed: exit 127 when it does not exist, 126 when
/// it is not executable, as shells, `env` and `docker run` do.
#[derive(Debug, thiserror::Error)]
#[error("{program}: {}", if self.missing { "command not found" } else { "not executable (permission denied)" })]
pub struct NotRunnable {
    pub program: String,
    pub missing: bool,
}

impl NotRunnable {
    /// From the error of spawning `program`, if it says so.
    pub fn from_spawn(program: &str, e: &std::io::Error) -> Option<NotRunnable> {
        let missing = match e.kind() {
            std::io::ErrorKind::NotFound => true,
            std::io::ErrorKind::PermissionDenied => false,
            _ => return None,
        };
        Some(NotRunnable { program: program.to_string(), missing })
    }

    pub fn exit_code(&self) -> u8 {
        if self.missing {
            127
        } else {
            126
        }
    }
}

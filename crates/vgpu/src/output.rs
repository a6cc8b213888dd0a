//! How listings look: comfy-table for people, JSON for scripts; `--watch` redraws them.
//! And the messages around them: every line on stderr goes through the log
//! ([`log_format`]) or [`notice`], so `-q` and `-v` govern them all.
//!
//! stdout carries results: a listing, a document, the line saying what a command did. -q
//! never suppresses them (a script asked for them). stderr carries messages: errors
//! (always), warnings (unless -q), notices of what a command is doing (`waiting for the
//! memory…`; unless -q), and with -v/-vv/-vvv the info, debug and trace log.

pub mod refresh;


use comfy_table::presets::UTF8_BORDERS_ONLY;
use comfy_table::{ContentArrangement, Table};
use serde::Serialize;

/// A table with vgpu's look and the given header.
pub fn table<I, S>(header: I) -> Table
where
    I: IntoIterator<Item = S>,
    S: Into<comfy_table::Cell>,
{
    let mut table = Table::new();
    table
        .load_preset(UTF8_BORDERS_ONLY)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    table
}

/// A JSON document on stdout (`{"schema": N, ...value's fields}`, pretty, with a final
/// newline). `value` must serialize as an object: wrap a list in a struct naming it.
pub fn print_json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    println!("{}", schema::to_text(value, true)?);
    Ok(())
}

/// "—" for a missing reading.
pub fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map(|v| v.to_string()).unwrap_or_else(|| "—".into())
}

pub use vgpu_host::notice::{notice, set_quiet};
pub use vgpu_json as schema;

/// The log's lines on stderr, in vgpu's own form: `vgpu: warning: MESSAGE`, `vgpu: error:
/// …`, `vgpu: MESSAGE` (info), `vgpu: debug: …`, `vgpu: trace: …`.
pub struct LogFormat;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for LogFormat
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => "error: ",
            tracing::Level::WARN => "warning: ",
            tracing::Level::INFO => "",
            tracing::Level::DEBUG => "debug: ",
            tracing::Level::TRACE => "trace: ",
        };
        write!(writer, "vgpu: {level}")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// The log filter: `-q` (errors only) or `-v`… on the command line, else `VGPU_LOG` (an
/// `EnvFilter` directive) if set, else warnings. Directives name vgpu's crates: the CLI and
/// library (`vgpu`) and its ABI crate (`vgpu_abi`).
pub fn log_filter(verbose: u8, quiet: bool, env: Option<&str>) -> String {
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => match env {
            Some(directives) if !directives.trim().is_empty() => return directives.to_string(),
            _ => "warn",
        },
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    format!("vgpu={level},vgpu_abi={level}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_vgpu_log_which_wins_over_the_default() {
        assert_eq!(log_filter(0, false, None), "vgpu=warn,vgpu_abi=warn");
        assert_eq!(log_filter(0, false, Some("vgpu=debug")), "vgpu=debug");
        assert_eq!(log_filter(0, false, Some(" ")), "vgpu=warn,vgpu_abi=warn");
        assert_eq!(log_filter(1, false, Some("vgpu=warn")), "vgpu=info,vgpu_abi=info");
        assert_eq!(log_filter(2, false, None), "vgpu=debug,vgpu_abi=debug");
        assert_eq!(log_filter(5, false, None), "vgpu=trace,vgpu_abi=trace");
        assert_eq!(log_filter(0, true, Some("vgpu=trace")), "vgpu=error,vgpu_abi=error");
    }
}

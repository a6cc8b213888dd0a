//! How listings look: comfy-table for people, JSON for scripts; `--watch` redraws them.

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

/// Pretty JSON on stdout, with a final newline.
pub fn print_json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// "—" for a missing reading.
pub fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map(|v| v.to_string()).unwrap_or_else(|| "—".into())
}

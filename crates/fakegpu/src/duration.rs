//! Durations as the config and `FAKEGPU_KERNELS` write them (below both `config` and
//! `model`, which use each other's types otherwise).

/// The longest duration either takes: no single launch occupies the device for longer.
pub const MAX_NS: u64 = 10_000_000_000;

/// A duration: `20us`, `1.5ms`, `2s`, `500ns`, or plain nanoseconds.
pub fn parse_duration_ns(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit.trim() {
        "" | "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}` (ns, us, ms, s)"
            ))
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (like 20us, 1ms, 50ms or 2000)"))?;
    let ns = (value * scale).round();
    if !(1.0..=MAX_NS as f64).contains(&ns) {
        return Err(format!("`{text}` is outside 1ns..=10s"));
    }
    Ok(ns as u64)
}

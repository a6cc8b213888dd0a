//! Sizes as people write them: `4G`, `4GiB`, `512M`, `1.5G`, `4096` (bytes).
//!
//! Units are binary: `4G` = `4GiB` = 4·2³⁰, because GPU memory is sold and reported in
//! binary units and `nvidia-smi` says "MiB". `4GB` is also read as binary for the same
//! reason; nobody means 4·10⁹ bytes of HBM.

use std::fmt;

/// Why a size could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError {
    pub input: String,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid size {:?}: expected a number of bytes or a number with a unit (K, M, G, T; e.g. 512M, 4G, 1.5GiB)",
            self.input
        )
    }
}

impl std::error::Error for SizeError {}

/// Parse a size in bytes. Binary units; fractions allowed (`1.5G`); zero is allowed here
/// (callers that need a positive size say so themselves).
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let err = || SizeError { input: input.to_string() };
    let trimmed = input.trim();
    if trimmed.is_empty() || trimmed.starts_with('-') || trimmed.starts_with('+') {
        return Err(err());
    }
    // "4GB" → "4GiB": the parse-size crate would read "GB" as decimal.
    let normalised = match trimmed.strip_suffix(['B', 'b']) {
        Some(rest) if rest.ends_with(|c: char| "kKmMgGtTpP".contains(c)) => format!("{rest}iB"),
        _ => trimmed.to_string(),
    };
    // parse-size rounds the digit after a u64::MAX mantissa (18446744073709551615…) up with an
    // unchecked addition: a panic in debug builds, 0 in release. No size needs more than 20
    // significant digits.
    let significant = normalised
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .filter(|b| *b != b'.')
        .skip_while(|b| *b == b'0')
        .count();
    if significant > 20 {
        return Err(err());
    }
    parse_size::Config::new()
        .with_binary()
        .parse_size(&normalised)
        .map_err(|_| err())
}

/// Format bytes for people: `4 GiB`, `1.50 GiB`, `512 MiB`, `17 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value.fract() == 0.0 {
        format!("{} {}", value as u64, UNITS[unit])
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_units() {
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("4GB").unwrap(), 4 << 30);
        assert_eq!(parse_size("4g").unwrap(), 4 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("16GiB").unwrap(), 16 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size(" 2K ").unwrap(), 2048);
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "abc", "-4G", "4X", "G", "4 G G", "+1G"] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(parse_size("4X").unwrap_err().to_string().contains("\"4X\""));
    }

    #[test]
    fn more_than_20_significant_digits_are_refused() {
        // Found by fuzzing (`size`): parse-size overflowed rounding the 21st digit after a
        // mantissa of u64::MAX (a panic in debug builds, 0 bytes in release).
        for bad in ["184467440737095516159", "1.84467440737095516159G", "00018446744073709551615999999G", "123456789012345678901"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert_eq!(parse_size("0000000000000000000000000001K").unwrap(), 1024);
        assert_eq!(parse_size("0.5000000000000000000K").unwrap(), 512);
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(4 << 30), "4 GiB");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
        assert_eq!(format_size(17), "17 B");
        assert_eq!(format_size(80 << 30), "80 GiB");
    }
}

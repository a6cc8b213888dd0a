//! `source = "file"`: a local time series, read at the current time.
//!
//! CSV, one `timestamp,gco2_per_kwh` per line (an optional header line, `#` comments and
//! blank lines are skipped), or JSON, an array of `{"timestamp": …, "gco2_per_kwh": …}`.
//! Timestamps as [`super::parse_timestamp`] reads them. The value in force is the one with
//! the latest timestamp at or before now. Its forecast is the rows from then on.
//!
//! Only a regular file is read, and at most [`MAX_FILE`] bytes of it: a FIFO, a device
//! (`/dev/zero`), a directory or a symbolic link is refused before anything is read (the
//! path is checked with lstat, then opened with O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC, so that
//! neither a FIFO without a writer nor a swapped-in link can block or redirect the read).

use std::io::Read as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::{parse_timestamp, Reading, Source, SourceError};

pub struct File {
    pub path: PathBuf,
}

impl Source for File {
    fn describe(&self) -> String {
        format!("file {}", self.path.display())
    }

    fn read(&self, now: DateTime<Utc>) -> Result<Reading, SourceError> {
        let text = read_capped(&self.path)?;
        let bad = |message: String| SourceError::BadFile { path: self.path.clone(), message };
        let series = parse_series(&text).map_err(bad)?;
        at(&series, now).ok_or_else(|| match series.iter().map(|r| r.timestamp).min() {
            Some(first) => bad(format!("no entry at or before now (the first is at {})", first.to_rfc3339())),
            None => bad("no entries".into()),
        })
    }

    fn forecast(&self, now: DateTime<Utc>, until: DateTime<Utc>) -> Result<Vec<Reading>, SourceError> {
        let text = read_capped(&self.path)?;
        let series = parse_series(&text).map_err(|message| SourceError::BadFile { path: self.path.clone(), message })?;
        let mut out: Vec<Reading> = at(&series, now).into_iter().collect();
        out.extend(series.into_iter().filter(|r| r.timestamp > now && r.timestamp < until));
        if out.is_empty() {
            return Err(SourceError::BadFile { path: self.path.clone(), message: "no entries from now on".into() });
        }
        Ok(out)
    }
}

/// The most of a time series file that is read: a year of 5-minute values as CSV.
pub const MAX_FILE: u64 = 4 << 20;

/// The text of the regular file at `path`, refusing anything else and anything over
/// [`MAX_FILE`].
fn read_capped(path: &Path) -> Result<String, SourceError> {
    let read_err = |source| SourceError::Read { path: path.to_path_buf(), source };
    let not_regular = |kind| SourceError::NotRegularFile { path: path.to_path_buf(), kind };
    let too_large = || SourceError::FileTooLarge { path: path.to_path_buf(), cap: MAX_FILE };
    // Refused before opening: opening a device or a FIFO can itself have effects.
    let before = std::fs::symlink_metadata(path).map_err(read_err)?;
    if !before.file_type().is_file() {
        return Err(not_regular(kind(&before.file_type())));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => not_regular("a symbolic link"),
            _ => read_err(e),
        })?;
    // And checked again on what was opened, in case the path was replaced in between.
    let opened = file.metadata().map_err(read_err)?;
    if !opened.file_type().is_file() {
        return Err(not_regular(kind(&opened.file_type())));
    }
    if (opened.dev(), opened.ino()) != (before.dev(), before.ino()) {
        return Err(read_err(std::io::Error::other("it was replaced while being opened")));
    }
    if opened.len() > MAX_FILE {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1).read_to_end(&mut bytes).map_err(read_err)?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(too_large()); // it grew after the check
    }
    String::from_utf8(bytes).map_err(|_| SourceError::BadFile {
        path: path.to_path_buf(),
        message: "not UTF-8 text".into(),
    })
}

fn kind(t: &std::fs::FileType) -> &'static str {
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

/// The reading in force at `now`.
pub fn at(series: &[Reading], now: DateTime<Utc>) -> Option<Reading> {
    series.iter().filter(|r| r.timestamp <= now).max_by_key(|r| r.timestamp).cloned()
}

/// CSV or JSON, told apart by the first character.
pub fn parse_series(text: &str) -> Result<Vec<Reading>, String> {
    if text.trim_start().starts_with('[') {
        parse_json(text)
    } else {
        parse_csv(text)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    timestamp: serde_json::Value,
    gco2_per_kwh: f64,
}

fn parse_json(text: &str) -> Result<Vec<Reading>, String> {
    // serde quotes an unknown key as it is: its control characters (a line break) as `?`.
    let entries: Vec<JsonEntry> = serde_json::from_str(text).map_err(|e| {
        let message: String = e.to_string().chars().map(|c| if c.is_control() { '?' } else { c }).collect();
        format!("not a JSON time series: {message}")
    })?;
    entries
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let stamp = match &e.timestamp {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let timestamp =
                parse_timestamp(&stamp).ok_or_else(|| format!("entry {}: cannot read timestamp {stamp}", i + 1))?;
            Ok(Reading { g_per_kwh: check(e.gco2_per_kwh).map_err(|m| format!("entry {}: {m}", i + 1))?, timestamp })
        })
        .collect()
}

fn parse_csv(text: &str) -> Result<Vec<Reading>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((stamp, value)) = line.split_once(',') else {
            return Err(format!("line {}: expected `timestamp,gco2_per_kwh`, got {line:?}", n + 1));
        };
        let value = value.trim().trim_matches('"');
        let Ok(number) = value.parse::<f64>() else {
            if out.is_empty() && parse_timestamp(stamp.trim_matches('"')).is_none() {
                continue; // header line
            }
            return Err(format!("line {}: {value:?} is not a number", n + 1));
        };
        let timestamp = parse_timestamp(stamp.trim().trim_matches('"'))
            .ok_or_else(|| format!("line {}: cannot read timestamp {:?}", n + 1, stamp.trim()))?;
        out.push(Reading { g_per_kwh: check(number).map_err(|m| format!("line {}: {m}", n + 1))?, timestamp });
    }
    Ok(out)
}

fn check(value: f64) -> Result<f64, String> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(format!("{value} is not a non-negative number"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        parse_timestamp(s).unwrap()
    }

    fn read(name: &str, text: &str, now: &str) -> Result<Reading, SourceError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        File { path }.read(t(now))
    }

    #[test]
    fn csv_with_header_and_comments_gives_the_value_in_force() {
        let text = "timestamp,gco2_per_kwh\n# hourly\n2024-05-01T10:00:00Z,300\n2024-05-01T12:00:00Z,250.5\n\n2024-05-01T11:00Z,280\n";
        let r = read("i.csv", text, "2024-05-01T11:59:59Z").unwrap();
        assert_eq!((r.g_per_kwh, r.timestamp), (280.0, t("2024-05-01T11:00:00Z")));
        assert_eq!(read("i.csv", text, "2024-05-02T00:00:00Z").unwrap().g_per_kwh, 250.5);
    }

    #[test]
    fn csv_accepts_unix_seconds_and_naive_times() {
        let text = "1714557600,100\n2024-05-01 11:00,200\n";
        assert_eq!(read("i.csv", text, "2024-05-01T10:30:00Z").unwrap().g_per_kwh, 100.0);
        assert_eq!(read("i.csv", text, "2024-05-01T11:30:00Z").unwrap().g_per_kwh, 200.0);
    }

    #[test]
    fn json_series() {
        let text = r#"[{"timestamp": "2024-05-01T10:00:00Z", "gco2_per_kwh": 300},
                       {"timestamp": 1714561200, "gco2_per_kwh": 120}]"#;
        assert_eq!(read("i.json", text, "2024-05-01T10:59:00Z").unwrap().g_per_kwh, 300.0);
        assert_eq!(read("i.json", text, "2024-05-01T11:00:00Z").unwrap().g_per_kwh, 120.0);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        for (text, want) in [
            ("2024-05-01T10:00:00Z,300\nnot a line\n", "line 2: expected"),
            ("2024-05-01T10:00:00Z,300\n2024-05-01T11:00:00Z,lots\n", "line 2: \"lots\" is not a number"),
            ("2024-05-01T10:00:00Z,-3\n", "line 1: -3 is not a non-negative number"),
            ("yesterday,3\n", "line 1: cannot read timestamp"),
            ("2030-01-01T00:00:00Z,3\n", "no entry at or before now (the first is at 2030-01-01T00:00:00+00:00)"),
            ("", "no entries"),
            ("[{\"timestamp\": \"x\"}]", "not a JSON time series"),
            ("[{\"timestamp\": \"x\", \"gco2_per_kwh\": 1}]", "entry 1: cannot read timestamp x"),
            // Found by fuzzing (`file_source`): an unknown key was quoted with its line breaks.
            ("[{\"a\\nb\": 1}]", "not a JSON time series: unknown field `a?b`"),
        ] {
            let err = read("i.csv", text, "2024-05-01T12:00:00Z").unwrap_err().to_string();
            assert!(err.contains("i.csv: ") && err.contains(want), "{err} (wanted {want})");
        }
        let missing = File { path: "/nonexistent/i.csv".into() }.read(Utc::now()).unwrap_err().to_string();
        assert!(missing.starts_with("cannot read /nonexistent/i.csv"), "{missing}");
    }

    #[test]
    fn only_regular_files_up_to_the_cap_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let err = |path: &Path| File { path: path.into() }.read(Utc::now()).unwrap_err().to_string();
        let good = dir.path().join("good.csv");
        std::fs::write(&good, "2020-01-01T00:00:00Z,300\n").unwrap();
        assert_eq!(File { path: good.clone() }.read(Utc::now()).unwrap().g_per_kwh, 300.0);

        let link = dir.path().join("link.csv");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert_eq!(err(&link), format!("{}: not a regular file but a symbolic link; the file source reads only regular files", link.display()));
        assert!(err(dir.path()).contains("not a regular file but a directory"));
        assert!(err(Path::new("/dev/null")).starts_with("/dev/null: not a regular file but a character device"));

        let big = dir.path().join("big.csv");
        std::fs::write(&big, vec![b'#'; (MAX_FILE + 1) as usize]).unwrap();
        assert_eq!(err(&big), format!("{}: larger than 4 MiB, the cap on a file source", big.display()));
        std::fs::write(&big, [b"2020-01-01T00:00:00Z,7\n".as_slice(), &vec![b'#'; (MAX_FILE - 23) as usize]].concat()).unwrap();
        assert_eq!(File { path: big }.read(Utc::now()).unwrap().g_per_kwh, 7.0, "exactly the cap is read");

        let binary = dir.path().join("bin.csv");
        std::fs::write(&binary, [0xff, 0xfe]).unwrap();
        assert!(err(&binary).ends_with("bin.csv: not UTF-8 text"));
    }
}

//! The grid's carbon intensity, gCO2/kWh: read from the configured source, remembered, and
//! replaced when the source fails.
//!
//! Order of resolution: `--intensity` (an override, the source is not asked); the source;
//! when it fails, the last good reading of the same source if it was fetched no longer
//! than `max_age` ago (and the plan says so); else the configured `fallback` value (said
//! too); else an error naming the source's failure.
//!
//! **Forecasts** ([`resolve_forecast`]): the figures from now to a horizon's end, each in
//! force from its timestamp until the next one's (the last holds to the end). The UK API
//! and Electricity Maps serve theirs (`fw48h`, `carbon-intensity/forecast`), a file source
//! its rows from now on; a static and a command source have none: their forecast is flat
//! at their current value. When the source fails, the last good forecast of the same
//! source fetched no longer than `max_age` ago is used; else a flat forecast at the
//! current intensity (itself a reading, a remembered one or the fallback). Which one, and
//! why, is in the forecast's `status` and `note`.

pub mod cache;
pub mod command;
pub mod electricitymaps;
pub mod file;
mod http;
pub mod static_;
pub mod uk_grid;

pub use http::error_detail;

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::config::{CarbonConfig, CarbonConfigError, SourceKind};
use cache::{Cache, CachedReading};

/// One value from a source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reading {
    pub g_per_kwh: f64,
    /// The time the value is for, as the source says (or the time it was read).
    pub timestamp: DateTime<Utc>,
}

/// Why a source gave no value.
#[derive(Debug, Error)]
pub enum SourceError {
    #[error("no intensity source configured: set [carbon] source in the config, or pass --intensity")]
    NotConfigured,
    #[error(transparent)]
    Config(#[from] CarbonConfigError),
    #[error("cannot reach {url}: {message}")]
    Unreachable { url: String, message: String },
    #[error("{url} did not answer within {}", humantime::format_duration(*.timeout))]
    Timeout { url: String, timeout: Duration },
    #[error("{url} answered HTTP {status}{}", detail_suffix(.detail))]
    Http { url: String, status: u16, detail: String },
    #[error("malformed response from {url}: {message}")]
    Malformed { url: String, message: String },
    #[error("cannot read {}: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: {message}", .path.display())]
    BadFile { path: PathBuf, message: String },
    #[error("{}: not a regular file but {kind}; the file source reads only regular files", .path.display())]
    NotRegularFile { path: PathBuf, kind: &'static str },
    #[error("{}: larger than {} MiB, the cap on a file source", .path.display(), .cap >> 20)]
    FileTooLarge { path: PathBuf, cap: u64 },
    #[error("command `{command}`: {error}")]
    Command { command: String, error: command::CommandError },
    #[error("{name} gave {value} gCO2/kWh, which is not a carbon intensity from 0 to {max}", max = crate::config::MAX_INTENSITY)]
    BadValue { name: String, value: f64 },
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

/// Anything that can say the current intensity.
pub trait Source {
    /// How plans and logs name it, e.g. "uk-grid region 13". A remembered reading is only
    /// reused by the source with the same description.
    fn describe(&self) -> String;
    fn read(&self, now: DateTime<Utc>) -> Result<Reading, SourceError>;

    /// The figures from `now` to `until`, each in force from its timestamp until the next
    /// one's (unchecked: [`resolve_forecast`] checks, sorts and trims them). A source with no
    /// forecast of its own (static, command) gives its current value: a flat forecast.
    fn forecast(&self, now: DateTime<Utc>, _until: DateTime<Utc>) -> Result<Vec<Reading>, SourceError> {
        self.read(now).map(|r| vec![Reading { g_per_kwh: r.g_per_kwh, timestamp: now }])
    }
}

/// A source not read now (its description only), so that [`resolve`] takes the remembered
/// reading or the fallback: for a re-plan made with the store lock held.
pub struct NotRead(pub String);

impl Source for NotRead {
    fn describe(&self) -> String {
        self.0.clone()
    }

    fn read(&self, _now: DateTime<Utc>) -> Result<Reading, SourceError> {
        Err(SourceError::Unreachable { url: self.0.clone(), message: "not asked while the store lock is held (a workload's end found by reconcile)".into() })
    }

    fn forecast(&self, now: DateTime<Utc>, _until: DateTime<Utc>) -> Result<Vec<Reading>, SourceError> {
        self.read(now).map(|r| vec![r])
    }
}

/// The source the config chooses.
pub fn from_config(config: &CarbonConfig) -> Result<Box<dyn Source>, SourceError> {
    config.validate()?;
    let timeout = config.timeout()?;
    let base_url = config.base_url.clone();
    // validate() has checked that the keys each source needs are present.
    let missing = |key: &'static str| CarbonConfigError { key, message: "is required by the source".into() };
    Ok(match config.source.ok_or(SourceError::NotConfigured)? {
        SourceKind::Static => Box::new(static_::Static { g_per_kwh: config.value.ok_or_else(|| missing("value"))? }),
        SourceKind::File => Box::new(file::File { path: config.path.clone().ok_or_else(|| missing("path"))? }),
        SourceKind::Command => {
            Box::new(command::Command { command: config.command.clone().ok_or_else(|| missing("command"))?, timeout })
        }
        SourceKind::Electricitymaps => Box::new(electricitymaps::ElectricityMaps {
            zone: config.zone.clone().ok_or_else(|| missing("zone"))?,
            token_file: config.token_file.clone(),
            base_url: base_url.unwrap_or_else(|| electricitymaps::DEFAULT_BASE_URL.into()),
            timeout,
        }),
        SourceKind::UkGrid => Box::new(uk_grid::UkGrid {
            area: match (&config.postcode, config.region_id) {
                (Some(postcode), _) => uk_grid::Area::Postcode(postcode.trim().to_uppercase()),
                (None, Some(id)) => uk_grid::Area::Region(id),
                (None, None) => uk_grid::Area::National,
            },
            base_url: base_url.unwrap_or_else(|| uk_grid::DEFAULT_BASE_URL.into()),
            timeout,
        }),
    })
}

/// Where the value in use came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Just read from the source.
    Fresh,
    /// The source failed; a remembered reading younger than `max_age` is used.
    Cached,
    /// The source failed and nothing recent is remembered: the config's `fallback`.
    Fallback,
    /// `--intensity` on the command line.
    Override,
}

/// The intensity a command works with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Intensity {
    /// gCO2/kWh.
    pub intensity: f64,
    pub source: String,
    pub status: Status,
    /// The time the value is for.
    pub timestamp: DateTime<Utc>,
    /// Seconds between `timestamp` and now (0 for values about the future).
    pub age_seconds: i64,
    /// Why a cached or fallback value is used: the source's failure.
    pub note: Option<String>,
}

impl Intensity {
    pub fn overridden(g_per_kwh: f64, now: DateTime<Utc>) -> Intensity {
        Intensity {
            intensity: g_per_kwh,
            source: "--intensity".into(),
            status: Status::Override,
            timestamp: now,
            age_seconds: 0,
            note: None,
        }
    }
}

#[derive(Debug, Error)]
#[error("no carbon intensity: {source_error}; {why_no_cache}; set [carbon] fallback, or pass --intensity")]
pub struct IntensityError {
    pub source_error: SourceError,
    pub why_no_cache: String,
}

/// What `resolve` needs besides the source.
pub struct Policy<'a> {
    pub cache: &'a Cache,
    pub max_age: Duration,
    pub fallback: Option<f64>,
    /// Remember a fresh reading (the commands that only look, like `plan`, do not write).
    pub remember: bool,
}

/// Read the source, falling back to the cache and then to the fallback value.
pub fn resolve(source: &dyn Source, policy: &Policy<'_>, now: DateTime<Utc>) -> Result<Intensity, IntensityError> {
    let name = source.describe();
    let error = match source.read(now).and_then(|r| check_value(&name, r)) {
        Ok(reading) => {
            if policy.remember {
                let entry = CachedReading { source: name.clone(), reading: reading.clone(), fetched_at: now };
                if let Err(e) = policy.cache.store(&entry) {
                    // Not fatal: the value is good; only the next failure's fallback suffers.
                    tracing::info!("cannot remember the intensity reading: {e}");
                }
            }
            return Ok(found(name, reading, Status::Fresh, None, now));
        }
        Err(e) => e,
    };
    let why_no_cache = match policy.cache.load() {
        // The file may be damaged: its value is checked like a fresh one.
        Ok(Some(entry)) if entry.source == name && check_value(&name, entry.reading.clone()).is_err() => {
            format!("the remembered reading is unusable ({} gCO2/kWh is not a non-negative number)", entry.reading.g_per_kwh)
        }
        // Read "in the future" (a clock stepped back, or a forged file): its age is unknown,
        // and counting it as 0 s would make it good forever.
        Ok(Some(entry)) if entry.source == name && entry.fetched_at > now + chrono::Duration::minutes(5) => {
            format!("the remembered reading is unusable (read at {}, in the future)", entry.fetched_at.to_rfc3339())
        }
        Ok(Some(entry)) if entry.source == name => {
            let age = now.signed_duration_since(entry.fetched_at).to_std().unwrap_or_default();
            if age <= policy.max_age {
                let note = format!(
                    "{error}; using the value read {} ago (max_age {})",
                    humantime::format_duration(round_secs(age)),
                    humantime::format_duration(policy.max_age)
                );
                return Ok(found(name, entry.reading, Status::Cached, Some(note), now));
            }
            format!(
                "the last good reading is {} old (max_age {})",
                humantime::format_duration(round_secs(age)),
                humantime::format_duration(policy.max_age)
            )
        }
        Ok(_) => "no earlier reading of this source is remembered".to_string(),
        Err(e) => format!("the remembered reading is unusable ({e})"),
    };
    match policy.fallback {
        Some(value) => {
            let note = format!("{error}; {why_no_cache}; using the configured fallback");
            Ok(Intensity {
                intensity: value,
                source: format!("fallback (for {name})"),
                status: Status::Fallback,
                timestamp: now,
                age_seconds: 0,
                note: Some(note),
            })
        }
        None => Err(IntensityError { source_error: error, why_no_cache }),
    }
}

fn round_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

fn check_value(name: &str, reading: Reading) -> Result<Reading, SourceError> {
    if crate::config::check_intensity("intensity", reading.g_per_kwh).is_ok() {
        Ok(reading)
    } else {
        Err(SourceError::BadValue { name: name.to_string(), value: reading.g_per_kwh })
    }
}

fn found(source: String, reading: Reading, status: Status, note: Option<String>, now: DateTime<Utc>) -> Intensity {
    Intensity {
        intensity: reading.g_per_kwh,
        source,
        status,
        timestamp: reading.timestamp,
        age_seconds: now.signed_duration_since(reading.timestamp).num_seconds().max(0),
        note,
    }
}

/// The grid's intensity from now on, as a step function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Forecast {
    /// The source's description (a remembered forecast is only reused by the same source).
    pub source: String,
    /// Fresh: the source's; Cached: a remembered one; Fallback: flat at the current
    /// intensity for lack of one; Override: flat at `--intensity`.
    pub status: Status,
    /// When the source gave it.
    pub fetched_at: DateTime<Utc>,
    /// Sorted by time; the first is in force now; each holds until the next (the last to
    /// the horizon's end).
    pub readings: Vec<Reading>,
    /// Why a remembered or flat forecast is used.
    pub note: Option<String>,
}

impl Forecast {
    /// Flat at `intensity` from `now`.
    pub fn flat(intensity: &Intensity, now: DateTime<Utc>, note: Option<String>) -> Forecast {
        let status = if intensity.status == Status::Override { Status::Override } else { Status::Fallback };
        Forecast {
            source: intensity.source.clone(),
            status,
            fetched_at: now,
            readings: vec![Reading { g_per_kwh: intensity.intensity, timestamp: now }],
            note,
        }
    }

    /// The figure in force at `t` (the first one before the forecast starts).
    pub fn at(&self, t: DateTime<Utc>) -> f64 {
        self.readings.iter().rev().find(|r| r.timestamp <= t).or(self.readings.first()).map_or(0.0, |r| r.g_per_kwh)
    }

    /// The time-weighted mean figure over [from, to) (the figure at `from` if empty).
    pub fn mean(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
        let total = (to - from).num_milliseconds();
        if total <= 0 {
            return self.at(from);
        }
        let mut sum = 0.0;
        let mut t = from;
        while t < to {
            let next = self.readings.iter().map(|r| r.timestamp).filter(|&s| s > t).min().map_or(to, |s| s.min(to));
            sum += self.at(t) * (next - t).num_milliseconds() as f64;
            t = next;
        }
        sum / total as f64
    }
}

/// Read `source`'s forecast for [now, until), falling back to the remembered forecast
/// (`policy.cache` is the forecast's cache, [`cache::FORECAST_FILE`]) and then to a flat
/// one at `current`. Never fails: the worst is flat, and the note says why.
pub fn resolve_forecast(
    source: &dyn Source,
    policy: &Policy<'_>,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
    current: &Intensity,
) -> Forecast {
    if current.status == Status::Override {
        return Forecast::flat(current, now, None);
    }
    let name = source.describe();
    let error = match source.forecast(now, until).and_then(|r| window(&name, r, now, until)) {
        Ok(readings) => {
            let found = Forecast { source: name, status: Status::Fresh, fetched_at: now, readings, note: None };
            if policy.remember {
                if let Err(e) = policy.cache.store_as(&found) {
                    tracing::info!("cannot remember the intensity forecast: {e}");
                }
            }
            return found;
        }
        Err(e) => e,
    };
    let why_not_remembered = match policy.cache.load_as::<Forecast>() {
        Ok(Some(old)) if old.source == name && old.fetched_at > now + chrono::Duration::minutes(5) => {
            format!("the remembered forecast is unusable (fetched at {}, in the future)", old.fetched_at.to_rfc3339())
        }
        Ok(Some(old)) if old.source == name => {
            let age = now.signed_duration_since(old.fetched_at).to_std().unwrap_or_default();
            if age > policy.max_age {
                format!(
                    "the last good forecast is {} old (max_age {})",
                    humantime::format_duration(round_secs(age)),
                    humantime::format_duration(policy.max_age)
                )
            } else {
                match window(&name, old.readings, now, until) {
                    Ok(readings) => {
                        let note = format!(
                            "forecast: {error}; using the forecast fetched {} ago (max_age {})",
                            humantime::format_duration(round_secs(age)),
                            humantime::format_duration(policy.max_age)
                        );
                        return Forecast { source: name, status: Status::Cached, fetched_at: old.fetched_at, readings, note: Some(note) };
                    }
                    Err(e) => format!("the remembered forecast is unusable ({e})"),
                }
            }
        }
        Ok(_) => "no earlier forecast of this source is remembered".to_string(),
        Err(e) => format!("the remembered forecast is unusable ({e})"),
    };
    let note = format!(
        "forecast: {error}; {why_not_remembered}; a flat forecast at the current intensity ({:.0} gCO2/kWh)",
        current.intensity
    );
    Forecast::flat(current, now, Some(note))
}

/// The figures in force from `now` to `until`, checked and sorted: the last one at or before
/// now (re-dated to now), then the later ones before `until`.
fn window(name: &str, mut readings: Vec<Reading>, now: DateTime<Utc>, until: DateTime<Utc>) -> Result<Vec<Reading>, SourceError> {
    for r in &readings {
        check_value(name, r.clone())?;
    }
    readings.sort_by_key(|r| r.timestamp);
    readings.dedup_by_key(|r| r.timestamp);
    let first = readings.iter().rposition(|r| r.timestamp <= now);
    let mut out: Vec<Reading> = match first {
        Some(i) => vec![Reading { g_per_kwh: readings[i].g_per_kwh, timestamp: now }],
        None => Vec::new(),
    };
    out.extend(readings.into_iter().filter(|r| r.timestamp > now && r.timestamp < until));
    match out.first() {
        None => Err(SourceError::Malformed { url: name.to_string(), message: "the forecast has no figure from now on".into() }),
        // The first figure is in the future: it stands for the time before it too.
        Some(r) if r.timestamp > now => {
            let g_per_kwh = r.g_per_kwh;
            out.insert(0, Reading { g_per_kwh, timestamp: now });
            Ok(out)
        }
        Some(_) => Ok(out),
    }
}

/// Parse a timestamp as the sources write them: RFC 3339 (`2018-01-20T12:00:00Z`), the UK
/// API's minute form (`2018-01-20T12:00Z`), a naive `2018-01-20 12:00[:00]` taken as UTC, or
/// Unix seconds.
pub fn parse_timestamp(text: &str) -> Option<DateTime<Utc>> {
    let text = text.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%dT%H:%MZ", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(text, format) {
            return Some(t.and_utc());
        }
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse::<i64>().ok().and_then(|s| DateTime::from_timestamp(s, 0));
    }
    None
}

#[cfg(test)]
mod tests;

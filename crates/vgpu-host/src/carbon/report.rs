//! `vgpu carbon report`: the window asked for, read from the history and accounted
//! ([`vgpu_carbon::account`]). Returns the report; `commands::carbon` prints it.

use std::collections::BTreeMap;
use std::path::Path;

use chrono::{DateTime, Local, NaiveDate, TimeZone as _, Utc};
use thiserror::Error;

use vgpu_carbon::account;

use vgpu_carbon::account::GroupBy;

use vgpu_carbon::account::Report;

use vgpu_carbon::account::Window;
use vgpu_carbon::model::DEFAULT_IDLE_FRACTION;
use crate::context::Context;
use vgpu_history::db::HistoryError;
use vgpu_history::db::ReadFrom;
use vgpu_history::query::IdleDefaults;
use vgpu_history::query::IdlePowers;
use vgpu_history::query::Reader;

/// The window when none is given: the last 24 hours.
pub const DEFAULT_SPAN: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

#[derive(Debug, Error, PartialEq)]
pub enum TimeError {
    #[error("{flag} {value:?}: not a time; give RFC 3339 (2026-11-27T08:00:00Z), a date (2026-11-27, local midnight) or a duration ago (24h, 7d)")]
    Unparsed { flag: &'static str, value: String },
    #[error("{flag} {value:?}: {why}")]
    OutOfRange { flag: &'static str, value: String, why: &'static str },
    #[error("--since ({since}) is not before --until ({until})")]
    Empty { since: String, until: String },
}

/// `value` of `flag` as a point in time: RFC 3339, a date (local midnight), or a duration
/// before `now` ("24h", "7d", "90min").
pub fn parse_time(flag: &'static str, value: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, TimeError> {
    let value = value.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(value) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(day) = NaiveDate::parse_from_str(value, "%Y-%m-%d") {
        let midnight = day.and_hms_opt(0, 0, 0).ok_or_else(|| TimeError::Unparsed { flag, value: value.into() })?;
        // A midnight skipped by a clock change: the first instant of the day there is.
        return Local
            .from_local_datetime(&midnight)
            .earliest()
            .or_else(|| Local.from_local_datetime(&(midnight + chrono::Duration::hours(1))).earliest())
            .map(|t| t.with_timezone(&Utc))
            .ok_or(TimeError::OutOfRange { flag, value: value.into(), why: "no such local time" });
    }
    let ago = humantime::parse_duration(value).map_err(|_| TimeError::Unparsed { flag, value: value.into() })?;
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .ok_or(TimeError::OutOfRange { flag, value: value.into(), why: "too long ago" })
}

/// The window of `--since`/`--until` (default: the last 24 hours up to now).
pub fn window(since: Option<&str>, until: Option<&str>, now: DateTime<Utc>) -> Result<Window, TimeError> {
    let until = match until {
        Some(v) => parse_time("--until", v, now)?,
        None => now,
    };
    let since = match since {
        Some(v) => parse_time("--since", v, now)?,
        None => until - chrono::Duration::from_std(DEFAULT_SPAN).unwrap_or_default(),
    };
    if since >= until {
        let fmt = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        return Err(TimeError::Empty { since: fmt(since), until: fmt(until) });
    }
    Ok(Window { since_ms: since.timestamp_millis(), until_ms: until.timestamp_millis() })
}

/// The idle power the planner's model gives every GPU from the config alone
/// (`[carbon] power_idle_w`, else 15 % of `power_max_w`); `None` without either.
pub fn configured_idle_w(config: &vgpu_carbon::config::CarbonConfig) -> Option<f64> {
    config.power_idle_w.or(config.power_max_w.map(|max| max * DEFAULT_IDLE_FRACTION))
}

/// The planner's default idle power of each GPU the driver sees, by UUID: 15 % of its
/// default power limit (else its enforced one), as `carbon::apply::read_devices` models it.
/// Empty without a driver.
pub fn driver_idle_w(ctx: &Context) -> BTreeMap<String, f64> {
    match ctx.nvml_read_only() {
        Ok(Some(nvml)) => driver_idle_w_of(&nvml),
        Ok(None) => BTreeMap::new(),
        Err(e) => {
            tracing::debug!("no power limits from the driver: {e:#}");
            BTreeMap::new()
        }
    }
}

/// [`driver_idle_w`] through an NVML already open (`vgpu watch`'s).
pub fn driver_idle_w_of(nvml: &vgpu_gpu::Nvml) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for index in 0..nvml.count().unwrap_or(0) {
        let Ok(device) = nvml.device(index) else { continue };
        let Ok(uuid) = device.uuid() else { continue };
        if let Some(mw) = device.power_management_limit_default().ok().or_else(|| device.enforced_power_limit().ok()) {
            out.insert(uuid, f64::from(mw) / 1000.0 * DEFAULT_IDLE_FRACTION);
        }
    }
    out
}

/// Idle power for GPUs without a measured model, as the planner models them on this host:
/// the config's, else the driver's power limits (see [`IdleDefaults`]).
pub fn idle_defaults(ctx: &Context) -> IdleDefaults<'_> {
    IdleDefaults::new(configured_idle_w(&ctx.config.carbon), move || driver_idle_w(ctx))
}

/// [`idle_defaults`] as values, read now through `nvml` (`vgpu watch`'s, which hands them to
/// its history thread: the hourly rollups are made with the idle powers reports take).
pub fn idle_powers(config: &vgpu_carbon::config::CarbonConfig, nvml: Option<&vgpu_gpu::Nvml>) -> IdlePowers {
    IdlePowers { configured_w: configured_idle_w(config), driver_w: nvml.map(driver_idle_w_of).unwrap_or_default() }
}

/// The report of `window` from the history in `lib_dir`; `Ok(None)`: no history yet.
pub fn build(lib_dir: &Path, idle: &IdleDefaults<'_>, window: Window, by: GroupBy) -> Result<Option<Report>, HistoryError> {
    let Some(reader) = Reader::open(lib_dir)? else {
        return Ok(None);
    };
    let accounting = reader.accounting(window, idle, None)?;
    let ids: Vec<&str> = accounting
        .gpus
        .values()
        .flat_map(|g| g.parts.keys())
        .filter_map(|p| match p {
            account::Party::Workload(id) => Some(id.as_str()),
            _ => None,
        })
        .collect();
    let workloads = reader.workloads(ids)?;
    let mut report = account::report(&accounting, by, &workloads);
    if let Some(note) = copy_note(reader.from(), window) {
        report.notes.push(note);
    }
    Ok(Some(report))
}

/// What a reader of the public copy is told when the window reaches past the copy's time.
pub fn copy_note(from: ReadFrom, window: Window) -> Option<String> {
    let ReadFrom::Snapshot { made } = from else { return None };
    let made_ms = made.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    if made_ms >= window.until_ms {
        return None;
    }
    let at = DateTime::<Utc>::from(made).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let age = humantime::format_duration(std::time::Duration::from_secs(((window.until_ms - made_ms) / 1000).max(0) as u64));
    Some(format!(
        "read from the public copy of the history made at {at} ({age} before the window's end): vgpu watch refreshes it at most once a minute; root reads the history itself"
    ))
}

/// The report there is when there is no history: no rows, a note saying why.
pub fn empty(lib_dir: &Path, window: Window, by: GroupBy) -> Report {
    let path = vgpu_history::db::path_in(lib_dir);
    let note = if !nix::unistd::geteuid().is_root() && path.exists() {
        format!(
            "no public copy of the history yet ({} is root's alone; `vgpu watch` publishes {} for everybody else, at most once a minute)",
            path.display(),
            vgpu_history::snapshot::path_in(lib_dir).display()
        )
    } else {
        format!("no history yet ({} does not exist): `vgpu watch` records it", path.display())
    };
    let accounting = account::Accounting { window, gpus: Default::default(), emissions_known: false, notes: vec![note] };
    account::report(&accounting, by, &Default::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-27T12:00:00Z").unwrap().with_timezone(&Utc)
    }

    #[test]
    fn times_as_rfc3339_dates_and_durations_ago() {
        let t = |v| parse_time("--since", v, now());
        assert_eq!(t("2026-11-27T08:00:00+01:00").unwrap().to_rfc3339(), "2026-11-27T07:00:00+00:00");
        assert_eq!(t("24h").unwrap(), now() - chrono::Duration::hours(24));
        assert_eq!(t("7d").unwrap(), now() - chrono::Duration::days(7));
        let midnight = Local.with_ymd_and_hms(2026, 11, 20, 0, 0, 0).earliest().unwrap();
        assert_eq!(t("2026-11-20").unwrap(), midnight.with_timezone(&Utc));
        assert!(matches!(t("yesterday"), Err(TimeError::Unparsed { .. })));
        assert!(matches!(t("2026-13-01"), Err(TimeError::Unparsed { .. })));
    }

    #[test]
    fn the_default_window_is_the_last_day_and_an_empty_one_is_refused() {
        let w = window(None, None, now()).unwrap();
        assert_eq!(w.until_ms - w.since_ms, 24 * 3600 * 1000);
        assert_eq!(w.until_ms, now().timestamp_millis());
        assert!(matches!(window(Some("1h"), Some("2h"), now()), Err(TimeError::Empty { .. })));
    }
}

//! Daily and monthly carbon budgets (`[carbon] budget_g_per_day`, `budget_g_per_month`):
//! their horizons in the host's local time, the forecast cut into hourly slots, and the
//! figures a plan reports. The allotment itself is [`super::horizon::allot`] (pure); what
//! was spent comes from the history (`vgpu_history::spent`); `host` puts them together.
//!
//! * **Horizons.** A day runs from the host's local midnight to the next; a month from
//!   local midnight of the 1st to that of the 1st of the next month (a DST change makes
//!   such a day 23 or 25 hours long). The time zone is the host's (`TZ`, else
//!   /etc/localtime).
//! * **Slots.** From now to the horizon's end: the first from now to the next full hour
//!   (partial), then hourly. The first slot's intensity is the one now (measured, or the
//!   remembered reading or the fallback); the others are the forecast's time-weighted mean
//!   over the hour; beyond the forecast's last figure, that figure holds.

use chrono::{DateTime, Datelike as _, Duration, DurationRound as _, Local, NaiveDate, TimeZone as _, Utc};
use serde::{Deserialize, Serialize};

use super::horizon::Slot;
use super::intensity::Forecast;

/// Which horizon a budget is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Period {
    Day,
    Month,
}

impl Period {
    /// "daily", "monthly": how notes name the budget.
    pub fn adjective(self) -> &'static str {
        match self {
            Period::Day => "daily",
            Period::Month => "monthly",
        }
    }
}

/// [start, end) of the local day or month that holds `now`.
pub fn bounds(period: Period, now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
    let today = now.with_timezone(&Local).date_naive();
    let (first, next) = match period {
        Period::Day => (today, today.succ_opt().unwrap_or(today)),
        Period::Month => {
            let first = today.with_day(1).unwrap_or(today);
            let next = if first.month() == 12 {
                NaiveDate::from_ymd_opt(first.year() + 1, 1, 1)
            } else {
                NaiveDate::from_ymd_opt(first.year(), first.month() + 1, 1)
            };
            (first, next.unwrap_or(today))
        }
    };
    (local_midnight(first), local_midnight(next))
}

/// The first instant of `day` in local time (a midnight skipped by DST: the first local
/// time of the day that exists).
fn local_midnight(day: NaiveDate) -> DateTime<Utc> {
    (0..24)
        .filter_map(|h| day.and_hms_opt(h, 0, 0))
        .find_map(|t| Local.from_local_datetime(&t).earliest())
        .map_or_else(|| day.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc(), |t| t.with_timezone(&Utc))
}

/// Hourly slots from `now` to `end` (the first partial, at `now_g_per_kwh`; the rest at the
/// forecast's mean over each). Empty when `end` is not after `now`.
pub fn slots(forecast: &Forecast, now_g_per_kwh: f64, now: DateTime<Utc>, end: DateTime<Utc>) -> Vec<Slot> {
    let mut out = Vec::new();
    let mut start = now;
    while start < end {
        let next_hour = start.duration_trunc(Duration::hours(1)).map_or(start + Duration::hours(1), |h| h + Duration::hours(1));
        let stop = next_hour.min(end);
        let g_per_kwh = if out.is_empty() { now_g_per_kwh } else { forecast.mean(start, stop) };
        out.push(Slot { start, hours: (stop - start).num_milliseconds() as f64 / 3.6e6, g_per_kwh });
        start = stop;
    }
    out
}

/// How the grams already spent in a horizon are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpentFrom {
    /// Measured: the history's GPU energy × the recorded intensity.
    History,
    /// Assumed: the decision log's plans, as if they were kept (no history to measure by).
    Plans,
}

/// One horizon's budget and its allotment, as plans report and the decision log records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HorizonFigures {
    pub period: Period,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// gCO2 for the whole horizon.
    pub budget_g: f64,
    /// gCO2 emitted since its start.
    pub spent_g: f64,
    pub spent_from: SpentFrom,
    /// budget − spent.
    pub remaining_g: f64,
    /// What the allotment plans to emit from now to the end.
    pub planned_g: f64,
    /// The least that can be emitted from now to the end (lowest clocks).
    pub min_needed_g: f64,
    /// The per-hour budget this horizon allots to now, gCO2/h.
    pub allotted_g_per_hour_now: f64,
    /// False: the budget cannot be kept even at the lowest clocks.
    pub feasible: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intensity::Reading;
    use crate::intensity::Status;

    fn t(s: &str) -> DateTime<Utc> {
        crate::intensity::parse_timestamp(s).unwrap()
    }

    #[test]
    fn horizons_are_local_days_and_months() {
        // The tests' zone is the host's; only its UTC offset at these times matters, and
        // a day is 24 h and a month starts on the 1st in every zone away from DST changes.
        let now = t("2024-05-15T12:34:56Z");
        let (start, end) = bounds(Period::Day, now);
        assert!(start <= now && now < end && end - start == Duration::hours(24), "{start} {end}");
        assert_eq!(start.with_timezone(&Local).format("%H:%M:%S").to_string(), "00:00:00");
        let (start, end) = bounds(Period::Month, now);
        assert!(start <= now && now < end, "{start} {end}");
        let (a, b) = (start.with_timezone(&Local), end.with_timezone(&Local));
        assert_eq!((a.day(), b.day(), a.format("%H:%M").to_string()), (1, 1, "00:00".to_string()));
        assert_eq!(b.month(), a.month() % 12 + 1);
        let (_, end) = bounds(Period::Month, t("2024-12-20T12:00:00Z"));
        assert_eq!(end.with_timezone(&Local).date_naive(), NaiveDate::from_ymd_opt(2025, 1, 1).unwrap(), "December rolls over");
    }

    #[test]
    fn slots_are_hourly_from_now_with_the_intensity_now_first() {
        let now = t("2024-05-01T10:40:00Z");
        let forecast = Forecast {
            source: "x".into(),
            status: Status::Fresh,
            fetched_at: now,
            readings: vec![
                Reading { g_per_kwh: 300.0, timestamp: now },
                Reading { g_per_kwh: 100.0, timestamp: t("2024-05-01T11:30:00Z") },
            ],
            note: None,
        };
        let got = slots(&forecast, 250.0, now, t("2024-05-01T13:15:00Z"));
        let want = [("2024-05-01T10:40:00Z", 20.0 / 60.0, 250.0), ("2024-05-01T11:00:00Z", 1.0, 200.0), ("2024-05-01T12:00:00Z", 1.0, 100.0), ("2024-05-01T13:00:00Z", 0.25, 100.0)];
        assert_eq!(got.len(), want.len());
        for (slot, (start, hours, g)) in got.iter().zip(want) {
            assert_eq!(slot.start, t(start));
            assert!((slot.hours - hours).abs() < 1e-9 && (slot.g_per_kwh - g).abs() < 1e-9, "{slot:?}");
        }
        assert!(slots(&forecast, 250.0, now, now).is_empty());
    }
}

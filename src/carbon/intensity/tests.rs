//! Resolution: source, remembered reading, fallback.

use std::cell::Cell;

use super::*;
use crate::carbon::config::CarbonConfig;

fn t(s: &str) -> DateTime<Utc> {
    parse_timestamp(s).unwrap()
}

/// A source that answers from a script and counts its calls.
struct Scripted {
    answer: Result<f64, &'static str>,
    calls: Cell<u32>,
}

impl Scripted {
    fn ok(v: f64) -> Scripted {
        Scripted { answer: Ok(v), calls: Cell::new(0) }
    }
    fn failing() -> Scripted {
        Scripted { answer: Err("boom"), calls: Cell::new(0) }
    }
}

impl Source for Scripted {
    fn describe(&self) -> String {
        "scripted".into()
    }
    fn read(&self, now: DateTime<Utc>) -> Result<Reading, SourceError> {
        self.calls.set(self.calls.get() + 1);
        match self.answer {
            Ok(v) => Ok(Reading { g_per_kwh: v, timestamp: now - chrono::Duration::minutes(5) }),
            Err(m) => Err(SourceError::Unreachable { url: "http://x".into(), message: m.into() }),
        }
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    cache: Cache,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::new(dir.path().join(cache::CACHE_FILE));
    Setup { _dir: dir, cache }
}

fn policy(cache: &Cache, fallback: Option<f64>, remember: bool) -> Policy<'_> {
    Policy { cache, max_age: Duration::from_secs(3600), fallback, remember }
}

#[test]
fn fresh_reading_is_used_and_remembered() {
    let s = setup();
    let now = t("2024-05-01T12:00:00Z");
    let got = resolve(&Scripted::ok(210.0), &policy(&s.cache, None, true), now).unwrap();
    assert_eq!((got.intensity, got.status, got.age_seconds), (210.0, Status::Fresh, 300));
    assert_eq!(got.source, "scripted");
    assert_eq!(got.note, None);
    let cached = s.cache.load().unwrap().unwrap();
    assert_eq!((cached.source.as_str(), cached.reading.g_per_kwh, cached.fetched_at), ("scripted", 210.0, now));
}

#[test]
fn looking_does_not_remember() {
    let s = setup();
    resolve(&Scripted::ok(210.0), &policy(&s.cache, None, false), Utc::now()).unwrap();
    assert!(s.cache.load().unwrap().is_none());
}

#[test]
fn failed_source_uses_a_recent_remembered_reading_and_says_so() {
    let s = setup();
    let then = t("2024-05-01T12:00:00Z");
    resolve(&Scripted::ok(210.0), &policy(&s.cache, Some(999.0), true), then).unwrap();
    let now = then + chrono::Duration::minutes(59);
    let got = resolve(&Scripted::failing(), &policy(&s.cache, Some(999.0), true), now).unwrap();
    assert_eq!((got.intensity, got.status), (210.0, Status::Cached));
    assert_eq!(got.timestamp, then - chrono::Duration::minutes(5));
    let note = got.note.unwrap();
    assert!(note.contains("boom") && note.contains("59m ago") && note.contains("max_age 1h"), "{note}");
    // The failure did not overwrite the remembered reading.
    assert_eq!(s.cache.load().unwrap().unwrap().fetched_at, then);
}

#[test]
fn too_old_a_reading_gives_way_to_the_fallback() {
    let s = setup();
    let then = t("2024-05-01T12:00:00Z");
    resolve(&Scripted::ok(210.0), &policy(&s.cache, None, true), then).unwrap();
    let now = then + chrono::Duration::minutes(61);
    let got = resolve(&Scripted::failing(), &policy(&s.cache, Some(400.0), true), now).unwrap();
    assert_eq!((got.intensity, got.status, got.timestamp), (400.0, Status::Fallback, now));
    assert!(got.source.contains("fallback"));
    let note = got.note.unwrap();
    assert!(note.contains("boom") && note.contains("1h 1m old"), "{note}");
}

#[test]
fn another_sources_reading_is_not_reused() {
    let s = setup();
    let now = t("2024-05-01T12:00:00Z");
    let other =
        CachedReading { source: "static".into(), reading: Reading { g_per_kwh: 1.0, timestamp: now }, fetched_at: now };
    s.cache.store(&other).unwrap();
    let err = resolve(&Scripted::failing(), &policy(&s.cache, None, true), now).unwrap_err().to_string();
    assert!(err.contains("no earlier reading of this source is remembered"), "{err}");
}

#[test]
fn no_cache_and_no_fallback_is_a_one_line_error() {
    let s = setup();
    let err = resolve(&Scripted::failing(), &policy(&s.cache, None, true), Utc::now()).unwrap_err().to_string();
    assert_eq!(
        err,
        "no carbon intensity: cannot reach http://x: boom; no earlier reading of this source is remembered; \
         set [carbon] fallback, or pass --intensity"
    );
}

#[test]
fn damaged_cache_is_skipped_with_a_reason() {
    let s = setup();
    std::fs::write(s.cache.path(), "garbage").unwrap();
    let got = resolve(&Scripted::failing(), &policy(&s.cache, Some(300.0), true), Utc::now()).unwrap();
    assert_eq!(got.status, Status::Fallback);
    assert!(got.note.unwrap().contains("unusable"));
}

#[test]
fn a_remembered_negative_reading_is_not_used() {
    // Caught by the `carbon_state` fuzz check: a damaged cache's value reached the planner unchecked.
    let s = setup();
    let now = t("2024-05-01T12:00:00Z");
    let damaged =
        CachedReading { source: "scripted".into(), reading: Reading { g_per_kwh: -212.0, timestamp: now }, fetched_at: now };
    s.cache.store(&damaged).unwrap();
    let err = resolve(&Scripted::failing(), &policy(&s.cache, None, true), now).unwrap_err().to_string();
    assert!(err.contains("the remembered reading is unusable (-212 gCO2/kWh is not a non-negative number)"), "{err}");
    let got = resolve(&Scripted::failing(), &policy(&s.cache, Some(300.0), true), now).unwrap();
    assert_eq!((got.intensity, got.status), (300.0, Status::Fallback));
}

#[test]
fn negative_readings_are_refused() {
    let s = setup();
    let err = resolve(&Scripted::ok(-4.0), &policy(&s.cache, None, true), Utc::now()).unwrap_err().to_string();
    assert!(err.contains("scripted gave -4 gCO2/kWh"), "{err}");
}

#[test]
fn override_is_marked() {
    let now = Utc::now();
    let got = Intensity::overridden(800.0, now);
    assert_eq!((got.intensity, got.status, got.source.as_str()), (800.0, Status::Override, "--intensity"));
}

#[test]
fn timestamps() {
    let want = t("2018-01-20T12:00:00Z");
    for text in [
        "2018-01-20T12:00:00Z",
        "2018-01-20T12:00Z",
        "2018-01-20T13:00:00+01:00",
        "2018-01-20 12:00",
        "1516449600",
        "2018-01-20T12:00:00.000Z",
    ] {
        assert_eq!(parse_timestamp(text), Some(want), "{text}");
    }
    assert_eq!(parse_timestamp("yesterday"), None);
    assert_eq!(parse_timestamp(""), None);
}

#[test]
fn sources_from_config() {
    let names = |text: &str| {
        let config: CarbonConfig = crate::config::Config::parse(text).unwrap().carbon;
        from_config(&config).map(|s| s.describe()).map_err(|e| e.to_string())
    };
    assert!(names("").unwrap_err().starts_with("no intensity source configured"));
    assert_eq!(names("[carbon]\nsource = \"static\"\nvalue = 1\n").unwrap(), "static");
    assert_eq!(names("[carbon]\nsource = \"file\"\npath = \"/a.csv\"\n").unwrap(), "file /a.csv");
    assert_eq!(names("[carbon]\nsource = \"command\"\ncommand = \"echo 1\"\n").unwrap(), "command `echo 1`");
    assert_eq!(names("[carbon]\nsource = \"electricitymaps\"\nzone = \"DE\"\n").unwrap(), "electricitymaps zone DE");
    assert_eq!(names("[carbon]\nsource = \"uk-grid\"\n").unwrap(), "uk-grid national");
    assert_eq!(names("[carbon]\nsource = \"uk-grid\"\npostcode = \"rg10\"\n").unwrap(), "uk-grid postcode RG10");
    assert_eq!(names("[carbon]\nsource = \"uk-grid\"\nregion_id = 13\n").unwrap(), "uk-grid region 13");
    assert!(names("[carbon]\nsource = \"static\"\n").unwrap_err().contains("[carbon] value"));
}

#[test]
fn static_source_gives_its_value_now() {
    let now = Utc::now();
    let got = static_::Static { g_per_kwh: 55.5 }.read(now).unwrap();
    assert_eq!((got.g_per_kwh, got.timestamp), (55.5, now));
}

#[test]
fn a_reading_remembered_in_the_future_is_not_used() {
    let s = setup();
    let later = t("2024-05-01T14:00:00Z");
    resolve(&Scripted::ok(210.0), &policy(&s.cache, None, true), later).unwrap();
    // The clock went back two hours (or the file was forged): its age is unknown.
    let now = t("2024-05-01T12:00:00Z");
    let err = resolve(&Scripted::failing(), &policy(&s.cache, None, true), now).unwrap_err().to_string();
    assert!(err.contains("in the future"), "{err}");
    let got = resolve(&Scripted::failing(), &policy(&s.cache, Some(300.0), true), now).unwrap();
    assert_eq!((got.intensity, got.status), (300.0, Status::Fallback));
}

//! Resolution: source, remembered reading, fallback.

use std::cell::Cell;

use super::*;
use crate::config::CarbonConfig;

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
    // A config file with only its `[carbon]` table, as the root config reads it.
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        carbon: CarbonConfig,
    }
    let names = |text: &str| {
        let config = toml::from_str::<File>(text).unwrap().carbon;
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

// Forecasts.

/// A source whose forecast is scripted (its current reading is the forecast's first).
struct Ahead {
    answer: Result<Vec<(i64, f64)>, &'static str>,
}

impl Source for Ahead {
    fn describe(&self) -> String {
        "ahead".into()
    }
    fn read(&self, now: DateTime<Utc>) -> Result<Reading, SourceError> {
        self.forecast(now, now).map(|f| f[0].clone())
    }
    fn forecast(&self, now: DateTime<Utc>, _until: DateTime<Utc>) -> Result<Vec<Reading>, SourceError> {
        match &self.answer {
            Ok(points) => Ok(points
                .iter()
                .map(|&(minutes, g)| Reading { g_per_kwh: g, timestamp: now + chrono::Duration::minutes(minutes) })
                .collect()),
            Err(m) => Err(SourceError::Unreachable { url: "http://x".into(), message: (*m).into() }),
        }
    }
}

fn current(g: f64, now: DateTime<Utc>) -> Intensity {
    Intensity { intensity: g, source: "ahead".into(), status: Status::Fresh, timestamp: now, age_seconds: 0, note: None }
}

fn figures(f: &Forecast, now: DateTime<Utc>) -> Vec<(i64, f64)> {
    f.readings.iter().map(|r| ((r.timestamp - now).num_minutes(), r.g_per_kwh)).collect()
}

#[test]
fn a_forecast_is_trimmed_to_the_horizon_remembered_and_reused_when_the_source_fails() {
    let s = setup();
    let now = t("2024-05-01T12:10:00Z");
    let until = now + chrono::Duration::hours(3);
    // Unsorted, one before now (in force now), one past the horizon.
    let source = Ahead { answer: Ok(vec![(50, 80.0), (-10, 300.0), (-40, 999.0), (200, 1.0), (110, 120.0)]) };
    let got = resolve_forecast(&source, &policy(&s.cache, None, true), now, until, &current(300.0, now));
    assert_eq!((got.status, got.note.as_deref()), (Status::Fresh, None));
    assert_eq!(figures(&got, now), vec![(0, 300.0), (50, 80.0), (110, 120.0)]);
    assert_eq!(got.fetched_at, now);

    // Forty minutes on, the source fails: the remembered forecast, from the new now.
    let later = now + chrono::Duration::minutes(40);
    let failing = Ahead { answer: Err("boom") };
    let got = resolve_forecast(&failing, &policy(&s.cache, None, true), later, until, &current(77.0, later));
    assert_eq!((got.status, got.fetched_at), (Status::Cached, now));
    assert_eq!(figures(&got, later), vec![(0, 300.0), (10, 80.0), (70, 120.0)]);
    let note = got.note.unwrap();
    assert!(note.contains("boom") && note.contains("using the forecast fetched 40m ago (max_age 1h)"), "{note}");

    // Past max_age: flat at the current intensity, and said so.
    let much_later = now + chrono::Duration::minutes(61);
    let got = resolve_forecast(&failing, &policy(&s.cache, None, true), much_later, until, &current(77.0, much_later));
    assert_eq!(got.status, Status::Fallback);
    assert_eq!(figures(&got, much_later), vec![(0, 77.0)]);
    let note = got.note.unwrap();
    assert!(note.contains("1h 1m old") && note.contains("a flat forecast at the current intensity (77 gCO2/kWh)"), "{note}");
}

#[test]
fn no_remembered_forecast_or_a_bad_value_gives_a_flat_forecast() {
    let s = setup();
    let now = t("2024-05-01T12:00:00Z");
    let until = now + chrono::Duration::hours(3);
    let got = resolve_forecast(&Ahead { answer: Err("down") }, &policy(&s.cache, None, true), now, until, &current(210.0, now));
    assert_eq!((got.status, figures(&got, now)), (Status::Fallback, vec![(0, 210.0)]));
    assert!(got.note.unwrap().contains("no earlier forecast of this source is remembered"));
    let got = resolve_forecast(&Ahead { answer: Ok(vec![(0, 100.0), (60, -5.0)]) }, &policy(&s.cache, None, true), now, until, &current(210.0, now));
    assert_eq!(got.status, Status::Fallback);
    assert!(got.note.unwrap().contains("ahead gave -5 gCO2/kWh"));
    assert!(s.cache.load_as::<Forecast>().unwrap().is_none(), "a bad forecast is not remembered");
    // Only in the future: the first figure stands for now too.
    let got = resolve_forecast(&Ahead { answer: Ok(vec![(30, 90.0)]) }, &policy(&s.cache, None, false), now, until, &current(210.0, now));
    assert_eq!(figures(&got, now), vec![(0, 90.0), (30, 90.0)]);
    assert!(s.cache.load_as::<Forecast>().unwrap().is_none(), "looking does not remember");
}

#[test]
fn an_override_is_a_flat_forecast_and_the_source_is_not_asked() {
    let s = setup();
    let now = t("2024-05-01T12:00:00Z");
    let source = Scripted::ok(1.0);
    let got = resolve_forecast(&source, &policy(&s.cache, None, true), now, now, &Intensity::overridden(640.0, now));
    assert_eq!((got.status, figures(&got, now)), (Status::Override, vec![(0, 640.0)]));
    assert_eq!(source.calls.get(), 0);
}

#[test]
fn static_and_command_sources_forecast_flat() {
    let now = t("2024-05-01T12:00:00Z");
    let got = static_::Static { g_per_kwh: 55.5 }.forecast(now, now + chrono::Duration::hours(5)).unwrap();
    assert_eq!(got, vec![Reading { g_per_kwh: 55.5, timestamp: now }]);
    let got = command::Command { command: "echo 42".into(), timeout: Duration::from_secs(5) }
        .forecast(now, now + chrono::Duration::hours(5))
        .unwrap();
    assert_eq!(got, vec![Reading { g_per_kwh: 42.0, timestamp: now }]);
}

#[test]
fn the_mean_over_a_slot_weighs_each_figure_by_its_time() {
    let now = t("2024-05-01T12:00:00Z");
    let f = Forecast {
        source: "x".into(),
        status: Status::Fresh,
        fetched_at: now,
        readings: vec![
            Reading { g_per_kwh: 100.0, timestamp: now },
            Reading { g_per_kwh: 300.0, timestamp: now + chrono::Duration::minutes(30) },
        ],
        note: None,
    };
    assert_eq!(f.mean(now, now + chrono::Duration::hours(1)), 200.0);
    assert_eq!(f.mean(now + chrono::Duration::minutes(45), now + chrono::Duration::hours(2)), 300.0);
    assert_eq!(f.at(now - chrono::Duration::hours(1)), 100.0);
}

fn fixture(name: &str) -> String {
    let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/carbon")).join(name);
    std::fs::read_to_string(&path).unwrap()
}

#[test]
fn recorded_forecasts_of_both_apis_parse() {
    let national = uk_grid::parse_forecast_body(&fixture("uk-fw48h-national.json"), &uk_grid::Area::National).unwrap();
    assert_eq!(national.len(), 96);
    assert_eq!((national[0].g_per_kwh, national[0].timestamp), (230.0, t("2018-01-20T12:00:00Z")), "the forecast, not the actual");
    assert_eq!(national[95].timestamp, t("2018-01-22T11:30:00Z"));
    let rg10 = uk_grid::parse_forecast_body(&fixture("uk-fw48h-postcode-RG10.json"), &uk_grid::Area::Postcode("RG10".into())).unwrap();
    assert_eq!((rg10.len(), rg10[0].g_per_kwh), (96, 195.0));
    let london = uk_grid::parse_forecast_body(&fixture("uk-fw48h-regionid-13.json"), &uk_grid::Area::Region(13)).unwrap();
    assert_eq!((london.len(), london[0].g_per_kwh), (6, 207.0));
    let de = electricitymaps::parse_forecast_body(&fixture("electricitymaps-forecast-DE.json"), "DE").unwrap();
    assert_eq!(de.len(), 24);
    assert_eq!((de[12].g_per_kwh, de[12].timestamp), (213.0, t("2018-04-26T06:00:00Z")));
}

#[test]
fn malformed_forecasts_are_clear_errors() {
    let err = electricitymaps::parse_forecast_body(&fixture("electricitymaps-forecast-bad.json"), "DE").unwrap_err();
    assert_eq!(err, "forecast entry 2: carbonIntensity is null: no value for zone DE");
    let err = electricitymaps::parse_forecast_body(r#"{"zone":"DE","forecast":[]}"#, "DE").unwrap_err();
    assert_eq!(err, "the forecast for zone DE is empty");
    assert!(electricitymaps::parse_forecast_body(&fixture("malformed.json"), "DE").is_err());
    let err = uk_grid::parse_forecast_body(r#"{"data":[]}"#, &uk_grid::Area::National).unwrap_err();
    assert_eq!(err, "the forecast has no periods");
    let err = uk_grid::parse_forecast_body(
        r#"{"data":[{"from":"2018-01-20T12:00Z","intensity":{"forecast":null,"actual":null}}]}"#,
        &uk_grid::Area::National,
    )
    .unwrap_err();
    assert_eq!(err, "the period from 2018-01-20T12:00Z has neither forecast nor actual intensity");
    let err = uk_grid::parse_forecast_body(r#"{"data":{"regionid":1,"data":[{"from":"soon","intensity":{"forecast":3}}]}}"#, &uk_grid::Area::Region(1)).unwrap_err();
    assert_eq!(err, "cannot read the period start \"soon\"");
}

#[test]
fn a_file_forecasts_its_rows_from_now_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("i.csv");
    std::fs::write(&path, "2024-05-01T10:00:00Z,300\n2024-05-01T11:00:00Z,200\n2024-05-01T13:00:00Z,50\n2024-05-02T13:00:00Z,5\n").unwrap();
    let got = file::File { path: path.clone() }.forecast(t("2024-05-01T11:30:00Z"), t("2024-05-02T00:00:00Z")).unwrap();
    let got: Vec<(String, f64)> = got.iter().map(|r| (r.timestamp.to_rfc3339(), r.g_per_kwh)).collect();
    assert_eq!(got, vec![("2024-05-01T11:00:00+00:00".to_string(), 200.0), ("2024-05-01T13:00:00+00:00".to_string(), 50.0)]);
    std::fs::write(&path, "2024-05-01T10:00:00Z,300\n").unwrap();
    let err = file::File { path: path.clone() }.forecast(t("2024-05-01T09:00:00Z"), t("2024-05-01T09:30:00Z")).unwrap_err();
    assert!(err.to_string().ends_with("i.csv: no entries from now on"), "{err}");
}

//! `source = "electricitymaps"`: Electricity Maps API v3, `GET /v3/carbon-intensity/latest?zone=Z`
//! with the token from `token_file` in the `auth-token` header. The answer:
//! `{"zone":"DE","carbonIntensity":302,"datetime":"2018-04-25T18:07:00.350Z",…}`.
//!
//! Forecast: `GET /v3/carbon-intensity/forecast?zone=Z` →
//! `{"zone":"DE","forecast":[{"carbonIntensity":319,"datetime":"2022-12-05T15:00:00.000Z"},…],"updatedAt":…}`
//! (hourly, a paid plan's endpoint).

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::{http, parse_timestamp, Reading, Source, SourceError};

pub const DEFAULT_BASE_URL: &str = "https://api.electricitymap.org";

pub struct ElectricityMaps {
    pub zone: String,
    pub token_file: Option<PathBuf>,
    pub base_url: String,
    pub timeout: Duration,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Latest {
    carbon_intensity: Option<f64>,
    datetime: Option<String>,
}

#[derive(Deserialize)]
struct ForecastAnswer {
    forecast: Vec<Latest>,
}

impl ElectricityMaps {
    pub fn url(&self) -> String {
        format!("{}/v3/carbon-intensity/latest?zone={}", self.base_url.trim_end_matches('/'), encode(&self.zone))
    }

    pub fn forecast_url(&self) -> String {
        format!("{}/v3/carbon-intensity/forecast?zone={}", self.base_url.trim_end_matches('/'), encode(&self.zone))
    }

    fn token(&self) -> Result<Option<String>, SourceError> {
        let Some(path) = &self.token_file else { return Ok(None) };
        let text = std::fs::read_to_string(path).map_err(|source| SourceError::Read { path: path.clone(), source })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(SourceError::BadFile { path: path.clone(), message: "the token file is empty".into() });
        }
        Ok(Some(token.to_string()))
    }
}

impl Source for ElectricityMaps {
    fn describe(&self) -> String {
        format!("electricitymaps zone {}", self.zone)
    }

    fn read(&self, _now: DateTime<Utc>) -> Result<Reading, SourceError> {
        let url = self.url();
        let token = self.token()?;
        let headers: Vec<(&str, &str)> = token.as_deref().map(|t| ("auth-token", t)).into_iter().collect();
        let latest: Latest = http::get_json(&url, &headers, self.timeout)?;
        reading(latest, &self.zone).map_err(|message| SourceError::Malformed { url, message })
    }

    fn forecast(&self, _now: DateTime<Utc>, _until: DateTime<Utc>) -> Result<Vec<Reading>, SourceError> {
        let url = self.forecast_url();
        let token = self.token()?;
        let headers: Vec<(&str, &str)> = token.as_deref().map(|t| ("auth-token", t)).into_iter().collect();
        let answer: ForecastAnswer = http::get_json(&url, &headers, self.timeout)?;
        forecast(answer, &self.zone).map_err(|message| SourceError::Malformed { url, message })
    }
}

/// The forecast in an answer's body; the error is the message of a `Malformed` error.
pub fn parse_forecast_body(body: &str, zone: &str) -> Result<Vec<Reading>, String> {
    forecast(serde_json::from_str(body).map_err(|e| e.to_string())?, zone)
}

fn forecast(answer: ForecastAnswer, zone: &str) -> Result<Vec<Reading>, String> {
    if answer.forecast.is_empty() {
        return Err(format!("the forecast for zone {zone} is empty"));
    }
    answer.forecast.into_iter().enumerate().map(|(i, f)| reading(f, zone).map_err(|m| format!("forecast entry {}: {m}", i + 1))).collect()
}

/// The reading in an answer's body (what `read` makes of it once fetched); the error is the
/// message of a `Malformed` error.
pub fn parse_body(body: &str, zone: &str) -> Result<Reading, String> {
    reading(serde_json::from_str(body).map_err(|e| e.to_string())?, zone)
}

fn reading(latest: Latest, zone: &str) -> Result<Reading, String> {
    let g_per_kwh =
        latest.carbon_intensity.ok_or_else(|| format!("carbonIntensity is null: no value for zone {zone}"))?;
    let stamp = latest.datetime.ok_or_else(|| "datetime is missing".to_string())?;
    let timestamp = parse_timestamp(&stamp).ok_or_else(|| format!("cannot read datetime {stamp:?}"))?;
    Ok(Reading { g_per_kwh, timestamp })
}

/// Percent-encode a query value (zone keys are letters, digits and dashes; anything else is
/// escaped rather than trusted).
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_and_encoding() {
        let em = ElectricityMaps {
            zone: "US-CAL-CISO".into(),
            token_file: None,
            base_url: "http://h:1/".into(),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(em.url(), "http://h:1/v3/carbon-intensity/latest?zone=US-CAL-CISO");
        assert_eq!(em.forecast_url(), "http://h:1/v3/carbon-intensity/forecast?zone=US-CAL-CISO");
        assert_eq!(encode("a b&c"), "a%20b%26c");
        assert_eq!(em.describe(), "electricitymaps zone US-CAL-CISO");
    }

    #[test]
    fn token_file_problems_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  \n").unwrap();
        let em = |p: PathBuf| ElectricityMaps {
            zone: "DE".into(),
            token_file: Some(p),
            base_url: "http://127.0.0.1:9".into(),
            timeout: Duration::from_secs(1),
        };
        let err = em(path.clone()).read(Utc::now()).unwrap_err().to_string();
        assert!(err.contains("token file is empty") && err.contains("token"), "{err}");
        let err = em(dir.path().join("missing")).read(Utc::now()).unwrap_err().to_string();
        assert!(err.starts_with("cannot read ") && err.contains("missing"), "{err}");
        std::fs::write(&path, "secret\n").unwrap();
        assert_eq!(em(path).token().unwrap().as_deref(), Some("secret"));
    }
}

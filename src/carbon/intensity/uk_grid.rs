//! `source = "uk-grid"`: Great Britain's Carbon Intensity API (National Grid ESO).
//!
//! * national: `GET /intensity` → `{"data":[{"from","to","intensity":{"forecast","actual","index"}}]}`;
//!   `actual` is null until the half hour is measured, then the `forecast` is used;
//! * regional: `GET /regional/postcode/RG10` or `GET /regional/regionid/13` →
//!   `{"data":[{"regionid",…,"data":[{"from","to","intensity":{"forecast","index"},…}]}]}`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::{http, parse_timestamp, Reading, Source, SourceError};

pub const DEFAULT_BASE_URL: &str = "https://api.carbonintensity.org.uk";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Area {
    National,
    /// Outward postcode, e.g. "RG10".
    Postcode(String),
    /// Region id 1–17.
    Region(u32),
}

pub struct UkGrid {
    pub area: Area,
    pub base_url: String,
    pub timeout: Duration,
}

#[derive(Deserialize)]
struct Response<T> {
    data: Vec<T>,
}

#[derive(Deserialize)]
struct Period {
    from: String,
    intensity: Figures,
}

#[derive(Deserialize)]
struct Figures {
    forecast: Option<f64>,
    #[serde(default)]
    actual: Option<f64>,
}

#[derive(Deserialize)]
struct Region {
    data: Vec<Period>,
}

impl UkGrid {
    pub fn url(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        match &self.area {
            Area::National => format!("{base}/intensity"),
            Area::Postcode(code) => format!("{base}/regional/postcode/{code}"),
            Area::Region(id) => format!("{base}/regional/regionid/{id}"),
        }
    }
}

impl Source for UkGrid {
    fn describe(&self) -> String {
        match &self.area {
            Area::National => "uk-grid national".into(),
            Area::Postcode(code) => format!("uk-grid postcode {code}"),
            Area::Region(id) => format!("uk-grid region {id}"),
        }
    }

    fn read(&self, _now: DateTime<Utc>) -> Result<Reading, SourceError> {
        let url = self.url();
        let period = match self.area {
            Area::National => national(http::get_json(&url, &[], self.timeout)?),
            Area::Postcode(_) | Area::Region(_) => regional(http::get_json(&url, &[], self.timeout)?),
        };
        period.and_then(reading).map_err(|message| SourceError::Malformed { url, message })
    }
}

/// The reading in an answer's body for `area` (what `read` makes of it once fetched); the
/// error is the message of a `Malformed` error.
pub fn parse_body(body: &str, area: &Area) -> Result<Reading, String> {
    let period = match area {
        Area::National => national(serde_json::from_str(body).map_err(|e| e.to_string())?),
        Area::Postcode(_) | Area::Region(_) => regional(serde_json::from_str(body).map_err(|e| e.to_string())?),
    };
    period.and_then(reading)
}

fn national(response: Response<Period>) -> Result<Period, String> {
    response.data.into_iter().next().ok_or_else(|| "empty data list".to_string())
}

fn regional(response: Response<Region>) -> Result<Period, String> {
    let region = response.data.into_iter().next().ok_or_else(|| "empty data list".to_string())?;
    region.data.into_iter().next().ok_or_else(|| "the region has no periods".to_string())
}

fn reading(period: Period) -> Result<Reading, String> {
    let g_per_kwh = period
        .intensity
        .actual
        .or(period.intensity.forecast)
        .ok_or_else(|| "neither actual nor forecast intensity is given".to_string())?;
    let timestamp =
        parse_timestamp(&period.from).ok_or_else(|| format!("cannot read the period start {:?}", period.from))?;
    Ok(Reading { g_per_kwh, timestamp })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_names() {
        let uk = |area| UkGrid { area, base_url: "http://h:1".into(), timeout: Duration::from_secs(1) };
        assert_eq!(uk(Area::National).url(), "http://h:1/intensity");
        assert_eq!(uk(Area::Postcode("RG10".into())).url(), "http://h:1/regional/postcode/RG10");
        assert_eq!(uk(Area::Region(13)).url(), "http://h:1/regional/regionid/13");
        assert_eq!(uk(Area::Region(13)).describe(), "uk-grid region 13");
    }
}

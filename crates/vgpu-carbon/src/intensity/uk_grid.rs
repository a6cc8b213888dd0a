//! `source = "uk-grid"`: Great Britain's Carbon Intensity API (National Grid ESO).
//!
//! * national: `GET /intensity` → `{"data":[{"from","to","intensity":{"forecast","actual","index"}}]}`;
//!   `actual` is null until the half hour is measured, then the `forecast` is used;
//! * regional: `GET /regional/postcode/RG10` or `GET /regional/regionid/13` →
//!   `{"data":[{"regionid",…,"data":[{"from","to","intensity":{"forecast","index"},…}]}]}`;
//! * forecast, 48 hours of half-hour periods from a time: `GET /intensity/{from}/fw48h`
//!   (the national answer's shape, `actual` null ahead of time), `GET
//!   /regional/intensity/{from}/fw48h/postcode/RG10` or `…/regionid/13` (the regional shape,
//!   but with `data` one object rather than a list; a list is accepted too). `{from}` is
//!   ISO 8601 to the minute, `2018-01-20T12:00Z`.

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

/// A regional forecast's `data`: one region (what the API sends), or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(Region),
    Many(Vec<Region>),
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

    /// The 48-hour forecast's address, from `from` (to the minute).
    pub fn forecast_url(&self, from: DateTime<Utc>) -> String {
        let base = self.base_url.trim_end_matches('/');
        let from = from.format("%Y-%m-%dT%H:%MZ");
        match &self.area {
            Area::National => format!("{base}/intensity/{from}/fw48h"),
            Area::Postcode(code) => format!("{base}/regional/intensity/{from}/fw48h/postcode/{code}"),
            Area::Region(id) => format!("{base}/regional/intensity/{from}/fw48h/regionid/{id}"),
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

    fn forecast(&self, now: DateTime<Utc>, _until: DateTime<Utc>) -> Result<Vec<Reading>, SourceError> {
        let url = self.forecast_url(now);
        let body: serde_json::Value = http::get_json(&url, &[], self.timeout)?;
        parse_forecast_value(body, &self.area).map_err(|message| SourceError::Malformed { url, message })
    }
}

/// The forecast in an answer's body for `area`; the error is the message of a `Malformed`
/// error.
pub fn parse_forecast_body(body: &str, area: &Area) -> Result<Vec<Reading>, String> {
    parse_forecast_value(serde_json::from_str(body).map_err(|e| e.to_string())?, area)
}

fn parse_forecast_value(body: serde_json::Value, area: &Area) -> Result<Vec<Reading>, String> {
    let periods = match area {
        Area::National => serde_json::from_value::<Response<Period>>(body).map_err(|e| e.to_string())?.data,
        Area::Postcode(_) | Area::Region(_) => {
            #[derive(Deserialize)]
            struct Regional {
                data: OneOrMany,
            }
            match serde_json::from_value::<Regional>(body).map_err(|e| e.to_string())?.data {
                OneOrMany::One(region) => region.data,
                OneOrMany::Many(regions) => {
                    regions.into_iter().next().ok_or_else(|| "empty data list".to_string())?.data
                }
            }
        }
    };
    if periods.is_empty() {
        return Err("the forecast has no periods".into());
    }
    periods.into_iter().map(forecast_reading).collect()
}

/// A period's forecast figure (the measured one where the period is past).
fn forecast_reading(period: Period) -> Result<Reading, String> {
    let g_per_kwh = period
        .intensity
        .forecast
        .or(period.intensity.actual)
        .ok_or_else(|| format!("the period from {} has neither forecast nor actual intensity", period.from))?;
    let timestamp =
        parse_timestamp(&period.from).ok_or_else(|| format!("cannot read the period start {:?}", period.from))?;
    Ok(Reading { g_per_kwh, timestamp })
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
        let from = parse_timestamp("2018-01-20T12:07:31Z").unwrap();
        assert_eq!(uk(Area::National).forecast_url(from), "http://h:1/intensity/2018-01-20T12:07Z/fw48h");
        assert_eq!(
            uk(Area::Postcode("RG10".into())).forecast_url(from),
            "http://h:1/regional/intensity/2018-01-20T12:07Z/fw48h/postcode/RG10"
        );
        assert_eq!(uk(Area::Region(13)).forecast_url(from), "http://h:1/regional/intensity/2018-01-20T12:07Z/fw48h/regionid/13");
    }
}

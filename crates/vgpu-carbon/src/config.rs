//! The `[carbon]` table of the config file.
//!
//! ```toml
//! [carbon]
//! source = "uk-grid"            # static | file | command | electricitymaps | uk-grid
//! postcode = "RG10"             # or region_id = 13; neither: national figure
//! budget_g_per_hour = 400       # gCO2 per hour for all of this host's GPUs
//! budget_g_per_day = 6000       # gCO2 per local day (from midnight), spent when the grid is clean
//! budget_g_per_month = 150000   # gCO2 per local calendar month (from the 1st)
//! max_age = "1h"                # how old a remembered reading may be when the source fails
//! fallback = 250                # gCO2/kWh when the source fails and nothing recent is remembered
//! ```
//!
//! Every key is optional here; `validate` checks values and that the chosen source has
//! what it needs, and names the key in its one-line message.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::model;

/// Where the current grid carbon intensity comes from.
///
/// `clap::ValueEnum` is derived for its generated list of every variant
/// (`SourceKind::value_variants()`), which `tests/maintainer_guide.rs` walks to check that
/// each source is configurable, documented and fuzzed (ARCHITECTURE.md, "Adding an
/// intensity source").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// A fixed value (`value`).
    Static,
    /// A local time series (`path`): CSV `timestamp,gco2_per_kwh` or JSON.
    File,
    /// A command (`command`, run by `sh -c`) that prints a number.
    Command,
    /// Electricity Maps API v3 `carbon-intensity/latest` for `zone`.
    Electricitymaps,
    /// Great Britain's Carbon Intensity API (National Grid ESO): national, or regional by
    /// `postcode` or `region_id`.
    UkGrid,
}

impl SourceKind {
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::Static => "static",
            SourceKind::File => "file",
            SourceKind::Command => "command",
            SourceKind::Electricitymaps => "electricitymaps",
            SourceKind::UkGrid => "uk-grid",
        }
    }
}

pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(3600);
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The smallest `log_max_bytes`: a few decisions of a large host.
pub const MIN_LOG_BYTES: u64 = 4096;
/// The most rotated decision logs kept.
pub const MAX_LOG_KEEP: u32 = 9;

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CarbonConfig {
    /// Intensity source; none: every carbon command needs `--intensity`.
    pub source: Option<SourceKind>,
    /// `static`: the intensity, gCO2/kWh.
    pub value: Option<f64>,
    /// `file`: the time series.
    pub path: Option<PathBuf>,
    /// `command`: a shell command printing gCO2/kWh.
    pub command: Option<String>,
    /// `electricitymaps`: the zone key, e.g. "DE".
    pub zone: Option<String>,
    /// `electricitymaps`: file holding the API token (sent as the `auth-token` header).
    pub token_file: Option<PathBuf>,
    /// `uk-grid`: outward postcode, e.g. "RG10".
    pub postcode: Option<String>,
    /// `uk-grid`: region id 1–17.
    pub region_id: Option<u32>,
    /// Overrides the API's address (tests point it at 127.0.0.1).
    pub base_url: Option<String>,
    /// The budget for all of this host's GPUs, gCO2 per hour; `--budget` wins.
    pub budget_g_per_hour: Option<f64>,
    /// The budget for a day (from the host's local midnight), gCO2, allotted over the day's
    /// hours by the intensity forecast; with other budgets, the tightest binds.
    pub budget_g_per_day: Option<f64>,
    /// The budget for a calendar month (from the 1st, local time), gCO2, likewise.
    pub budget_g_per_month: Option<f64>,
    /// How old a remembered reading may be when the source fails [default: 1h].
    pub max_age: Option<String>,
    /// The intensity to use when the source fails and no recent reading is remembered.
    pub fallback: Option<f64>,
    /// Network and command timeout [default: 10s].
    pub timeout: Option<String>,
    /// Exponent of the power model P(f) = P_idle + (P_max − P_idle)·(f/f_max)^γ [default: 2].
    pub gamma: Option<f64>,
    /// Clock step of the planner's stage 2, MHz [default: one supported-clock step].
    pub delta_f_mhz: Option<u32>,
    /// Throughput each extra GPU adds to a workload, as a fraction of one GPU [default: 0.9].
    pub scaling_efficiency: Option<f64>,
    /// Frequency sensitivity of workloads that declare none: 1 = speed ∝ clock,
    /// 0 = clock does not matter [default: 1].
    pub freq_sensitivity: Option<f64>,
    /// Power of a GPU with no work, watts [default: 15 % of power_max_w].
    pub power_idle_w: Option<f64>,
    /// Power of a GPU at its highest clock, watts [default: the device's default power limit].
    pub power_max_w: Option<f64>,
    /// The decision log's size cap, bytes: past it, carbon.jsonl is rotated [default: 16 MiB].
    pub log_max_bytes: Option<u64>,
    /// Rotated decision logs kept (carbon.jsonl.1 … .N), 1 to 9 [default: 1].
    pub log_keep: Option<u32>,
}

/// A config value that cannot be used; the message names the key.
#[derive(Debug, Error, PartialEq)]
#[error("[carbon] {key}: {message}")]
pub struct CarbonConfigError {
    pub key: &'static str,
    pub message: String,
}

fn bad(key: &'static str, message: impl Into<String>) -> CarbonConfigError {
    CarbonConfigError { key, message: message.into() }
}

/// The highest grid carbon intensity vgpu believes, gCO2/kWh. The dirtiest grids average
/// about 1000 (lignite and oil plants emit up to about 1300 per kWh they produce); five
/// times the worst plant leaves room for any real reading and refuses typos like `1e308`.
pub const MAX_INTENSITY: f64 = 5000.0;

/// A plausible grid carbon intensity: finite, from 0 to [`MAX_INTENSITY`] gCO2/kWh.
pub fn check_intensity(key: &'static str, value: f64) -> Result<f64, CarbonConfigError> {
    if value.is_finite() && (0.0..=MAX_INTENSITY).contains(&value) {
        Ok(value)
    } else {
        Err(bad(key, format!("must be a carbon intensity from 0 to {MAX_INTENSITY} gCO2/kWh, got {value}")))
    }
}

/// A non-negative, finite number: intensities and budgets.
pub fn check_non_negative(key: &'static str, value: f64) -> Result<f64, CarbonConfigError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(bad(key, format!("must be a non-negative number, got {value}")))
    }
}

fn parse_duration(key: &'static str, text: &str) -> Result<Duration, CarbonConfigError> {
    humantime::parse_duration(text.trim())
        .map_err(|e| bad(key, format!("cannot read {text:?} as a duration like \"30m\" or \"1h\": {e}")))
}

impl CarbonConfig {
    /// Check every value and that the chosen source has the keys it needs.
    pub fn validate(&self) -> Result<(), CarbonConfigError> {
        if let Some(v) = self.value {
            check_intensity("value", v)?;
        }
        if let Some(v) = self.fallback {
            check_intensity("fallback", v)?;
        }
        for (key, value) in [
            ("budget_g_per_hour", self.budget_g_per_hour),
            ("budget_g_per_day", self.budget_g_per_day),
            ("budget_g_per_month", self.budget_g_per_month),
        ] {
            if let Some(v) = value {
                check_non_negative(key, v)?;
            }
        }
        self.max_age()?;
        if self.timeout()?.is_zero() {
            return Err(bad("timeout", "must be longer than zero"));
        }
        self.model_defaults()?;
        self.log_rotation()?;
        for (key, value) in [("power_idle_w", self.power_idle_w), ("power_max_w", self.power_max_w)] {
            if let Some(v) = value {
                check_non_negative(key, v)?;
            }
        }
        if let (Some(idle), Some(max)) = (self.power_idle_w, self.power_max_w) {
            if idle > max {
                return Err(bad("power_idle_w", format!("{idle} W is above power_max_w ({max} W)")));
            }
        }
        if let Some(id) = self.region_id {
            if !(1..=17).contains(&id) {
                return Err(bad("region_id", format!("must be a GB region id from 1 to 17, got {id}")));
            }
        }
        if let Some(url) = &self.base_url {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(bad("base_url", format!("must start with http:// or https://, got {url:?}")));
            }
        }
        self.validate_source()
    }

    fn validate_source(&self) -> Result<(), CarbonConfigError> {
        let Some(source) = self.source else { return Ok(()) };
        let need = |key: &'static str, present: bool| {
            if present {
                Ok(())
            } else {
                Err(bad(key, format!("is required with source = \"{}\"", source.name())))
            }
        };
        match source {
            SourceKind::Static => need("value", self.value.is_some()),
            SourceKind::File => need("path", self.path.is_some()),
            SourceKind::Command => need("command", self.command.as_deref().is_some_and(|c| !c.trim().is_empty())),
            SourceKind::Electricitymaps => need("zone", self.zone.as_deref().is_some_and(|z| !z.trim().is_empty())),
            SourceKind::UkGrid => {
                if self.postcode.is_some() && self.region_id.is_some() {
                    return Err(bad("postcode", "give postcode or region_id, not both"));
                }
                match &self.postcode {
                    Some(p) if p.trim().is_empty() || !p.trim().chars().all(|c| c.is_ascii_alphanumeric()) => {
                        Err(bad("postcode", format!("must be an outward postcode like \"RG10\", got {p:?}")))
                    }
                    _ => Ok(()),
                }
            }
        }
    }

    /// Whether any budget (per hour, day or month) is configured.
    pub fn has_budget(&self) -> bool {
        self.budget_g_per_hour.is_some() || self.budget_g_per_day.is_some() || self.budget_g_per_month.is_some()
    }

    pub fn max_age(&self) -> Result<Duration, CarbonConfigError> {
        self.max_age.as_deref().map_or(Ok(DEFAULT_MAX_AGE), |t| parse_duration("max_age", t))
    }

    pub fn timeout(&self) -> Result<Duration, CarbonConfigError> {
        self.timeout.as_deref().map_or(Ok(DEFAULT_TIMEOUT), |t| parse_duration("timeout", t))
    }

    /// When the decision log is rotated, defaults filled in and checked.
    pub fn log_rotation(&self) -> Result<Rotation, CarbonConfigError> {
        let max_bytes = self.log_max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
        if max_bytes < MIN_LOG_BYTES {
            return Err(bad("log_max_bytes", format!("must be at least {MIN_LOG_BYTES} bytes, got {max_bytes}")));
        }
        let keep = self.log_keep.unwrap_or(DEFAULT_KEEP);
        if !(1..=MAX_LOG_KEEP).contains(&keep) {
            return Err(bad("log_keep", format!("must be from 1 to {MAX_LOG_KEEP}, got {keep}")));
        }
        Ok(Rotation { max_bytes, keep })
    }

    /// The model's tunables, defaults filled in and checked.
    pub fn model_defaults(&self) -> Result<model::Tunables, CarbonConfigError> {
        let gamma = self.gamma.unwrap_or(model::DEFAULT_GAMMA);
        if !(gamma.is_finite() && (1.0..=4.0).contains(&gamma)) {
            return Err(bad("gamma", format!("must be between 1 and 4, got {gamma}")));
        }
        let scaling_efficiency = self.scaling_efficiency.unwrap_or(model::DEFAULT_SCALING_EFFICIENCY);
        if !(scaling_efficiency.is_finite() && (0.0..=1.0).contains(&scaling_efficiency)) {
            return Err(bad("scaling_efficiency", format!("must be between 0 and 1, got {scaling_efficiency}")));
        }
        let freq_sensitivity = self.freq_sensitivity.unwrap_or(model::DEFAULT_FREQ_SENSITIVITY);
        if !(freq_sensitivity.is_finite() && (0.0..=1.0).contains(&freq_sensitivity)) {
            return Err(bad("freq_sensitivity", format!("must be between 0 and 1, got {freq_sensitivity}")));
        }
        if self.delta_f_mhz == Some(0) {
            return Err(bad("delta_f_mhz", "must be at least 1 MHz"));
        }
        Ok(model::Tunables { gamma, scaling_efficiency, freq_sensitivity, delta_f_mhz: self.delta_f_mhz })
    }
}

/// The decision log's rotation (`[carbon] log_max_bytes`, `log_keep`; the log is `log`).
/// `[carbon] log_max_bytes` by default.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 20;
/// `[carbon] log_keep` by default: old files kept beside the log.
pub const DEFAULT_KEEP: u32 = 1;

/// When and how the log is rotated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// The most bytes the log may hold before it is rotated (a single longer line is still
    /// written, alone in a new file).
    pub max_bytes: u64,
    /// How many rotated files are kept (`carbon.jsonl.1` … `.N`), at least 1.
    pub keep: u32,
}

impl Default for Rotation {
    fn default() -> Rotation {
        Rotation { max_bytes: DEFAULT_MAX_BYTES, keep: DEFAULT_KEEP }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config file with only the `[carbon]` table, read as the root config
    /// (`vgpu_host::config::Config`) reads it; the root's own tests parse whole files.
    #[derive(Debug, serde::Deserialize)]
    struct Config {
        #[serde(default)]
        carbon: CarbonConfig,
    }

    impl Config {
        fn parse(text: &str) -> Result<Config, String> {
            toml::from_str(text).map_err(|e| e.to_string())
        }
    }

    fn parse(text: &str) -> CarbonConfig {
        Config::parse(text).expect("config parses").carbon
    }

    #[test]
    fn defaults_are_valid_and_sourceless() {
        let c = CarbonConfig::default();
        c.validate().unwrap();
        assert!(c.source.is_none());
        assert_eq!(c.max_age().unwrap(), DEFAULT_MAX_AGE);
        assert_eq!(c.timeout().unwrap(), DEFAULT_TIMEOUT);
    }

    #[test]
    fn every_key_parses() {
        let c = parse(
            "[carbon]\nsource = \"uk-grid\"\nvalue = 300\npath = \"/x.csv\"\ncommand = \"echo 1\"\nzone = \"DE\"\n\
             token_file = \"/t\"\npostcode = \"RG10\"\nbase_url = \"http://127.0.0.1:9\"\n\
             budget_g_per_hour = 500.5\nbudget_g_per_day = 9000\nbudget_g_per_month = 2e5\nmax_age = \"2h\"\nfallback = 250\ntimeout = \"3s\"\ngamma = 2.5\n\
             delta_f_mhz = 30\nscaling_efficiency = 0.8\nfreq_sensitivity = 0.5\npower_idle_w = 60\npower_max_w = 300\n",
        );
        c.validate().unwrap();
        assert_eq!(c.source, Some(SourceKind::UkGrid));
        assert_eq!(c.value, Some(300.0));
        assert_eq!((c.budget_g_per_day, c.budget_g_per_month), (Some(9000.0), Some(200_000.0)));
        assert_eq!(c.max_age().unwrap(), Duration::from_secs(7200));
        assert_eq!(c.model_defaults().unwrap().delta_f_mhz, Some(30));
    }

    #[test]
    fn source_names() {
        for (text, kind) in [
            ("static", SourceKind::Static),
            ("file", SourceKind::File),
            ("command", SourceKind::Command),
            ("electricitymaps", SourceKind::Electricitymaps),
            ("uk-grid", SourceKind::UkGrid),
        ] {
            assert_eq!(parse(&format!("[carbon]\nsource = \"{text}\"\n")).source, Some(kind));
            assert_eq!(kind.name(), text);
        }
        assert!(Config::parse("[carbon]\nsource = \"wind\"\n").is_err());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::parse("[carbon]\nbudget = 5\n").unwrap_err();
        assert!(err.contains("budget"), "{err}");
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("budget_g_per_hour = -5", "budget_g_per_hour"),
            ("budget_g_per_day = -1", "budget_g_per_day"),
            ("budget_g_per_day = inf", "budget_g_per_day"),
            ("budget_g_per_month = nan", "budget_g_per_month"),
            ("budget_g_per_month = -0.5", "budget_g_per_month"),
            ("value = -1", "value"),
            ("fallback = -1", "fallback"),
            ("value = 1e308", "value"),
            ("fallback = 5001", "fallback"),
            ("value = nan", "value"),
            ("max_age = \"soon\"", "max_age"),
            ("timeout = \"0s\"", "timeout"),
            ("gamma = 0.5", "gamma"),
            ("scaling_efficiency = 1.5", "scaling_efficiency"),
            ("freq_sensitivity = -0.1", "freq_sensitivity"),
            ("delta_f_mhz = 0", "delta_f_mhz"),
            ("region_id = 40", "region_id"),
            ("base_url = \"ftp://x\"", "base_url"),
            ("power_idle_w = 400\npower_max_w = 300", "power_idle_w"),
            ("source = \"static\"", "value"),
            ("source = \"file\"", "path"),
            ("source = \"command\"", "command"),
            ("source = \"electricitymaps\"", "zone"),
            ("source = \"uk-grid\"\npostcode = \"RG10\"\nregion_id = 3", "postcode"),
            ("source = \"uk-grid\"\npostcode = \"RG10 6AA/..\"", "postcode"),
        ] {
            let err = parse(&format!("[carbon]\n{text}\n")).validate().unwrap_err();
            assert_eq!(err.key, key, "{text}: {err}");
            let line = err.to_string();
            assert!(line.starts_with(&format!("[carbon] {key}: ")), "{line}");
            assert!(!line.contains('\n'), "{line}");
        }
    }
}

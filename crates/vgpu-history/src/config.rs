//! The `[history]` table of the config file: what `vgpu watch` records in history.db.
//!
//! ```toml
//! [history]
//! enabled = true   # false: vgpu watch records nothing
//! keep = "90d"     # rows older than this are deleted (at start, then hourly)
//! interval = "10s" # one row per GPU (and workload) per this much; 0s: per watch round
//! ```

use std::time::Duration;

use serde::Deserialize;

/// 90 days.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(90 * 86_400);
/// The shortest retention: an hour (retention runs hourly).
pub const MIN_KEEP: Duration = Duration::from_secs(3600);
/// A row per GPU per 10 s: at 1 s rounds a tenth of the rows (8 busy GPUs: about 24 MB a
/// day, 2.2 GB in 90 days, instead of 240 MB and 22 GB), with the same totals.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// The longest recording interval.
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    pub enabled: bool,
    #[serde(with = "humantime_serde")]
    pub keep: Duration,
    /// How long one row covers at least: the watch's rounds are added up until then
    /// (zero: every round is written).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig { enabled: true, keep: DEFAULT_KEEP, interval: DEFAULT_INTERVAL }
    }
}

impl HistoryConfig {
    /// Values serde cannot check; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.keep < MIN_KEEP {
            return Err(format!(
                "[history] keep: must be at least {}, got {}",
                humantime::format_duration(MIN_KEEP),
                humantime::format_duration(self.keep)
            ));
        }
        if self.interval > MAX_INTERVAL {
            return Err(format!(
                "[history] interval: must be at most {}, got {}",
                humantime::format_duration(MAX_INTERVAL),
                humantime::format_duration(self.interval)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// A config file with only the `[history]` table, read as the root config
    /// (`vgpu_host::config::Config`) reads it; the root's own tests parse whole files.
    #[derive(Debug, serde::Deserialize)]
    struct Config {
        #[serde(default)]
        history: HistoryConfig,
    }

    impl Config {
        fn parse(text: &str) -> Result<Config, String> {
            toml::from_str(text).map_err(|e| e.to_string())
        }
    }

    #[test]
    fn defaults_and_every_key() {
        let c = Config::parse("").unwrap().history;
        assert_eq!(c, HistoryConfig::default());
        assert!(c.enabled);
        assert_eq!(c.keep, Duration::from_secs(90 * 86_400));
        assert_eq!(Config::parse("").unwrap().history.interval, DEFAULT_INTERVAL, "a row per 10 s unless asked");
        let c = Config::parse("[history]\nenabled = false\nkeep = \"7d\"\ninterval = \"10s\"\n").unwrap().history;
        c.validate().unwrap();
        assert_eq!(c, HistoryConfig { enabled: false, keep: Duration::from_secs(7 * 86_400), interval: Duration::from_secs(10) });
    }
}

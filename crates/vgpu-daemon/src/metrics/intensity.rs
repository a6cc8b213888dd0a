//! The carbon intensity the metrics show: what `vgpu carbon intensity` would say (the
//! configured source, then the remembered reading within `max_age`, then `fallback`), read
//! at most every [`REFRESH`] — and at once after the `[carbon]` table changes — on a thread
//! of its own, so that a slow API or command never delays a round. Good readings are
//! remembered in `<lib>/carbon-intensity.json` as `vgpu carbon apply` does.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::Utc;

use vgpu_carbon::config::CarbonConfig;
use vgpu_carbon::intensity::cache::Cache;
use vgpu_carbon::intensity::cache::CACHE_FILE;
use vgpu_carbon::intensity;
use vgpu_carbon::intensity::Intensity;
use vgpu_carbon::intensity::Policy;

/// How often the source is asked (the grid APIs publish every 5 to 30 minutes).
pub const REFRESH: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
#[error("carbon intensity: {0}")]
pub struct IntensityError(pub String);

/// The latest reading and the refresh under way.
#[derive(Debug, Default)]
pub struct IntensityFeed {
    latest: Option<Intensity>,
    /// The `[carbon]` table the latest reading (or the refresh under way) is for.
    config_key: Option<String>,
    started_at: Option<Instant>,
    in_flight: Option<(String, JoinHandle<Result<Intensity, String>>)>,
}

impl IntensityFeed {
    /// Take the result of a finished refresh, start the next one when due, and say the
    /// intensity to show (None: no source configured, or nothing usable). `Err` when a
    /// refresh finished without a value; the previous value is then dropped, as `vgpu
    /// carbon` would have none either.
    pub fn poll(&mut self, config: &CarbonConfig, lib_dir: &Path, now: Instant) -> Result<Option<&Intensity>, IntensityError> {
        let key = serde_json::to_string(config).unwrap_or_default();
        let mut failed = None;
        if self.in_flight.as_ref().is_some_and(|(_, job)| job.is_finished()) {
            if let Some((job_key, job)) = self.in_flight.take() {
                let result = job.join().unwrap_or_else(|_| Err("the reading thread panicked".to_string()));
                if job_key == key {
                    match result {
                        Ok(found) => self.latest = Some(found),
                        Err(message) => {
                            self.latest = None;
                            failed = Some(IntensityError(message));
                        }
                    }
                }
            }
        }
        if config.source.is_none() {
            self.latest = None;
            self.config_key = Some(key);
            return Ok(None);
        }
        let changed = self.config_key.as_deref() != Some(key.as_str());
        if changed {
            self.latest = None;
            self.config_key = Some(key.clone());
        }
        let due = changed || self.started_at.is_none_or(|t| now.duration_since(t) >= REFRESH);
        if due && self.in_flight.is_none() {
            let (config, cache) = (config.clone(), lib_dir.join(CACHE_FILE));
            match std::thread::Builder::new().name("vgpu-intensity".into()).spawn(move || read(&config, cache)) {
                Ok(job) => {
                    self.in_flight = Some((key, job));
                    self.started_at = Some(now);
                }
                Err(e) => failed = Some(IntensityError(format!("cannot start the reading thread: {e}"))),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(self.latest.as_ref()),
        }
    }

    /// Wait for the refresh under way (tests).
    #[cfg(test)]
    pub fn wait(&mut self) {
        if let Some((_, job)) = &self.in_flight {
            while !job.is_finished() {
                std::thread::yield_now();
            }
        }
    }
}

/// One reading, as `vgpu carbon intensity` resolves it.
fn read(config: &CarbonConfig, cache: PathBuf) -> Result<Intensity, String> {
    let source = intensity::from_config(config).map_err(|e| e.to_string())?;
    let max_age = config.max_age().map_err(|e| e.to_string())?;
    let cache = Cache::new(cache);
    let policy = Policy { cache: &cache, max_age, fallback: config.fallback, remember: true };
    intensity::resolve(source.as_ref(), &policy, Utc::now()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_carbon::config::SourceKind;
    use vgpu_carbon::intensity::Status;

    fn fixed(value: f64) -> CarbonConfig {
        CarbonConfig { source: Some(SourceKind::Static), value: Some(value), ..CarbonConfig::default() }
    }

    #[test]
    fn reads_in_the_background_then_again_only_when_due_or_changed() {
        let dir = tempfile::tempdir().unwrap();
        let mut feed = IntensityFeed::default();
        let t0 = Instant::now();
        assert_eq!(feed.poll(&fixed(120.0), dir.path(), t0).unwrap(), None, "nothing before the first reading");
        feed.wait();
        let got = feed.poll(&fixed(120.0), dir.path(), t0).unwrap().cloned().unwrap();
        assert_eq!((got.intensity, got.status), (120.0, Status::Fresh));
        assert!(dir.path().join(CACHE_FILE).is_file(), "a good reading is remembered");
        // Not due: no new reading started.
        feed.poll(&fixed(120.0), dir.path(), t0 + Duration::from_secs(10)).unwrap();
        assert!(feed.in_flight.is_none());
        // Changed: the old value is not shown for the new source, and it is read at once.
        assert_eq!(feed.poll(&fixed(300.0), dir.path(), t0 + Duration::from_secs(11)).unwrap(), None);
        feed.wait();
        assert_eq!(feed.poll(&fixed(300.0), dir.path(), t0 + Duration::from_secs(12)).unwrap().unwrap().intensity, 300.0);
        // Due again after REFRESH.
        feed.poll(&fixed(300.0), dir.path(), t0 + Duration::from_secs(12) + REFRESH).unwrap();
        assert!(feed.in_flight.is_some());
    }

    #[test]
    fn no_source_no_value_and_a_failing_source_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut feed = IntensityFeed::default();
        assert!(feed.poll(&CarbonConfig::default(), dir.path(), Instant::now()).unwrap().is_none());
        assert!(feed.in_flight.is_none(), "nothing to read");
        let broken = CarbonConfig {
            source: Some(SourceKind::File),
            path: Some(dir.path().join("missing.csv")),
            ..CarbonConfig::default()
        };
        feed.poll(&broken, dir.path(), Instant::now()).unwrap();
        feed.wait();
        let err = feed.poll(&broken, dir.path(), Instant::now()).unwrap_err().to_string();
        assert!(err.contains("missing.csv") && !err.contains('\n'), "{err}");
    }
}

//! The `[watch]` table of the config file: how `vgpu watch` audits and enforces.
//!
//! ```toml
//! [watch]
//! interval = "1s"             # one audit and reconcile per interval
//! grace = "500ms"             # how long a vGPU may stay over its memory quota
//! kill_after = "5s"           # SIGTERM, then SIGKILL this much later
//! context_allowance = "auto" # per process with a context on a GPU: what one CUDA context takes there
//! offence_window = "10m"      # a workload's second offence within this ends the whole workload
//! unmanaged = "report"        # report | kill: processes on a vGPU's GPU outside every vGPU
//! compute = "throttle"        # report | throttle | kill: a vGPU over its compute share the shim does not see
//! compute_tolerance = 10      # percentage points above the share before the compute audit acts
//! compute_window = "5s"       # how long it must stay above
//! listen = "127.0.0.1:9400"   # Prometheus metrics; "" disables
//! textfile = "/var/lib/node_exporter/textfile_collector/vgpu.prom"   # optional
//! metrics_max_connections = 128          # connections the endpoint holds at once (all peers)
//! metrics_max_connections_per_peer = 32  # … from one peer address
//! metrics_header_timeout = "10s"         # a request's head, from its first byte to its end
//! metrics_idle_timeout = "30s"           # a connection with no request under way
//! metrics_write_timeout = "10s"          # a response the client does not read
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// What the watch does about processes on a GPU that has vGPUs but in no vGPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnmanagedPolicy {
    /// Log them (once per process) and count them in the metrics.
    #[default]
    Report,
    /// Terminate them: SIGTERM, then SIGKILL after `kill_after`.
    Kill,
}

/// What the watch does about a vGPU that uses more of the GPU than its compute share while
/// the shim's ledger says it is within it (work the shim does not see).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputePolicy {
    /// Log it and count it in the metrics.
    Report,
    /// Duty-cycle its cgroup freezer down to the share; terminate it if that does not help.
    #[default]
    Throttle,
    /// Terminate the processes that use the GPU unseen.
    Kill,
}

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_GRACE: Duration = Duration::from_millis(500);
pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(5);
/// How long after a workload's first offence a second one ends the whole workload.
pub const DEFAULT_OFFENCE_WINDOW: Duration = Duration::from_secs(600);

/// What each process with a context on a GPU may hold there beyond its vGPU's quota, which
/// NVML counts and the shim does not: its CUDA context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContextAllowance {
    /// What one context takes on that GPU, measured by the watch (`gpu::context`), or the
    /// GPU's architecture's figure where it cannot measure.
    #[default]
    Auto,
    /// This many bytes on every GPU.
    Bytes(u64),
}

impl<'de> Deserialize<'de> for ContextAllowance {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bytes(b) => Ok(ContextAllowance::Bytes(b)),
            Raw::Text(t) if t.trim() == "auto" => Ok(ContextAllowance::Auto),
            Raw::Text(t) => vgpu_abi::size::parse_size(&t)
                .map(ContextAllowance::Bytes)
                .map_err(|e| serde::de::Error::custom(format!("{e} (\"auto\", or a size such as \"300MiB\")"))),
        }
    }
}
pub const DEFAULT_COMPUTE_TOLERANCE: u32 = 10;
pub const DEFAULT_COMPUTE_WINDOW: Duration = Duration::from_secs(5);
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9400";
/// Connections the metrics endpoint holds at once: a few scrapers need a few; the cap is
/// lowered further when the descriptor limit leaves less (`crate::fdlimit`).
pub const DEFAULT_METRICS_MAX_CONNECTIONS: usize = 128;
/// From one peer address (16 keep-alive scrapers on one host fit).
pub const DEFAULT_METRICS_MAX_CONNECTIONS_PER_PEER: usize = 32;
pub const DEFAULT_METRICS_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_METRICS_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_METRICS_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchConfig {
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    #[serde(with = "humantime_serde")]
    pub grace: Duration,
    #[serde(with = "humantime_serde")]
    pub kill_after: Duration,
    /// "auto", bytes, or a size such as "300MiB".
    pub context_allowance: ContextAllowance,
    /// A second offence of a workload within this of its first ends it; 0: never.
    #[serde(with = "humantime_serde")]
    pub offence_window: Duration,
    pub unmanaged: UnmanagedPolicy,
    pub compute: ComputePolicy,
    /// Percentage points.
    pub compute_tolerance: u32,
    #[serde(with = "humantime_serde")]
    pub compute_window: Duration,
    /// `host:port` of the metrics endpoint; empty: none.
    pub listen: String,
    /// A node_exporter textfile to rewrite at every interval.
    pub textfile: Option<PathBuf>,
    /// Connections the endpoint holds at once, from all peers.
    pub metrics_max_connections: usize,
    /// … from one peer address.
    pub metrics_max_connections_per_peer: usize,
    /// How long a request's head (request line and headers) may take from its first byte.
    #[serde(with = "humantime_serde")]
    pub metrics_header_timeout: Duration,
    /// How long a connection may stay open with no request under way (keep-alive).
    #[serde(with = "humantime_serde")]
    pub metrics_idle_timeout: Duration,
    /// How long a response may wait for the client to read (no byte written).
    #[serde(with = "humantime_serde")]
    pub metrics_write_timeout: Duration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            interval: DEFAULT_INTERVAL,
            grace: DEFAULT_GRACE,
            kill_after: DEFAULT_KILL_AFTER,
            context_allowance: ContextAllowance::Auto,
            offence_window: DEFAULT_OFFENCE_WINDOW,
            unmanaged: UnmanagedPolicy::default(),
            compute: ComputePolicy::default(),
            compute_tolerance: DEFAULT_COMPUTE_TOLERANCE,
            compute_window: DEFAULT_COMPUTE_WINDOW,
            listen: DEFAULT_LISTEN.to_string(),
            textfile: None,
            metrics_max_connections: DEFAULT_METRICS_MAX_CONNECTIONS,
            metrics_max_connections_per_peer: DEFAULT_METRICS_MAX_CONNECTIONS_PER_PEER,
            metrics_header_timeout: DEFAULT_METRICS_HEADER_TIMEOUT,
            metrics_idle_timeout: DEFAULT_METRICS_IDLE_TIMEOUT,
            metrics_write_timeout: DEFAULT_METRICS_WRITE_TIMEOUT,
        }
    }
}

impl WatchConfig {
    /// Values serde cannot check; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        let range = |key: &str, d: Duration, min: Duration, max: Duration| {
            if d < min || d > max {
                Err(format!(
                    "[watch] {key}: must be from {} to {}, got {}",
                    humantime::format_duration(min),
                    humantime::format_duration(max),
                    humantime::format_duration(d)
                ))
            } else {
                Ok(())
            }
        };
        range("interval", self.interval, Duration::from_millis(50), Duration::from_secs(3600))?;
        range("grace", self.grace, Duration::ZERO, Duration::from_secs(3600))?;
        range("kill_after", self.kill_after, Duration::ZERO, Duration::from_secs(3600))?;
        range("compute_window", self.compute_window, Duration::from_millis(100), Duration::from_secs(3600))?;
        range("offence_window", self.offence_window, Duration::ZERO, Duration::from_secs(7 * 24 * 3600))?;
        if self.compute_tolerance > 100 {
            return Err(format!("[watch] compute_tolerance: must be 0 to 100 percentage points, got {}", self.compute_tolerance));
        }
        for (key, d) in [
            ("metrics_header_timeout", self.metrics_header_timeout),
            ("metrics_idle_timeout", self.metrics_idle_timeout),
            ("metrics_write_timeout", self.metrics_write_timeout),
        ] {
            range(key, d, Duration::from_millis(100), Duration::from_secs(3600))?;
        }
        for (key, n) in [("metrics_max_connections", self.metrics_max_connections), ("metrics_max_connections_per_peer", self.metrics_max_connections_per_peer)] {
            if !(1..=65_536).contains(&n) {
                return Err(format!("[watch] {key}: must be from 1 to 65536, got {n}"));
            }
        }
        self.listen_addr()?;
        if let Some(path) = &self.textfile {
            if !path.is_absolute() || path.file_name().is_none() {
                return Err(format!("[watch] textfile: must be an absolute file path, got {:?}", path.display().to_string()));
            }
        }
        Ok(())
    }

    /// The metrics endpoint's address; `None` when `listen` is empty.
    pub fn listen_addr(&self) -> Result<Option<SocketAddr>, String> {
        let text = self.listen.trim();
        if text.is_empty() {
            return Ok(None);
        }
        text.parse::<SocketAddr>()
            .map(Some)
            .map_err(|_| format!("[watch] listen: {text:?} is not host:port (e.g. \"127.0.0.1:9400\"; \"\" disables)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn defaults_and_every_key() {
        let c = Config::parse("").unwrap().watch;
        assert_eq!(c, WatchConfig::default());
        assert_eq!(c.listen_addr().unwrap().unwrap().to_string(), "127.0.0.1:9400");
        let c = Config::parse(
            "[watch]\ninterval = \"250ms\"\ngrace = \"2s\"\nkill_after = \"10s\"\ncontext_allowance = \"1GiB\"\noffence_window = \"1h\"\nunmanaged = \"kill\"\ncompute = \"report\"\ncompute_tolerance = 5\ncompute_window = \"3s\"\nlisten = \"\"\ntextfile = \"/tmp/x.prom\"\nmetrics_max_connections = 10\nmetrics_max_connections_per_peer = 2\nmetrics_header_timeout = \"1s\"\nmetrics_idle_timeout = \"2s\"\nmetrics_write_timeout = \"3s\"\n",
        )
        .unwrap()
        .watch;
        c.validate().unwrap();
        assert_eq!(c.interval, Duration::from_millis(250));
        assert_eq!(c.grace, Duration::from_secs(2));
        assert_eq!(c.kill_after, Duration::from_secs(10));
        assert_eq!(c.context_allowance, ContextAllowance::Bytes(1 << 30));
        assert_eq!(c.offence_window, Duration::from_secs(3600));
        assert_eq!(c.unmanaged, UnmanagedPolicy::Kill);
        assert_eq!(c.compute, ComputePolicy::Report);
        assert_eq!(c.compute_tolerance, 5);
        assert_eq!(c.listen_addr().unwrap(), None);
        assert_eq!((c.metrics_max_connections, c.metrics_max_connections_per_peer), (10, 2));
        assert_eq!(
            (c.metrics_header_timeout, c.metrics_idle_timeout, c.metrics_write_timeout),
            (Duration::from_secs(1), Duration::from_secs(2), Duration::from_secs(3))
        );
        assert_eq!(Config::parse("[watch]\ncontext_allowance = 1000\n").unwrap().watch.context_allowance, ContextAllowance::Bytes(1000));
        assert_eq!(Config::parse("[watch]\ncontext_allowance = \"auto\"\n").unwrap().watch.context_allowance, ContextAllowance::Auto);
        let defaults = WatchConfig::default();
        assert_eq!((defaults.context_allowance, defaults.offence_window), (ContextAllowance::Auto, Duration::from_secs(600)));
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, needle) in [
            ("[watch]\ninterval = \"soon\"\n", "watch.interval"),
            ("[watch]\nunmanaged = \"shoot\"\n", "watch.unmanaged"),
            ("[watch]\nintervall = \"1s\"\n", "intervall"),
            ("[watch]\ncontext_allowance = \"lots\"\n", "watch.context_allowance"),
            ("[watch]\noffence_window = \"often\"\n", "watch.offence_window"),
        ] {
            let err = Config::parse(text).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
        for (text, needle) in [
            ("[watch]\ninterval = \"1ms\"\n", "[watch] interval"),
            ("[watch]\nlisten = \"everywhere\"\n", "[watch] listen"),
            ("[watch]\ncompute_tolerance = 101\n", "[watch] compute_tolerance"),
            ("[watch]\noffence_window = \"8d\"\n", "[watch] offence_window"),
            ("[watch]\ntextfile = \"rel.prom\"\n", "[watch] textfile"),
            ("[watch]\nmetrics_max_connections = 0\n", "[watch] metrics_max_connections"),
            ("[watch]\nmetrics_idle_timeout = \"0s\"\n", "[watch] metrics_idle_timeout"),
        ] {
            let err = Config::parse(text).unwrap().validate().unwrap_err();
            assert!(err.contains(needle) && !err.contains('\n'), "{text}: {err}");
        }
    }
}

//! The config file: `/etc/vgpu/config.toml`, or `--config` / `VGPU_CONFIG`.
//!
//! A missing file means defaults. An unknown key or a bad value is an error that names the
//! key and the file (serde's `deny_unknown_fields` plus toml's span-aware messages).

pub mod slurm;
pub mod suspend;
pub mod watch;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/vgpu/config.toml";
pub const DEFAULT_STATE_DIR: &str = "/run/vgpu";
pub const DEFAULT_LIB_DIR: &str = "/var/lib/vgpu";

/// The whole config file. Every table is optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where `libvgpu.so` is, when it is neither next to the binary nor under the prefix.
    pub shim_path: Option<PathBuf>,
    /// Runtime state (workloads, usage files); `--state-dir` and `VGPU_STATE_DIR` win.
    pub state_dir: Option<PathBuf>,
    /// Persistent state (partitions, carbon log).
    pub lib_dir: Option<PathBuf>,
    /// Use the bundled simulated driver (same as `--simulate`).
    pub simulate: bool,
    pub carbon: vgpu_carbon::config::CarbonConfig,
    /// `[compute]`: the default compute policy.
    pub compute: vgpu_store::compute::ComputeConfig,
    pub pool: vgpu_pool::config::PoolConfig,
    /// `[policy]`: what a user who starts vgpu through sudo may do beyond the defaults.
    pub policy: PolicyConfig,
    /// `[watch]`: how `vgpu watch` audits, enforces and exports metrics.
    pub watch: crate::config::watch::WatchConfig,
    /// `[suspend]`: whether suspension moves device memory to host memory.
    pub suspend: suspend::SuspendConfig,
    /// `[cgroup]`: who makes a workload's cgroup.
    pub cgroup: CgroupConfig,
    /// `[history]`: what `vgpu watch` records in history.db, and for how long.
    pub history: vgpu_history::config::HistoryConfig,
    /// `[slurm]`: what a Slurm shard is worth (`spank_vgpu.so`, `vgpu slurm conf`).
    pub slurm: slurm::SlurmConfig,
}

/// `[cgroup]`: `manager = "auto"` (the default: the delegated subtree of the systemd unit
/// vgpu runs in when it has `Delegate=yes`, a transient scope from systemd when systemd is
/// PID 1, else each hierarchy's root), `"cgroupfs"`, `"delegated"` or `"systemd"` (see
/// `vgpu_cgroups::home`). `VGPU_CGROUP_MANAGER` overrides it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CgroupConfig {
    pub manager: vgpu_cgroups::home::Setting,
}

/// `[policy]`: what a user who runs vgpu through sudo may do. By default a workload runs as
/// themselves only, at priority 50 at most, without `--oversubscribe`, with no cap on GPU
/// memory (`max_mem`); root (without sudo,
/// or through its own sudo) may do anything. Grants only add: the most generous of the
/// top-level values, the user's table and their groups' tables applies (see `crate::policy`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Users (`"alice"`) and groups (`"%gpuadmin"`) who, through sudo, may use
    /// `vgpu run --user` to run a workload as another user (root included).
    pub run_as_others: Vec<String>,
    /// The highest `--priority` any user may ask for through sudo [default: 50, the default
    /// priority].
    pub max_priority: Option<i64>,
    /// Users and `%group`s who may use `--oversubscribe` (`vgpu run`, `partition create`)
    /// through sudo.
    pub oversubscribe: Vec<String>,
    /// The most GPU memory a sudo user's workload may reserve on each GPU (`--mem`'s
    /// syntax: `"8G"`, `"50%"` of the device) [default: no cap, the whole GPU].
    pub max_mem: Option<String>,
    /// `[policy.users.NAME]`: grants to one user.
    pub users: BTreeMap<String, PolicyGrant>,
    /// `[policy.groups.NAME]`: grants to every member of a group.
    pub groups: BTreeMap<String, PolicyGrant>,
}

/// `[policy.users.NAME]` or `[policy.groups.NAME]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyGrant {
    /// The highest `--priority` they may ask for.
    pub max_priority: Option<i64>,
    /// Whether they may use `--oversubscribe`.
    pub oversubscribe: bool,
    /// The most GPU memory per GPU they may reserve (`"40G"`, `"100%"`).
    pub max_mem: Option<String>,
}

impl PolicyConfig {
    /// Priorities are 0–100, names are not empty.
    pub fn validate(&self) -> Result<(), String> {
        let priorities = std::iter::once(("[policy] max_priority".to_string(), self.max_priority))
            .chain(self.users.iter().map(|(n, g)| (format!("[policy.users.{n}] max_priority"), g.max_priority)))
            .chain(self.groups.iter().map(|(n, g)| (format!("[policy.groups.{n}] max_priority"), g.max_priority)));
        for (key, value) in priorities {
            if let Some(p) = value.filter(|p| vgpu_pool::Priority::new(*p).is_err()) {
                return Err(format!("{key}: must be a priority from 0 to 100, got {p}"));
            }
        }
        let mems = std::iter::once(("[policy] max_mem".to_string(), &self.max_mem))
            .chain(self.users.iter().map(|(n, g)| (format!("[policy.users.{n}] max_mem"), &g.max_mem)))
            .chain(self.groups.iter().map(|(n, g)| (format!("[policy.groups.{n}] max_mem"), &g.max_mem)));
        for (key, value) in mems {
            if let Some(Err(e)) = value.as_deref().map(vgpu_store::admission::MemSpec::parse) {
                return Err(format!("{key}: {e} (a size such as \"8G\", or \"NN%\" of each GPU)"));
            }
        }
        for (key, list) in [("run_as_others", &self.run_as_others), ("oversubscribe", &self.oversubscribe)] {
            if let Some(bad) = list.iter().find(|e| e.trim_start_matches('%').trim().is_empty()) {
                return Err(format!("[policy] {key}: {bad:?} is not a user or %group name"));
            }
        }
        for (table, names) in [("users", &self.users), ("groups", &self.groups)] {
            if let Some(bad) = names.keys().find(|n| n.trim().is_empty()) {
                return Err(format!("[policy.{table}]: {bad:?} is not a name"));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config {path}")]
    Read { path: PathBuf, #[source] source: std::io::Error },
    #[error("invalid config {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

impl Config {
    /// Load `path`. `required` is true when the user named the file explicitly: then a
    /// missing file is an error instead of "use the defaults".
    pub fn load(path: &Path, required: bool) -> Result<Config, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                return Ok(Config::default());
            }
            Err(source) => return Err(ConfigError::Read { path: path.to_path_buf(), source }),
        };
        Config::parse(&text)
            .and_then(|config| config.validate().map(|()| config))
            .map_err(|message| ConfigError::Invalid { path: path.to_path_buf(), message })
    }

    /// Parse config text; the error is one line naming the key. Values each table checks only
    /// as a whole (a carbon source without its keys, a `gamma` out of range) are checked by
    /// [`Config::validate`].
    pub fn parse(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| one_line(text, &e))
    }

    /// Check every table, the same way for every command: [`Config::load`] calls it, so a
    /// value `vgpu carbon plan` would refuse (`gamma = nan`) is refused by `vgpu ps` and
    /// `vgpu run` too. The error is one line naming the table and key.
    pub fn validate(&self) -> Result<(), String> {
        self.carbon.validate().map_err(|e| e.to_string())?;
        self.pool.validate().map_err(|e| e.to_string())?;
        self.policy.validate()?;
        self.compute.validate()?;
        self.watch.validate()?;
        self.history.validate()?;
        self.slurm.validate()?;
        Ok(())
    }
}

/// toml's messages span several lines with a source excerpt; keep the gist on one line,
/// with the key (qualified by its table) and the line number.
pub(crate) fn one_line(text: &str, err: &toml::de::Error) -> String {
    let message = err.message().trim().replace('\n', " ");
    let Some(span) = err.span() else { return message };
    let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
    let key = key_at_line(text, line_no);
    match key {
        Some(key) if !message.contains(&format!("`{key}`")) && !message.contains(&key) => {
            format!("key `{key}`: {message} (line {line_no})")
        }
        _ => format!("{message} (line {line_no})"),
    }
}

/// `table.key` for a `key = value` on line `line_no` (1-based), following `[table]` headers.
fn key_at_line(text: &str, line_no: usize) -> Option<String> {
    let mut table = String::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            table = trimmed.trim_matches(|c| c == '[' || c == ']').trim().to_string();
        }
        if i + 1 == line_no {
            let (key, _) = trimmed.split_once('=')?;
            let key = key.trim().trim_matches('"');
            return Some(if table.is_empty() { key.to_string() } else { format!("{table}.{key}") });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_default() {
        let config = Config::parse("").unwrap();
        assert!(config.shim_path.is_none());
        assert!(!config.simulate);
    }

    #[test]
    fn cgroup_manager_is_checked() {
        use vgpu_cgroups::home::Setting;
        assert_eq!(Config::parse("[cgroup]\nmanager = \"delegated\"\n").unwrap().cgroup.manager, Setting::Delegated);
        assert_eq!(Config::parse("").unwrap().cgroup.manager, Setting::Auto);
        let err = Config::parse("[cgroup]\nmanager = \"docker\"\n").unwrap_err();
        assert!(err.contains("cgroup.manager") && err.contains("line 2"), "{err}");
        let err = Config::parse("[cgroup]\nmanagr = \"auto\"\n").unwrap_err();
        assert!(err.contains("managr"), "{err}");
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::parse("simulat = true\n").unwrap_err();
        assert!(err.contains("simulat"), "{err}");
        assert!(err.contains("line 1"), "{err}");
        assert!(!err.contains('\n'));
    }

    #[test]
    fn bad_value_names_its_key_with_its_table() {
        let err = Config::parse("simulate = \"yes\"\n").unwrap_err();
        assert!(err.starts_with("key `simulate`"), "{err}");
        assert!(err.contains("line 1"), "{err}");
        let err = Config::parse("# c\n[carbon]\nbudget_g_per_hour = \"lots\"\n").unwrap_err();
        assert!(err.contains("carbon.budget_g_per_hour") && err.contains("line 3"), "{err}");
    }

    #[test]
    fn compute_policy_is_checked_and_named() {
        use vgpu_store::compute::ComputePolicy;
        assert_eq!(Config::parse("").unwrap().compute.policy, ComputePolicy::Strict);
        assert_eq!(Config::parse("[compute]\npolicy = \"fair\"\n").unwrap().compute.policy, ComputePolicy::Fair);
        let err = Config::parse("[compute]\npolicy = \"bogus\"\n").unwrap_err();
        assert!(err.contains("compute.policy") && err.contains("bogus") && err.contains("line 2"), "{err}");
        let err = Config::parse("[compute]\npolcy = \"fair\"\n").unwrap_err();
        assert!(err.contains("polcy"), "{err}");
    }

    #[test]
    fn compute_turn_is_a_bounded_duration() {
        let checked = |text: &str| Config::parse(text).and_then(|c| c.validate().map(|()| c.compute.turn_us()));
        assert_eq!(checked(""), Ok(Ok(0)));
        assert_eq!(checked("[compute]\nturn = \"2ms\"\n"), Ok(Ok(2000)));
        let err = checked("[compute]\nturn = \"500us\"\n").unwrap_err();
        assert!(err.contains("[compute] turn") && err.contains("1ms") && err.contains("15ms"), "{err}");
        let err = checked("[compute]\nturn = \"1h\"\n").unwrap_err();
        assert!(err.contains("[compute] turn"), "{err}");
        let err = checked("[compute]\nturn = \"soon\"\n").unwrap_err();
        assert!(err.contains("[compute] turn") && err.contains("soon"), "{err}");
    }

    #[test]
    fn policy_lists_users_and_groups() {
        assert!(Config::parse("").unwrap().policy.run_as_others.is_empty());
        let config = Config::parse("[policy]\nrun_as_others = [\"alice\", \"%gpuadmin\"]\n").unwrap();
        assert_eq!(config.policy.run_as_others, ["alice", "%gpuadmin"]);
        let err = Config::parse("[policy]\nrun_as_other = []\n").unwrap_err();
        assert!(err.contains("run_as_other"), "{err}");
    }

    #[test]
    fn policy_grants_parse_and_are_checked() {
        let config = Config::parse(
            "[policy]\nmax_priority = 40\noversubscribe = [\"%gpuadmin\"]\nmax_mem = \"8G\"\n[policy.users.alice]\nmax_priority = 80\noversubscribe = true\nmax_mem = \"50%\"\n[policy.groups.ops]\nmax_priority = 100\n",
        )
        .unwrap();
        config.validate().unwrap();
        let policy = config.policy;
        assert_eq!(policy.max_priority, Some(40));
        assert_eq!(policy.oversubscribe, ["%gpuadmin"]);
        assert_eq!(policy.max_mem.as_deref(), Some("8G"));
        assert_eq!(policy.users["alice"], PolicyGrant { max_priority: Some(80), oversubscribe: true, max_mem: Some("50%".into()) });
        assert_eq!(policy.groups["ops"], PolicyGrant { max_priority: Some(100), oversubscribe: false, max_mem: None });
        for (text, needle) in [
            ("[policy]\nmax_priority = 101\n", "[policy] max_priority"),
            ("[policy.users.bob]\nmax_priority = -1\n", "[policy.users.bob] max_priority"),
            ("[policy]\noversubscribe = [\"%\"]\n", "oversubscribe"),
            ("[policy]\nmax_mem = \"lots\"\n", "[policy] max_mem"),
            ("[policy.groups.ops]\nmax_mem = \"150%\"\n", "[policy.groups.ops] max_mem"),
            ("[policy.users.bob]\nmax_mem = \"0\"\n", "[policy.users.bob] max_mem"),
        ] {
            let err = Config::parse(text).unwrap().validate().unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
        let err = Config::parse("[policy.users.bob]\nmax_prio = 1\n").unwrap_err();
        assert!(err.contains("max_prio"), "{err}");
    }

    #[test]
    fn load_validates_every_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        for (text, needle) in [("[carbon]\ngamma = nan\n", "[carbon] gamma"), ("[carbon]\nsource = \"static\"\n", "[carbon] value")] {
            std::fs::write(&path, text).unwrap();
            let err = Config::load(&path, true).unwrap_err().to_string();
            assert!(err.contains(needle) && err.contains("config.toml") && !err.contains('\n'), "{err}");
        }
        std::fs::write(&path, "[carbon]\ngamma = 2.5\n").unwrap();
        Config::load(&path, true).unwrap();
    }

    #[test]
    fn missing_optional_file_is_default_but_required_is_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.toml");
        assert!(Config::load(&path, false).is_ok());
        let err = Config::load(&path, true).unwrap_err().to_string();
        assert!(err.contains("nope.toml"), "{err}");
    }

    /// Moved from the history crate: the key is named by the root config's one-line errors.
    #[test]
    fn history_values_name_their_key() {
        let err = Config::parse("[history]\nkeep = \"forever\"\n").unwrap_err();
        assert!(err.contains("history.keep"), "{err}");
        let err = Config::parse("[history]\nkep = \"1d\"\n").unwrap_err();
        assert!(err.contains("kep"), "{err}");
        let err = Config::parse("[history]\nkeep = \"5m\"\n").unwrap().validate().unwrap_err();
        assert!(err.contains("[history] keep") && !err.contains('\n'), "{err}");
        let err = Config::parse("[history]\ninterval = \"2h\"\n").unwrap().validate().unwrap_err();
        assert!(err.contains("[history] interval"), "{err}");
    }
}

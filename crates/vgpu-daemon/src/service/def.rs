//! A service definition: `vgpu run`'s options and command, plus how many replicas to keep
//! and what to scale them by. One TOML file per service, `<lib>/services/NAME.toml`; its keys
//! are a workload file's (`vgpu_host::workload_file`: `vgpu run`'s long options without `--`,
//! and `command`) plus the service's own:
//!
//! ```toml
//! replicas = "1-4"             # MIN-MAX, or N for N-N
//! scale_on = ["cpu=70%"]       # cpu, mem or gpu = target utilization; none: a fixed count
//! window = "60s"               # scale-up acts after one window
//! cooldown = "120s"            # scale-down only after this long of consistently lower desire
//! grace = "10s"                # SIGTERM to SIGKILL when a replica is stopped
//! mem = "4G"
//! env = { PORT = "80{replica}" }
//! command = ["python", "serve.py", "--port", "80{replica}"]
//! ```
//!
//! `name` and `wait` are not keys of a service: replica `i` is named `NAME-i`, and a replica
//! that cannot be admitted is retried by the runner instead of waiting.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use vgpu_store::compute::ComputePolicy;
use vgpu_host::workload_file::Options;

/// The most replicas a service may have.
pub const MAX_REPLICAS: u32 = 64;
/// The longest service name: `NAME-63` must fit a workload name (64 bytes).
pub const MAX_NAME_LEN: usize = 60;
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(120);
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// What `{replica}` in the command and in `--env` values becomes: the replica's index.
pub const REPLICA_PLACEHOLDER: &str = "{replica}";

/// One service, as defined.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceDef {
    /// `[a-z0-9][a-z0-9_.-]*`, at most [`MAX_NAME_LEN`].
    pub name: String,
    pub min: u32,
    pub max: u32,
    /// `vgpu run`'s options, as a workload file gives them (`name`, `wait` and `command`
    /// unset: see [`ServiceDef::command`]).
    pub run: Options,
    pub command: Vec<String>,
    /// Empty: no autoscaling (the count is `service scale`'s, else MIN).
    pub scale_on: Vec<Target>,
    pub window: Duration,
    pub cooldown: Duration,
    pub grace: Duration,
}

/// A signal services scale on: each replica's utilization of what it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Signal {
    /// CPU time over the window ÷ (window × the CPUs it may use).
    Cpu,
    /// Host memory in use ÷ its `--memory` limit.
    Mem,
    /// The vGPU's measured compute share ÷ its compute share.
    Gpu,
}

impl Signal {
    pub const ALL: [Signal; 3] = [Signal::Cpu, Signal::Mem, Signal::Gpu];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Cpu => "cpu",
            Signal::Mem => "mem",
            Signal::Gpu => "gpu",
        }
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Signal {
    type Err = String;
    fn from_str(s: &str) -> Result<Signal, String> {
        Signal::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown signal {s:?}: cpu, mem or gpu"))
    }
}

/// `--scale-on cpu=70%`: keep the mean utilization of `signal` near `target` (0.70).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    pub signal: Signal,
    pub target: f64,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}%", self.signal, format_pct(self.target))
    }
}

/// 0.7 as "70", 0.125 as "12.5".
fn format_pct(ratio: f64) -> String {
    let pct = (ratio * 1000.0).round() / 10.0;
    if pct.fract() == 0.0 {
        format!("{pct:.0}")
    } else {
        format!("{pct}")
    }
}

impl std::str::FromStr for Target {
    type Err = String;
    /// `cpu=70%` (or `cpu=70`): a percentage from 1 to 100.
    fn from_str(s: &str) -> Result<Target, String> {
        let Some((signal, pct)) = s.split_once('=') else {
            return Err(format!("expected SIGNAL=PCT%, e.g. cpu=70%, got {s:?}"));
        };
        let signal: Signal = signal.trim().parse()?;
        let text = pct.trim().trim_end_matches('%');
        match text.parse::<f64>() {
            Ok(p) if (1.0..=100.0).contains(&p) => Ok(Target {
                signal,
                target: p / 100.0,
            }),
            _ => Err(format!(
                "{signal}: a target percentage from 1 to 100, got {pct:?}"
            )),
        }
    }
}

/// Whether `name` may name a service: `[a-z0-9][a-z0-9_.-]*`, at most [`MAX_NAME_LEN`]
/// bytes (so that its replicas' names `NAME-i` are valid workload names).
pub fn valid_name(name: &str) -> bool {
    name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-'))
}

/// `--replicas MIN-MAX` or `N` (N-N): 0 ≤ MIN ≤ MAX ≤ [`MAX_REPLICAS`], MAX ≥ 1.
pub fn parse_replicas(text: &str) -> Result<(u32, u32), String> {
    let num = |s: &str| s.trim().parse::<u32>().ok();
    let range = match text.split_once('-') {
        Some((a, b)) => num(a).zip(num(b)),
        None => num(text).map(|n| (n, n)),
    };
    match range {
        Some((min, max)) if min <= max && (1..=MAX_REPLICAS).contains(&max) => Ok((min, max)),
        _ => Err(format!("expected MIN-MAX or N with 0 <= MIN <= MAX <= {MAX_REPLICAS} and MAX >= 1, got {text:?}")),
    }
}

/// The longest `window`, `cooldown` and `grace`: a runner's stop waits for the longest
/// grace, and its deadlines are instants that must not overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// A duration such as `60s`, `2m`, `1m30s`; at least one second, at most [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text.trim()) {
        Ok(d) if d > MAX_DURATION => Err(format!(
            "at most {}, got {text:?}",
            humantime::format_duration(MAX_DURATION)
        )),
        Ok(d) if d >= Duration::from_secs(1) => Ok(d),
        Ok(_) => Err(format!("at least 1s, got {text:?}")),
        Err(e) => Err(format!("{text:?}: {e}")),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct DefError {
    pub message: String,
}

fn def_err(message: impl Into<String>) -> DefError {
    DefError {
        message: message.into(),
    }
}

/// The service's own keys in its file (the rest are a workload file's).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceKeys {
    replicas: vgpu_host::workload_file::Text,
    #[serde(default)]
    scale_on: Vec<String>,
    window: Option<String>,
    cooldown: Option<String>,
    grace: Option<String>,
}

const SERVICE_KEYS: [&str; 5] = ["replicas", "scale_on", "window", "cooldown", "grace"];

impl ServiceDef {
    /// The `vgpu run` options and command of replica `index`, without the service's own
    /// flags: what `vgpu run` validates (`commands::service` parses them as `vgpu run`'s).
    pub fn option_args(&self, index: u32) -> Vec<String> {
        self.args_with(&format!("{}-{index}", self.name), &|s: &str| {
            s.replace(REPLICA_PLACEHOLDER, &index.to_string())
        })
    }

    /// The options as the definition gives them (`{replica}` kept), for people to read:
    /// `--mem=4G --env=PORT=80{replica}` (no `--name`, no command).
    pub fn options_text(&self) -> Vec<String> {
        let args = self.args_with("", &|s: &str| s.to_string());
        args.into_iter()
            .take_while(|a| a != "--")
            .filter(|a| a != "--name=")
            .collect()
    }

    fn args_with(&self, name: &str, subst: &dyn Fn(&str) -> String) -> Vec<String> {
        let r = &self.run;
        let mut out: Vec<String> = Vec::new();
        let mut flag = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                out.push(format!("--{name}={v}"));
            }
        };
        for gpu in &r.gpu {
            flag("gpu", Some(gpu.clone()));
        }
        flag("gpus", r.gpus.clone());
        flag("mem", r.mem.clone());
        flag("compute", r.compute.map(|c| c.to_string()));
        flag("compute-policy", r.compute_policy.map(policy_name));
        flag("turn", r.turn.clone());
        flag("partition", r.partition.clone());
        flag("tflops", r.tflops.clone());
        flag("kind", r.kind.clone());
        flag("priority", r.priority.clone());
        flag(
            "freq-sensitivity",
            r.freq_sensitivity.map(|s| s.to_string()),
        );
        flag("cpus", r.cpus.map(|c| c.to_string()));
        flag("memory", r.memory.clone());
        flag("pids", r.pids.map(|p| p.to_string()));
        flag("name", Some(name.to_string()));
        flag("user", r.user.clone());
        for kv in &r.env {
            // In the value only: a variable's name is the same in every replica.
            let kv = match kv.split_once('=') {
                Some((k, v)) => format!("{k}={}", subst(v)),
                None => kv.clone(),
            };
            flag("env", Some(kv));
        }
        flag("cwd", r.cwd.as_ref().map(|c| c.display().to_string()));
        if r.oversubscribe {
            out.push("--oversubscribe".into());
        }
        out.push("--".into());
        out.extend(self.command.iter().map(|a| subst(a)));
        out
    }

    /// The `vgpu run` arguments (everything after `run`) of replica `index` (0-based): every
    /// option as a flag, `--name NAME-<index>`, `--service NAME --replica <index>`, `{replica}`
    /// replaced by the index in the command and the `--env` values, then `--` and the command.
    pub fn run_args(&self, index: u32) -> Vec<String> {
        let mut out = vec![
            "--service".to_string(),
            self.name.clone(),
            "--replica".to_string(),
            index.to_string(),
        ];
        out.extend(self.option_args(index));
        out
    }

    /// Checks what the run options cannot: the name, the replica range, the targets.
    pub fn check(&self) -> Result<(), DefError> {
        if !valid_name(&self.name) {
            return Err(def_err(format!(
                "service name {:?}: lowercase letters, digits, '_', '.', '-', starting with a letter or digit, at most {MAX_NAME_LEN}",
                self.name
            )));
        }
        if !(self.min <= self.max && (1..=MAX_REPLICAS).contains(&self.max)) {
            return Err(def_err(format!(
                "replicas {}-{}: 0 <= MIN <= MAX <= {MAX_REPLICAS} and MAX >= 1",
                self.min, self.max
            )));
        }
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err(def_err("no command: give it after --"));
        }
        let mut seen = Vec::new();
        for t in &self.scale_on {
            if seen.contains(&t.signal) {
                return Err(def_err(format!("scale_on: {} is given twice", t.signal)));
            }
            seen.push(t.signal);
            if !(t.target > 0.0 && t.target <= 1.0) {
                return Err(def_err(format!(
                    "scale_on: {}: a target from 1% to 100%",
                    t.signal
                )));
            }
        }
        if self.run.name.is_some() || self.run.wait.is_some() {
            return Err(def_err("a service has no `name` or `wait`: its replicas are NAME-<index>, retried until admitted"));
        }
        Ok(())
    }

    /// The file's text.
    pub fn to_toml(&self) -> String {
        let mut t = toml::Table::new();
        let s = |v: &str| toml::Value::String(v.to_string());
        t.insert("replicas".into(), s(&format!("{}-{}", self.min, self.max)));
        if !self.scale_on.is_empty() {
            t.insert(
                "scale_on".into(),
                toml::Value::Array(self.scale_on.iter().map(|x| s(&x.to_string())).collect()),
            );
        }
        t.insert(
            "window".into(),
            s(&humantime::format_duration(self.window).to_string()),
        );
        t.insert(
            "cooldown".into(),
            s(&humantime::format_duration(self.cooldown).to_string()),
        );
        t.insert(
            "grace".into(),
            s(&humantime::format_duration(self.grace).to_string()),
        );
        let r = &self.run;
        let mut opt = |k: &str, v: Option<toml::Value>| {
            if let Some(v) = v {
                t.insert(k.into(), v);
            }
        };
        opt(
            "gpu",
            (!r.gpu.is_empty()).then(|| toml::Value::Array(r.gpu.iter().map(|g| s(g)).collect())),
        );
        opt("gpus", r.gpus.as_deref().map(s));
        opt("mem", r.mem.as_deref().map(s));
        opt("compute", r.compute.map(|c| toml::Value::Integer(c.into())));
        opt(
            "compute_policy",
            r.compute_policy.map(|p| s(&policy_name(p))),
        );
        opt("turn", r.turn.as_deref().map(s));
        opt("partition", r.partition.as_deref().map(s));
        opt("tflops", r.tflops.as_deref().map(s));
        opt("kind", r.kind.as_deref().map(s));
        opt("priority", r.priority.as_deref().map(s));
        opt(
            "freq_sensitivity",
            r.freq_sensitivity.map(toml::Value::Float),
        );
        opt("cpus", r.cpus.map(toml::Value::Float));
        opt("memory", r.memory.as_deref().map(s));
        opt(
            "pids",
            r.pids
                .map(|p| toml::Value::Integer(i64::try_from(p).unwrap_or(i64::MAX))),
        );
        opt("user", r.user.as_deref().map(s));
        if !r.env.is_empty() {
            let env: toml::Table = r
                .env
                .iter()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), s(v)))
                .collect();
            opt("env", Some(toml::Value::Table(env)));
        }
        opt("cwd", r.cwd.as_ref().map(|c| s(&c.display().to_string())));
        opt(
            "oversubscribe",
            r.oversubscribe.then_some(toml::Value::Boolean(true)),
        );
        t.insert(
            "command".into(),
            toml::Value::Array(self.command.iter().map(|a| s(a)).collect()),
        );
        let body = toml::to_string(&t).unwrap_or_default();
        format!("# vgpu service {}: written by `vgpu service create/update`; see `vgpu service show {}`\n{body}", self.name, self.name)
    }

    /// Parses a service file's text; `name` is the file's (`NAME.toml`), `path` for messages.
    /// An unknown key or a bad value is an error naming the key.
    pub fn parse(name: &str, text: &str, path: &Path) -> Result<ServiceDef, DefError> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| def_err(one_line(&e.to_string())))?;
        for forbidden in ["name", "wait"] {
            if table.contains_key(forbidden) {
                return Err(def_err(format!(
                    "key `{forbidden}`: not a service's (its replicas are named NAME-<index>, and one not admitted is retried)"
                )));
            }
        }
        let mut own = toml::Table::new();
        for key in SERVICE_KEYS {
            if let Some(v) = table.remove(key) {
                own.insert(key.into(), v);
            }
        }
        let keys: ServiceKeys = own
            .try_into()
            .map_err(|e: toml::de::Error| def_err(one_line(&e.to_string())))?;
        let rest = toml::to_string(&table).map_err(|e| def_err(e.to_string()))?;
        let mut run = vgpu_host::workload_file::parse(&rest, path).map_err(|e| match e {
            vgpu_host::workload_file::WorkloadFileError::Invalid { message, .. } => def_err(message),
            other => def_err(other.to_string()),
        })?;
        let (min, max) = match keys.replicas {
            vgpu_host::workload_file::Text::Int(n) => u32::try_from(n)
                .map_err(|_| format!("{n}"))
                .and_then(|n| parse_replicas(&n.to_string())),
            vgpu_host::workload_file::Text::Str(s) => parse_replicas(&s),
            vgpu_host::workload_file::Text::Float(x) => Err(format!("{x}: not a whole number")),
        }
        .map_err(|e| def_err(format!("key `replicas`: {e}")))?;
        let scale_on = keys
            .scale_on
            .iter()
            .map(|s| s.parse::<Target>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| def_err(format!("key `scale_on`: {e}")))?;
        let duration = |key: &str, text: Option<String>, default: Duration| match text {
            None => Ok(default),
            Some(t) => parse_duration(&t).map_err(|e| def_err(format!("key `{key}`: {e}"))),
        };
        let command = std::mem::take(&mut run.command);
        run.path = path.to_path_buf();
        let def = ServiceDef {
            name: name.to_string(),
            min,
            max,
            run,
            command,
            scale_on,
            window: duration("window", keys.window, DEFAULT_WINDOW)?,
            cooldown: duration("cooldown", keys.cooldown, DEFAULT_COOLDOWN)?,
            grace: duration("grace", keys.grace, DEFAULT_GRACE)?,
        };
        def.check()?;
        Ok(def)
    }
}

fn policy_name(p: ComputePolicy) -> String {
    use clap::ValueEnum;
    p.to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_else(|| format!("{p:?}").to_lowercase())
}

/// toml's multi-line messages (with a caret under the column) on one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ServiceDef, String> {
        ServiceDef::parse("web", text, Path::new("/lib/services/web.toml"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn round_trips_through_its_file() {
        let def = parse(
            "replicas = \"1-4\"\nscale_on = [\"cpu=70%\", \"gpu=60\"]\nwindow = \"30s\"\nmem = \"4G\"\ncompute = 30\ngpu = [0, 1]\ncpus = 1.5\nenv = { PORT = \"80{replica}\" }\noversubscribe = true\ncommand = [\"serve\", \"--log\", \"/tmp/r{replica}.log\"]\n",
        )
        .unwrap();
        assert_eq!((def.min, def.max), (1, 4));
        assert_eq!(
            def.scale_on,
            vec![
                Target {
                    signal: Signal::Cpu,
                    target: 0.7
                },
                Target {
                    signal: Signal::Gpu,
                    target: 0.6
                }
            ]
        );
        assert_eq!(
            (def.window, def.cooldown, def.grace),
            (Duration::from_secs(30), DEFAULT_COOLDOWN, DEFAULT_GRACE)
        );
        let again =
            ServiceDef::parse("web", &def.to_toml(), Path::new("/lib/services/web.toml")).unwrap();
        assert_eq!(again, def);
    }

    #[test]
    fn run_args_substitute_the_replica_index() {
        let def = parse("replicas = 2\nmem = \"1G\"\nenv = { PORT = \"80{replica}\", \"X{replica}\" = \"{replica}{replica}\" }\ncommand = [\"serve\", \"--port\", \"80{replica}\"]\n").unwrap();
        assert_eq!(
            def.run_args(3),
            [
                "--service",
                "web",
                "--replica",
                "3",
                "--mem=1G",
                "--name=web-3",
                "--env=PORT=803",
                "--env=X{replica}=33",
                "--",
                "serve",
                "--port",
                "803"
            ]
        );
    }

    #[test]
    fn errors_name_the_key() {
        for (text, key) in [
            (
                "replicas = \"1-4\"\nmems = \"4G\"\ncommand = [\"x\"]\n",
                "mems",
            ),
            ("replicas = \"4-1\"\ncommand = [\"x\"]\n", "replicas"),
            ("replicas = \"1-65\"\ncommand = [\"x\"]\n", "replicas"),
            ("replicas = \"0-0\"\ncommand = [\"x\"]\n", "replicas"),
            (
                "replicas = 2\nscale_on = [\"disk=50%\"]\ncommand = [\"x\"]\n",
                "scale_on",
            ),
            (
                "replicas = 2\nscale_on = [\"cpu=0%\"]\ncommand = [\"x\"]\n",
                "scale_on",
            ),
            (
                "replicas = 2\nwindow = \"soon\"\ncommand = [\"x\"]\n",
                "window",
            ),
            (
                "replicas = 2\ncompute = 300\ncommand = [\"x\"]\n",
                "compute",
            ),
            ("replicas = 2\nname = \"x\"\ncommand = [\"x\"]\n", "name"),
            ("replicas = 2\n", "command"),
            ("command = [\"x\"]\n", "replicas"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(key), "{text:?}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn durations_are_one_second_to_one_day() {
        assert_eq!(parse_duration("24h"), Ok(MAX_DURATION));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        // Beyond an Instant's range: `vgpu watch`'s stop panicked adding it.
        for huge in ["25h", "500000000000years"] {
            let err = parse_duration(huge).unwrap_err();
            assert!(err.contains("at most 1day"), "{huge}: {err}");
        }
        assert!(parse("replicas = 2\ngrace = \"1000years\"\ncommand = [\"x\"]\n")
            .unwrap_err()
            .contains("grace"));
    }

    #[test]
    fn names_fit_their_replicas_workload_names() {
        assert!(
            valid_name("web") && valid_name("a.b-c_1") && valid_name(&"a".repeat(MAX_NAME_LEN))
        );
        for bad in [
            "",
            "Web",
            "-x",
            ".x",
            "a/b",
            "a b",
            &"a".repeat(MAX_NAME_LEN + 1),
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        let longest = format!("{}-{}", "a".repeat(MAX_NAME_LEN), MAX_REPLICAS - 1);
        assert!(vgpu_store::state::partition::valid_name(&longest));
    }
}

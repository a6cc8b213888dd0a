//! Workload files: `vgpu run --workload NAME` takes its options and command from
//! `/etc/vgpu/workloads/NAME.toml` (what the template unit `vgpu@NAME.service` runs). The
//! keys are `vgpu run`'s long options without `--`, and `command`:
//!
//! ```toml
//! mem = "4G"
//! compute = 30
//! env = { MODEL = "/srv/models/7b" }
//! command = ["python", "serve.py"]
//! ```
//!
//! An unknown key or a bad value is an error that names the key and the file, as in the
//! config file (`config.rs`).
//!
//! vgpu runs as root, possibly for a user who has sudo rights to `vgpu run` only, so [`load`]
//! reads only what that user could have given on the command line: a regular file (its
//! path opened with `O_PATH` and without following a final symlink, so a FIFO, a device or
//! a terminal is refused before it is opened), at most [`MAX_BYTES`]; through sudo opened
//! as the caller (`identity::as_user`: a file behind a directory closed to them is
//! "permission denied" whether or not it exists), and
//! - as root itself (no sudo, systemd's `vgpu@NAME`): owned by root and writable by root
//!   alone, since its `user` and `command` run as whoever it names;
//! - through sudo by a user other than root: owned by that user, or root's (writable by root
//!   alone, readable by all) in the workloads directory. Any other file (`/etc/shadow`) is
//!   refused before a byte of it is read, so an error that quotes a file's content (a key, a
//!   value) quotes only what the caller may read themselves.
//!
//! The values then go through the same checks, `[policy]`'s included, as the command line's.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use vgpu_store::compute::ComputePolicy;

/// Where workload files are: `/etc/vgpu/workloads`, or `VGPU_WORKLOADS_DIR` (tests, and
/// hosts that keep them elsewhere).
pub const DEFAULT_DIR: &str = "/etc/vgpu/workloads";
pub const ENV_DIR: &str = "VGPU_WORKLOADS_DIR";

/// The largest workload file vgpu reads (a workload file is a few lines).
pub const MAX_BYTES: u64 = 64 * 1024;

/// A string or an integer in TOML (`gpus = 2` or `gpus = "1-4"`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Text {
    Int(i64),
    Float(f64),
    Str(String),
}

impl Text {
    fn into_string(self) -> String {
        match self {
            Text::Int(n) => n.to_string(),
            Text::Float(x) => x.to_string(),
            Text::Str(s) => s,
        }
    }
}

/// `gpu = "0"` or `gpu = ["0", "1"]` (or integers).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(Text),
    Many(Vec<Text>),
}

/// One workload file, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    /// The program and its arguments.
    pub command: Vec<String>,
    pub gpu: Option<OneOrMany>,
    pub gpus: Option<Text>,
    pub mem: Option<Text>,
    pub compute: Option<u32>,
    pub compute_policy: Option<ComputePolicy>,
    pub turn: Option<Text>,
    pub partition: Option<String>,
    pub tflops: Option<Text>,
    pub kind: Option<String>,
    pub wait: Option<Text>,
    pub freq_sensitivity: Option<f64>,
    pub cpus: Option<f64>,
    pub memory: Option<Text>,
    pub pids: Option<u64>,
    pub name: Option<String>,
    pub user: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    pub priority: Option<Text>,
    #[serde(default)]
    pub oversubscribe: bool,
}

/// A workload file's values as `vgpu run`'s options take them (strings where the option is
/// one), for the command to merge with those given on the command line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Options {
    pub path: PathBuf,
    pub command: Vec<String>,
    pub gpu: Vec<String>,
    pub gpus: Option<String>,
    pub mem: Option<String>,
    pub compute: Option<u32>,
    pub compute_policy: Option<ComputePolicy>,
    /// The longest turn beside a higher priority (`--turn`), as written (`"2ms"`).
    pub turn: Option<String>,
    pub partition: Option<String>,
    pub tflops: Option<String>,
    pub kind: Option<String>,
    pub wait: Option<String>,
    pub freq_sensitivity: Option<f64>,
    pub cpus: Option<f64>,
    pub memory: Option<String>,
    pub pids: Option<u64>,
    pub name: Option<String>,
    pub user: Option<String>,
    pub env: Vec<String>,
    pub cwd: Option<PathBuf>,
    pub priority: Option<String>,
    pub oversubscribe: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadFileError {
    #[error(
        "workload {name:?}: give a plain name (letters, digits, '-', '_', '.'; `/etc/vgpu/workloads/NAME.toml`) or a path containing '/'"
    )]
    BadName { name: String },
    #[error("cannot read workload file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid workload file {}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error("refusing workload file {}: {reason}", path.display())]
    Refused { path: PathBuf, reason: String },
}

/// Who asks for the file: `None` for root itself, else the user who ran sudo.
pub type Caller<'a> = Option<&'a vgpu_store::state::UserSpec>;

/// The file `--workload` names: a path when it contains `/`, else `NAME.toml` in the
/// workloads directory `dir`, NAME a plain name (as systemd's `%i` is).
fn resolve_in(arg: &str, dir: &Path) -> Result<PathBuf, WorkloadFileError> {
    if arg.contains('/') {
        return Ok(PathBuf::from(arg));
    }
    let plain = !arg.is_empty()
        && arg.len() <= 128
        && arg.starts_with(|c: char| c.is_ascii_alphanumeric())
        && arg.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !plain {
        return Err(WorkloadFileError::BadName { name: arg.to_string() });
    }
    Ok(dir.join(format!("{arg}.toml")))
}

/// Reads and checks the workload file `--workload ARG` names, for `caller` (see the module
/// comment for what it may read).
pub fn load(arg: &str, caller: Caller) -> Result<Options, WorkloadFileError> {
    let dir = std::env::var_os(ENV_DIR).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
    let path = resolve_in(arg, &dir)?;
    let text = read_checked(&path, &dir, caller)?;
    let mut options = parse(&text, &path)?;
    if options.name.is_none() {
        options.name = default_name(&path);
    }
    Ok(options)
}

/// A workload file without `name` names its workload after itself: `vgpu@llm.service`'s
/// workload (`/etc/vgpu/workloads/llm.toml`) is `llm` in `vgpu ps`, as the admin knows it,
/// not `python3-<id>` after its command (the first run under a real systemd showed it as
/// `sleep-<id>`). `None` when the file's name is not a plain one (the command's then).
fn default_name(path: &Path) -> Option<String> {
    let stem = path.file_stem()?.to_str()?;
    let plain = !stem.is_empty()
        && stem.len() <= 128
        && stem.starts_with(|c: char| c.is_ascii_alphanumeric())
        && stem.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    plain.then(|| stem.to_string())
}

/// The file's text, read under the rules of the module comment.
fn read_checked(path: &Path, dir: &Path, caller: Caller) -> Result<String, WorkloadFileError> {
    let read_err = |source: std::io::Error| WorkloadFileError::Read { path: path.to_path_buf(), source };
    let refused = |reason: String| WorkloadFileError::Refused { path: path.to_path_buf(), reason };
    use vgpu_store::state::small_file;
    use vgpu_store::state::small_file::Links;
    use vgpu_store::state::small_file::SmallFileError;
    let small_file_err = |e: SmallFileError| match e {
        SmallFileError::Io(e) => read_err(e),
        SmallFileError::Link => refused("it is a symbolic link: give the file itself".into()),
        SmallFileError::NotRegular => refused("not a regular file".into()),
        SmallFileError::TooLarge(_) => refused(format!("larger than {MAX_BYTES} bytes")),
    };
    // Through sudo, opened as the caller: a path behind a directory closed to them is
    // "permission denied" whether or not it exists, as it would be for them.
    let opened = match caller {
        None => small_file::open(path, Links::NotLast, MAX_BYTES),
        Some(user) => vgpu_store::identity::as_user(user, || small_file::open(path, Links::NotLast, MAX_BYTES)).unwrap_or_else(|e| Err(SmallFileError::Io(e))),
    };
    let (file, meta) = opened.map_err(small_file_err)?;
    let (owner, mode) = (meta.uid(), meta.mode());
    let root_only_writable = owner == 0 && mode & 0o022 == 0;
    match caller {
        None if root_only_writable => {}
        None => {
            return Err(refused(format!("owned by uid {owner} with mode {:o}: run as root, a workload file must be root's and writable by root alone", mode & 0o7777)));
        }
        Some(user) if owner == user.uid => {}
        // Readable by all: nothing an error quotes is hidden from the caller.
        Some(_) if root_only_writable && mode & 0o004 != 0 && in_dir(&file, dir) => {}
        Some(user) => {
            return Err(refused(format!("through sudo, a workload file must be yours (uid {}), or root's, readable by all, in {}", user.uid, dir.display())));
        }
    }
    let bytes = small_file::read(file, MAX_BYTES).map_err(small_file_err)?;
    String::from_utf8(bytes).map_err(|e| read_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// Whether the open `file` is in `dir` (resolved): where the kernel says the file it opened
/// is (`/proc/self/fd/N`), not where its path, which may be changed meanwhile, led.
fn in_dir(file: &std::fs::File, dir: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let opened = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()));
    match (opened, dir.canonicalize()) {
        (Ok(opened), Ok(dir)) => opened.parent() == Some(dir.as_path()),
        _ => false,
    }
}

/// Parses workload file text (`path` for messages).
pub fn parse(text: &str, path: &Path) -> Result<Options, WorkloadFileError> {
    let invalid = |message: String| WorkloadFileError::Invalid { path: path.to_path_buf(), message };
    let file: WorkloadFile = toml::from_str(text).map_err(|e| invalid(crate::config::one_line(text, &e)))?;
    let options = file.into_options(path);
    options.check().map_err(invalid)?;
    Ok(options)
}

impl WorkloadFile {
    fn into_options(self, path: &Path) -> Options {
        let text = |t: Option<Text>| t.map(Text::into_string);
        Options {
            path: path.to_path_buf(),
            command: self.command,
            gpu: match self.gpu {
                None => Vec::new(),
                Some(OneOrMany::One(one)) => vec![one.into_string()],
                Some(OneOrMany::Many(many)) => many.into_iter().map(Text::into_string).collect(),
            },
            gpus: text(self.gpus),
            mem: text(self.mem),
            compute: self.compute,
            compute_policy: self.compute_policy,
            turn: text(self.turn),
            partition: self.partition,
            tflops: text(self.tflops),
            kind: self.kind,
            wait: text(self.wait),
            freq_sensitivity: self.freq_sensitivity,
            cpus: self.cpus,
            memory: text(self.memory),
            pids: self.pids,
            name: self.name,
            user: self.user,
            env: self.env.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
            cwd: self.cwd,
            priority: text(self.priority),
            oversubscribe: self.oversubscribe,
        }
    }
}

/// The option pairs `vgpu run` refuses together (clap's `conflicts_with` on `RunArgs`), and
/// those that need another, by key: checked again on a file and on the merged options,
/// which clap never saw.
const CONFLICTS: [(&str, &[&str]); 3] = [
    ("partition", &["gpu", "gpus", "mem", "compute", "compute_policy", "turn", "oversubscribe", "tflops"]),
    ("tflops", &["gpu", "compute", "gpus"]),
    ("gpus", &["gpu"]),
];
const REQUIRES: [(&str, &str); 2] = [("kind", "tflops"), ("wait", "tflops")];

/// Refuses options given together that `vgpu run` refuses together; `given(key)` says
/// whether one is given, `name(key)` how to name it in the message (`key `mem`` or `--mem`).
pub fn check_combination(given: &dyn Fn(&str) -> bool, name: &dyn Fn(&str) -> String) -> Result<(), String> {
    for (key, others) in CONFLICTS {
        if let Some(other) = others.iter().find(|o| given(key) && given(o)) {
            return Err(format!("{} cannot be used with {}", name(key), name(other)));
        }
    }
    for (key, needed) in REQUIRES {
        if given(key) && !given(needed) {
            return Err(format!("{} needs {}", name(key), name(needed)));
        }
    }
    Ok(())
}

impl Options {
    /// Whether the file gives `key`.
    fn gives(&self, key: &str) -> bool {
        match key {
            "gpu" => !self.gpu.is_empty(),
            "gpus" => self.gpus.is_some(),
            "mem" => self.mem.is_some(),
            "compute" => self.compute.is_some(),
            "compute_policy" => self.compute_policy.is_some(),
            "turn" => self.turn.is_some(),
            "partition" => self.partition.is_some(),
            "tflops" => self.tflops.is_some(),
            "kind" => self.kind.is_some(),
            "wait" => self.wait.is_some(),
            "oversubscribe" => self.oversubscribe,
            _ => false,
        }
    }

    /// The values `vgpu run` would refuse whatever the command line adds, named by their key
    /// (the rest are checked with the command line's, naming the option).
    fn check(&self) -> Result<(), String> {
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err("key `command`: give the program and its arguments, e.g. command = [\"python\", \"serve.py\"]".into());
        }
        if let Some(mem) = &self.mem {
            vgpu_store::admission::MemSpec::parse(mem).map_err(|e| format!("key `mem`: {e}"))?;
        }
        if let Some(memory) = &self.memory {
            vgpu_abi::size::parse_size(memory).map_err(|e| format!("key `memory`: {e}"))?;
        }
        if let Some(turn) = &self.turn {
            vgpu_store::compute::parse_turn(turn).map_err(|e| format!("key `turn`: {e}"))?;
        }
        if let Some(pct) = self.compute.filter(|p| !(1..=100).contains(p)) {
            return Err(format!("key `compute`: a percentage from 1 to 100, got {pct}"));
        }
        if let Some(s) = self.freq_sensitivity.filter(|s| !(0.0..=1.0).contains(s)) {
            return Err(format!("key `freq_sensitivity`: between 0 and 1, got {s}"));
        }
        if let Some(cpus) = self.cpus.filter(|c| !(*c > 0.0 && c.is_finite())) {
            return Err(format!("key `cpus`: a positive number, got {cpus}"));
        }
        if self.pids == Some(0) {
            return Err("key `pids`: at least 1".into());
        }
        if let Some(bad) = self.env.iter().find(|kv| kv.starts_with('=')) {
            return Err(format!("key `env`: {bad:?} has no variable name"));
        }
        check_combination(&|key| self.gives(key), &|key| format!("key `{key}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(text: &str) -> Options {
        parse(text, Path::new("w.toml")).unwrap()
    }

    fn parse_err(text: &str) -> String {
        parse(text, Path::new("w.toml")).unwrap_err().to_string()
    }

    #[test]
    fn keys_are_the_run_options() {
        let o = parse_ok(
            "mem = \"4G\"\ncompute = 30\ngpu = [0, \"GPU-x\"]\ncpus = 1.5\nenv = { A = \"1\" }\noversubscribe = true\ncommand = [\"python\", \"serve.py\"]\n",
        );
        assert_eq!(o.mem.as_deref(), Some("4G"));
        assert_eq!(o.compute, Some(30));
        assert_eq!(o.gpu, vec!["0", "GPU-x"]);
        assert_eq!(parse_ok("gpus = 2\ncommand = [\"x\"]\n").gpus.as_deref(), Some("2"));
        assert_eq!(o.env, vec!["A=1"]);
        assert!(o.oversubscribe);
        assert_eq!(o.command, vec!["python", "serve.py"]);
        assert_eq!(parse_ok("gpu = 1\ncommand = [\"x\"]\n").gpu, vec!["1"]);
        assert_eq!(parse_ok("turn = \"2ms\"\ncommand = [\"x\"]\n").turn.as_deref(), Some("2ms"));
    }

    #[test]
    fn errors_name_the_key_and_the_file() {
        for (text, key) in [
            ("mems = \"4G\"\ncommand = [\"x\"]\n", "mems"),
            ("mem = \"4X\"\ncommand = [\"x\"]\n", "mem"),
            ("compute = 300\ncommand = [\"x\"]\n", "compute"),
            ("compute = \"lots\"\ncommand = [\"x\"]\n", "compute"),
            ("freq_sensitivity = 2.0\ncommand = [\"x\"]\n", "freq_sensitivity"),
            ("mem = \"4G\"\n", "command"),
            ("command = []\n", "command"),
            ("compute_policy = \"nice\"\ncommand = [\"x\"]\n", "compute_policy"),
            ("turn = \"500us\"\ncommand = [\"x\"]\n", "key `turn`"),
            ("partition = \"p\"\nturn = \"2ms\"\ncommand = [\"x\"]\n", "key `partition` cannot be used with key `turn`"),
            ("partition = \"p\"\nmem = \"1G\"\ncommand = [\"x\"]\n", "key `partition` cannot be used with key `mem`"),
            ("kind = \"npu\"\ncommand = [\"x\"]\n", "key `kind` needs key `tflops`"),
        ] {
            let err = parse_err(text);
            assert!(err.contains(key) && err.contains("w.toml"), "{text:?}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    /// A file in `dir` with `text`, owner `uid` and `mode`.
    fn file_in(dir: &Path, name: &str, text: &str, uid: u32, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(&path, Some(uid), None).unwrap();
        path
    }

    #[test]
    fn only_files_the_caller_could_give_are_read() {
        assert!(nix::unistd::geteuid().is_root(), "this test must run as root (CI does): it gives files owners");
        let workloads = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let (dir, other) = (workloads.path(), elsewhere.path());
        use std::os::unix::fs::PermissionsExt;
        for d in [dir, other] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let text = "command = [\"x\"]\n";
        let user = |uid: u32| vgpu_store::state::UserSpec { name: format!("u{uid}"), uid, gid: uid, groups: vec![uid], home: "/".into() };
        let (alice, bob) = (user(60_001), user(60_002));
        let (alice, bob) = (Some(&alice), Some(&bob));
        let ok = |path: &Path, caller: Caller| read_checked(path, dir, caller).map(|t| t == text).unwrap_or(false);
        let refused = |path: &Path, caller: Caller| matches!(read_checked(path, dir, caller), Err(WorkloadFileError::Refused { .. }));
        let unreadable = |path: &Path, caller: Caller| match read_checked(path, dir, caller) {
            Err(WorkloadFileError::Read { source, .. }) => source.kind() == std::io::ErrorKind::PermissionDenied,
            _ => false,
        };

        // Root's, writable by root alone, in the workloads directory: anyone's to run.
        let admin = file_in(dir, "admin.toml", text, 0, 0o644);
        assert!(ok(&admin, None) && ok(&admin, alice));
        // ... not if the caller could not read it, nor from another directory.
        let secret = file_in(dir, "secret.toml", text, 0, 0o600);
        assert!(ok(&secret, None) && unreadable(&secret, alice));
        let outside = file_in(other, "shadow", text, 0, 0o644);
        assert!(ok(&outside, None) && refused(&outside, alice));
        // Writable by others: nobody's to trust.
        let loose = file_in(dir, "loose.toml", text, 0, 0o664);
        assert!(refused(&loose, None) && refused(&loose, alice));
        // A user's own file, anywhere: theirs through sudo, never root's.
        let mine = file_in(other, "mine.toml", text, 60_001, 0o666);
        assert!(ok(&mine, alice) && refused(&mine, bob) && refused(&mine, None));
        // Not through a symlink, not a FIFO (refused at once, not waited on), not too big.
        let link = dir.join("link.toml");
        std::os::unix::fs::symlink(&admin, &link).unwrap();
        assert!(refused(&link, None) && refused(&link, alice));
        let fifo = dir.join("fifo.toml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        assert!(refused(&fifo, None));
        let big = file_in(dir, "big.toml", &format!("{text}#{}\n", "x".repeat(MAX_BYTES as usize)), 0, 0o644);
        assert!(refused(&big, None));
        assert!(matches!(read_checked(&dir.join("none.toml"), dir, None), Err(WorkloadFileError::Read { .. })));
        // Behind a directory closed to the caller: opened as them, an existing file and a
        // missing one are both "permission denied" (as root, they differ).
        let closed = other.join("closed");
        std::fs::create_dir(&closed).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let hidden = file_in(&closed, "mine.toml", text, 60_001, 0o644);
        let message = |path: &Path| {
            let e = read_checked(path, dir, alice).unwrap_err();
            let cause = std::error::Error::source(&e).map(|c| c.to_string()).unwrap_or_default();
            format!("{e}: {cause}").replace(&path.display().to_string(), "PATH")
        };
        assert!(unreadable(&hidden, alice) && unreadable(&closed.join("none.toml"), alice));
        assert_eq!(message(&hidden), message(&closed.join("none.toml")));
    }

    #[test]
    fn a_file_without_a_name_names_its_workload() {
        assert_eq!(default_name(Path::new("/etc/vgpu/workloads/llm.toml")).as_deref(), Some("llm"));
        assert_eq!(default_name(Path::new("./jobs/train-7b.v2.toml")).as_deref(), Some("train-7b.v2"));
        assert_eq!(default_name(Path::new("/tmp/a b.toml")), None);
        assert_eq!(default_name(Path::new("/tmp/.toml")), None);
    }

    #[test]
    fn names_are_plain_or_paths() {
        let dir = Path::new(DEFAULT_DIR);
        assert_eq!(resolve_in("gpt", dir).unwrap(), Path::new("/etc/vgpu/workloads/gpt.toml"));
        assert_eq!(resolve_in("./x.toml", dir).unwrap(), Path::new("./x.toml"));
        for bad in ["", "..", ".x", "a b", "-x", "a\\b"] {
            assert!(matches!(resolve_in(bad, dir), Err(WorkloadFileError::BadName { .. })), "{bad:?}");
        }
    }
}

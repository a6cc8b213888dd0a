//! vgpu installed in a [`Container`] as an admin installs it: `install.sh --no-build` from
//! this checkout (bound read-only at its own path) with what `cargo build --workspace`
//! built (bound read-only too), into a prefix the container can write (`/opt/vgpu`; its
//! `/usr` is the host's, read-only), the units where systemd loads them
//! (`/etc/systemd/system`) and the config in `/etc/vgpu`. vgpu uses its simulated driver
//! (`simulate = true` in the config: one H100).

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use crate::systemd::container::{Container, Tree};

pub const PREFIX: &str = "/opt/vgpu";
pub const VGPU: &str = "/opt/vgpu/bin/vgpu";
pub const CONFIG: &str = "/etc/vgpu/config.toml";

/// The checkout (install.sh, systemd/, man/, examples/).
pub fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the checkout's path")
}

/// Where `cargo build --workspace` put vgpu, libvgpu.so and libfakegpu.so (and the test
/// programs, under examples/).
pub fn artefacts() -> PathBuf {
    let dir = crate::common::artefact_dir();
    for file in ["vgpu", "libvgpu.so", "libfakegpu.so"] {
        crate::common::artefact(file);
    }
    dir.canonicalize().expect("the build directory's path")
}

/// A booted container with vgpu installed in it.
pub struct Installed {
    pub ct: Container,
    /// What install.sh printed.
    pub install_output: String,
}

impl Installed {
    /// Boots a container of `tree`, installs vgpu with `install.sh --no-watch` (the tests
    /// start what they test) and writes a config with `simulate = true` and `extra`.
    pub fn new(tree: Tree, extra_config: &str) -> Installed {
        let installed = Installed::with_install_args(tree, &["--no-watch"]);
        installed.config(extra_config);
        installed
    }

    /// Boots a container and runs install.sh with `args` (after `--no-build --prefix
    /// /opt/vgpu --systemd-dir /etc/systemd/system --etc-dir /etc/vgpu`), which must succeed.
    pub fn with_install_args(tree: Tree, args: &[&str]) -> Installed {
        let checkout = checkout();
        let artefacts = artefacts();
        let mut binds = vec![checkout.clone()];
        if !artefacts.starts_with(&checkout) {
            binds.push(artefacts.clone());
        }
        let ct = Container::boot(tree, &binds).unwrap_or_else(|e| panic!("the {} container did not boot: {e}", tree.name()));
        let script = format!(
            "VGPU_INSTALL_FROM={} {}/install.sh --no-build --prefix {PREFIX} --systemd-dir /etc/systemd/system --etc-dir /etc/vgpu {}",
            artefacts.display(),
            checkout.display(),
            args.join(" ")
        );
        let out = ct.shell(&script);
        let install_output = text(&out);
        assert!(out.status.success(), "install.sh in the container: {}\n{install_output}", out.status);
        Installed { ct, install_output }
    }

    /// `/etc/vgpu/config.toml`: the simulated driver and `extra`.
    pub fn config(&self, extra: &str) {
        self.write(CONFIG, &format!("simulate = true\n{extra}"));
    }

    /// Writes a root-owned 0644 file inside the container (its directories made).
    pub fn write(&self, inside: &str, text: &str) {
        let path = self.ct.path(inside);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        }
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {inside}: {e}"));
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap_or_else(|e| panic!("chmod {inside}: {e}"));
    }

    /// A file inside the container, if it is there.
    pub fn read(&self, inside: &str) -> Option<String> {
        std::fs::read_to_string(self.ct.path(inside)).ok()
    }

    pub fn exists(&self, inside: &str) -> bool {
        self.ct.path(inside).symlink_metadata().is_ok()
    }

    /// `systemctl ARGS…` in the container, which must succeed; its stdout.
    pub fn systemctl(&self, args: &[&str]) -> String {
        let mut all = vec!["systemctl"];
        all.extend_from_slice(args);
        self.ct.output(&all).unwrap_or_else(|e| panic!("{e}\n--- journal\n{}", self.journal_all()))
    }

    /// `systemctl ARGS…`, whatever it exits with.
    pub fn systemctl_output(&self, args: &[&str]) -> Output {
        let mut all = vec!["systemctl"];
        all.extend_from_slice(args);
        self.ct.nsenter(&all).output().expect("nsenter systemctl")
    }

    /// A unit's property (`systemctl show -P`).
    pub fn show(&self, unit: &str, property: &str) -> String {
        self.systemctl(&["show", "-P", property, unit]).trim().to_string()
    }

    /// `systemctl status UNIT` (whatever it exits with: 3 for an inactive unit).
    pub fn status(&self, unit: &str) -> String {
        text(&self.systemctl_output(&["status", "--no-pager", "--full", "--lines=50", unit]))
    }

    /// The journal of `unit` (this boot).
    pub fn journal(&self, unit: &str) -> String {
        self.ct.output(&["journalctl", "--no-pager", "-o", "cat", "-u", unit]).unwrap_or_default()
    }

    pub fn journal_all(&self) -> String {
        self.ct.output(&["journalctl", "--no-pager", "-n", "200"]).unwrap_or_default()
    }

    /// `vgpu ARGS…` run from a shell in the container (a transient service, as root).
    pub fn vgpu(&self, args: &[&str]) -> Output {
        let quoted: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
        self.ct.shell(&format!("exec {VGPU} {}", quoted.join(" ")))
    }

    /// `vgpu ps --json`'s rows.
    pub fn ps(&self) -> Vec<serde_json::Value> {
        let out = self.vgpu(&["ps", "--json"]);
        assert!(out.status.success(), "vgpu ps --json: {}", text(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("vgpu ps --json: {e}: {}", text(&out)));
        json["workloads"].as_array().cloned().unwrap_or_default()
    }

    /// The workload records under `/run/vgpu/workloads`.
    pub fn records(&self) -> Vec<serde_json::Value> {
        let Ok(entries) = std::fs::read_dir(self.ct.path("/run/vgpu/workloads")) else { return Vec::new() };
        entries.flatten().filter_map(|e| std::fs::read(e.path()).ok()).filter_map(|b| serde_json::from_slice(&b).ok()).collect()
    }

    /// The vGPU directories under `/run/vgpu/vgpus`.
    pub fn vgpu_dirs(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.ct.path("/run/vgpu/vgpus")) else { return Vec::new() };
        entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()
    }

    /// Polls `f` every 20 ms for up to 30 s; fails naming `what` (with the journal).
    pub fn wait_for(&self, what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if f() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("timed out waiting for {what}\n--- journal\n{}", self.journal_all());
    }
}

/// stdout and stderr of `out`, for messages.
pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `arg` quoted for bash.
pub fn shell_quote(arg: &str) -> String {
    if !arg.is_empty() && arg.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c)) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

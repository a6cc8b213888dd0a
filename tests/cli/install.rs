//! install.sh, run for real: into a temporary prefix, from the artefacts `cargo build
//! --workspace` left in target/debug (`--no-build` with VGPU_INSTALL_FROM), with every path
//! outside the prefix moved under a temporary root (VGPU_INSTALL_ROOT), so that "touches
//! nothing outside PREFIX" and "uninstall removes exactly what it installed" are checked on
//! the file system.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{artefact, artefact_dir, Sim};
use tempfile::TempDir;

fn script() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("install.sh")
}

/// install.sh with a clean environment for its options, taking the built files from
/// target/debug and putting `root` in front of every system path.
fn install_sh(root: &Path, args: &[&str]) -> Output {
    artefact("libvgpu.so");
    artefact("libfakegpu.so");
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .env("VGPU_INSTALL_ROOT", root)
        .env("VGPU_INSTALL_FROM", artefact_dir())
        .env_remove("SYSTEMD_DIR")
        .env_remove("VGPU_ETC_DIR")
        .env_remove("VGPU_STATE_DIR")
        .env_remove("VGPU_NO_WATCH")
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run install.sh");
    assert!(
        out.status.success(),
        "install.sh {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Every path under `dir`, relative, with its kind (d, f, l), sorted.
fn tree(dir: &Path) -> BTreeSet<String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).expect("read_dir") {
            let entry = entry.expect("dir entry");
            let path = entry.path();
            let rel = path.strip_prefix(base).expect("under base").display().to_string();
            let kind = entry.file_type().expect("file type");
            if kind.is_dir() {
                out.insert(format!("d {rel}"));
                walk(base, &path, out);
            } else if kind.is_symlink() {
                out.insert(format!("l {rel}"));
            } else {
                out.insert(format!("f {rel}"));
            }
        }
    }
    let mut out = BTreeSet::new();
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out
}

struct Scratch {
    dir: TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::Builder::new().prefix("vgpu-install-").tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("root")).expect("mkdir root");
        Scratch { dir }
    }
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn text(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
    }
}

#[test]
fn help_is_the_usage_text_only() {
    let out = Command::new("bash").arg(script()).arg("--help").output().expect("run install.sh --help");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("--prefix DIR") && text.contains("--uninstall"), "{text}");
    assert!(!text.contains("set -euo") && !text.contains("#!"), "code in --help:\n{text}");
}

#[test]
fn prefix_install_stays_inside_the_prefix_and_uninstall_restores_it() {
    let s = Scratch::new();
    let prefix = s.path("opt");
    // The prefix already holds something of someone else's, in directories install.sh uses.
    std::fs::create_dir_all(prefix.join("share/man/man1")).expect("mkdir");
    std::fs::write(prefix.join("share/man/man1/other.1"), ".TH other 1\n").expect("write");
    std::fs::create_dir_all(prefix.join("bin")).expect("mkdir");
    let before = tree(&prefix);

    install_sh(&s.root(), &["--no-build", "--prefix", prefix.to_str().expect("utf-8")]);
    assert_eq!(tree(&s.root()), BTreeSet::new(), "a --prefix install wrote outside the prefix");
    for rel in [
        "opt/bin/vgpu",
        "opt/lib/vgpu/libvgpu.so",
        "opt/lib/vgpu/libfakegpu.so",
        "opt/lib/vgpu/install-manifest.txt",
        "opt/share/man/man1/vgpu.1",
        "opt/share/bash-completion/completions/vgpu",
        "opt/share/zsh/site-functions/_vgpu",
        "opt/share/fish/vendor_completions.d/vgpu.fish",
        "opt/etc/vgpu/config.toml",
    ] {
        assert!(s.path(rel).is_file(), "{rel} not installed");
    }
    let watch = s.text("opt/lib/systemd/system/vgpu-watch.service");
    assert!(
        watch.contains(&format!("ExecStart={}/bin/vgpu watch", prefix.display())),
        "the unit does not run the prefix's binary:\n{watch}"
    );
    let manifest = s.text("opt/lib/vgpu/install-manifest.txt");
    assert!(
        manifest.lines().any(|l| l.starts_with("unit\t") && l.ends_with("/lib/systemd/system/vgpu-watch.service")),
        "{manifest}"
    );
    assert!(manifest.contains(&format!("found\t-\t{}/bin\n", prefix.display())), "{manifest}");

    // The installed binary, run with --simulate, links the simulated driver from the state
    // directory into the prefix; uninstall takes those links away with the library.
    let sim = Sim::new(&[("NVIDIA A100-SXM4-40GB", "40GiB")]);
    let state = s.root().join("run/vgpu");
    let out = Command::new(prefix.join("bin/vgpu"))
        .args(["--simulate", "devices"])
        .envs(sim.env())
        .env("VGPU_STATE_DIR", &state)
        .output()
        .expect("run the installed vgpu");
    assert!(out.status.success(), "installed vgpu: {}", String::from_utf8_lossy(&out.stderr));
    let link = std::fs::read_link(state.join("simulate/libcuda.so.1")).expect("simulate link");
    assert!(link.starts_with(&prefix), "{}", link.display());

    let out = install_sh(&s.root(), &["--uninstall", "--prefix", prefix.to_str().expect("utf-8")]);
    assert_eq!(tree(&prefix), before, "uninstall did not leave the prefix as it was");
    assert!(!state.join("simulate").exists(), "dangling simulate links left");
    assert!(String::from_utf8_lossy(&out.stdout).contains("vgpu uninstalled"));
}

#[test]
fn uninstall_removes_only_the_units_it_installed() {
    let s = Scratch::new();
    let units = s.root().join("etc/systemd/system");
    std::fs::create_dir_all(&units).expect("mkdir");
    std::fs::write(units.join("vgpu-local.service"), "[Service]\nExecStart=/bin/true\n").expect("write");
    let (a, b, c) = (s.path("a"), s.path("b"), s.path("c"));
    let arg = |p: &Path| p.to_str().expect("utf-8").to_string();
    let units_arg = arg(&units);

    // A installs the units into the shared directory; B, with --prefix only, must neither
    // rewrite them nor, uninstalled, remove them.
    install_sh(&s.root(), &["--no-build", "--prefix", &arg(&a), "--systemd-dir", &units_arg]);
    let a_units = tree(&units);
    let watch_a = std::fs::read_to_string(units.join("vgpu-watch.service")).expect("unit");
    assert!(watch_a.contains(&format!("ExecStart={}/bin/vgpu watch", a.display())));
    install_sh(&s.root(), &["--no-build", "--prefix", &arg(&b)]);
    assert_eq!(std::fs::read_to_string(units.join("vgpu-watch.service")).expect("unit"), watch_a);
    install_sh(&s.root(), &["--uninstall", "--prefix", &arg(&b)]);
    assert_eq!(tree(&units), a_units, "uninstalling B touched A's units");
    assert!(!b.exists(), "B's prefix left behind");

    // C installs over A's units: uninstalling A then keeps them (they are C's now).
    install_sh(&s.root(), &["--no-build", "--prefix", &arg(&c), "--systemd-dir", &units_arg]);
    let out = install_sh(&s.root(), &["--uninstall", "--prefix", &arg(&a)]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("kept"), "no word of the units kept");
    let watch_c = std::fs::read_to_string(units.join("vgpu-watch.service")).expect("C's unit");
    assert!(watch_c.contains(&format!("ExecStart={}/bin/vgpu watch", c.display())));
    install_sh(&s.root(), &["--uninstall", "--prefix", &arg(&c)]);
    let left: BTreeSet<String> = tree(&units);
    assert_eq!(left, BTreeSet::from(["f vgpu-local.service".to_string()]), "a unit it did not install was removed");
    assert!(!a.exists() && !c.exists());
}

#[test]
fn an_edited_config_survives_uninstall() {
    let s = Scratch::new();
    let prefix = s.path("opt");
    let p = prefix.to_str().expect("utf-8");
    install_sh(&s.root(), &["--no-build", "--prefix", p]);
    std::fs::write(prefix.join("etc/vgpu/config.toml"), "simulate = true\n").expect("edit config");
    // Installing again keeps the edit and puts the new default beside it.
    install_sh(&s.root(), &["--no-build", "--prefix", p]);
    assert_eq!(s.text("opt/etc/vgpu/config.toml"), "simulate = true\n");
    assert!(prefix.join("etc/vgpu/config.toml.default").is_file());
    let out = install_sh(&s.root(), &["--uninstall", "--prefix", p]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("kept"));
    assert_eq!(
        tree(&prefix),
        BTreeSet::from(["d etc".to_string(), "d etc/vgpu".to_string(), "f etc/vgpu/config.toml".to_string()])
    );
}

#[test]
fn sudo_without_cargo_says_what_to_run() {
    // root's PATH under sudo, without cargo even where the system has one: one directory
    // of links to every program of /usr/sbin, /usr/bin, /sbin and /bin but cargo.
    let bin = tempfile::tempdir().expect("temporary directory");
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name();
            if name != "cargo" && !bin.path().join(&name).exists() {
                std::os::unix::fs::symlink(entry.path(), bin.path().join(&name)).expect("link a program");
            }
        }
    }
    let path = bin.path().to_str().expect("a UTF-8 temporary path");
    let out = Command::new("bash")
        .arg(script())
        .args(["--prefix", "/opt/vgpu-never-made"])
        .env_clear()
        .env("PATH", path)
        .env("SUDO_USER", "root")
        .output()
        .expect("run install.sh");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "sudo resets PATH",
        "VGPU_PREFIX=/opt/vgpu-never-made cargo build --release --workspace --exclude workspace-hack --locked",
        "sudo ./install.sh --no-build --prefix /opt/vgpu-never-made",
    ] {
        assert!(err.contains(needle), "message lacks {needle:?}:\n{err}");
    }
    if Path::new("/root/.cargo/bin/cargo").is_file() {
        assert!(err.contains("/root/.cargo/bin/cargo"), "the user's cargo is not named:\n{err}");
    }
    assert!(!Path::new("/opt/vgpu-never-made").exists());
}

/// The files a `*` in the last component of `pattern` matches (cargo-deb's asset globs as
/// this package uses them), or the file itself.
fn matches(pattern: &Path) -> Vec<PathBuf> {
    let name = pattern.file_name().and_then(|n| n.to_str()).expect("asset file name");
    let Some((head, tail)) = name.split_once('*') else {
        return if pattern.is_file() { vec![pattern.to_path_buf()] } else { Vec::new() };
    };
    let dir = pattern.parent().expect("asset directory");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            p.is_file() && n.len() >= head.len() + tail.len() && n.starts_with(head) && n.ends_with(tail)
        })
        .collect();
    out.sort();
    out
}

/// [package.metadata.deb] (the .deb, built by packaging/deb.sh, too slow for CI) checked
/// without cargo-deb: every asset is in the tree, a built artefact or generated by
/// packaging/assets.sh; the config is a conffile; the units run /usr/bin/vgpu.
#[test]
fn deb_metadata_names_files_that_exist_or_are_generated() {
    let repo = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    // The binary's package (crates/vgpu) carries the metadata; its paths are relative to it.
    let package = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo_toml: toml::Table =
        toml::from_str(&std::fs::read_to_string(package.join("Cargo.toml")).expect("Cargo.toml")).expect("parse");
    let deb = cargo_toml["package"]["metadata"]["deb"].as_table().expect("[package.metadata.deb]");
    for key in ["maintainer", "section", "priority", "depends", "extended-description"] {
        assert!(deb.get(key).and_then(|v| v.as_str()).is_some_and(|v| !v.is_empty()), "{key} missing");
    }

    let generated = tempfile::tempdir().expect("tempdir");
    let out = Command::new("bash")
        .arg(repo.join("packaging/assets.sh"))
        .arg(env!("CARGO_BIN_EXE_vgpu"))
        .arg(generated.path())
        .output()
        .expect("run packaging/assets.sh");
    assert!(out.status.success(), "packaging/assets.sh: {}", String::from_utf8_lossy(&out.stderr));

    let mut dests = Vec::new();
    for asset in deb["assets"].as_array().expect("assets") {
        let asset = asset.as_array().expect("[source, dest, mode]");
        let (src, dest) = (asset[0].as_str().expect("source"), asset[1].as_str().expect("dest"));
        let found = if let Some(file) = src.strip_prefix("target/release/") {
            vec![artefact(file)]
        } else if let Some(rel) = src.strip_prefix("target/assets/") {
            matches(&generated.path().join(rel))
        } else {
            matches(&package.join(src))
        };
        assert!(!found.is_empty(), "asset {src} is neither in the tree, built, nor generated by packaging/assets.sh");
        dests.push((src.to_string(), dest.to_string(), found));
    }
    let dest_of = |dest: &str| dests.iter().find(|(_, d, _)| d == dest);

    // The binary, the libraries where the binary looks (PREFIX/lib/vgpu), every man page,
    // the completions, the config.
    for dest in [
        "usr/bin/",
        "usr/lib/vgpu/",
        "usr/share/man/man1/",
        "usr/share/bash-completion/completions/vgpu",
        "usr/share/zsh/vendor-completions/",
        "usr/share/fish/vendor_completions.d/",
        "etc/vgpu/config.toml",
    ] {
        assert!(dest_of(dest).is_some(), "nothing installed to {dest}");
    }
    let pages = matches(&repo.join("man/*.1"));
    let shipped: Vec<&PathBuf> =
        dests.iter().filter(|(_, d, _)| d == "usr/share/man/man1/").flat_map(|(_, _, f)| f).collect();
    for page in &pages {
        assert!(shipped.contains(&page), "{} not in the package", page.display());
    }
    let conf_files: Vec<&str> =
        deb["conf-files"].as_array().expect("conf-files").iter().map(|v| v.as_str().expect("path")).collect();
    assert!(conf_files.contains(&"/etc/vgpu/config.toml"), "the config is not a conffile: {conf_files:?}");

    // Every unit of systemd/ is shipped, rewritten to the package's binary.
    let (_, _, units) = dest_of("usr/lib/systemd/system/").expect("units shipped");
    let mut names: Vec<String> = Vec::new();
    for unit in ["*.service", "*.timer"].iter().flat_map(|p| matches(&repo.join("systemd").join(p))) {
        let name = unit.file_name().expect("name").to_string_lossy().to_string();
        let copy = units.iter().find(|u| u.file_name() == unit.file_name());
        let copy = copy.unwrap_or_else(|| panic!("systemd/{name} is not in the package"));
        let text = std::fs::read_to_string(copy).expect("read unit");
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            assert!(!line.contains("/usr/local"), "{name} still names /usr/local: {line}");
            if line.contains("bin/vgpu") {
                assert!(line.contains("/usr/bin/vgpu"), "{name} runs another vgpu than /usr/bin/vgpu: {line}");
            }
        }
        names.push(name);
    }
    for entry in deb["systemd-units"].as_array().expect("systemd-units") {
        let unit = entry["unit-name"].as_str().expect("unit-name");
        assert!(names.iter().any(|n| n.starts_with(&format!("{unit}."))), "systemd-units names {unit}, not shipped");
    }
    let scripts = package.join(deb["maintainer-scripts"].as_str().expect("maintainer-scripts"));
    for script in matches(&scripts.join("*")) {
        let text = std::fs::read_to_string(&script).expect("read script");
        assert_eq!(text.matches("#DEBHELPER#").count(), 1, "{}: one #DEBHELPER# token", script.display());
    }
}

/// The manifest is TAB-separated, one entry a line: a prefix with spaces installs and
/// uninstalls cleanly; one with a newline (which would split into entries of its own at
/// --uninstall, e.g. `\nfile\t-\t/etc/passwd`) is refused before anything is written.
#[test]
fn prefixes_with_spaces_work_and_ones_the_manifest_cannot_hold_are_refused() {
    let s = Scratch::new();
    let spaced = s.path("my prefix");
    install_sh(&s.root(), &["--no-build", "--prefix", spaced.to_str().expect("utf-8")]);
    assert!(spaced.join("bin/vgpu").is_file());
    install_sh(&s.root(), &["--uninstall", "--prefix", spaced.to_str().expect("utf-8")]);
    assert!(!spaced.exists() || tree(&spaced).is_empty(), "left behind: {:?}", tree(&spaced));

    let victim = s.path("victim");
    std::fs::write(&victim, "someone else's\n").expect("write");
    let evil = s.path(&format!("p\nfile\t-\t{}", victim.display()));
    for prefix in [evil.clone(), s.path("tab\there")] {
        let out = Command::new("bash")
            .arg(script())
            .args(["--no-build", "--prefix", prefix.to_str().expect("utf-8")])
            .env("VGPU_INSTALL_ROOT", s.root())
            .env("VGPU_INSTALL_FROM", artefact_dir())
            .output()
            .expect("run install.sh");
        assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("tab or a newline"), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(victim.is_file() && tree(&s.root()).is_empty());
    assert!(!s.path("p").exists() && !s.path("tab\there").exists(), "refused, yet it wrote");
}

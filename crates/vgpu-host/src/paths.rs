//! Where vgpu finds its files: the shim, the simulated driver, and the link directory that
//! turns the simulated driver into "the" NVIDIA driver for a process.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};


pub const SHIM_FILE: &str = "libvgpu.so";
pub const FAKE_DRIVER_FILE: &str = "libfakegpu.so";
pub use vgpu_gpu::{CUDA_SONAME, NVML_SONAME};
/// The install prefix compiled in (install.sh passes `VGPU_PREFIX` at build time).
pub const BUILD_PREFIX: &str = match option_env!("VGPU_PREFIX") {
    Some(prefix) => prefix,
    None => "/usr/local",
};

/// Directories a bundled library (`libvgpu.so`, `libfakegpu.so`) is looked for in, in
/// order: next to the running binary, then `<prefix>/lib/vgpu` for the prefix the binary
/// sits in (`<prefix>/bin/vgpu`), then the prefix it was built for.
pub fn library_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(bin) = exe.parent() {
            dirs.push(bin.to_path_buf());
            if let Some(prefix) = bin.parent() {
                dirs.push(prefix.join("lib/vgpu"));
            }
        }
    }
    let built = Path::new(BUILD_PREFIX).join("lib/vgpu");
    if !dirs.contains(&built) {
        dirs.push(built);
    }
    dirs
}

fn find_library(file: &str) -> Option<PathBuf> {
    library_dirs().into_iter().map(|dir| dir.join(file)).find(|path| path.is_file())
}

/// The shim: next to the binary, under the install prefix, then the configured path
/// (the config's `shim_path`).
pub fn find_shim(configured: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = find_library(SHIM_FILE) {
        return Ok(path);
    }
    if let Some(path) = configured {
        if path.is_file() {
            return Ok(path.to_path_buf());
        }
        bail!("shim not found: config shim_path {} does not exist", path.display());
    }
    bail!(
        "shim {SHIM_FILE} not found (looked in {}); reinstall with install.sh or set shim_path in the config",
        library_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
    )
}

/// The simulated driver library.
pub fn find_fake_driver() -> Result<PathBuf> {
    find_library(FAKE_DRIVER_FILE).with_context(|| {
        format!(
            "--simulate needs {FAKE_DRIVER_FILE} (looked in {}); build it with `cargo build --release --workspace` or install with install.sh",
            library_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}

/// Make (idempotently) `<state-dir>/simulate/` holding `libcuda.so.1` and
/// `libnvidia-ml.so.1`, both links to the simulated driver, and return it.
pub fn simulated_driver_dir(state_dir: &Path) -> Result<PathBuf> {
    let target = find_fake_driver()?;
    let dir = state_dir.join("simulate");
    make_driver_links(&dir, &target)?;
    Ok(dir)
}

/// Create `dir` with both driver links pointing at `target`, replacing stale links.
pub fn make_driver_links(dir: &Path, target: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for name in [CUDA_SONAME, NVML_SONAME] {
        let link = dir.join(name);
        if std::fs::read_link(&link).ok().as_deref() == Some(target) {
            continue;
        }
        // Build the link beside its final name and rename over it: concurrent vgpu
        // processes never see a missing link.
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp)
            .with_context(|| format!("cannot create link {}", tmp.display()))?;
        std::fs::rename(&tmp, &link).with_context(|| format!("cannot create link {}", link.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_links_are_idempotent_and_replace_stale_ones() {
        let dir = tempfile::tempdir().unwrap();
        let links = dir.path().join("sim");
        let a = dir.path().join("a.so");
        let b = dir.path().join("b.so");
        std::fs::write(&a, b"").unwrap();
        std::fs::write(&b, b"").unwrap();
        make_driver_links(&links, &a).unwrap();
        make_driver_links(&links, &a).unwrap();
        assert_eq!(std::fs::read_link(links.join(CUDA_SONAME)).unwrap(), a);
        make_driver_links(&links, &b).unwrap();
        assert_eq!(std::fs::read_link(links.join(NVML_SONAME)).unwrap(), b);
        assert_eq!(std::fs::read_dir(&links).unwrap().count(), 2);
    }
}

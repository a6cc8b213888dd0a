//! What every command gets: the loaded config and the resolved global settings.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use crate::config::Config;

use crate::config::ConfigError;

use crate::config::DEFAULT_LIB_DIR;

use crate::config::DEFAULT_STATE_DIR;
use vgpu_gpu::Nvml;

/// The resolved global settings, built once in `main` from flags, environment and config.
#[derive(Debug, Clone)]
pub struct Context {
    pub config: Config,
    /// `/run/vgpu` unless moved by `--state-dir`, `VGPU_STATE_DIR` or the config.
    pub state_dir: PathBuf,
    /// `/var/lib/vgpu` unless moved by `VGPU_LIB_DIR` or the config.
    pub lib_dir: PathBuf,
    /// Use the bundled simulated driver instead of NVIDIA's.
    pub simulate: bool,
    /// Where the settings came from, to load them again (`vgpu watch` on SIGHUP).
    pub origin: Origin,
}

/// The command line's say in the settings: the config file it names and its overrides.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// `--config`/`VGPU_CONFIG`; None: the default path, which may be missing.
    pub config: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub lib_dir: Option<PathBuf>,
    pub simulate: bool,
}

/// `path` with the links of its existing part resolved (`/var/run/vgpu` → `/run/vgpu`), so
/// that every path vgpu builds below it can be opened with no link in any component
/// (`vgpu_abi::mapping::open_no_links`). The part that does not exist yet is kept as given.
fn resolved(path: &Path) -> PathBuf {
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            return rest.iter().rev().fold(real, |p, name| p.join(name));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                existing = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

impl Context {
    /// Resolve settings; flags (already merged with their environment variables by clap)
    /// win over the config file.
    pub fn new(config: Config, origin: Origin) -> Context {
        let state_dir = origin
            .state_dir
            .clone()
            .or_else(|| config.state_dir.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        let lib_dir = origin.lib_dir.clone().or_else(|| config.lib_dir.clone()).unwrap_or_else(|| PathBuf::from(DEFAULT_LIB_DIR));
        let simulate = origin.simulate || config.simulate;
        Context { config, state_dir: resolved(&state_dir), lib_dir: resolved(&lib_dir), simulate, origin }
    }

    /// Read the config file again and resolve the settings as at start.
    pub fn load(origin: Origin) -> Result<Context, ConfigError> {
        let (path, required) = match &origin.config {
            Some(path) => (path.clone(), true),
            None => (PathBuf::from(crate::config::DEFAULT_CONFIG_PATH), false),
        };
        let config = Config::load(&path, required)?;
        Ok(Context::new(config, origin))
    }

    /// NVML, or `None` when the host has no NVIDIA driver. In simulation mode the bundled
    /// simulated driver is loaded instead.
    pub fn nvml(&self) -> Result<Option<Nvml>> {
        let library = if self.simulate {
            Some(crate::paths::simulated_driver_dir(&self.state_dir)?.join(crate::paths::NVML_SONAME))
        } else {
            None
        };
        let nvml = Nvml::open(library.as_deref()).context("cannot initialise NVML")?;
        if nvml.is_none() && self.simulate {
            anyhow::bail!("the simulated driver did not initialise (check FAKEGPU_CONFIG; its message is above)");
        }
        Ok(nvml)
    }

    /// The GPUs as admission sees them (index, UUID, name, memory; no readings): as the
    /// running `vgpu watch` published them, where that list is current
    /// (`vgpu_store::state::inventory`), else read through NVML now ([`Context::nvml`]).
    /// `None`: the host has no NVIDIA driver.
    pub fn gpu_identities(&self) -> Result<Option<Vec<vgpu_gpu::GpuInfo>>> {
        Ok(self.host_gpus()?.map(|host| host.gpus))
    }

    /// [`Context::gpu_identities`], with the watch's list when they are taken from it.
    pub fn host_gpus(&self) -> Result<Option<HostGpus>> {
        let store = vgpu_store::state::Store::new(&self.state_dir, &self.lib_dir);
        match vgpu_store::state::inventory::current_list(&store, self.simulate, std::time::SystemTime::now()) {
            Ok(current) => {
                let gpus: Vec<vgpu_gpu::GpuInfo> = current.published.gpus.iter().cloned().map(identity).collect();
                tracing::debug!("{} GPU(s) as vgpu watch published them ({})", gpus.len(), store.inventory_path().display());
                return Ok(Some(HostGpus { gpus, watch: Some(current) }));
            }
            Err(why) => tracing::debug!("GPUs read through NVML: the published list is not taken: {why}"),
        }
        let Some(nvml) = self.nvml()? else { return Ok(None) };
        Ok(Some(HostGpus { gpus: nvml.identities()?, watch: None }))
    }

    /// NVML as [`Context::nvml`] opens it, making nothing: in simulation mode the simulated
    /// driver is loaded from where it is installed, not through the link directory under the
    /// state directory (which only root can make). For the listing commands.
    pub fn nvml_read_only(&self) -> Result<Option<Nvml>> {
        let library = if self.simulate { Some(crate::paths::find_fake_driver()?) } else { None };
        let nvml = Nvml::open(library.as_deref()).context("cannot initialise NVML")?;
        if nvml.is_none() && self.simulate {
            anyhow::bail!("the simulated driver did not initialise (check FAKEGPU_CONFIG; its message is above)");
        }
        Ok(nvml)
    }

    /// Directory of `libcuda.so.1`/`libnvidia-ml.so.1` links to put first on a workload's
    /// `LD_LIBRARY_PATH`, in simulation mode only.
    pub fn driver_library_dir(&self) -> Result<Option<PathBuf>> {
        if self.simulate {
            Ok(Some(crate::paths::simulated_driver_dir(&self.state_dir)?))
        } else {
            Ok(None)
        }
    }

    pub fn state_path(&self, name: &str) -> PathBuf {
        self.state_dir.join(name)
    }

    pub fn lib_path(&self, name: impl AsRef<Path>) -> PathBuf {
        self.lib_dir.join(name)
    }
}

/// The GPUs an admission takes ([`Context::host_gpus`]), and the list of the running
/// `vgpu watch` they were taken from, when they were.
#[derive(Debug, Clone)]
pub struct HostGpus {
    pub gpus: Vec<vgpu_gpu::GpuInfo>,
    /// The watch's published list, found current: its writer runs and marked it within
    /// two rounds.
    pub watch: Option<vgpu_store::state::inventory::Current>,
}

/// A published GPU as [`vgpu_gpu::Nvml::identities`] gives it (no readings; the memory in
/// use is not published, and admission does not read it).
fn identity(g: vgpu_store::state::inventory::PublishedGpu) -> vgpu_gpu::GpuInfo {
    vgpu_gpu::GpuInfo::identified(g.index, g.uuid, g.name, g.memory_total_bytes, 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn links_in_the_existing_part_are_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("run")).unwrap();
        assert_eq!(super::resolved(&dir.path().join("run/vgpu/x")), real.join("vgpu/x"));
        assert_eq!(super::resolved(&dir.path().join("run")), real);
    }
}

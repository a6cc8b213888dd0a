//! NVIDIA GPUs through NVML, loaded at run time (`libnvidia-ml.so.1`): the binary links
//! nothing of NVIDIA's and runs on hosts without a GPU.

pub mod ancestry;
pub mod cgroup_of;
pub mod checkpoint;
pub mod context;
pub mod inventory;
pub mod snapshot;
pub mod unmanaged;

/// The CUDA driver's and NVML's sonames, as the dynamic linker finds them.
pub const CUDA_SONAME: &str = "libcuda.so.1";
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";

use std::ffi::OsStr;
use std::path::Path;

use nvml_wrapper::error::NvmlError;

pub use inventory::GpuInfo;

/// An initialised NVML library.
pub struct Nvml {
    inner: nvml_wrapper::Nvml,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nvml")
    }
}

impl Nvml {
    /// Load and initialise NVML from `library` (default: `libnvidia-ml.so.1` through the
    /// dynamic linker). `Ok(None)`: no NVIDIA driver on this host (library missing, or
    /// present with no kernel driver loaded).
    pub fn open(library: Option<&Path>) -> Result<Option<Nvml>, NvmlError> {
        let mut builder = nvml_wrapper::Nvml::builder();
        if let Some(path) = library {
            builder.lib_path(path.as_os_str());
        } else {
            builder.lib_path(OsStr::new(crate::NVML_SONAME));
        }
        match builder.init() {
            Ok(inner) => Ok(Some(Nvml { inner })),
            Err(NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound | NvmlError::DriverNotLoaded) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn raw(&self) -> &nvml_wrapper::Nvml {
        &self.inner
    }

    pub fn driver_version(&self) -> Result<String, NvmlError> {
        self.inner.sys_driver_version()
    }

    /// CUDA driver API version as "12.8".
    pub fn cuda_version(&self) -> Result<String, NvmlError> {
        let v = self.inner.sys_cuda_driver_version()?;
        Ok(format!("{}.{}", v / 1000, (v % 1000) / 10))
    }

    pub fn count(&self) -> Result<u32, NvmlError> {
        self.inner.device_count()
    }

    pub fn device(&self, index: u32) -> Result<nvml_wrapper::Device<'_>, NvmlError> {
        self.inner.device_by_index(index)
    }

    /// A snapshot of every GPU.
    pub fn inventory(&self) -> Result<Vec<GpuInfo>, NvmlError> {
        (0..self.count()?).map(|i| inventory::snapshot(&self.device(i)?, i)).collect()
    }

    /// Every GPU's identity and memory, without the readings an admission does not use
    /// (clocks, power, utilization, processes: [`inventory::identity`]).
    pub fn identities(&self) -> Result<Vec<GpuInfo>, NvmlError> {
        (0..self.count()?).map(|i| inventory::identity(&self.device(i)?, i)).collect()
    }
}

/// NVML's error as one line a user can act on.
pub fn explain(err: &NvmlError) -> String {
    match err {
        NvmlError::NoPermission => "NVML refused: permission denied (run as root, e.g. with sudo)".into(),
        NvmlError::NotSupported => "not supported by this GPU or driver".into(),
        other => other.to_string(),
    }
}

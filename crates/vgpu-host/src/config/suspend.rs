//! The `[suspend]` table of the config file: how `vgpu suspend` and pool preemption
//! suspend a workload.
//!
//! ```toml
//! [suspend]
//! checkpoint = true        # move device memory to host memory where the driver can (570+)
//! lock_timeout = "10s"     # how long to wait for a process's GPU work to drain
//! ```

use std::time::Duration;

use serde::Deserialize;

pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SuspendConfig {
    /// Use the CUDA checkpoint API when the driver has it. False: suspension only
    /// freezes, and the memory stays on the GPU.
    pub checkpoint: bool,
    /// How long locking a process may wait for its CUDA calls and queued kernels to end;
    /// past it, that workload is frozen with its memory held.
    #[serde(with = "humantime_serde")]
    pub lock_timeout: Duration,
}

impl Default for SuspendConfig {
    fn default() -> Self {
        SuspendConfig { checkpoint: true, lock_timeout: DEFAULT_LOCK_TIMEOUT }
    }
}

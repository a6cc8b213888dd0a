//! What each process with a context on a GPU is allowed there beyond its vGPU's quota
//! (`[watch] context_allowance`): with `"auto"` (the default) what one CUDA context takes on
//! that GPU, measured once per GPU by the watch when it opens NVML (`gpu::context::measure`),
//! or the architecture's figure (`gpu::context::fallback`) for a GPU it could not measure;
//! with a size, that size everywhere.

use std::collections::HashMap;

use vgpu_abi::size::format_size;

use vgpu_host::config::watch::ContextAllowance;
use super::Event;
use vgpu_gpu::snapshot::GpuSample;
use vgpu_gpu::context::fallback;
use vgpu_gpu::context::measure;
use vgpu_gpu::Nvml;

/// One context's size per GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextSizes {
    /// GPU UUID → bytes.
    per_gpu: HashMap<String, u64>,
    /// For a GPU not in `per_gpu` (one that appeared after the measurement).
    otherwise: u64,
}

impl ContextSizes {
    /// The same size on every GPU.
    pub fn fixed(bytes: u64) -> ContextSizes {
        ContextSizes { per_gpu: HashMap::new(), otherwise: bytes }
    }

    /// What `setting` gives on the GPUs `nvml` sees: measured through the driver at
    /// `library` (None: `libcuda.so.1`) under `"auto"`. Says what it found in one line.
    pub fn resolve(setting: ContextAllowance, nvml: &Nvml, library: Option<&std::path::Path>) -> (ContextSizes, Event) {
        let bytes = match setting {
            ContextAllowance::Bytes(bytes) => {
                return (ContextSizes::fixed(bytes), Event::debug(format!("context allowance: {} per process on every GPU", format_size(bytes))))
            }
            ContextAllowance::Auto => bytes_or_why(measure(library, nvml)),
        };
        let (otherwise, _) = fallback(None);
        let mut sizes = ContextSizes { per_gpu: HashMap::new(), otherwise };
        let mut said = Vec::new();
        let mut warn = false;
        for index in 0..nvml.count().unwrap_or(0) {
            let Ok(device) = nvml.device(index) else { continue };
            let Ok(uuid) = device.uuid() else { continue };
            match bytes.as_ref().ok().and_then(|m| m.get(&uuid)) {
                Some(&b) => {
                    sizes.per_gpu.insert(uuid, b);
                    said.push(format!("GPU {index} {} (measured)", format_size(b)));
                }
                None => {
                    let (b, arch) = fallback(device.architecture().ok().as_ref());
                    sizes.per_gpu.insert(uuid, b);
                    said.push(format!("GPU {index} {} ({arch}'s figure)", format_size(b)));
                    warn = true;
                }
            }
        }
        let line = match bytes {
            Err(why) => Event::warn(format!("cannot measure what a CUDA context takes ({why}): context allowance per process {}", said.join(", "))),
            Ok(_) if warn => Event::warn(format!("context allowance per process: {} (a GPU not measured: hidden from the watch, or NVML does not report its processes' memory)", said.join(", "))),
            Ok(_) => Event::info(format!("context allowance per process: {}", said.join(", "))),
        };
        (sizes, line)
    }

    /// One context's size on `gpu`.
    pub fn of(&self, gpu: &GpuSample) -> u64 {
        self.per_gpu.get(&gpu.uuid).copied().unwrap_or(self.otherwise)
    }
}

fn bytes_or_why(m: Result<HashMap<String, u64>, vgpu_gpu::context::ContextError>) -> Result<HashMap<String, u64>, String> {
    m.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_size_is_the_same_everywhere_and_an_unknown_gpu_gets_the_lowest_figure() {
        let gpu = vgpu_gpu::snapshot::idle_gpu(0, Vec::new());
        assert_eq!(ContextSizes::fixed(64 << 20).of(&gpu), 64 << 20);
        let sizes = ContextSizes { per_gpu: [("GPU-0".to_string(), 300 << 20)].into_iter().collect(), otherwise: fallback(None).0 };
        assert_eq!(sizes.of(&gpu), 300 << 20);
        assert_eq!(sizes.of(&vgpu_gpu::snapshot::idle_gpu(1, Vec::new())), fallback(None).0);
    }
}

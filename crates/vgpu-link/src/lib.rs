//! No code: this crate's build script decides how every artefact that depends on it is
//! linked (see `build.rs`). The four artefacts (`vgpu`, `libvgpu.so`, `libfakegpu.so`,
//! `libspank_vgpu.so`) depend on it.

//! Link spank_vgpu.so `-z nodelete`: Slurm dlcloses its SPANK plugins, and the Rust
//! standard library may have registered thread-local destructors in the library
//! (`__cxa_thread_atexit_impl`); unloaded, those would run code that is gone when the
//! thread exits. With nodelete the library stays mapped after dlclose.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}

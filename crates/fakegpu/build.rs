//! Link the driver library as NVIDIA links theirs: references inside it bind to its own
//! definitions (`-Bsymbolic`). The function pointers `cuGetProcAddress` hands out are then
//! the driver's own, as a real `libcuda.so.1`'s are, even when a preloaded library (a shim)
//! exports the same names; without it, the dynamic linker would hand out the preloaded
//! library's functions from the driver's own table, and a program that reaches the driver
//! without the shim (glibc's own `dlsym`) could not escape it as it does on real hardware.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}

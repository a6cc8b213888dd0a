//! How programs reach the governed functions: by name through the dynamic linker (the
//! exports in [`crate::hooks`] bind before libcuda's), through `dlsym` on a library handle
//! ([`dlsym`]), and through `cuGetProcAddress` ([`procaddr`]). [`exports`] is the one list.

pub mod dlsym;
pub mod exports;
pub mod procaddr;

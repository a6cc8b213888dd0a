//! How programs reach the governed functions: by name through the dynamic linker (the
//! exports generated in [`exports`] from THE list, `crate::governed`, bind before libcuda's),
//! through `dlsym` on a library handle ([`dlsym`]), and through `cuGetProcAddress`
//! ([`procaddr`]). [`exports`] is also the table both of those consult.
//!
//! The top of the shim: it wires the hooks (`crate::hooks`) into the exports, and nothing
//! below uses it. Inside, [`exports`] and [`procaddr`] use each other: `cuGetProcAddress` is
//! itself governed (its export is in the table) and its hook hands out wrappers from that
//! table.

pub mod dlsym;
pub mod exports;
pub mod procaddr;

//! The table of governed functions: exported symbol name → the shim's wrapper. `dlsym` and
//! `cuGetProcAddress` hand these out; everything else reaches the driver untouched.
//!
//! The table is not written by hand: `governed_exports!` makes it from THE list in
//! `crate::governed`, together with each function's export, so a wrapper cannot exist
//! without its row (or a row without its wrapper). The same list gives each function its
//! real-driver slot and signature type in `crate::real`.

use std::ffi::{c_char, c_int, c_uint, c_void};

use super::procaddr;
use crate::ffi::*;
use crate::hooks::{arrays, info, init, launch, memory, nvml, pools, vmm};
use crate::real::Library;

/// One governed function.
pub struct Export {
    /// The exported symbol (`cuMemAlloc_v2`).
    pub name: &'static str,
    /// The shim's wrapper.
    pub wrapper: *mut c_void,
    /// The driver library that has the real one.
    pub library: &'static Library,
}

// SAFETY: the table is immutable; the pointers are addresses of functions of this library.
unsafe impl Sync for Export {}

/// Exports every governed function of THE list (`crate::governed`, handed over by
/// `governed_functions!`), each once. The list's shape:
///
/// ```text
///     CUDA, CUDA_ERROR_NOT_FOUND => {
///         fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CuResult => memory::alloc;
///         fn cuMemAllocAsync | cuMemAllocAsync_ptsz (dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CuResult => memory::alloc_async;
///         fn cuLaunch(f: CUfunction) -> CuResult => launch::legacy, fast if launch::unlimited;
///     }
/// ```
///
/// For every name (a `|`-separated twin shares the line, its signature and its hook) this
/// generates
/// - the `#[no_mangle] pub unsafe extern "C" fn NAME(args)` export, whose body is
///   `guard("NAME", |call| HOOK(call, real::NAME, args…), || real::NAME(args…))` (with
///   `real::NAME`, the real driver function in its own lazily resolved slot, and
///   `real::sig::FIRST`, the C signature as an `unsafe fn` pointer type, both generated from
///   the same list in `crate::real`);
/// - its row of `EXPORTS` (`NAMES` in declaration order; `ORDER` sorts it at compile time,
///   and compilation fails on a name declared twice).
///
/// A hook is `unsafe fn(call: &Call<R>, real: sig::FIRST, args…) -> R` and reaches the driver
/// only as `call.driver(|| real(…))`, exactly once.
macro_rules! governed_exports {
    (
        $( $library:ident, $missing:expr => {
            $( fn $first:ident $(| $twin:ident)* ( $($args:tt)* ) -> $ret:ty => $hook:path $(, fast if $fast:path)?; )*
        } )*
    ) => {
        $( $(
            governed_exports!(@export $first [$first $($twin)*] ($($args)*) -> $ret => $hook, [$($fast)?]);
        )* )*

        /// Every governed symbol, in declaration order.
        pub static EXPORTS: &[$crate::interpose::exports::Export] = &[
            $( $(
                $crate::interpose::exports::Export {
                    name: stringify!($first), wrapper: $first as *mut ::std::ffi::c_void, library: &$crate::real::$library,
                },
                $( $crate::interpose::exports::Export {
                    name: stringify!($twin), wrapper: $twin as *mut ::std::ffi::c_void, library: &$crate::real::$library,
                }, )*
            )* )*
        ];

        /// The names of [`EXPORTS`], same order.
        pub const NAMES: &[&str] = &[ $( $( stringify!($first), $( stringify!($twin), )* )* )* ];

        /// Indices of [`EXPORTS`] sorted by name (computed, and checked for duplicates, by
        /// the compiler).
        pub static ORDER: [u16; NAMES.len()] = $crate::interpose::exports::sorted_order(NAMES);
    };

    (@export $first:ident [$($name:ident)+] $args:tt -> $ret:ty => $hook:path, []) => {
        $( governed_exports!(@one $first $name $args -> $ret => $hook, $crate::interpose::exports::never); )+
    };
    (@export $first:ident [$($name:ident)+] $args:tt -> $ret:ty => $hook:path, [$fast:path]) => {
        $( governed_exports!(@one $first $name $args -> $ret => $hook, $fast); )+
    };

    (@one $first:ident $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty => $hook:path, $fast:path) => {
        #[no_mangle]
        #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // `fast if PREDICATE`: when it holds (nothing to govern, e.g. a launch with no
            // compute limit) the real function is called straight away: no guard, no hook,
            // and (the governed path being a function of its own) no big stack frame.
            if $fast() {
                // SAFETY: the real function of this symbol, with the program's arguments.
                return unsafe { $crate::real::$name($($arg),*) };
            }
            #[inline(never)]
            #[allow(non_snake_case, clippy::too_many_arguments)]
            unsafe fn governed($($arg: $ty),*) -> $ret {
                $crate::guard::guard(
                    stringify!($name),
                    |call| {
                        // SAFETY: the hook gets the program's arguments under the driver API's
                        // contract, and the real function of this very symbol.
                        unsafe { $hook(call, $crate::real::$name as $crate::real::sig::$first, $($arg),*) }
                    },
                    || {
                        // SAFETY: the real function of this symbol, with the program's arguments.
                        unsafe { $crate::real::$name($($arg),*) }
                    },
                )
            }
            // SAFETY: the same arguments, under the same contract.
            unsafe { governed($($arg),*) }
        }
    };
}

// THE list's exports and table.
crate::governed::governed_functions!(governed_exports);

/// The fast-path predicate of a governed function without one: never.
#[inline(always)]
pub const fn never() -> bool {
    false
}

/// `a < b`, bytewise (a `const fn`).
const fn less(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut i = 0;
    while i < a.len() && i < b.len() {
        if a[i] != b[i] {
            return a[i] < b[i];
        }
        i += 1;
    }
    a.len() < b.len()
}

/// Indices of `names` in sorted order; a compile error if a name occurs twice.
pub const fn sorted_order<const N: usize>(names: &[&str]) -> [u16; N] {
    assert!(names.len() == N && N <= u16::MAX as usize);
    let mut order = [0u16; N];
    let mut i = 0;
    while i < N {
        order[i] = i as u16;
        i += 1;
    }
    // Insertion sort: a few dozen names, once, at compile time.
    let mut i = 1;
    while i < N {
        let mut j = i;
        while j > 0 && less(names[order[j] as usize], names[order[j - 1] as usize]) {
            let t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
            j -= 1;
        }
        i += 1;
    }
    let mut i = 1;
    while i < N {
        assert!(
            less(names[order[i - 1] as usize], names[order[i] as usize]),
            "a governed function is declared twice"
        );
        i += 1;
    }
    order
}

/// The governed function exported as `name`.
pub fn find(name: &[u8]) -> Option<&'static Export> {
    ORDER
        .binary_search_by(|&i| EXPORTS[i as usize].name.as_bytes().cmp(name))
        .ok()
        .map(|k| &EXPORTS[ORDER[k] as usize])
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_abi::cuda_procs::by_symbol;

    #[test]
    fn sorted_and_found() {
        assert_eq!(EXPORTS.len(), NAMES.len());
        for pair in ORDER.windows(2) {
            let (a, b) = (NAMES[pair[0] as usize], NAMES[pair[1] as usize]);
            assert!(a < b, "{a} must sort before {b}");
        }
        for (e, name) in EXPORTS.iter().zip(NAMES) {
            assert_eq!(e.name, *name);
            assert_eq!(find(e.name.as_bytes()).map(|f| f.name), Some(e.name));
        }
        assert!(find(b"cuMemAlloc").is_none(), "the legacy 32-bit ABI is not governed");
        assert!(find(b"cuMemcpy").is_none());
        assert!(find(b"").is_none());
        assert!(find(b"zzz").is_none());
    }

    #[test]
    fn sorted_order_sorts_bytewise() {
        let names = ["cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuA", "cu"];
        let order: [u16; 5] = sorted_order(&names);
        let sorted: Vec<&str> = order.iter().map(|&i| names[i as usize]).collect();
        assert_eq!(
            sorted,
            ["cu", "cuA", "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernel_ptsz"]
        );
    }

    #[test]
    fn every_cuda_export_is_a_driver_symbol() {
        for e in EXPORTS.iter().filter(|e| e.name.starts_with("cu")) {
            assert!(by_symbol(e.name).is_some(), "{} is not in cuda_procs", e.name);
        }
    }

    #[test]
    fn every_launch_path_is_governed() {
        for name in [
            "cuLaunchKernel",
            "cuLaunchKernel_ptsz",
            "cuLaunchKernelEx",
            "cuLaunchKernelEx_ptsz",
            "cuLaunchCooperativeKernel",
            "cuLaunchCooperativeKernel_ptsz",
            "cuLaunchCooperativeKernelMultiDevice",
            "cuGraphLaunch",
            "cuGraphLaunch_ptsz",
            "cuLaunch",
            "cuLaunchGrid",
            "cuLaunchGridAsync",
        ] {
            assert!(find(name.as_bytes()).is_some(), "{name} is not governed");
        }
    }

    /// Exports of the shim that are not driver functions.
    const OTHER_EXPORTS: &[&str] = &["dlsym"];

    /// The freshly built `libvgpu.so` (this test binary is `target/<profile>/deps/vgpu-…`;
    /// cargo does not build a cdylib for unit tests, so build it as the integration tests do).
    fn built_library() -> std::path::PathBuf {
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev".to_string(),
            Some(other) => other.to_string(),
        };
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let status = std::process::Command::new(env!("CARGO"))
            .args([
                "build",
                "--quiet",
                "-p",
                "vgpu-shim",
                "--profile",
                &profile,
                "--manifest-path",
            ])
            .arg(&manifest)
            .status()
            .unwrap();
        assert!(status.success(), "cargo build -p vgpu-shim failed");
        profile_dir.join("libvgpu.so")
    }

    /// The defined, global or weak function symbols of an ELF64 little-endian shared
    /// object's `.dynsym` (what `nm -D --defined-only` lists as `T`/`W`).
    fn dynamic_functions(elf: &[u8]) -> Vec<String> {
        let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
        let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) as usize;
        let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
        assert_eq!(&elf[..4], b"\x7fELF");
        assert_eq!((elf[4], elf[5]), (2, 1), "ELF64 little-endian");
        let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
        let section = |i: usize| shoff + i * shentsize;
        const SHT_DYNSYM: usize = 11;
        let dynsym = (0..shnum)
            .map(section)
            .find(|&s| u32_at(s + 4) == SHT_DYNSYM)
            .expect("a .dynsym section");
        let strtab = u64_at(section(u32_at(dynsym + 0x28)) + 0x18);
        let (offset, size, entsize) = (u64_at(dynsym + 0x18), u64_at(dynsym + 0x20), u64_at(dynsym + 0x38));
        (0..size / entsize)
            .map(|i| offset + i * entsize)
            .filter(|&sym| {
                let info = elf[sym + 4];
                let (kind, bind) = (info & 0xf, info >> 4);
                const FUNC: u8 = 2;
                const GLOBAL: u8 = 1;
                const WEAK: u8 = 2;
                kind == FUNC && (bind == GLOBAL || bind == WEAK) && u16_at(sym + 6) != 0
            })
            .map(|sym| {
                let name = &elf[strtab + u32_at(sym)..];
                let end = name.iter().position(|&b| b == 0).unwrap();
                String::from_utf8_lossy(&name[..end]).into_owned()
            })
            .collect()
    }

    #[test]
    fn the_built_library_exports_exactly_the_table() {
        let path = built_library();
        let elf = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let exported = dynamic_functions(&elf);
        for symbol in &exported {
            if symbol.starts_with("cu") || symbol.starts_with("nvml") {
                assert!(
                    find(symbol.as_bytes()).is_some(),
                    "{symbol} is exported but not in EXPORTS: dlsym and cuGetProcAddress would not govern it"
                );
            } else {
                assert!(OTHER_EXPORTS.contains(&symbol.as_str()), "unexpected export {symbol}");
            }
        }
        for e in EXPORTS {
            assert!(
                exported.iter().any(|s| s == e.name),
                "{} is in EXPORTS but not exported",
                e.name
            );
        }
        for other in OTHER_EXPORTS {
            assert!(exported.iter().any(|s| s == other), "{other} is not exported");
        }
        // The reader agrees with binutils where it is installed.
        if let Ok(out) = std::process::Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(&path)
            .output()
        {
            if out.status.success() {
                let mut nm: Vec<String> = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter_map(|l| {
                        let mut f = l.split_whitespace();
                        let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
                        matches!(kind, "T" | "W").then(|| name.to_string())
                    })
                    .collect();
                let mut ours = exported.clone();
                nm.sort();
                ours.sort();
                assert_eq!(ours, nm, "the ELF reader and nm -D disagree");
            }
        }
    }
}

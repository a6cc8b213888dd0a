#!/usr/bin/env python3
"""Generate crates/vgpu-abi/src/cuda_procs.rs: the cuGetProcAddress table of the CUDA driver API.

    crates/fakegpu/gen_cuda_procs.py [INCLUDE_DIR] [--check]

INCLUDE_DIR holds cuda.h and cudaTypedefs.h (default: whatever tests/fetch-headers.sh
prints). --check regenerates in memory and exits 1 if a checked-in file differs.

It also writes crates/fakegpu/src/cuda/error_names.rs: every CUresult value of cuda.h with
its name and the first sentence of its description (for cuGetErrorName/cuGetErrorString).

Where the facts come from:

* cudaTypedefs.h (and the GL/EGL/VDPAU/profiler siblings) declare one typedef per ABI
  version of every driver function: PFN_<base>_v<version>[_ptds|_ptsz]. <version> is the
  CUDA version that introduced that ABI; _ptds/_ptsz are the per-thread-default-stream
  variants. That gives the (base, version, per-thread) keys of the table.
* The exported symbol of each key is not spelled in cudaTypedefs.h. The driver keeps
  successive ABIs of a function under successive names: the oldest is <base>, the next
  <base>_v2, then <base>_v3 ... (cuCtxCreate, cuCtxCreate_v2, cuCtxCreate_v3,
  cuCtxCreate_v4). A per-thread variant introduced at version V belongs to the newest plain
  ABI not newer than V, plus the suffix (cuMemcpyHtoD_v7000_ptds -> cuMemcpyHtoD_v2_ptds).
  Every name derived this way is checked against the names cuda.h really declares: the
  declarations after its `#define cuMemAlloc cuMemAlloc_v2` / __CUDA_API_PTDS() /
  __CUDA_API_PTSZ() macros are applied, plus the legacy names it declares under
  __CUDA_API_VERSION_INTERNAL. A derived name that cuda.h does not declare aborts the run.
* One fact is not in the headers: since CUDA 12.0 the base name cuGraphInstantiate resolves
  to cuGraphInstantiateWithFlags (cudaTypedefs.h says `#define PFN_cuGraphInstantiate
  PFN_cuGraphInstantiateWithFlags_v11040`, cuda.h `#define cuGraphInstantiate
  cuGraphInstantiateWithFlags`; the version, 12000, is the release that made that switch).
"""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUTPUT = os.path.join(REPO, "crates", "vgpu-abi", "src", "cuda_procs.rs")
ERRORS_OUTPUT = os.path.join(HERE, "src", "cuda", "error_names.rs")

# Typedef header -> the header declaring those functions. The runtime wheel lacks
# cudaProfiler.h; the three cuProfiler* names then go unchecked (they have one ABI each, so
# the rule gives their plain names).
TYPEDEF_HEADERS = {
    "cudaTypedefs.h": "cuda.h",
    "cudaGLTypedefs.h": "cudaGL.h",
    "cudaEGLTypedefs.h": "cudaEGL.h",
    "cudaVDPAUTypedefs.h": "cudaVDPAU.h",
    "cudaProfilerTypedefs.h": "cudaProfiler.h",
}

# (base name, CUDA version, exported symbol): base names that switched to a differently
# named function. See the module docstring.
ALIASES = [("cuGraphInstantiate", 12000, "cuGraphInstantiateWithFlags")]

TYPEDEF_RE = re.compile(r"typedef\s+CUresult\s*\(\s*CUDAAPI\s*\*\s*PFN_(\w+)\s*\)")
# `#define PFN_cuX PFN_cuX_v12040` and `#define PFN_cuX __API_TYPEDEF_PTSZ(PFN_cuX, 3020, 7000)`
PFN_DEFINE_RE = re.compile(r"^\s*#\s*define\s+PFN_(cu\w+)\s+PFN_(cu\w+)\s*$", re.M)
PFN_PT_DEFINE_RE = re.compile(
    r"^\s*#\s*define\s+PFN_(cu\w+)\s+__API_TYPEDEF_(PTDS|PTSZ)\(PFN_(cu\w+),\s*(\d+),\s*(\d+)\)", re.M
)
PFN_NAME_RE = re.compile(r"^(cu\w+?)_v(\d{4,5})(?:_(ptds|ptsz))?$")
DEFINE_RE = re.compile(r"^\s*#\s*define\s+(cu\w+)\s+(.*?)\s*$")
PT_MACRO_RE = re.compile(r"^__CUDA_API_(PTDS|PTSZ)\((\w+)\)$")
DECL_RE = re.compile(r"\bCUresult\s+CUDAAPI\s+(cu\w+)\s*\(")


def fail(msg):
    sys.exit(f"gen_cuda_procs: {msg}")


def include_dir(argv):
    for arg in argv:
        if not arg.startswith("--"):
            return arg
    script = os.path.join(REPO, "tests", "fetch-headers.sh")
    try:
        out = subprocess.run([script], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        fail(f"cannot fetch the NVIDIA headers with {script}: {err}")
    for line in out.splitlines():
        if os.path.isfile(os.path.join(line, "cuda.h")):
            return line
    fail(f"{script} printed no directory holding cuda.h")


def read(inc, name):
    path = os.path.join(inc, name)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def header_version(inc):
    text = read(inc, "cuda.h")
    m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", text or "")
    if not m:
        fail("no CUDA_VERSION in cuda.h")
    return int(m.group(1))


def parse_typedefs(inc):
    """{base: {"plain": set(versions), "pt": {version: flavor}, "checked": bool}}"""
    funcs = {}
    for header, decl_header in TYPEDEF_HEADERS.items():
        checked = read(inc, decl_header) is not None
        text = read(inc, header)
        if text is None:
            if header == "cudaTypedefs.h":
                fail(f"{header} not found in {inc}")
            continue
        # A few typedefs lack their version suffix (PFN_cuModuleGetFunctionCount); the
        # `#define PFN_<base> PFN_<base>_v<version>` line beside them still has it.
        keys = []
        for pfn in TYPEDEF_RE.findall(text):
            m = PFN_NAME_RE.match(pfn)
            if m:
                keys.append((m.group(1), int(m.group(2)), m.group(3)))
            elif not re.search(rf"#\s*define\s+PFN_{pfn}\s+(PFN_{pfn}_v\d+|__API_TYPEDEF)", text):
                fail(f"{header}: typedef PFN_{pfn} has no version and no #define giving one")
        for alias, target in PFN_DEFINE_RE.findall(text):
            m = PFN_NAME_RE.match(target)
            if m and m.group(1) == alias:
                keys.append((m.group(1), int(m.group(2)), m.group(3)))
        for _alias, flavor, base, plain_version, pt_version in PFN_PT_DEFINE_RE.findall(text):
            base = re.sub(r"_v\d{4,5}$", "", base)  # PFN_cuStreamGetId_v12000 in 12.9
            keys.append((base, int(plain_version), None))
            keys.append((base, int(pt_version), flavor.lower()))
        for base, version, flavor in keys:
            entry = funcs.setdefault(base, {"plain": set(), "pt": {}, "checked": checked})
            if flavor:
                old = entry["pt"].get(version)
                if old and old != flavor:
                    fail(f"{base} v{version} has both _ptds and _ptsz typedefs")
                entry["pt"][version] = flavor
            else:
                entry["plain"].add(version)
    return funcs


def condition_flags(stack):
    """(internal, per_thread_only) for a stack of active #if conditions."""
    internal = any(
        "__CUDA_API_VERSION_INTERNAL" in c and "!defined(__CUDA_API_VERSION_INTERNAL)" not in c
        and not c.startswith("!")
        for c in stack
    )
    per_thread = any(c == "defined(__CUDA_API_PER_THREAD_DEFAULT_STREAM)" for c in stack)
    return internal, per_thread


def scan_declarations(inc, headers):
    """Every driver function `headers` declare, before macros are applied:
    ([(name, internal, parameters)], legacy_macros, pt_macros). `internal` marks the legacy
    declarations under __CUDA_API_VERSION_INTERNAL; `parameters` is the text between the
    declaration's parentheses. legacy_macros maps cuX to the name a default build links
    against, pt_macros to the name a per-thread-default-stream build links against."""
    legacy_macros = {}  # cuX -> name in the default build
    pt_macros = {}  # cuX -> name when compiled with per-thread default stream
    decls = []
    for header in headers:
        text = read(inc, header)
        if text is None:
            continue
        # Some declarations put the name on the line after `CUresult CUDAAPI`.
        text = re.sub(r"CUDAAPI[ \t]*\n\s*", "CUDAAPI ", text)
        stack = []
        lines = text.splitlines()
        for index, line in enumerate(lines):
            s = line.strip()
            if s.startswith("#"):
                directive = s[1:].strip()
                word = directive.split(None, 1)[0] if directive else ""
                rest = directive[len(word):].strip()
                if word in ("if", "ifdef", "ifndef"):
                    if word == "ifdef":
                        rest = f"defined({rest})"
                    elif word == "ifndef":
                        rest = f"!defined({rest})"
                    stack.append(rest)
                    continue
                if word == "elif" and stack:
                    stack[-1] = "!prev&&" + rest
                    continue
                if word == "else" and stack:
                    stack[-1] = "!" + stack[-1]
                    continue
                if word == "endif" and stack:
                    stack.pop()
                    continue
            internal, per_thread_only = condition_flags(stack)
            d = DEFINE_RE.match(line)
            if d and not internal:
                name, value = d.group(1), d.group(2)
                pt = PT_MACRO_RE.match(value)
                if pt:
                    target = pt.group(2)
                    if not per_thread_only:
                        legacy_macros[name] = target
                    pt_macros[name] = f"{target}_{pt.group(1).lower()}"
                elif re.fullmatch(r"cu\w+", value) and not per_thread_only:
                    legacy_macros[name] = value
                    pt_macros.setdefault(name, value)
                continue
            for m in DECL_RE.finditer(line):
                rest = "\n".join([line[m.end():]] + lines[index + 1:index + 60])
                decls.append((m.group(1), internal, parameters_text(rest)))
    return decls, legacy_macros, pt_macros


def parameters_text(text):
    """The text up to the parenthesis that closes an already opened one."""
    depth = 1
    for i, c in enumerate(text):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth == 0:
            return text[:i]
    fail(f"unterminated declaration: {text[:80]}")


def parse_declarations(inc):
    """Names the headers declare, as the linker sees them (macros applied)."""
    decls, legacy_macros, pt_macros = scan_declarations(inc, TYPEDEF_HEADERS.values())
    declared = {name for name, internal, _ in decls if internal}
    main_decls = [name for name, internal, _ in decls if not internal]
    for name in main_decls:
        declared.add(legacy_macros.get(name, name))
        declared.add(pt_macros.get(name, legacy_macros.get(name, name)))
    return declared, legacy_macros


def plain_symbol(base, index):
    return base if index == 0 else f"{base}_v{index + 1}"


def build_table(funcs, declared, legacy_macros):
    rows = []  # (name, per_thread, version, symbol)
    problems = []
    for base in sorted(funcs):
        plain = sorted(funcs[base]["plain"])
        pt = sorted(funcs[base]["pt"].items())
        if not plain:
            problems.append(f"{base}: per-thread typedefs without a plain one")
            continue
        names = [plain_symbol(base, i) for i in range(len(plain))]
        checked = funcs[base]["checked"]
        for version, symbol in zip(plain, names):
            if checked and symbol not in declared:
                problems.append(f"{base} v{version}: derived symbol {symbol} is not declared in cuda.h")
            rows.append((base, False, version, symbol))
        expected_latest = legacy_macros.get(base, base)
        if checked and expected_latest not in names and base not in ("cuGraphInstantiate",):
            problems.append(f"{base}: cuda.h maps it to {expected_latest}, not one of {names}")
        for version, flavor in pt:
            older = [i for i, v in enumerate(plain) if v <= version]
            if not older:
                problems.append(f"{base} v{version}_{flavor}: no plain ABI at or before it")
                continue
            symbol = f"{names[older[-1]]}_{flavor}"
            if checked and symbol not in declared:
                problems.append(f"{base} v{version}_{flavor}: derived symbol {symbol} is not declared in cuda.h")
            rows.append((base, True, version, symbol))
    for base, version, symbol in ALIASES:
        if symbol not in declared:
            problems.append(f"alias {base} -> {symbol}: {symbol} is not declared in cuda.h")
        rows.append((base, False, version, symbol))
    if problems:
        fail("the headers do not fit the naming rule:\n  " + "\n  ".join(problems))
    rows.sort()
    return rows


TEMPLATE_HEAD = """\
//! Which exported driver symbol `cuGetProcAddress` hands out for a base name, a CUDA version
//! and the per-thread-default-stream flag: the table the real `libcuda.so.1` keeps, for every
//! driver function of CUDA {cuda_major}.{cuda_minor}'s headers.
//!
//! GENERATED by `crates/fakegpu/gen_cuda_procs.py` from NVIDIA's `cudaTypedefs.h` and `cuda.h`
//! (CUDA_VERSION {cuda_version}, fetched by `tests/fetch-headers.sh`). Do not edit; rerun the
//! generator. The generator's docstring explains how each row is derived and checked.

/// One ABI version of one driver function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaProc {{
    /// The base name callers pass to `cuGetProcAddress` (`"cuMemAlloc"`).
    pub name: &'static str,
    /// The CUDA version (1000·major + 10·minor) that introduced this ABI.
    pub version: i32,
    /// A per-thread-default-stream variant (`_ptds` / `_ptsz`).
    pub per_thread: bool,
    /// The symbol the driver exports for it (`"cuMemAlloc_v2"`).
    pub symbol: &'static str,
}}

/// The outcome of a lookup, mirroring `CUdriverProcAddressQueryResult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {{
    /// `CU_GET_PROC_ADDRESS_SUCCESS`: this ABI.
    Found(&'static CudaProc),
    /// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`: the function exists, but only from
    /// `min_version` on.
    VersionNotSufficient {{ min_version: i32 }},
    /// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`: no driver function has this base name.
    NotFound,
}}

/// Resolve like the driver: the newest ABI of `base` introduced at or before `cuda_version`.
/// With `per_thread`, a per-thread variant is preferred and the legacy one is the fallback
/// (`CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`); without it, per-thread variants are
/// never returned (`CU_GET_PROC_ADDRESS_LEGACY_STREAM`, and `DEFAULT`, whose per-thread
/// choice `cuda.h` makes at compile time).
pub fn resolve(base: &str, cuda_version: i32, per_thread: bool) -> Resolution {{
    let entries = entries_for(base);
    if entries.is_empty() {{
        return Resolution::NotFound;
    }}
    let newest = |want_per_thread: bool| {{
        entries
            .iter()
            .filter(|p| p.per_thread == want_per_thread && p.version <= cuda_version)
            .max_by_key(|p| p.version)
    }};
    let found = if per_thread {{ newest(true).or_else(|| newest(false)) }} else {{ newest(false) }};
    match found {{
        Some(proc_) => Resolution::Found(proc_),
        None => Resolution::VersionNotSufficient {{
            min_version: entries.iter().map(|p| p.version).min().unwrap_or(i32::MAX),
        }},
    }}
}}

/// Every ABI of `base` (empty if there is no such driver function).
pub fn entries_for(base: &str) -> &'static [CudaProc] {{
    let start = CUDA_PROCS.partition_point(|p| p.name < base);
    let len = CUDA_PROCS[start..].partition_point(|p| p.name == base);
    &CUDA_PROCS[start..start + len]
}}

/// The base name and ABI behind an exported symbol (`"cuMemAlloc_v2"` → `cuMemAlloc`, 3020).
/// A symbol that is also handed out under another base name (cuGraphInstantiateWithFlags)
/// gives its own base name.
pub fn by_symbol(symbol: &str) -> Option<&'static CudaProc> {{
    let own_name = |p: &&CudaProc| {{
        p.symbol == p.name || p.symbol.strip_prefix(p.name).is_some_and(|rest| rest.starts_with('_'))
    }};
    let mut rows = CUDA_PROCS.iter().filter(|p| p.symbol == symbol);
    let first = rows.clone().next();
    rows.find(own_name).or(first)
}}

/// Sorted by (name, per_thread, version); [`entries_for`] relies on it.
#[rustfmt::skip]
pub const CUDA_PROCS: &[CudaProc] = &[
"""

TEMPLATE_TAIL = """\
];

#[cfg(test)]
mod tests {
    use super::*;

    fn symbol(base: &str, version: i32, per_thread: bool) -> Option<&'static str> {
        match resolve(base, version, per_thread) {
            Resolution::Found(p) => Some(p.symbol),
            _ => None,
        }
    }

    #[test]
    fn table_is_sorted_and_unique() {
        for pair in CUDA_PROCS.windows(2) {
            let key = |p: &CudaProc| (p.name, p.per_thread, p.version);
            assert!(key(&pair[0]) < key(&pair[1]), "{:?} !< {:?}", pair[0], pair[1]);
        }
    }

    #[test]
    fn versioned_names() {
        assert_eq!(symbol("cuMemAlloc", 12000, false), Some("cuMemAlloc_v2"));
        assert_eq!(symbol("cuMemAlloc", 3010, false), Some("cuMemAlloc"));
        assert_eq!(symbol("cuGetProcAddress", 12000, false), Some("cuGetProcAddress_v2"));
        assert_eq!(symbol("cuGetProcAddress", 11030, false), Some("cuGetProcAddress"));
        assert_eq!(symbol("cuCtxCreate", 11040, false), Some("cuCtxCreate_v3"));
        assert_eq!(symbol("cuCtxCreate", 12050, false), Some("cuCtxCreate_v4"));
        assert_eq!(symbol("cuDeviceGetUuid", 12000, false), Some("cuDeviceGetUuid_v2"));
        assert_eq!(symbol("cuGraphInstantiate", 12000, false), Some("cuGraphInstantiateWithFlags"));
        assert_eq!(symbol("cuGraphInstantiate", 11000, false), Some("cuGraphInstantiate_v2"));
    }

    #[test]
    fn per_thread_variants() {
        assert_eq!(symbol("cuLaunchKernel", 12000, true), Some("cuLaunchKernel_ptsz"));
        assert_eq!(symbol("cuLaunchKernel", 12000, false), Some("cuLaunchKernel"));
        assert_eq!(symbol("cuMemcpyHtoD", 12000, true), Some("cuMemcpyHtoD_v2_ptds"));
        assert_eq!(symbol("cuStreamGetCaptureInfo", 12030, true), Some("cuStreamGetCaptureInfo_v3_ptsz"));
        // No per-thread variant: the legacy one.
        assert_eq!(symbol("cuMemAlloc", 12000, true), Some("cuMemAlloc_v2"));
        // Per-thread variant newer than the request: the legacy one of that version.
        assert_eq!(symbol("cuStreamSynchronize", 5000, true), Some("cuStreamSynchronize"));
    }

    #[test]
    fn misses() {
        assert_eq!(resolve("cuNoSuchFunction", 12000, false), Resolution::NotFound);
        assert_eq!(resolve("cuMemAlloc_v2", 12000, false), Resolution::NotFound);
        assert_eq!(
            resolve("cuMemCreate", 10000, false),
            Resolution::VersionNotSufficient { min_version: 10020 }
        );
    }

    #[test]
    fn reverse_lookup() {
        let p = by_symbol("cuMemAlloc_v2").unwrap();
        assert_eq!((p.name, p.version, p.per_thread), ("cuMemAlloc", 3020, false));
        let p = by_symbol("cuLaunchKernel_ptsz").unwrap();
        assert_eq!((p.name, p.version, p.per_thread), ("cuLaunchKernel", 7000, true));
        assert_eq!(by_symbol("cuGraphInstantiateWithFlags").unwrap().name, "cuGraphInstantiateWithFlags");
        assert_eq!(by_symbol("cuNoSuchFunction"), None);
    }
}
"""


def render(rows, cuda_version):
    out = [
        TEMPLATE_HEAD.format(
            cuda_version=cuda_version,
            cuda_major=cuda_version // 1000,
            cuda_minor=(cuda_version % 1000) // 10,
        )
    ]
    for name, per_thread, version, symbol in rows:
        out.append(
            f'    CudaProc {{ name: "{name}", version: {version}, '
            f'per_thread: {"true" if per_thread else "false"}, symbol: "{symbol}" }},\n'
        )
    out.append(TEMPLATE_TAIL)
    return rustfmt("".join(out))


def rustfmt(text):
    """Format like `cargo fmt` would, so that the checked-in file passes `cargo fmt --check`."""
    try:
        done = subprocess.run(
            ["rustfmt", "--edition", "2021"], input=text, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError) as err:
        fail(f"rustfmt failed: {err}")
    return done.stdout


ERROR_RE = re.compile(r"/\*\*((?:(?!\*/).)*?)\*/\s*(CUDA_\w+)\s*=\s*(\d+)", re.S)


def parse_errors(inc):
    """[(value, name, first sentence of the description)] of enum cudaError_enum."""
    text = read(inc, "cuda.h")
    m = re.search(r"typedef enum cudaError_enum \{(.*?)\} CUresult;", text, re.S)
    if not m:
        fail("no enum cudaError_enum in cuda.h")
    errors = []
    for comment, name, value in ERROR_RE.findall(m.group(1)):
        words = " ".join(line.strip().lstrip("*").strip() for line in comment.splitlines())
        words = re.sub(r"\\deprecated\s*", "", words)
        words = re.sub(r"::(\w+)", r"\1", words).strip()
        sentence = re.split(r"(?<=[a-z0-9)])\.\s", words + " ", maxsplit=1)[0].strip().rstrip(".")
        errors.append((int(value), name, sentence.replace("\\", "").replace('"', "'")))
    if len(errors) < 50:
        fail(f"only {len(errors)} CUresult values found in cuda.h")
    return sorted(errors)


def render_errors(errors, cuda_version):
    out = [
        "//! Every `CUresult` of cuda.h: value, name, and the first sentence of its description.\n",
        "//!\n",
        f"//! GENERATED by `crates/fakegpu/gen_cuda_procs.py` from cuda.h (CUDA_VERSION {cuda_version}).\n",
        "//! Do not edit; rerun the generator.\n\n",
        "#[rustfmt::skip]\n",
        "pub(crate) const CU_RESULTS: &[(u32, &str, &str)] = &[\n",
    ]
    for value, name, text in errors:
        out.append(f'    ({value}, "{name}", "{text}"),\n')
    out.append("];\n")
    return "".join(out)


def write_or_check(path, text, check):
    if check:
        try:
            with open(path, encoding="utf-8") as f:
                current = f.read()
        except OSError:
            current = None
        if current != text:
            print(f"{path} is out of date; run {sys.argv[0]}", file=sys.stderr)
            return False
        return True
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return True


def main(argv):
    inc = include_dir(argv)
    funcs = parse_typedefs(inc)
    declared, legacy_macros = parse_declarations(inc)
    rows = build_table(funcs, declared, legacy_macros)
    version = header_version(inc)
    text = render(rows, version)
    errors_text = render_errors(parse_errors(inc), version)
    symbols = {r[3] for r in rows}
    uncovered = sorted(n for n in declared if n not in symbols)
    check = "--check" in argv
    ok = write_or_check(OUTPUT, text, check)
    ok = write_or_check(ERRORS_OUTPUT, errors_text, check) and ok
    if check:
        return 0 if ok else 1
    print(
        f"wrote {OUTPUT}: {len(rows)} rows, {len(funcs)} functions, {len(symbols)} symbols "
        f"({len(uncovered)} declared names without a typedef: {', '.join(uncovered) or '-'})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

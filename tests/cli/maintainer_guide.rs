//! The checklists of ARCHITECTURE.md ("Adding a CUDA allocation path", "Adding an intensity
//! source"), as tests: forgetting a step fails here with a message naming the step.
//!
//! - Every function of NVIDIA's `cuda.h` that can allocate device memory (the simulated
//!   driver's conformance table lists every exported name of the header, and
//!   `crates/fakegpu/tests/generated.rs` keeps that table equal to the pinned header) is
//!   either governed by the shim or named, with the reason, in the exemptions below, each of
//!   which the shim's README lists under "Not covered" (or is host memory).
//! - Every governed allocation function is simulated by the fake driver, called by a shim
//!   test program, and listed in the shim's README.
//! - Every intensity source (`SourceKind`, all variants through clap's generated list) is in
//!   docs/carbon-budgets.md's key table and source list, the example config, and a fuzz target.

use std::collections::BTreeSet;
use std::path::Path;

use clap::ValueEnum;
use vgpu_carbon::config::SourceKind;

fn read(relative: &str) -> String {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Whether a `cuda.h` name looks like it can allocate device memory. Deliberately wide: a
/// false positive costs one line in [`NOT_DEVICE_ALLOCATIONS`], a miss costs a quota escape.
fn looks_like_an_allocation(name: &str) -> bool {
    let memory_object = ["cuMem", "cuArray", "cuMipmappedArray", "cuMulticast", "cuIpc", "cuGraphAddMem"]
        .iter()
        .any(|p| name.starts_with(p));
    name.contains("Alloc") || (memory_object && ["Create", "Open", "Register"].iter().any(|w| name.contains(w)))
}

/// Names that match [`looks_like_an_allocation`] and take no device memory from the vGPU.
const NOT_DEVICE_ALLOCATIONS: &[(&str, &str)] = &[
    ("cuMemAllocHost_v2", "page-locked host memory"),
    ("cuMemAllocHost", "page-locked host memory (legacy ABI)"),
    ("cuMemHostAlloc", "page-locked host memory"),
    ("cuMemHostRegister_v2", "pins existing host memory"),
    ("cuMemHostRegister", "pins existing host memory (legacy ABI)"),
    ("cuIpcOpenEventHandle", "an event, no memory"),
    ("cuMemGetAllocationGranularity", "a query"),
    ("cuMemGetAllocationPropertiesFromHandle", "a query"),
    ("cuMemRetainAllocationHandle", "a new reference to memory already counted at cuMemCreate"),
    ("cuGraphMemAllocNodeGetParams", "a query"),
];

/// Device allocations the shim deliberately does not govern; each must be named in the
/// shim README's "Not covered" section, so users are told.
const NOT_COVERED: &[(&str, &str)] = &[
    ("cuMemAlloc", "legacy 32-bit ABI (CUDA < 3.2)"),
    ("cuMemAllocPitch", "legacy 32-bit ABI (CUDA < 3.2)"),
    ("cuArrayCreate", "legacy 32-bit ABI (CUDA < 3.2)"),
    ("cuArray3DCreate", "legacy 32-bit ABI (CUDA < 3.2)"),
    ("cuIpcOpenMemHandle", "legacy ABI; another process's memory, counted by its owner"),
    ("cuIpcOpenMemHandle_v2", "another process's memory, counted once, by its owner"),
    ("cuGraphAddMemAllocNode", "graph memory nodes: allocated by the driver at graph launch"),
    ("cuMulticastCreate", "multicast objects: memory is bound from cuMemCreate handles"),
];

/// The simulated driver's conformance table: (exported name, status) of every cuda.h name.
fn cuda_h_names() -> Vec<(String, String)> {
    let readme = read("crates/fakegpu/README.md");
    let rows: Vec<(String, String)> = readme
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            (cells.len() == 5 && cells[2] == "cuda.h" && cells[1].starts_with('`'))
                .then(|| (cells[1].trim_matches('`').to_string(), cells[3].to_string()))
        })
        .collect();
    assert!(rows.len() > 500, "the fake's conformance table lists {} cuda.h names: has its format changed?", rows.len());
    rows
}

/// Every exported name the shim's `governed!` list declares (twins included).
fn governed_names() -> BTreeSet<String> {
    let source = read("crates/vgpu-shim/src/governed.rs");
    let body = &source[source.find("governed! {").expect("governed.rs has the governed! list")..];
    let mut names = BTreeSet::new();
    for line in body.lines() {
        let Some(rest) = line.trim().strip_prefix("fn ") else { continue };
        let declared = rest.split('(').next().unwrap_or(rest);
        names.extend(declared.split('|').map(|n| n.trim().to_string()).filter(|n| !n.is_empty()));
    }
    assert!(names.contains("cuMemAlloc_v2"), "could not read the governed! list: {names:?}");
    names
}

/// `cuMemAlloc_v2` → `cuMemAlloc`, `cuMemAllocAsync_ptsz` → `cuMemAllocAsync`: the name a C
/// program writes (cuda.h maps it to the versioned symbol).
fn base_name(name: &str) -> &str {
    let name = name.strip_suffix("_ptsz").unwrap_or(name);
    name.strip_suffix("_v2").unwrap_or(name)
}

#[test]
fn every_device_allocation_of_cuda_h_is_governed_or_documented_as_not_covered() {
    let governed = governed_names();
    let classified: BTreeSet<&str> = NOT_DEVICE_ALLOCATIONS.iter().chain(NOT_COVERED).map(|(n, _)| *n).collect();
    let header: Vec<(String, String)> = cuda_h_names();
    let mut unclassified = Vec::new();
    for (name, _) in header.iter().filter(|(n, _)| looks_like_an_allocation(n)) {
        if !governed.contains(name) && !classified.contains(name.as_str()) {
            unclassified.push(name.clone());
        }
    }
    assert!(
        unclassified.is_empty(),
        "cuda.h functions that may allocate device memory are neither governed (crates/vgpu-shim/src/governed.rs) \
         nor listed as not covered: {unclassified:?}. Follow ARCHITECTURE.md, \"Adding a CUDA allocation path\""
    );
    // The exemptions stay true: each names a real cuda.h function, none is governed after all.
    let in_header: BTreeSet<&str> = header.iter().map(|(n, _)| n.as_str()).collect();
    for name in &classified {
        assert!(in_header.contains(name), "{name} is exempted here but is not a cuda.h function");
        assert!(!governed.contains(*name), "{name} is governed: remove it from the exemptions in this test");
    }
    let shim_readme = read("crates/vgpu-shim/README.md");
    let not_covered = &shim_readme[shim_readme.find("## Not covered").expect("crates/vgpu-shim/README.md has \"## Not covered\"")..];
    for (name, why) in NOT_COVERED {
        assert!(
            not_covered.contains(base_name(name)),
            "{name} ({why}) is not governed, and crates/vgpu-shim/README.md's \"Not covered\" section does not say so"
        );
    }
}

#[test]
fn every_governed_allocation_is_simulated_tested_and_documented() {
    let governed = governed_names();
    let status: std::collections::BTreeMap<String, String> = cuda_h_names().into_iter().collect();
    let shim_readme = read("crates/vgpu-shim/README.md");
    let governed_paragraph = {
        let start = shim_readme.find("**Governed functions**").expect("crates/vgpu-shim/README.md lists the governed functions");
        let end = shim_readme[start..].find("\n\n").map_or(shim_readme.len(), |e| start + e);
        &shim_readme[start..end]
    };
    // Every test program the shim's tests build or drive.
    let mut shim_tests = String::new();
    for dir in ["crates/vgpu-shim/tests", "crates/vgpu-shim/tests/c"] {
        let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(dir);
        for entry in std::fs::read_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())) {
            let file = entry.expect("a directory entry").path();
            if file.extension().is_some_and(|x| x == "c" || x == "rs") {
                shim_tests.push_str(&std::fs::read_to_string(&file).unwrap_or_default());
            }
        }
    }
    let allocations: Vec<&String> = governed.iter().filter(|n| looks_like_an_allocation(n)).collect();
    assert!(allocations.len() >= 10, "only {} governed allocation functions found: {allocations:?}", allocations.len());
    for name in allocations {
        assert_eq!(
            status.get(name.as_str()).map(String::as_str),
            Some("simulated"),
            "{name} is governed but the simulated driver does not simulate it (tests/fakegpu): \
             the shim's hook for it cannot be tested"
        );
        assert!(
            shim_tests.contains(base_name(name)),
            "{name} is governed but no shim test (shim/tests/*.rs, shim/tests/c/*.c) calls it"
        );
        assert!(
            governed_paragraph.contains(base_name(name)),
            "{name} is governed but crates/vgpu-shim/README.md's list of governed functions does not name it"
        );
    }
}

#[test]
fn every_intensity_source_is_documented_configured_and_fuzzed() {
    let readme = read("docs/carbon-budgets.md");
    let example = read("examples/config.toml");
    let fuzz = read("fuzz/src/lib.rs");
    let example_sources = example
        .lines()
        .find(|l| l.contains("Where the grid carbon intensity comes from"))
        .expect("examples/config.toml lists the intensity sources");
    let readme_sources = readme
        .lines()
        .find(|l| l.starts_with("source = ") && l.contains("# static"))
        .expect("docs/carbon-budgets.md's carbon example lists the intensity sources");
    for kind in SourceKind::value_variants() {
        let name = kind.name();
        assert_eq!(
            kind.to_possible_value().map(|v| v.get_name().to_string()),
            Some(name.to_string()),
            "{kind:?}: SourceKind::name and the config's spelling differ"
        );
        let config = format!("[carbon]\nsource = \"{name}\"\n");
        let parsed: Result<toml::Table, _> = toml::from_str(&config);
        let carbon: vgpu_carbon::config::CarbonConfig =
            parsed.expect("toml").get("carbon").cloned().expect("[carbon]").try_into().expect("source parses");
        assert_eq!(carbon.source, Some(*kind), "source = {name:?} does not select {kind:?}");
        assert!(
            readme.contains(&format!("| `{name}` |")),
            "docs/carbon-budgets.md's [carbon] key table has no row for the {name} source's keys"
        );
        assert!(readme_sources.contains(name), "docs/carbon-budgets.md's `source = …` line does not list {name}");
        assert!(example_sources.contains(name), "examples/config.toml does not list the {name} source");
        // Every source but `static` parses input from outside vgpu (a file, a command's output,
        // an HTTP answer): its parser must be a fuzz target's.
        if *kind != SourceKind::Static {
            let module = name.replace('-', "_");
            assert!(
                fuzz.contains(&format!("{module}::")),
                "the {name} source's parser is not fuzzed (fuzz/src/lib.rs never calls intensity::{module})"
            );
        }
    }
}

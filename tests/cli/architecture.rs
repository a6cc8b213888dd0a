//! The architecture, checked: the crate table of ARCHITECTURE.md is the workspace's
//! dependency graph, and no crate's top-level modules import each other in a circle (the
//! module graph is read by tests/support/module_graph.rs, which the shim's layering test
//! shares). Cargo already refuses a circle between crates.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

#[path = "../support/module_graph.rs"]
mod module_graph;

/// A circle between top-level modules of the crate whose sources are `src`, if any.
fn circle(src: &Path) -> Option<String> {
    let graph = module_graph::graph(src);
    let edges: BTreeMap<&str, Vec<&str>> =
        graph.iter().map(|(m, uses)| (m.as_str(), uses.keys().map(String::as_str).collect())).collect();
    module_graph::find_cycle(&edges).map(|c| c.join(" → "))
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// The workspace's crates (directory name → package name) and their dependencies among
/// themselves (`[dependencies]` only: a dev-dependency may point anywhere).
fn crate_graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = workspace().join("crates");
    let mut names = BTreeMap::new();
    let mut manifests = BTreeMap::new();
    for entry in fs::read_dir(&root).expect("crates/") {
        let dir = entry.expect("entry").path();
        let manifest: toml::Table = fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml").parse().expect("TOML");
        let name = manifest["package"]["name"].as_str().expect("package.name").to_string();
        names.insert(name.clone(), ());
        manifests.insert(name, manifest);
    }
    manifests
        .iter()
        .map(|(name, manifest)| {
            let deps = manifest
                .get("dependencies")
                .and_then(|d| d.as_table())
                .map(|d| d.keys().filter(|k| names.contains_key(*k)).cloned().collect())
                .unwrap_or_default();
            (name.clone(), deps)
        })
        .collect()
}

/// ARCHITECTURE.md's crate table, the first table of its `## Crates` section:
/// `| \`crate\` | job | may depend on |`.
fn documented_crates() -> BTreeMap<String, BTreeSet<String>> {
    let text = fs::read_to_string(workspace().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = text.split("\n## ").find(|s| s.starts_with("Crates")).expect("ARCHITECTURE.md has a `## Crates` section");
    let mut table = BTreeMap::new();
    for line in section.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 3 {
            continue;
        }
        let name = cells[0].trim_matches('`').trim_end_matches('/').to_string();
        let deps = cells[2]
            .split(',')
            .map(|d| d.trim().trim_matches('`').to_string())
            .filter(|d| !d.is_empty() && d != "—")
            .collect();
        table.insert(name, deps);
    }
    table
}

#[test]
fn the_crate_table_is_the_dependency_graph() {
    let actual = crate_graph();
    let documented = documented_crates();
    let mut wrong = Vec::new();
    for (name, deps) in &actual {
        match documented.get(name) {
            None => wrong.push(format!("{name} is not in ARCHITECTURE.md's crate table")),
            Some(doc) if doc != deps => wrong.push(format!("{name} depends on {deps:?}, ARCHITECTURE.md says {doc:?}")),
            Some(_) => {}
        }
    }
    for name in documented.keys().filter(|n| !actual.contains_key(*n)) {
        wrong.push(format!("ARCHITECTURE.md lists {name}, which is not a crate under crates/"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every feature a crate's `[dev-dependencies]` asks of a workspace crate (the
/// `test-support` fixtures), `workspace-hack` asks too: else the plain and the test build
/// compile that crate and everything above it twice (see its Cargo.toml).
#[test]
fn workspace_hack_asks_every_feature_the_tests_ask_of_a_workspace_crate() {
    let root = workspace().join("crates");
    let manifest = |dir: &Path| -> toml::Table { fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml").parse().expect("TOML") };
    let features = |deps: Option<&toml::Value>| -> BTreeSet<(String, String)> {
        let Some(deps) = deps.and_then(|d| d.as_table()) else { return BTreeSet::new() };
        deps.iter()
            .filter(|(name, _)| root.join(name).is_dir())
            .flat_map(|(name, spec)| {
                let asked = spec.get("features").and_then(|f| f.as_array()).cloned().unwrap_or_default();
                asked.into_iter().filter_map(|f| f.as_str().map(str::to_string)).map(move |f| (name.clone(), f))
            })
            .collect()
    };
    let hack = features(manifest(&root.join("workspace-hack")).get("dependencies"));
    let mut missing = Vec::new();
    for entry in fs::read_dir(&root).expect("crates/") {
        let dir = entry.expect("entry").path();
        for (name, feature) in features(manifest(&dir).get("dev-dependencies")) {
            if !hack.contains(&(name.clone(), feature.clone())) {
                missing.push(format!("{} asks {name}/{feature} in [dev-dependencies]; crates/workspace-hack does not", dir.display()));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    assert!(hack.contains(&("vgpu-store".to_string(), "test-support".to_string())), "the check reads workspace-hack's dependencies");
}

#[test]
fn no_crate_has_a_circle_between_its_top_level_modules() {
    let mut found = Vec::new();
    for entry in fs::read_dir(workspace().join("crates")).expect("crates/") {
        let src = entry.expect("entry").path().join("src");
        if let Some(circle) = circle(&src) {
            found.push(format!("{}: {circle}", src.display()));
        }
    }
    assert!(found.is_empty(), "import circles between top-level modules:\n{}", found.join("\n"));
}

/// The check sees a circle that runs through a `super::` and skips one only mentioned in a
/// comment (a test of the test).
#[test]
fn a_circle_in_a_crate_is_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    fs::create_dir(src.join("b")).expect("mkdir");
    fs::write(src.join("lib.rs"), "pub mod a; pub mod b; pub mod c;").expect("write");
    fs::write(src.join("a.rs"), "use crate::b::X;").expect("write");
    fs::write(src.join("b/mod.rs"), "mod inner;").expect("write");
    fs::write(src.join("b/inner.rs"), "use super::super::c::Y;").expect("write");
    fs::write(src.join("c.rs"), "// crate::a is only mentioned\n").expect("write");
    assert_eq!(circle(src), None);
    fs::write(src.join("c.rs"), "fn f() { crate::a::g() }").expect("write");
    assert_eq!(circle(src).as_deref(), Some("a → b → c → a"));
}

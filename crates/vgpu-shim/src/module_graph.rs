//! The layering of the crate's top-level modules, checked against the sources.
//!
//! Every `shim/src/X.rs` or `shim/src/X/` is one top-level module. This test reads the
//! crate's own sources, finds every reference one top-level module makes to another
//! (`crate::X…`, `$crate::X…`, `crate::{X, Y::…}`, and `super::…` reaching the crate root
//! from a module's root file), and fails if the references form a cycle (naming it) or if a
//! module uses one that [`MAY_USE`] does not allow it. A module may use its own submodules
//! and `super::` freely; only references between top-level modules count.

use std::path::Path;

// The reader and the checks, shared with the workspace's `architecture` test.
#[path = "../../../tests/support/module_graph.rs"]
mod reader;
use reader::{check, code_only, graph, references, Graph};

/// The layering, bottom to top: each top-level module and the top-level modules it may use,
/// all of them listed before it. `lib` is the crate root (`lib.rs`).
const MAY_USE: &[(&str, &[&str])] = &[
    ("lib", &[]),
    ("module_graph", &[]),
    ("ffi", &[]),
    ("log", &[]),
    ("spinlock", &[]),
    ("governed", &[]),
    ("guard", &["log"]),
    ("real", &["ffi", "governed", "log"]),
    ("state", &["log"]),
    ("governor", &["ffi", "guard", "log", "real", "spinlock", "state"]),
    ("fork", &["governor", "log", "state"]),
    ("config", &["fork", "guard", "log", "state"]),
    ("hooks", &["config", "ffi", "governor", "guard", "real", "state"]),
    ("interpose", &["ffi", "governed", "guard", "hooks", "log", "real"]),
];

#[test]
fn top_level_modules_form_the_documented_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    if let Err(e) = check(&graph, MAY_USE) {
        panic!("{e}");
    }
}

#[test]
fn the_reader_finds_every_form_of_reference() {
    let root_file = vec!["a".to_string()];
    let sub_file = vec!["a".to_string(), "b".to_string()];
    let refs = |src: &str, path: &[String]| Vec::from_iter(references(&code_only(src), path));
    assert_eq!(refs("use crate::x::y;\nfn f() { crate::z::g() }", &root_file), ["x", "z"]);
    assert_eq!(refs("use crate::{x, y::{p, q}, z::r};", &root_file), ["x", "y", "z"]);
    assert_eq!(refs("macro_rules! m { () => { $crate::x::f() } }", &root_file), ["x"]);
    assert_eq!(refs("// crate::x\n/* crate::y */ /// crate::z\nlet s = \"crate::w\";", &root_file), [""; 0]);
    let literals = "let c = '\"'; let s = r#\"crate::w\"#; fn f<'a>(x: &'a crate::v::T) {}";
    assert_eq!(refs(literals, &root_file), ["v"]);
    // super:: from a root file is the crate root; from a submodule file, its own module.
    assert_eq!(refs("use super::x::f;", &root_file), ["x"]);
    assert_eq!(refs("use super::{x, y};", &root_file), ["x", "y"]);
    assert_eq!(refs("use super::*;", &root_file), ["*"]);
    assert_eq!(refs("use super::c::f;", &sub_file), [""; 0]);
    assert_eq!(refs("use super::super::x::f;", &sub_file), ["x"]);
    // Inside an inline module, super:: is the file's own module.
    assert_eq!(refs("mod tests { use super::*; }\nuse super::y;", &root_file), ["y"]);
    assert_eq!(refs("pub(super) fn f() {}", &root_file), [""; 0]);
    assert_eq!(refs("let q = '\\''; let u = '\\u{7f}'; use crate::x;", &root_file), ["x"]);
}

#[test]
fn a_cycle_or_an_unlisted_use_fails() {
    fn add(graph: &mut Graph, a: &str, b: &str) {
        graph.entry(a.into()).or_default().entry(b.into()).or_default().insert(format!("{a}.rs"));
        graph.entry(b.into()).or_default();
    }
    let mut graph = Graph::new();
    add(&mut graph, "top", "low");
    let layers: &[(&str, &[&str])] = &[("low", &[]), ("top", &["low"])];
    assert_eq!(check(&graph, layers), Ok(()));
    let e = check(&graph, &[("low", &[]), ("top", &[])]).unwrap_err();
    assert!(e.contains("top uses low (top.rs), which MAY_USE does not allow"), "{e}");
    let e = check(&graph, &[("top", &["low"]), ("low", &[])]).unwrap_err();
    assert!(e.contains("not listed before it"), "{e}");
    add(&mut graph, "low", "top");
    let e = check(&graph, layers).unwrap_err();
    assert!(e.contains("cycle: low -> top -> low"), "{e}");
    assert!(e.contains("low -> top (low.rs)"), "{e}");
}

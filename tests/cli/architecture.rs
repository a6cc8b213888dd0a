//! The architecture, checked: the crate table of ARCHITECTURE.md is the workspace's
//! dependency graph, and no crate's top-level modules import each other in a circle.
//!
//! A top-level module is `src/X.rs` or `src/X/` of a crate; "A uses B" when a file of A
//! names `crate::B` (also inside a `crate::{…}` group, or as `super::B` climbing to the
//! crate root), outside comments. Cargo already refuses a circle between crates.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// `line` without its `//` comment (a `//` inside a string literal also ends it: harmless
/// here, since only `crate::` paths are looked for).
fn code_of(line: &str) -> &str {
    match line.find("//") {
        Some(at) => &line[..at],
        None => line,
    }
}

/// The identifiers at the top level of a `{a, b::c, d as e}` group starting at `text`.
fn group_heads(text: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut at_item) = (0, true);
    let mut ident = String::new();
    for c in text.chars() {
        match c {
            '{' => {
                depth += 1;
                if depth > 1 {
                    at_item = false;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => {
                if !ident.is_empty() {
                    heads.push(std::mem::take(&mut ident));
                }
                at_item = true;
            }
            c if at_item && depth == 1 && (c.is_alphanumeric() || c == '_') => ident.push(c),
            _ if at_item && !ident.is_empty() => {
                heads.push(std::mem::take(&mut ident));
                at_item = false;
            }
            _ => {}
        }
    }
    if !ident.is_empty() {
        heads.push(ident);
    }
    heads
}

fn ident_at(text: &str) -> String {
    text.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// The crate-root names one file refers to. `depth`: how many modules deep the file is
/// (`src/a.rs` and `src/a/mod.rs`: 1; `src/a/b.rs`: 2).
pub fn root_names(source: &str, depth: usize) -> BTreeSet<String> {
    let mut code = String::new();
    let mut in_block = false;
    for line in source.lines() {
        let mut rest = line;
        if in_block {
            match rest.find("*/") {
                Some(end) => {
                    rest = &rest[end + 2..];
                    in_block = false;
                }
                None => continue,
            }
        }
        let mut kept = String::new();
        while let Some(start) = rest.find("/*") {
            kept.push_str(&rest[..start]);
            match rest[start..].find("*/") {
                Some(end) => rest = &rest[start + end + 2..],
                None => {
                    in_block = true;
                    rest = "";
                }
            }
        }
        kept.push_str(rest);
        code.push_str(code_of(&kept));
        code.push('\n');
    }
    let mut names = BTreeSet::new();
    let supers = "super::".repeat(depth);
    let bytes = code.as_bytes();
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && (bytes[at - 1] == b'$' || bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':') {
            continue;
        }
        let after = &code[at + "crate::".len()..];
        if after.starts_with('{') {
            names.extend(group_heads(after));
        } else {
            names.insert(ident_at(after));
        }
    }
    if depth > 0 {
        for (at, _) in code.match_indices(&supers) {
            let after = &code[at + supers.len()..];
            if at >= 2 && &code[at - 2..at] == "::" || after.starts_with("super::") {
                continue;
            }
            if after.starts_with('{') {
                names.extend(group_heads(after));
            } else {
                names.insert(ident_at(after));
            }
        }
    }
    names.remove("");
    names
}

/// Top-level module → the other top-level modules it uses, for the crate at `src`.
pub fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, files);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let top = |rel: &Path| -> Option<String> {
        let first = rel.components().next()?.as_os_str().to_str()?.to_string();
        let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
        (name != "lib" && name != "main").then_some(name)
    };
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top(f.strip_prefix(src).ok()?)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    for file in &files {
        let rel = file.strip_prefix(src).expect("below src");
        let Some(me) = top(rel) else { continue };
        let parts = rel.components().count();
        let depth = if rel.ends_with("mod.rs") { parts - 1 } else { parts };
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for name in root_names(&text, depth) {
            if name != me && modules.contains(&name) {
                graph.get_mut(&me).expect("module").insert(name);
            }
        }
    }
    graph
}

/// Every circle of the graph (its strongly connected components of more than one module).
pub fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm, recursive: the graphs are a few dozen modules.
    struct T<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
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

#[test]
fn no_crate_has_a_circle_between_its_top_level_modules() {
    let mut found = Vec::new();
    for entry in fs::read_dir(workspace().join("crates")).expect("crates/") {
        let src = entry.expect("entry").path().join("src");
        for circle in circles(&module_graph(&src)) {
            found.push(format!("{}: {}", src.display(), circle.join(" ↔ ")));
        }
    }
    assert!(found.is_empty(), "import circles between top-level modules:\n{}", found.join("\n"));
}

/// The checker finds what it must (a test of the test).
#[test]
fn the_checker_sees_paths_groups_supers_and_skips_comments() {
    let names = root_names("use crate::{a::x, b, c as d};\n// crate::commented\nlet y = crate::e::f();\n/* crate::block */ use super::g;\n$crate::macro_only", 1);
    assert_eq!(names, ["a", "b", "c", "e", "g"].map(String::from).into());
    assert_eq!(root_names("use super::sibling;", 2), BTreeSet::new(), "super from depth 2 is the parent module");
    assert_eq!(root_names("use super::super::top;", 2), ["top".to_string()].into());

    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    fs::create_dir(src.join("b")).expect("mkdir");
    fs::write(src.join("lib.rs"), "pub mod a; pub mod b; pub mod c;").expect("write");
    fs::write(src.join("a.rs"), "use crate::b::X;").expect("write");
    fs::write(src.join("b/mod.rs"), "mod inner;").expect("write");
    fs::write(src.join("b/inner.rs"), "use super::super::c::Y;").expect("write");
    fs::write(src.join("c.rs"), "// crate::a is only mentioned\n").expect("write");
    assert!(circles(&module_graph(src)).is_empty());
    fs::write(src.join("c.rs"), "fn f() { crate::a::g() }").expect("write");
    assert_eq!(circles(&module_graph(src)), vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]);
}

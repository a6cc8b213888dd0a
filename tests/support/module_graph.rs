//! The module graph of a crate, read from its sources: which top-level modules use which.
//! One definition, for the shim's layering test (`crates/vgpu-shim/src/module_graph.rs`,
//! with its `MAY_USE` table) and the workspace's `architecture` test (no crate has a circle
//! between its top-level modules). Included by path; test code only.
//!
//! Every `src/X.rs` or `src/X/` is one top-level module (`lib` is the crate root). A
//! reference is `crate::X…`, `$crate::X…`, `crate::{X, Y::…}`, or `super::…` reaching the
//! crate root, in code (comments and literals are skipped). A module may use its own
//! submodules and `super::` freely; only references between top-level modules count.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `src` with comments removed and the contents of string and character literals blanked,
/// so that only code is searched.
pub fn code_only(src: &str) -> String {
    let s: Vec<char> = src.chars().collect();
    let n = s.len();
    let mut out = String::with_capacity(n);
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < n {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < n && s[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < n {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
            continue;
        }
        // Raw strings: r"…", r#"…"#, br"…", cr"…" (not raw identifiers like r#type).
        let starts_word = |k: usize| k == 0 || !ident(s[k - 1]);
        if c == 'r' && (starts_word(i) || matches!(s[i - 1], 'b' | 'c') && starts_word(i - 1)) {
            let mut j = i + 1;
            while j < n && s[j] == '#' {
                j += 1;
            }
            if j < n && s[j] == '"' {
                let hashes = j - i - 1;
                j += 1;
                let closes = |j: usize| s[j] == '"' && s[j + 1..].iter().take(hashes).filter(|&&h| h == '#').count() == hashes;
                while j < n && !closes(j) {
                    j += 1;
                }
                out.push_str("\"\"");
                i = j + 1 + hashes;
                continue;
            }
        }
        if c == '"' {
            let mut j = i + 1;
            while j < n && s[j] != '"' {
                j += if s[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
            continue;
        }
        if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a, 'static).
            if next == Some('\\') {
                let mut j = i + 3;
                while j < n && s[j] != '\'' {
                    j += 1;
                }
                out.push_str("' '");
                i = j + 1;
                continue;
            }
            if s.get(i + 2) == Some(&'\'') {
                out.push_str("' '");
                i += 3;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// The module path of a source file relative to `src/` (`governor/mod.rs` → `[governor]`).
pub fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// A tiny tokenizer over code-only text: identifiers, `::`, and single punctuation.
pub fn tokens(code: &str) -> Vec<String> {
    let s: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_') {
                i += 1;
            }
            out.push(s[start..i].iter().collect());
        } else if c == ':' && s.get(i + 1) == Some(&':') {
            out.push("::".to_string());
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

/// The first segments named at `t[k..]`: `X` of `X::…`, or each item of a `{X, Y::…}` group.
pub fn named_at(t: &[String], k: usize) -> Vec<String> {
    match t.get(k).map(String::as_str) {
        Some("{") => {
            let (mut depth, mut first_of_item, mut names) = (0, true, Vec::new());
            for tok in &t[k..] {
                match tok.as_str() {
                    "{" => {
                        depth += 1;
                        continue;
                    }
                    "}" => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                        continue;
                    }
                    "," if depth == 1 => {
                        first_of_item = true;
                        continue;
                    }
                    _ => {}
                }
                if depth == 1 && first_of_item {
                    names.push(tok.clone());
                    first_of_item = false;
                }
            }
            names
        }
        Some(name) => vec![name.to_string()],
        None => Vec::new(),
    }
}

/// The top-level names (modules, or items of the crate root) that the code of a file at
/// module path `path` refers to.
pub fn references(code: &str, path: &[String]) -> BTreeSet<String> {
    let t = tokens(code);
    let mut found = BTreeSet::new();
    // Brace depths at which inline `mod NAME {` blocks opened (each adds a path segment).
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0;
    let mut k = 0;
    while k < t.len() {
        let tok = t[k].as_str();
        let after_path = k > 0 && t[k - 1] == "::";
        match tok {
            "{" => depth += 1,
            "}" => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
                depth -= 1;
            }
            "mod" if t.get(k + 2).map(String::as_str) == Some("{") => {
                depth += 1;
                inline.push(depth);
                k += 3;
                continue;
            }
            "crate" if !after_path && t.get(k + 1).map(String::as_str) == Some("::") => {
                found.extend(named_at(&t, k + 2));
            }
            "super" if !after_path && t.get(k + 1).map(String::as_str) == Some("::") => {
                let is = |j: usize, s: &str| t.get(j).map(String::as_str) == Some(s);
                let mut ups = 0;
                let mut j = k;
                while is(j, "super") && is(j + 1, "::") {
                    ups += 1;
                    j += 2;
                }
                // Up to the crate root: what follows names a top-level module (or `*`, the
                // root itself).
                if ups >= path.len() + inline.len() {
                    found.extend(named_at(&t, j));
                }
                k = j;
                continue;
            }
            _ => {}
        }
        k += 1;
    }
    found
}

/// Top-level module → (module it uses → the files that use it).
pub type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The crate's top-level module graph, read from `src`.
pub fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let path_of = |file: &PathBuf| module_path(file.strip_prefix(src).unwrap());
    let module_of = |path: &[String]| path.first().cloned().unwrap_or_else(|| "lib".to_string());
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&path_of(f))).collect();
    let mut graph = Graph::new();
    for file in &files {
        let path = path_of(file);
        let module = module_of(&path);
        let uses = graph.entry(module.clone()).or_default();
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        for name in references(&code, &path) {
            // A name that is no top-level module is an item of the crate root.
            let target = if modules.contains(&name) { name } else { "lib".to_string() };
            if target != module {
                let shown = file.strip_prefix(src).unwrap().display().to_string();
                uses.entry(target).or_default().insert(shown);
            }
        }
    }
    graph
}

/// A cycle of `edges`, as the list of its nodes (first = last), if there is one.
pub fn find_cycle<'a>(edges: &BTreeMap<&'a str, Vec<&'a str>>) -> Option<Vec<&'a str>> {
    fn visit<'a>(
        node: &'a str,
        edges: &BTreeMap<&'a str, Vec<&'a str>>,
        state: &mut BTreeMap<&'a str, bool>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<&'a str>> {
        // state: false = on the current path, true = done.
        match state.get(node) {
            Some(true) => return None,
            Some(false) => {
                let from = stack.iter().position(|&n| n == node).unwrap();
                let mut cycle = stack[from..].to_vec();
                cycle.push(node);
                return Some(cycle);
            }
            None => {}
        }
        state.insert(node, false);
        stack.push(node);
        for &next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, state, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        state.insert(node, true);
        None
    }
    let mut state = BTreeMap::new();
    edges.keys().find_map(|&node| visit(node, edges, &mut state, &mut Vec::new()))
}

pub fn check(graph: &Graph, may_use: &[(&str, &[&str])]) -> Result<(), String> {
    let edges: BTreeMap<&str, Vec<&str>> = graph
        .iter()
        .map(|(m, uses)| (m.as_str(), uses.keys().map(String::as_str).collect()))
        .collect();
    if let Some(cycle) = find_cycle(&edges) {
        let steps: Vec<String> = cycle
            .windows(2)
            .map(|w| {
                let files = Vec::from_iter(graph[w[0]][w[1]].iter().cloned()).join(", ");
                format!("  {} -> {} ({files})", w[0], w[1])
            })
            .collect();
        let cycle = cycle.join(" -> ");
        return Err(format!("top-level modules use each other in a cycle: {cycle}\n{}", steps.join("\n")));
    }
    let mut errors = Vec::new();
    for (i, (module, allowed)) in may_use.iter().enumerate() {
        if !graph.contains_key(*module) {
            errors.push(format!("MAY_USE lists {module}, which is not a top-level module of src/"));
        }
        for used in allowed.iter() {
            if !may_use[..i].iter().any(|(m, _)| m == used) {
                errors.push(format!(
                    "MAY_USE: {module} may use {used}, which is not listed before it (the table is bottom to top)"
                ));
            }
        }
    }
    for (module, uses) in graph {
        let Some((_, allowed)) = may_use.iter().find(|(m, _)| m == module) else {
            errors.push(format!("{module} is not in MAY_USE: add it where it belongs in the layering"));
            continue;
        };
        for (used, files) in uses {
            if !allowed.contains(&used.as_str()) {
                let files = Vec::from_iter(files.iter().cloned()).join(", ");
                errors.push(format!("{module} uses {used} ({files}), which MAY_USE does not allow"));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

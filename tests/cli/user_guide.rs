//! The user guide (docs/, an mdBook: book.toml) builds and its links hold, checked as
//! `mdbook build` would without needing mdbook in CI: docs/SUMMARY.md's entries exist and
//! every page of docs/ is one of them; every relative link of README.md and of the guide
//! resolves to a file of the repository, and every `#anchor` to a heading of its target
//! (mdBook's and GitHub's ids: lowercase, spaces to `-`, other punctuation dropped, `-N`
//! for a repeated heading). Nothing refers to files outside the repository; the README stays
//! a front door of at most 300 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).canonicalize().expect("repository root")
}

/// A heading's id, as mdBook (`normalize_id`) and GitHub make it.
fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_lowercase().collect::<String>()),
            c if c.is_whitespace() => Some("-".to_string()),
            _ => None,
        })
        .collect()
}

/// Lines of Markdown outside fenced code blocks, numbered from 1.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut fence = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if !fence {
            out.push((n + 1, line));
        }
    }
    out
}

/// The ids of a Markdown file's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let Some(title) = line.strip_prefix('#').map(|l| l.trim_start_matches('#')).and_then(|l| l.strip_prefix(' ')) else {
            continue;
        };
        let id = slug(title.trim());
        let n = seen.entry(id.clone()).or_default();
        out.insert(if *n == 0 { id.clone() } else { format!("{id}-{n}") });
        *n += 1;
    }
    out
}

/// Every inline link target `[text](target)` of the prose, with its line, code spans left out.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(text) {
        // Code spans hold examples, not links.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else {
                break;
            };
            out.push((n, after[..end].to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// `path` with `.` and `..` resolved lexically; None when it climbs out of the repository.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// The problems of the links of `file` (repository-relative).
fn check_links(file: &str) -> Vec<String> {
    let root = repo();
    let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let dir = Path::new(file).parent().unwrap_or(Path::new(""));
    let mut problems = Vec::new();
    for (n, target) in links(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() { Some(PathBuf::from(file)) } else { normalise(&dir.join(path)) };
        let Some(resolved) = resolved else {
            problems.push(format!("{file}:{n}: {target} points outside the repository"));
            continue;
        };
        if !root.join(&resolved).exists() {
            problems.push(format!("{file}:{n}: {target}: no {}", resolved.display()));
            continue;
        }
        if let Some(anchor) = anchor {
            let target_text = std::fs::read_to_string(root.join(&resolved)).unwrap_or_default();
            if !anchors(&target_text).contains(anchor) {
                problems.push(format!("{file}:{n}: {target}: {} has no heading #{anchor}", resolved.display()));
            }
        }
    }
    problems
}

/// The pages docs/SUMMARY.md lists, in order.
fn summary_pages() -> Vec<String> {
    let summary = std::fs::read_to_string(repo().join("docs/SUMMARY.md")).expect("docs/SUMMARY.md");
    links(&summary).into_iter().map(|(_, t)| t).collect()
}

#[test]
fn the_summary_lists_every_page_once_and_each_exists() {
    let pages = summary_pages();
    let listed: BTreeSet<&String> = pages.iter().collect();
    assert_eq!(listed.len(), pages.len(), "a page is listed twice: {pages:?}");
    for page in &pages {
        assert!(repo().join("docs").join(page).is_file(), "docs/SUMMARY.md lists {page}, which does not exist (mdbook build would create it empty)");
    }
    let on_disk: BTreeSet<String> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && n != "SUMMARY.md")
        .collect();
    let unlisted: Vec<&String> = on_disk.iter().filter(|n| !listed.contains(n)).collect();
    assert!(unlisted.is_empty(), "pages of docs/ that docs/SUMMARY.md does not list (the book would leave them out): {unlisted:?}");
    let book = std::fs::read_to_string(repo().join("book.toml")).expect("book.toml");
    assert!(book.contains("src = \"docs\""), "book.toml's [book] src is not docs/");
    for page in &pages {
        let text = std::fs::read_to_string(repo().join("docs").join(page)).unwrap();
        assert!(text.starts_with("# "), "docs/{page} does not start with its title");
    }
}

#[test]
fn every_link_of_the_readme_and_the_guide_resolves() {
    let mut files = vec!["README.md".to_string(), "ARCHITECTURE.md".to_string(), "docs/SUMMARY.md".to_string()];
    files.extend(summary_pages().into_iter().map(|p| format!("docs/{p}")));
    let problems: Vec<String> = files.iter().flat_map(|f| check_links(f)).collect();
    assert!(problems.is_empty(), "broken links:\n{}", problems.join("\n"));
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines: reference material goes into the guide (docs/)");
    // Its two set-up commands, exactly as a newcomer pastes them.
    for command in ["    ./install.sh && vgpu --simulate run --mem 4G -- python3 examples/alloc.py 6\n", "    cargo build --workspace && cargo test --workspace\n"] {
        assert!(readme.contains(command), "README.md lacks the set-up command {command:?}");
    }
    assert!(readme.contains("FAKEGPU_CONFIG"), "the tour shows how to simulate GPUs");
    // Nothing a user of the repository does not have.
    let mut files = vec!["README.md".to_string()];
    files.extend(summary_pages().into_iter().map(|p| format!("docs/{p}")));
    for file in files {
        let text = std::fs::read_to_string(repo().join(&file)).unwrap();
        for outside in ["../shared", "SPEC.md", "SPEC 1."] {
            assert!(!text.contains(outside), "{file} refers to {outside:?}, which is not in the repository");
        }
    }
}

#[test]
fn the_checker_finds_what_it_should() {
    assert_eq!(slug("The service (`systemd/vgpu-watch.service`)"), "the-service-systemdvgpu-watchservice");
    assert_eq!(slug("What `sudo` grants"), "what-sudo-grants");
    let a = anchors("# A\n## B\n```\n# not\n```\n## B\n");
    assert_eq!(a, ["a", "b", "b-1"].iter().map(|s| s.to_string()).collect());
    assert_eq!(links("[x](a.md#b) `[y](no.md)` [z](c.md)"), vec![(1, "a.md#b".to_string()), (1, "c.md".to_string())]);
    assert_eq!(normalise(Path::new("docs/../README.md")), Some(PathBuf::from("README.md")));
    assert_eq!(normalise(Path::new("../x")), None);
}

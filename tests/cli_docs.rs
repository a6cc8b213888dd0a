//! The man page is generated from the clap definition; it must never go stale.
//! Regenerate with: VGPU_BLESS=1 cargo test --test cli_docs

use std::path::Path;

#[test]
fn man_page_is_in_sync_with_the_cli() {
    let rendered = vgpu::cli::render_man_page().expect("render man page");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("man/vgpu.1");
    if std::env::var_os("VGPU_BLESS").is_some() {
        std::fs::write(&path, &rendered).expect("write man/vgpu.1");
    }
    let on_disk = std::fs::read(&path).unwrap_or_default();
    assert!(
        on_disk == rendered,
        "man/vgpu.1 is stale: regenerate it with `VGPU_BLESS=1 cargo test --test cli_docs`"
    );
    let text = String::from_utf8_lossy(&rendered);
    for needle in [".TH vgpu 1", "devices", "doctor", "completions", "\\-\\-simulate", "VGPU_STATE_DIR"] {
        assert!(text.contains(needle), "man page lacks {needle:?}");
    }
}

#[test]
fn completions_are_generated_for_each_shell() {
    for (shell, marker) in [("bash", "complete -F"), ("zsh", "#compdef vgpu"), ("fish", "complete -c vgpu")] {
        let out = assert_cmd::Command::cargo_bin("vgpu").unwrap().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {}", String::from_utf8_lossy(&out.stderr));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(marker), "{shell} script lacks {marker:?}");
        assert!(script.contains("devices") && script.contains("doctor"), "{shell} script lacks subcommands");
    }
}

#[test]
fn clap_definition_is_consistent() {
    vgpu::cli::command().debug_assert();
}

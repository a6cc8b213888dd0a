//! The shipped config (examples/config.toml) parses as it is, and with every commented
//! `key = value` line switched on: each documented key is a real key with a valid value.

use vgpu_host::config::Config;

const SHIPPED: &str = include_str!("../../examples/config.toml");

#[test]
fn shipped_config_parses_as_is() {
    let config = Config::parse(SHIPPED).expect("examples/config.toml as shipped");
    config.validate().expect("examples/config.toml as shipped validates");
}

#[test]
fn every_documented_key_is_valid() {
    // "# key = value" → "key = value"; "# [table]" → "[table]"; prose stays a comment.
    let mut switched_on = String::new();
    let mut keys = 0;
    for line in SHIPPED.lines() {
        let body = line.strip_prefix("# ").unwrap_or(line);
        let is_setting = body.split_once(" = ").is_some_and(|(k, _)| !k.contains(' ') || k.starts_with('"'));
        let is_table = body.starts_with('[') && body.trim_end().ends_with(']') || body.starts_with("[[") || body.starts_with("[pool.");
        if line.starts_with("# ") && (is_setting || is_table) {
            let code = body.split(" #").next().unwrap_or(body);
            switched_on.push_str(code);
            keys += usize::from(is_setting);
        } else {
            switched_on.push_str(line);
        }
        switched_on.push('\n');
    }
    // One source at a time is what validate() expects; the parser takes them all.
    let config = Config::parse(&switched_on).unwrap_or_else(|e| panic!("{e}\n---\n{switched_on}"));
    assert!(keys >= 30, "only {keys} documented keys found");
    assert_eq!(config.pool.devices.len(), 1);
    assert_eq!(config.state_dir.as_deref(), Some(std::path::Path::new("/run/vgpu")));
}

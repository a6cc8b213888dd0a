//! The workload's environment: what `vgpu run` passes its child, and the variables the shim
//! (and the simulated driver) depend on, which nothing else may replace.

use std::ffi::OsString;
use std::path::Path;

use anyhow::Result;

use crate::context::Context;
use vgpu_store::state::Store;
use vgpu_store::state::Workload;

use super::Request;

/// How vgpu guards a variable the shim (or the simulated driver) depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShimVar {
    /// vgpu alone sets it (or leaves it out): `--env` may not name it, and a value inherited
    /// from vgpu's own environment never reaches the workload.
    Owned,
    /// A search list whose head vgpu sets: `--env K=V` (non-empty) and an inherited value only
    /// come after it.
    Appended,
}

/// The variables the shim and the simulated driver depend on: the one list. Neither `--env`
/// nor vgpu's own environment can unset or replace them (see [`workload_env`]).
pub const SHIM_ENV: &[(&str, ShimVar)] = &[
    // The shim, always first; `--env LD_PRELOAD=extra.so` adds libraries after it.
    ("LD_PRELOAD", ShimVar::Appended),
    // With --simulate: the simulated driver's directory first; extra directories after it.
    ("LD_LIBRARY_PATH", ShimVar::Appended),
    // The vGPU's state: unset or empty would make the shim pass everything through.
    ("VGPU_DIR", ShimVar::Owned),
    // The shim's panic-injection test hook: a panic before the driver call falls back to the
    // unguarded driver call, so it must never reach a workload.
    ("VGPU_SHIM_TEST_PANIC", ShimVar::Owned),
    // The shim's kill-at-a-registration-step test hook: a workload stopped there would leave
    // a half-written per-process record behind at every start.
    ("VGPU_SHIM_TEST_STOP", ShimVar::Owned),
];

/// How vgpu guards variable `key`, if it is one of [`SHIM_ENV`].
pub fn shim_var(key: &str) -> Option<ShimVar> {
    SHIM_ENV.iter().find(|(k, _)| *k == key).map(|(_, kind)| *kind)
}

/// The child's environment: ours, plus the GPUs, the vGPU, the user's identity, `--env`, and
/// last the shim's variables ([`SHIM_ENV`]), so that nothing before can replace them.
pub fn workload_env(ctx: &Context, store: &Store, shim: &Path, w: &Workload, request: &Request) -> Result<Vec<(OsString, OsString)>> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            !k.starts_with("SUDO_") && shim_var(&k).is_none()
        })
        .collect();
    let mut set = |k: &str, v: OsString| {
        env.retain(|(key, _)| key != k);
        env.push((k.into(), v));
    };
    let uuids: Vec<&str> = w.gpus.iter().map(|g| g.uuid.as_str()).collect();
    set("CUDA_VISIBLE_DEVICES", uuids.join(",").into());
    set("VGPU_WORKLOAD_ID", w.id.clone().into());
    set("VGPU_WORKLOAD_NAME", w.name.clone().into());
    set("VGPU_NUM_GPUS", w.gpus.len().to_string().into());
    for (k, v) in w.pool_env.iter().filter(|(k, _)| shim_var(k).is_none()) {
        set(k, v.into());
    }
    if request.user.uid != 0 || std::env::var_os("SUDO_UID").is_some() {
        set("HOME", request.user.home.clone().into());
        set("USER", request.user.name.clone().into());
        set("LOGNAME", request.user.name.clone().into());
    }
    for (k, v) in request.env.iter().filter(|(k, _)| shim_var(k).is_none()) {
        set(k, v.into());
    }
    // The shim's variables. An Appended one: vgpu's head, then `--env`'s value (validated
    // non-empty) or else the inherited one.
    let extra = |k: &str| -> Option<OsString> {
        match request.env.iter().rev().find(|(key, _)| key == k) {
            Some((_, v)) => Some(v.into()),
            None => std::env::var_os(k).filter(|v| !v.is_empty()),
        }
    };
    let join = |head: OsString, tail: Option<OsString>| match tail {
        Some(tail) => {
            let mut v = head;
            v.push(":");
            v.push(tail);
            v
        }
        None => head,
    };
    set("LD_PRELOAD", join(shim.as_os_str().to_owned(), extra("LD_PRELOAD")));
    match ctx.driver_library_dir()? {
        Some(dir) => set("LD_LIBRARY_PATH", join(dir.into_os_string(), extra("LD_LIBRARY_PATH"))),
        None => {
            if let Some(v) = extra("LD_LIBRARY_PATH") {
                set("LD_LIBRARY_PATH", v);
            }
        }
    }
    set("VGPU_DIR", store.vgpu_dir(&w.vgpu).into_os_string());
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every test hook the shim reads from its environment (`VGPU_SHIM_TEST_…` in its
    /// sources) is one of vgpu's own variables: never set by `--env`, never inherited.
    #[test]
    fn every_shim_test_hook_is_owned() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../vgpu-shim/src");
        let mut hooks = std::collections::BTreeSet::new();
        let mut dirs = vec![src];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("the shim's sources") {
                let path = entry.expect("an entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).expect("a source file");
                    for (at, _) in text.match_indices("\"VGPU_SHIM_TEST_") {
                        let name: String = text[at + 1..].chars().take_while(|c| c.is_ascii_uppercase() || *c == '_').collect();
                        hooks.insert(name);
                    }
                }
            }
        }
        assert!(hooks.len() >= 2, "the shim's test hooks were not found: {hooks:?}");
        for hook in &hooks {
            assert_eq!(shim_var(hook), Some(ShimVar::Owned), "{hook} reaches workloads: add it to SHIM_ENV");
        }
    }
}

//! Argument types and completion candidates shared by several commands.

use std::path::PathBuf;

use clap::Args;
use clap_complete::engine::{ArgValueCandidates, CompletionCandidate};

/// `--compute PCT`: a share of a GPU's busy time, 1 to 100, with or without its `%`
/// (`30`, `30%`), as `--mem` takes `25%`.
pub fn compute_pct(text: &str) -> Result<u32, String> {
    let digits = text.trim().strip_suffix('%').unwrap_or(text.trim()).trim_end();
    match digits.parse::<u32>() {
        Ok(pct @ 1..=100) => Ok(pct),
        Ok(_) => Err(format!("{text:?} is not a share from 1 to 100 percent")),
        Err(_) => Err(format!("{text:?} is not a whole percentage (30 or 30%, from 1 to 100)")),
    }
}

#[derive(Debug, Args)]
pub struct JsonArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Completion candidates for an argument naming workloads (`kill`, `suspend`, `resume`,
/// `update`): each workload's id (its name as help) and name (its id as help), from the
/// records of the state directory that `VGPU_CONFIG`/`VGPU_STATE_DIR` point to, read as
/// they are: no lock taken or waited for, nothing written (as `vgpu_store::read_only`'s
/// listings).
pub fn workload_candidates() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        let Some(store) = completion_store() else {
            return Vec::new();
        };
        let (mut workloads, _damaged) = store.workloads();
        workloads.sort_by_key(|w| w.created_unix_ms);
        let mut out = Vec::new();
        for w in &workloads {
            let state = format!("{:?}", w.state).to_lowercase();
            out.push(CompletionCandidate::new(&w.id).help(Some(format!("{} ({state})", w.name).into())));
            if !w.name.is_empty() && w.name != w.id {
                out.push(CompletionCandidate::new(&w.name).help(Some(format!("{} ({state})", w.id).into())));
            }
        }
        out
    })
}

/// Completion candidates for a partition name, from `partitions.json` in the lib directory.
pub fn partition_candidates() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        let Some(store) = completion_store() else {
            return Vec::new();
        };
        let Ok(partitions) = vgpu_store::state::Partitions::load(&store.partitions_path()) else {
            return Vec::new();
        };
        partitions.partitions.iter().map(|p| CompletionCandidate::new(&p.name).help(Some(format!("GPU {}", p.gpu_uuid).into()))).collect()
    })
}

/// Completion candidates for a service name: the definitions in the lib directory's
/// `services/` (each with its replica range as help), read as they are.
pub fn service_candidates() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        let Some(store) = completion_store() else {
            return Vec::new();
        };
        let Ok((services, _damaged)) = vgpu_daemon::service::Services::new(&store.lib_dir).list() else {
            return Vec::new();
        };
        services.iter().map(|s| CompletionCandidate::new(&s.name).help(Some(format!("{}-{} replicas", s.min, s.max).into()))).collect()
    })
}

/// `--kind`: the pool's device kinds, and `any`.
pub fn kind_candidates() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        vgpu_pool::kind::DeviceKind::ALL
            .iter()
            .map(|k| CompletionCandidate::new(k.as_str()))
            .chain([CompletionCandidate::new("any").help(Some("any kind [default]".into()))])
            .collect()
    })
}

/// `--signal`: the signal names `kill` accepts (TERM, KILL, …), without the SIG prefix.
pub fn signal_candidates() -> ArgValueCandidates {
    ArgValueCandidates::new(|| {
        nix::sys::signal::Signal::iterator()
            .map(|s| CompletionCandidate::new(s.as_str().trim_start_matches("SIG")).help(Some(format!("{}", s as i32).into())))
            .collect()
    })
}

/// The store completions read: where `vgpu` would look with the environment as it is
/// (`--state-dir` and `--config` on the line being completed are not seen). None when the
/// config cannot be read or a directory is not as a writer would make it.
fn completion_store() -> Option<vgpu_store::state::Store> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let origin = vgpu_host::context::Origin { config: var("VGPU_CONFIG"), state_dir: var("VGPU_STATE_DIR"), lib_dir: var("VGPU_LIB_DIR"), simulate: false };
    let ctx = vgpu_host::context::Context::load(origin).ok()?;
    let store = vgpu_store::state::Store::new(&ctx.state_dir, &ctx.lib_dir);
    store.check_existing_dirs().ok()?;
    Some(store)
}

//! What a user who starts vgpu through sudo may ask for beyond the defaults: the config's
//! `[policy]` table. Root (no sudo, or root's own sudo) is never restricted.
//!
//! ```toml
//! [policy]
//! max_priority = 50                 # the highest --priority for every sudo user [default: 50]
//! oversubscribe = ["%gpuadmin"]     # users and %groups who may use --oversubscribe
//! max_mem = "8G"                    # GPU memory per GPU, or "25%" [default: no cap]
//!
//! [policy.users.alice]              # grants to one user
//! max_priority = 80
//! oversubscribe = true
//! max_mem = "40G"
//!
//! [policy.groups.ops]               # grants to every member of a group
//! max_priority = 100
//! max_mem = "100%"
//! ```
//!
//! Grants only add: a user gets the highest `max_priority`, any `oversubscribe` and the
//! largest `max_mem` (on each GPU: a size, or a share of that GPU) of the top level, their
//! own table and the tables of their groups (primary and supplementary). No `max_mem`
//! anywhere: no cap.
//!
//! `max_mem` caps every slice of a GPU a sudo user's workload reserves, however it is placed
//! (`--gpu`, `--gpus all|N`, the compute pool): without `--mem` the slice (the whole GPU, or
//! the pool's share) is lowered to the cap, as `--priority` is lowered to `max_priority`; a
//! `--mem` above it (`8G`, or `NN%` of a GPU) is refused, and so are `vgpu update --mem` and
//! `vgpu partition create --mem` above it.

use nix::unistd::Group;

use vgpu_abi::size::format_size;

use vgpu_store::admission::MemSpec;
use crate::config::PolicyConfig;
use vgpu_pool::Priority;
use vgpu_store::state::UserSpec;

/// What one sudo user may ask for.
#[derive(Debug, Clone, PartialEq)]
pub struct Allowance {
    pub max_priority: i32,
    pub oversubscribe: bool,
    /// The GPU memory they may reserve per GPU; None: no cap.
    pub max_mem: Option<MemCap>,
}

/// `max_mem`: the most GPU memory a sudo user's workload may reserve on one GPU, the most
/// generous of the values that apply to them (each a size or a share of that GPU).
#[derive(Debug, Clone, PartialEq)]
pub struct MemCap {
    /// Who it is for (messages).
    pub user: String,
    specs: Vec<MemSpec>,
}

impl MemCap {
    /// The cap on a GPU of `device_memory` bytes (never above the GPU).
    pub fn bytes_of(&self, device_memory: u64) -> u64 {
        self.specs.iter().map(|s| s.bytes_of(device_memory).min(device_memory)).max().unwrap_or(device_memory)
    }

    /// The bytes a slice gets on GPU `gpu` of `device_memory` bytes: `asked` (`--mem`), refused
    /// above the cap; or, not asked, `default` lowered to the cap.
    pub fn slice(cap: Option<&MemCap>, asked: Option<MemSpec>, default: u64, gpu: u32, device_memory: u64) -> Result<u64, PolicyError> {
        let wanted = asked.map(|m| m.bytes_of(device_memory)).unwrap_or(default);
        let Some(cap) = cap else { return Ok(wanted) };
        let max = cap.bytes_of(device_memory);
        match asked {
            Some(_) if wanted > max => Err(PolicyError::Mem { user: cap.user.clone(), gpu, asked: format_size(wanted), max: format_size(max) }),
            Some(_) => Ok(wanted),
            None => Ok(wanted.min(max)),
        }
    }
}

/// A request beyond the caller's allowance; one line naming the user, the value and the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("started through sudo by {user}: --priority {asked} is above {max}, the most the config's [policy] grants {user} (max_priority; root may use any)")]
    Priority { user: String, asked: i32, max: i32 },
    #[error("started through sudo by {user}: --oversubscribe is not granted to {user} by the config's [policy] (oversubscribe = [\"{user}\"], or [policy.users.{user}] oversubscribe = true; root may)")]
    Oversubscribe { user: String },
    #[error("started through sudo by {user}: --mem {asked} on GPU {gpu} is above {max}, the most GPU memory the config's [policy] grants {user} per GPU (max_mem; root may use any)")]
    Mem { user: String, gpu: u32, asked: String, max: String },
}

/// The allowance of `caller`, a user who ran vgpu through sudo.
pub fn allowance(policy: &PolicyConfig, caller: &UserSpec) -> Allowance {
    let in_group = |name: &str| match Group::from_name(name) {
        Ok(Some(group)) => caller.groups.contains(&group.gid.as_raw()) || caller.gid == group.gid.as_raw(),
        _ => false,
    };
    let grants: Vec<&crate::config::PolicyGrant> = policy
        .users
        .iter()
        .filter(|(name, _)| **name == caller.name)
        .chain(policy.groups.iter().filter(|(name, _)| in_group(name)))
        .map(|(_, grant)| grant)
        .collect();
    let clamp = |p: i64| p.clamp(i64::from(Priority::MIN), i64::from(Priority::MAX)) as i32;
    let max_priority = grants
        .iter()
        .filter_map(|g| g.max_priority)
        .chain(policy.max_priority)
        .map(clamp)
        .max()
        .unwrap_or(Priority::DEFAULT.get());
    let oversubscribe = grants.iter().any(|g| g.oversubscribe) || vgpu_store::identity::may_run_as_others(caller, &policy.oversubscribe);
    // Validated at load (`PolicyConfig::validate`): an unparsable value is not there.
    let specs: Vec<MemSpec> = grants.iter().filter_map(|g| g.max_mem.as_deref()).chain(policy.max_mem.as_deref()).filter_map(|m| MemSpec::parse(m).ok()).collect();
    let max_mem = (!specs.is_empty()).then(|| MemCap { user: caller.name.clone(), specs });
    Allowance { max_priority, oversubscribe, max_mem }
}

/// The GPU memory cap of `caller` (`None`: root, or no `max_mem` applies).
pub fn mem_cap(policy: &PolicyConfig, caller: Option<&UserSpec>) -> Option<MemCap> {
    caller.and_then(|c| allowance(policy, c).max_mem)
}

/// The priority a run gets and whether it may oversubscribe. `caller` is the sudo user
/// (`None`: root, unrestricted). Without `--priority` a sudo user gets the default priority,
/// lowered to their `max_priority` when that is below it.
pub fn check_run(policy: &PolicyConfig, caller: Option<&UserSpec>, priority: Option<Priority>, oversubscribe: bool) -> Result<Priority, PolicyError> {
    let Some(caller) = caller else { return Ok(priority.unwrap_or(Priority::DEFAULT)) };
    let allowed = allowance(policy, caller);
    if oversubscribe && !allowed.oversubscribe {
        return Err(PolicyError::Oversubscribe { user: caller.name.clone() });
    }
    match priority {
        Some(p) if p.get() > allowed.max_priority => Err(PolicyError::Priority { user: caller.name.clone(), asked: p.get(), max: allowed.max_priority }),
        Some(p) => Ok(p),
        None => Ok(Priority::new(i64::from(Priority::DEFAULT.get().min(allowed.max_priority))).unwrap_or(Priority::DEFAULT)),
    }
}

/// `--oversubscribe` elsewhere (`vgpu partition create`): granted or not.
pub fn check_oversubscribe(policy: &PolicyConfig, caller: Option<&UserSpec>) -> Result<(), PolicyError> {
    match caller {
        Some(caller) if !allowance(policy, caller).oversubscribe => Err(PolicyError::Oversubscribe { user: caller.name.clone() }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn nobody() -> UserSpec {
        vgpu_store::identity::sudo_caller(Some(&nix::unistd::User::from_name("nobody").unwrap().unwrap().uid.as_raw().to_string()))
            .unwrap()
            .unwrap()
    }

    fn policy(text: &str) -> PolicyConfig {
        let config = Config::parse(text).unwrap();
        config.validate().unwrap();
        config.policy
    }

    fn p(v: i64) -> Option<Priority> {
        Some(Priority::new(v).unwrap())
    }

    #[test]
    fn defaults_allow_the_default_priority_and_no_oversubscription() {
        let none = policy("");
        let caller = nobody();
        assert_eq!(allowance(&none, &caller), Allowance { max_priority: 50, oversubscribe: false, max_mem: None });
        assert_eq!(check_run(&none, Some(&caller), None, false).unwrap().get(), 50);
        assert_eq!(check_run(&none, Some(&caller), p(50), false).unwrap().get(), 50);
        assert_eq!(check_run(&none, Some(&caller), p(10), false).unwrap().get(), 10);
        let err = check_run(&none, Some(&caller), p(51), false).unwrap_err();
        assert_eq!(err, PolicyError::Priority { user: "nobody".into(), asked: 51, max: 50 });
        assert!(!err.to_string().contains('\n'));
        assert_eq!(check_run(&none, Some(&caller), None, true).unwrap_err(), PolicyError::Oversubscribe { user: "nobody".into() });
        assert!(check_oversubscribe(&none, Some(&caller)).is_err());
        // Root is not restricted.
        assert_eq!(check_run(&none, None, p(100), true).unwrap().get(), 100);
        assert!(check_oversubscribe(&none, None).is_ok());
    }

    #[test]
    fn grants_add_up_from_the_top_level_the_user_and_their_groups() {
        let caller = nobody();
        let group = Group::from_gid(nix::unistd::Gid::from_raw(caller.gid)).unwrap().unwrap().name;
        let top = policy("[policy]\nmax_priority = 30\noversubscribe = [\"nobody\"]\n");
        assert_eq!(allowance(&top, &caller), Allowance { max_priority: 30, oversubscribe: true, max_mem: None });
        // Below the default priority, the default is lowered to it.
        assert_eq!(check_run(&top, Some(&caller), None, true).unwrap().get(), 30);
        let user = policy("[policy]\nmax_priority = 30\n[policy.users.nobody]\nmax_priority = 80\noversubscribe = true\n");
        assert_eq!(allowance(&user, &caller), Allowance { max_priority: 80, oversubscribe: true, max_mem: None });
        assert_eq!(check_run(&user, Some(&caller), p(80), true).unwrap().get(), 80);
        let by_group = policy(&format!("[policy.users.someone-else]\nmax_priority = 100\n[policy.groups.{group}]\nmax_priority = 90\n"));
        assert_eq!(allowance(&by_group, &caller), Allowance { max_priority: 90, oversubscribe: false, max_mem: None });
        let by_group_list = policy(&format!("[policy]\noversubscribe = [\"%{group}\"]\n"));
        assert!(allowance(&by_group_list, &caller).oversubscribe);
        let others = policy("[policy]\noversubscribe = [\"someone-else\", \"%no-such-group-xyz\"]\n[policy.groups.no-such-group-xyz]\nmax_priority = 100\n");
        assert_eq!(allowance(&others, &caller), Allowance { max_priority: 50, oversubscribe: false, max_mem: None });
    }

    #[test]
    fn memory_caps_take_the_most_generous_value_per_gpu_and_spare_root() {
        const GIB: u64 = 1 << 30;
        let caller = nobody();
        let group = Group::from_gid(nix::unistd::Gid::from_raw(caller.gid)).unwrap().unwrap().name;
        assert_eq!(mem_cap(&policy(""), Some(&caller)), None);
        let top = policy("[policy]\nmax_mem = \"8G\"\n");
        assert_eq!(mem_cap(&top, None), None, "root is not capped");
        let cap = mem_cap(&top, Some(&caller)).expect("a cap");
        assert_eq!((cap.bytes_of(16 * GIB), cap.bytes_of(4 * GIB)), (8 * GIB, 4 * GIB));
        // Not asked (the whole GPU): lowered to the cap. Asked: refused above it, on one line.
        assert_eq!(MemCap::slice(Some(&cap), None, 16 * GIB, 0, 16 * GIB), Ok(8 * GIB));
        assert_eq!(MemCap::slice(Some(&cap), Some(MemSpec::Bytes(8 * GIB)), 16 * GIB, 0, 16 * GIB), Ok(8 * GIB));
        let err = MemCap::slice(Some(&cap), Some(MemSpec::Percent(75.0)), 16 * GIB, 1, 16 * GIB).unwrap_err();
        assert_eq!(err, PolicyError::Mem { user: "nobody".into(), gpu: 1, asked: "12 GiB".into(), max: "8 GiB".into() });
        assert!(!err.to_string().contains('\n') && err.to_string().contains("max_mem"), "{err}");
        assert_eq!(MemCap::slice(None, None, 16 * GIB, 0, 16 * GIB), Ok(16 * GIB));
        // A group's share beats the top level's size on a large GPU, not on a small one.
        let both = policy(&format!("[policy]\nmax_mem = \"8G\"\n[policy.groups.{group}]\nmax_mem = \"25%\"\n"));
        let cap = mem_cap(&both, Some(&caller)).expect("a cap");
        assert_eq!((cap.bytes_of(80 * GIB), cap.bytes_of(16 * GIB)), (20 * GIB, 8 * GIB));
        let unlimited = policy("[policy]\nmax_mem = \"8G\"\n[policy.users.nobody]\nmax_mem = \"100%\"\n");
        assert_eq!(mem_cap(&unlimited, Some(&caller)).expect("a cap").bytes_of(80 * GIB), 80 * GIB);
    }
}

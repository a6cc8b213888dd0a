//! What a user who starts vgpu through sudo may ask for beyond the defaults: the config's
//! `[policy]` table. Root (no sudo, or root's own sudo) is never restricted.
//!
//! ```toml
//! [policy]
//! max_priority = 50                 # the highest --priority for every sudo user [default: 50]
//! oversubscribe = ["%gpuadmin"]     # users and %groups who may use --oversubscribe
//!
//! [policy.users.alice]              # grants to one user
//! max_priority = 80
//! oversubscribe = true
//!
//! [policy.groups.ops]               # grants to every member of a group
//! max_priority = 100
//! ```
//!
//! Grants only add: a user gets the highest `max_priority` and any `oversubscribe` of the
//! top level, their own table and the tables of their groups (primary and supplementary).

use nix::unistd::Group;

use crate::config::PolicyConfig;
use crate::pool::Priority;
use crate::state::UserSpec;

/// What one sudo user may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowance {
    pub max_priority: i32,
    pub oversubscribe: bool,
}

/// A request beyond the caller's allowance; one line naming the user, the value and the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("started through sudo by {user}: --priority {asked} is above {max}, the most the config's [policy] grants {user} (max_priority; root may use any)")]
    Priority { user: String, asked: i32, max: i32 },
    #[error("started through sudo by {user}: --oversubscribe is not granted to {user} by the config's [policy] (oversubscribe = [\"{user}\"], or [policy.users.{user}] oversubscribe = true; root may)")]
    Oversubscribe { user: String },
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
    let oversubscribe = grants.iter().any(|g| g.oversubscribe) || crate::identity::may_run_as_others(caller, &policy.oversubscribe);
    Allowance { max_priority, oversubscribe }
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
        crate::identity::sudo_caller(Some(&nix::unistd::User::from_name("nobody").unwrap().unwrap().uid.as_raw().to_string()))
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
        assert_eq!(allowance(&none, &caller), Allowance { max_priority: 50, oversubscribe: false });
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
        assert_eq!(allowance(&top, &caller), Allowance { max_priority: 30, oversubscribe: true });
        // Below the default priority, the default is lowered to it.
        assert_eq!(check_run(&top, Some(&caller), None, true).unwrap().get(), 30);
        let user = policy("[policy]\nmax_priority = 30\n[policy.users.nobody]\nmax_priority = 80\noversubscribe = true\n");
        assert_eq!(allowance(&user, &caller), Allowance { max_priority: 80, oversubscribe: true });
        assert_eq!(check_run(&user, Some(&caller), p(80), true).unwrap().get(), 80);
        let by_group = policy(&format!("[policy.users.someone-else]\nmax_priority = 100\n[policy.groups.{group}]\nmax_priority = 90\n"));
        assert_eq!(allowance(&by_group, &caller), Allowance { max_priority: 90, oversubscribe: false });
        let by_group_list = policy(&format!("[policy]\noversubscribe = [\"%{group}\"]\n"));
        assert!(allowance(&by_group_list, &caller).oversubscribe);
        let others = policy("[policy]\noversubscribe = [\"someone-else\", \"%no-such-group-xyz\"]\n[policy.groups.no-such-group-xyz]\nmax_priority = 100\n");
        assert_eq!(allowance(&others, &caller), Allowance { max_priority: 50, oversubscribe: false });
    }
}

//! Who a workload runs as: `--user USER[:GROUP]`, else the user who ran `sudo`, else root.

use nix::unistd::{Gid, Group, Uid, User};

use crate::state::UserSpec;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("unknown user {0:?}")]
    UnknownUser(String),
    #[error("unknown group {0:?}")]
    UnknownGroup(String),
    #[error("cannot read the user database: {0}")]
    Lookup(#[from] nix::Error),
}

/// Resolve the workload's user. `user_arg` is `--user`; `sudo_uid` is `$SUDO_UID`.
pub fn resolve(user_arg: Option<&str>, sudo_uid: Option<&str>) -> Result<UserSpec, IdentityError> {
    match user_arg {
        Some(spec) => {
            let (user_part, group_part) = match spec.split_once(':') {
                Some((u, g)) => (u, Some(g)),
                None => (spec, None),
            };
            let user = lookup_user(user_part)?;
            let gid = match group_part {
                Some(g) => lookup_group(g)?,
                None => user.gid,
            };
            spec_for(&user, gid)
        }
        None => {
            // Started through sudo: run as the invoking user.
            let uid = sudo_uid.and_then(|u| u.parse::<u32>().ok()).unwrap_or(0);
            let user = User::from_uid(Uid::from_raw(uid))?.ok_or_else(|| IdentityError::UnknownUser(uid.to_string()))?;
            spec_for(&user, user.gid)
        }
    }
}

fn lookup_user(name: &str) -> Result<User, IdentityError> {
    if let Some(user) = User::from_name(name)? {
        return Ok(user);
    }
    if let Ok(uid) = name.parse::<u32>() {
        if let Some(user) = User::from_uid(Uid::from_raw(uid))? {
            return Ok(user);
        }
    }
    Err(IdentityError::UnknownUser(name.to_string()))
}

fn lookup_group(name: &str) -> Result<Gid, IdentityError> {
    if let Some(group) = Group::from_name(name)? {
        return Ok(group.gid);
    }
    if let Ok(gid) = name.parse::<u32>() {
        if Group::from_gid(Gid::from_raw(gid))?.is_some() {
            return Ok(Gid::from_raw(gid));
        }
    }
    Err(IdentityError::UnknownGroup(name.to_string()))
}

fn spec_for(user: &User, gid: Gid) -> Result<UserSpec, IdentityError> {
    let cname = std::ffi::CString::new(user.name.as_bytes()).map_err(|_| IdentityError::UnknownUser(user.name.clone()))?;
    let mut groups: Vec<u32> = nix::unistd::getgrouplist(&cname, gid)?.into_iter().map(|g| g.as_raw()).collect();
    if !groups.contains(&gid.as_raw()) {
        groups.insert(0, gid.as_raw());
    }
    Ok(UserSpec {
        name: user.name.clone(),
        uid: user.uid.as_raw(),
        gid: gid.as_raw(),
        groups,
        home: user.dir.to_string_lossy().into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_root_and_sudo_user_wins() {
        let root = resolve(None, None).unwrap();
        assert_eq!((root.uid, root.name.as_str()), (0, "root"));
        let nobody = User::from_name("nobody").unwrap().unwrap();
        let via_sudo = resolve(None, Some(&nobody.uid.as_raw().to_string())).unwrap();
        assert_eq!(via_sudo.uid, nobody.uid.as_raw());
        assert_eq!(via_sudo.gid, nobody.gid.as_raw());
    }

    #[test]
    fn explicit_user_and_group() {
        let spec = resolve(Some("nobody:root"), Some("0")).unwrap();
        assert_eq!(spec.name, "nobody");
        assert_eq!(spec.gid, 0);
        assert!(spec.groups.contains(&0));
        assert!(matches!(resolve(Some("no-such-user-xyz"), None), Err(IdentityError::UnknownUser(_))));
        assert!(matches!(resolve(Some("root:no-such-group-xyz"), None), Err(IdentityError::UnknownGroup(_))));
    }
}

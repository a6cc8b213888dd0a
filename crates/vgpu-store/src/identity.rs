//! Who a workload runs as: `--user USER[:GROUP]`, else the user who ran `sudo`, else root.
//!
//! Started through `sudo` by a user other than root (`SUDO_UID` set and not 0), `--user` may
//! only name that user, and `:GROUP` only one of that user's groups: sudo rights to `vgpu run`
//! are not rights to run as root (or anyone else). Root itself (no `SUDO_UID`, or 0) may name
//! anyone, and so may the users and `%groups` listed in the config's `[policy] run_as_others`.

use nix::unistd::{Gid, Group, Uid, User};

use crate::state::UserSpec;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("unknown user {0:?}")]
    UnknownUser(String),
    #[error("unknown group {0:?}")]
    UnknownGroup(String),
    #[error("SUDO_UID {0:?} is not a user id")]
    BadSudoUid(String),
    #[error("started through sudo by {caller}: a workload may run only as {caller}, not {wanted} (root, or a user listed in [policy] run_as_others, may name anyone)")]
    OtherUser { caller: String, wanted: String },
    #[error("started through sudo by {caller}: {caller} is not in group {group} (root, or a user listed in [policy] run_as_others, may name any group)")]
    OtherGroup { caller: String, group: String },
    #[error("cannot read the user database: {0}")]
    Lookup(#[from] nix::Error),
}

/// Resolve the workload's user. `user_arg` is `--user`; `sudo_uid` is `$SUDO_UID`;
/// `run_as_others` is `[policy] run_as_others` (user names and `%group` names).
pub fn resolve(user_arg: Option<&str>, sudo_uid: Option<&str>, run_as_others: &[String]) -> Result<UserSpec, IdentityError> {
    let caller = caller_user(sudo_uid)?;
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
            let wanted = spec_for(&user, gid)?;
            if let Some(caller) = &caller {
                let own = spec_for(caller, caller.gid)?;
                if !may_run_as_others(&own, run_as_others) {
                    if wanted.uid != own.uid {
                        return Err(IdentityError::OtherUser { caller: caller.name.clone(), wanted: user.name.clone() });
                    }
                    if !own.groups.contains(&wanted.gid) {
                        let group = group_part.unwrap_or_default().to_string();
                        return Err(IdentityError::OtherGroup { caller: caller.name.clone(), group });
                    }
                }
            }
            Ok(wanted)
        }
        None => {
            // Started through sudo: run as the invoking user.
            match caller {
                Some(user) => spec_for(&user, user.gid),
                // Root itself ran vgpu (a shell, cron, a service, a Slurm prolog): the
                // workload gets this process's own credentials, which are root's as whoever
                // started it set them, without asking the group database (every group
                // source nsswitch.conf lists: LDAP, sssd, systemd).
                None if nix::unistd::getuid().is_root() => own_root_spec(),
                None => {
                    let root = User::from_uid(Uid::from_raw(0))?.ok_or_else(|| IdentityError::UnknownUser("0".into()))?;
                    spec_for(&root, root.gid)
                }
            }
        }
    }
}

/// The unprivileged user who ran sudo (`sudo_uid` is `$SUDO_UID`, set and not 0), with their
/// groups; `None` for root (no sudo, or root's own sudo). What `[policy]` restricts.
pub fn sudo_caller(sudo_uid: Option<&str>) -> Result<Option<UserSpec>, IdentityError> {
    caller_user(sudo_uid)?.map(|user| spec_for(&user, user.gid)).transpose()
}

fn caller_user(sudo_uid: Option<&str>) -> Result<Option<User>, IdentityError> {
    // An unreadable SUDO_UID fails closed (it never means root).
    let sudo_uid = match sudo_uid.filter(|u| !u.is_empty()) {
        Some(text) => Some(text.trim().parse::<u32>().map_err(|_| IdentityError::BadSudoUid(text.to_string()))?),
        None => None,
    };
    match sudo_uid {
        Some(uid) if uid != 0 => Ok(Some(User::from_uid(Uid::from_raw(uid))?.ok_or_else(|| IdentityError::UnknownUser(uid.to_string()))?)),
        _ => Ok(None),
    }
}

/// Whether a `[policy]` list of users and `%group`s (`run_as_others`, `oversubscribe`) names
/// `caller` or one of its groups.
pub fn may_run_as_others(caller: &UserSpec, run_as_others: &[String]) -> bool {
    run_as_others.iter().any(|entry| match entry.strip_prefix('%') {
        Some(group) => match Group::from_name(group) {
            Ok(Some(g)) => caller.groups.contains(&g.gid.as_raw()),
            _ => false,
        },
        None => *entry == caller.name,
    })
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

/// Root's own name and home, as systemd gives uid 0 without asking NSS (its user records
/// and `get_user_creds` synthesize root): the name is only said (`vgpu ps`, the history),
/// and the home is not given to root's own workloads (`launch::env` sets `HOME` for a sudo
/// caller's). The user database is not asked for root's record: its first lookup in a
/// process took 50–85 µs of every `vgpu run` (issue 28), and a source it lists before the
/// files could answer slowly or not at all.
const ROOT_NAME: &str = "root";
/// See [`ROOT_NAME`].
const ROOT_HOME: &str = "/root";

/// Root, with this process's gid and supplementary groups.
fn own_root_spec() -> Result<UserSpec, IdentityError> {
    let gid = nix::unistd::getgid().as_raw();
    let mut groups: Vec<u32> = nix::unistd::getgroups()?.into_iter().map(|g| g.as_raw()).collect();
    if !groups.contains(&gid) {
        groups.insert(0, gid);
    }
    Ok(UserSpec { name: ROOT_NAME.to_string(), uid: 0, gid, groups, home: ROOT_HOME.to_string() })
}

/// Runs `f` as `user` would: on a thread of its own that switches only its own credentials
/// (groups, then gid, then uid: real, effective and saved), so that every path `f` resolves,
/// opens or checks is resolved with that user's rights, and an error is what that user
/// would see (`EACCES` for a directory closed to them, never "exists" or "missing" as root
/// knows it). The thread ends with `f`; the process's other threads keep root's
/// credentials throughout.
///
/// The raw system calls are per thread in the kernel; glibc's `setuid`/`setgid`/`setgroups`
/// wrappers would change every thread of the process (POSIX semantics), so they are not used.
///
/// Nothing is switched when it would change nothing: `user` is root (root reads everything
/// anyway), or this process is not root (it cannot switch, and reads only what it may).
pub fn as_user<T: Send>(user: &UserSpec, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    if user.uid == 0 || !nix::unistd::geteuid().is_root() {
        return Ok(f());
    }
    let (uid, gid, groups) = (user.uid, user.gid, user.groups.clone());
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new().name("vgpu-as-user".into()).spawn_scoped(scope, move || {
            switch_this_thread(uid, gid, &groups)?;
            Ok(f())
        })?;
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Sets the calling thread's (only) supplementary groups, gid and uid.
fn switch_this_thread(uid: u32, gid: u32, groups: &[u32]) -> std::io::Result<()> {
    let check = |rc: libc::c_long| if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
    // SAFETY: setgroups with a count and a pointer to that many gid_t (u32) that outlive the
    // call; a raw system call changes this thread's credentials only.
    check(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) })?;
    // SAFETY: setresgid/setresuid take three ids by value; raw, they change this thread only.
    check(unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) })?;
    // SAFETY: as above.
    check(unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_root_and_sudo_user_wins() {
        let root = resolve(None, None, &[]).unwrap();
        assert_eq!((root.uid, root.name.as_str()), (0, "root"));
        let nobody = User::from_name("nobody").unwrap().unwrap();
        let via_sudo = resolve(None, Some(&nobody.uid.as_raw().to_string()), &[]).unwrap();
        assert_eq!(via_sudo.uid, nobody.uid.as_raw());
        assert_eq!(via_sudo.gid, nobody.gid.as_raw());
    }

    #[test]
    fn root_without_sudo_runs_with_this_process_credentials_not_the_group_database() {
        // On a thread of its own (a raw setgroups changes that thread alone): supplementary
        // groups the group database does not give root.
        let spec = std::thread::spawn(|| {
            let groups: [u32; 2] = [0, 4242];
            // SAFETY: setgroups with a count and a pointer to that many gid_t that outlive
            // the call; raw, it changes this test thread's credentials only.
            assert_eq!(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) }, 0);
            resolve(None, None, &[]).unwrap()
        })
        .join()
        .unwrap();
        assert_eq!((spec.uid, spec.gid, spec.name.as_str()), (0, 0, "root"));
        assert!(spec.groups.contains(&4242) && spec.groups.contains(&0), "{:?}", spec.groups);
    }

    #[test]
    fn explicit_user_and_group() {
        let spec = resolve(Some("nobody:root"), Some("0"), &[]).unwrap();
        assert_eq!(spec.name, "nobody");
        assert_eq!(spec.gid, 0);
        assert!(spec.groups.contains(&0));
        assert!(matches!(resolve(Some("no-such-user-xyz"), None, &[]), Err(IdentityError::UnknownUser(_))));
        assert!(matches!(resolve(Some("root:no-such-group-xyz"), None, &[]), Err(IdentityError::UnknownGroup(_))));
    }

    #[test]
    fn a_sudo_caller_may_name_only_itself_and_its_groups() {
        let nobody = User::from_name("nobody").unwrap().unwrap();
        let uid = nobody.uid.as_raw().to_string();
        let sudo = Some(uid.as_str());
        assert!(matches!(resolve(Some("root"), sudo, &[]), Err(IdentityError::OtherUser { .. })));
        assert!(matches!(resolve(Some("0"), sudo, &[]), Err(IdentityError::OtherUser { .. })));
        assert!(matches!(resolve(Some("nobody:root"), sudo, &[]), Err(IdentityError::OtherGroup { .. })));
        assert_eq!(resolve(Some("nobody"), sudo, &[]).unwrap().uid, nobody.uid.as_raw());
        assert_eq!(resolve(Some(&uid), sudo, &[]).unwrap().uid, nobody.uid.as_raw());
        // Root without sudo, and root through sudo, may name anyone.
        assert_eq!(resolve(Some("nobody"), None, &[]).unwrap().uid, nobody.uid.as_raw());
        assert_eq!(resolve(Some("nobody"), Some("0"), &[]).unwrap().uid, nobody.uid.as_raw());
        // An unreadable SUDO_UID never means root.
        assert!(matches!(resolve(None, Some("nobody"), &[]), Err(IdentityError::BadSudoUid(_))));
        // The message is one line naming both users.
        let msg = resolve(Some("root"), sudo, &[]).unwrap_err().to_string();
        assert!(msg.contains("nobody") && msg.contains("root") && !msg.contains('\n'), "{msg}");
    }

    #[test]
    fn policy_grants_run_as_others_to_users_and_groups() {
        let nobody = User::from_name("nobody").unwrap().unwrap();
        let uid = nobody.uid.as_raw().to_string();
        let sudo = Some(uid.as_str());
        assert_eq!(resolve(Some("root"), sudo, &["nobody".into()]).unwrap().uid, 0);
        let group = Group::from_gid(nobody.gid).unwrap().unwrap().name;
        assert_eq!(resolve(Some("root"), sudo, &[format!("%{group}")]).unwrap().uid, 0);
        assert!(resolve(Some("root"), sudo, &["someone-else".into(), "%no-such-group-xyz".into()]).is_err());
    }

    /// The switch is the thread's alone: while it runs as nobody, the calling thread is still
    /// root (the kernel says so), and after it ends nothing of it remains.
    #[test]
    fn as_user_switches_one_thread_only() {
        assert!(nix::unistd::geteuid().is_root(), "this test must run as root (CI does)");
        let nobody = sudo_caller(Some(&User::from_name("nobody").unwrap().unwrap().uid.as_raw().to_string())).unwrap().unwrap();
        let caller_tid = nix::unistd::gettid();
        let status_uid = |tid: nix::unistd::Pid| {
            let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
            status.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().skip(1).map(str::to_string).collect::<Vec<_>>()).unwrap()
        };
        let (inside, outside, groups) = as_user(&nobody, || {
            // SAFETY: getuid/geteuid/getgroups(0) read this thread's credentials.
            let ids = unsafe { (libc::getuid(), libc::geteuid(), libc::getgroups(0, std::ptr::null_mut())) };
            (ids, status_uid(caller_tid), nix::unistd::getgroups().unwrap())
        })
        .unwrap();
        let uid = nobody.uid;
        assert_eq!((inside.0, inside.1), (uid, uid));
        assert_eq!(inside.2 as usize, nobody.groups.len());
        assert_eq!(groups.iter().map(|g| g.as_raw()).collect::<Vec<_>>(), nobody.groups);
        assert_eq!(outside, ["0", "0", "0", "0"], "the calling thread stayed root");
        assert!(nix::unistd::geteuid().is_root() && nix::unistd::getuid().is_root());
        // Root, and the caller's own identity, run in place.
        let root = resolve(None, None, &[]).unwrap();
        assert_eq!(as_user(&root, nix::unistd::gettid).unwrap(), caller_tid);
        // What the user may not see is refused as for them.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), "x").unwrap();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let read = |user: &UserSpec| as_user(user, || std::fs::read_to_string(dir.path().join("secret")).map_err(|e| e.kind())).unwrap();
        assert_eq!(read(&root), Ok("x".to_string()));
        assert_eq!(read(&nobody), Err(std::io::ErrorKind::PermissionDenied));
    }
}

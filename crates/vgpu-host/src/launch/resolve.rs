//! The paths a `vgpu run` caller names, resolved as the workload's user: its working
//! directory (`--cwd`, a workload file's or a service's `cwd`) and its program (relative to
//! that directory, or on `PATH`). vgpu runs as root, often for a sudo caller: checked as
//! root, `--cwd /root/private/sub` would pass and tell the caller that a hidden directory
//! exists. Checked through [`vgpu_store::identity::as_user`], the answer is the one the user
//! would get themselves (a directory below one closed to them is "permission denied",
//! whether or not it exists). The child enters the directory itself, after its privilege
//! drop (`supervise::spawn`): these checks only make the refusal early and clear.

use std::path::{Path, PathBuf};

use vgpu_store::error::NotRunnable;

use vgpu_store::error::UsageError;
use vgpu_store::state::UserSpec;

/// Why `--cwd` (or `program`) was refused, as the user sees it.
#[derive(Debug)]
pub enum Refusal {
    /// One line naming the directory, as `--cwd` takes it.
    Cwd(String),
    Program(NotRunnable),
}

impl From<Refusal> for anyhow::Error {
    fn from(r: Refusal) -> anyhow::Error {
        match r {
            Refusal::Cwd(line) => UsageError::new(line).into(),
            Refusal::Program(not) => not.into(),
        }
    }
}

/// `--cwd DIR` and `program` as `user` finds them: the directory exists, is one and may be
/// entered; the program exists (relative to DIR, or on `path`) and may be executed. One
/// switch of credentials for both (a thread, well under a millisecond; none for root).
pub fn check(user: &UserSpec, cwd: Option<&Path>, program: &str, path: Option<&str>) -> anyhow::Result<()> {
    let name = user.name.as_str();
    let verdict = vgpu_store::identity::as_user(user, || -> Result<(), Refusal> {
        if let Some(dir) = cwd {
            check_cwd(dir, name)?;
        }
        match resolve_program(program, path, cwd) {
            None => Err(Refusal::Program(NotRunnable { program: program.to_string(), missing: true })),
            Some(found) if nix::unistd::access(&found, nix::unistd::AccessFlags::X_OK).is_err() => {
                Err(Refusal::Program(NotRunnable { program: program.to_string(), missing: false }))
            }
            Some(_) => Ok(()),
        }
    })
    .map_err(|e| anyhow::Error::new(e).context(format!("cannot check --cwd and the program as user {name}")))?;
    verdict.map_err(Into::into)
}

/// `--cwd DIR` alone, as `user` finds it (`Ok` when it may be entered): after a failed
/// start, whether the directory is why.
pub fn check_cwd_as(user: &UserSpec, dir: &Path) -> anyhow::Result<()> {
    let name = user.name.as_str();
    vgpu_store::identity::as_user(user, || check_cwd(dir, name))
        .map_err(|e| anyhow::Error::new(e).context(format!("cannot check --cwd as user {name}")))?
        .map_err(Into::into)
}

/// Call as the user (inside `as_user`): `dir` is a directory they may enter.
fn check_cwd(dir: &Path, user: &str) -> Result<(), Refusal> {
    let refused = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => Refusal::Cwd(format!("--cwd {}: no such directory", dir.display())),
        _ => Refusal::Cwd(format!("--cwd {}: {user} cannot enter it: {e}", dir.display())),
    };
    let meta = std::fs::metadata(dir).map_err(refused)?;
    if !meta.is_dir() {
        return Err(Refusal::Cwd(format!("--cwd {}: not a directory", dir.display())));
    }
    nix::unistd::access(dir, nix::unistd::AccessFlags::X_OK).map_err(|errno| refused(std::io::Error::from(errno)))
}

/// Where `program` is: a path (relative to `cwd` when it is relative), or the first regular
/// file of that name on `path`, as `execvp` in the child will find it.
fn resolve_program(program: &str, path: Option<&str>, cwd: Option<&Path>) -> Option<PathBuf> {
    if program.contains('/') {
        let p = match cwd {
            Some(dir) if !program.starts_with('/') => dir.join(program),
            _ => PathBuf::from(program),
        };
        return p.is_file().then_some(p);
    }
    std::env::split_paths(path?).map(|dir| dir.join(program)).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn nobody() -> UserSpec {
        let uid = nix::unistd::User::from_name("nobody").unwrap().unwrap().uid.as_raw().to_string();
        vgpu_store::identity::sudo_caller(Some(&uid)).unwrap().unwrap()
    }

    fn root() -> UserSpec {
        vgpu_store::identity::resolve(None, None, &[]).unwrap()
    }

    /// Root sees through a closed directory; nobody gets "permission denied" for what is
    /// behind it, existing or not, and "no such directory" only where they could look.
    #[test]
    fn the_working_directory_is_checked_as_the_user() {
        assert!(nix::unistd::geteuid().is_root(), "this test must run as root (CI does)");
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let closed = tmp.path().join("closed");
        std::fs::create_dir_all(closed.join("sub")).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(closed.join("sub"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = Some("/usr/bin:/bin");
        let cwd_error = |user: &UserSpec, dir: &Path| match check(user, Some(dir), "true", path) {
            Ok(()) => None,
            Err(e) => Some(e.to_string().replace(&dir.display().to_string(), "DIR")),
        };
        let (nobody, root) = (nobody(), root());
        assert_eq!(cwd_error(&root, &closed.join("sub")), None);
        assert_eq!(cwd_error(&nobody, &open), None);
        let hidden = cwd_error(&nobody, &closed.join("sub")).expect("refused");
        let missing_behind = cwd_error(&nobody, &closed.join("missing")).expect("refused");
        assert_eq!(hidden, missing_behind);
        assert!(hidden.contains("nobody cannot enter it") && hidden.contains("ermission denied"), "{hidden}");
        assert_eq!(cwd_error(&nobody, &open.join("missing")).as_deref(), Some("--cwd DIR: no such directory"));
        // The program relative to the directory, as the user: theirs to run, or not.
        let script = open.join("job.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check(&nobody, Some(&open), "./job.sh", path).is_ok());
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o744)).unwrap();
        let err = check(&nobody, Some(&open), "./job.sh", path).unwrap_err();
        assert!(err.downcast_ref::<NotRunnable>().is_some_and(|n| !n.missing), "{err}");
        assert!(check(&root, Some(&open), "./job.sh", path).is_ok());
        let err = check(&nobody, Some(&open), "./none.sh", path).unwrap_err();
        assert!(err.downcast_ref::<NotRunnable>().is_some_and(|n| n.missing), "{err}");
        // A program behind the closed directory is "not found" for nobody, as for a shell.
        let secret = closed.join("sub/tool");
        std::fs::write(&secret, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check(&root, None, secret.to_str().unwrap(), path).is_ok());
        let err = check(&nobody, None, secret.to_str().unwrap(), path).unwrap_err();
        assert!(err.downcast_ref::<NotRunnable>().is_some_and(|n| n.missing), "{err}");
    }
}

//! Telling a Slurm job why the watch killed one of its tasks: a line on the task's stderr
//! (`/proc/PID/fd/2`), which is the job's output, before the SIGKILL. A `vgpu run` workload
//! learns it from `vgpu run`; a Slurm step's tasks have no vgpu process of their own.
//!
//! Root reopens another process's descriptor here, so what is opened is checked before a
//! byte is written: the descriptor is opened write-only, never blocking (a FIFO without a
//! reader fails at once, a full pipe drops the line), no controlling terminal; then only a
//! pipe (what slurmstepd gives a task) or a regular file owned by the job's user (an sbatch
//! job's output file) is written. Anything else — a root-owned file the task opened
//! read-only as its stderr, a device, a terminal — is left alone: reopening through /proc
//! would grant root's write access to what the task could only read.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};

/// Write `line` to the stderr of `pid`, if it is a pipe or `uid`'s own file; whether it was.
pub fn tell(pid: u32, uid: u32, line: &str) -> bool {
    let path = format!("/proc/{pid}/fd/2");
    let Ok(mut file) = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(&path)
    else {
        return false;
    };
    let Ok(meta) = file.metadata() else {
        return false;
    };
    let kind = meta.file_type();
    let writable = kind.is_fifo() || (kind.is_file() && meta.uid() == uid);
    if !writable {
        return false;
    }
    file.write_all(format!("{line}\n").as_bytes()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_pipe_gets_the_line_and_a_file_of_another_user_does_not() {
        let mut child = std::process::Command::new("sleep").arg("30").stderr(std::process::Stdio::piped()).spawn().expect("sleep");
        assert!(tell(child.id(), 4242, "vgpu watch: killed"));
        let _ = child.kill();
        let _ = child.wait();
        let mut got = String::new();
        child.stderr.take().expect("its stderr").read_to_string(&mut got).expect("read");
        assert_eq!(got, "vgpu watch: killed\n");

        // A file the process holds whose owner is not the job's user: left alone.
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("err");
        std::fs::write(&file, "").expect("write");
        let mut child = std::process::Command::new("sleep").arg("30").stderr(std::fs::File::open(&file).expect("open")).spawn().expect("sleep");
        let owner = std::fs::metadata(&file).expect("stat").uid();
        assert!(!tell(child.id(), owner + 1, "vgpu watch: killed"));
        assert!(tell(child.id(), owner, "vgpu watch: killed"), "the job's own file is written");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(std::fs::read_to_string(&file).expect("read"), "vgpu watch: killed\n");
    }
}

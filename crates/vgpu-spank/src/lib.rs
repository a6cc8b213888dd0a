//! `spank_vgpu.so`: the Slurm SPANK plugin that runs a job step's tasks inside a vGPU.
//!
//! Loaded through `plugstack.conf` (`required /usr/lib/vgpu/spank_vgpu.so [vgpu=PATH]`) by
//! srun, sbatch and salloc (options, checked at submission) and by each node's slurmstepd
//! (the step's vGPU). It adds `--vgpu-mem=SIZE|PCT%`, `--vgpu-compute=PCT`,
//! `--vgpu-compute-policy=strict|fair` and `--vgpu-freq-sensitivity=S`. In slurmstepd, as
//! root, before the tasks are forked (`slurm_spank_init_post_opt`), a step that asked with
//! these options or holds shards (`SLURM_SHARDS_ON_NODE`) gets a vGPU on the GPUs Slurm
//! gave it: the plugin runs `vgpu slurm step-begin` (which admits and records it as any
//! workload, its supervisor being this slurmstepd) and sets the environment it prints in
//! the job's environment (the shim preloaded, the GPUs by UUID, the vGPU directory). When
//! the step ends (`slurm_spank_exit`) it runs `vgpu slurm step-end`. The tasks stay in
//! Slurm's cgroups: nothing here moves a process or writes a cgroup file.
//!
//! Why a child process and not vgpu's crates in-process: slurmstepd is a long-lived,
//! multi-threaded root daemon of Slurm's; vgpu's admission loads the NVIDIA driver (which
//! starts threads of its own and is never unloaded), takes locks and may run for as long
//! as the store lock is held by another command. In a child, none of that reaches
//! slurmstepd, a failure is an exit status and one line, and the plugin itself is small
//! enough to hold no state but the step it began. Measured: `benches/slurm_step.rs`.
//!
//! At the C boundary: every entry point catches panics (`guard`), so none unwinds into
//! Slurm; the plugin starts no thread and leaves no child (it waits for each); it is
//! linked `-z nodelete` (`build.rs`).
//!
//! The SPANK API is declared by hand below (the few functions used), from Debian's
//! `/usr/include/slurm/spank.h` (Slurm 22.05); `tests::declarations_match_the_header`
//! checks them against that header.

use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// `spank_t`: an opaque handle.
#[repr(C)]
pub struct SpankHandle {
    _opaque: [u8; 0],
}
type Spank = *mut SpankHandle;

/// `spank_opt_cb_f`.
type OptionCallback = unsafe extern "C" fn(val: c_int, optarg: *const c_char, remote: c_int) -> c_int;

/// `struct spank_option`.
#[repr(C)]
pub struct SpankOption {
    name: *const c_char,
    arginfo: *const c_char,
    usage: *const c_char,
    has_arg: c_int,
    val: c_int,
    cb: Option<OptionCallback>,
}

// `enum spank_item` values used (their positions in spank.h).
const S_JOB_UID: c_int = 0;
const S_JOB_ID: c_int = 2;
const S_JOB_STEPID: c_int = 3;
const S_JOB_NODEID: c_int = 5;
// `enum spank_context` values used.
const S_CTX_LOCAL: c_int = 1;
const S_CTX_REMOTE: c_int = 2;
const S_CTX_ALLOCATOR: c_int = 3;
/// `ESPANK_SUCCESS`.
const ESPANK_SUCCESS: c_int = 0;
// Special step ids (slurm.h).
const SLURM_EXTERN_CONT: u32 = 0xffff_fffc;
const SLURM_BATCH_SCRIPT: u32 = 0xffff_fffb;
const SLURM_INTERACTIVE_STEP: u32 = 0xffff_fffa;

extern "C" {
    fn spank_option_register(spank: Spank, opt: *mut SpankOption) -> c_int;
    fn spank_get_item(spank: Spank, item: c_int, ...) -> c_int;
    fn spank_getenv(spank: Spank, var: *const c_char, buf: *mut c_char, len: c_int) -> c_int;
    fn spank_setenv(spank: Spank, var: *const c_char, val: *const c_char, overwrite: c_int) -> c_int;
    fn spank_context() -> c_int;
    fn slurm_error(format: *const c_char, ...);
    fn slurm_info(format: *const c_char, ...);
}

// The symbols Slurm's plugin loader reads (`SPANK_PLUGIN(vgpu, 1)` in C).
#[no_mangle]
#[used]
pub static plugin_name: [u8; 5] = *b"vgpu\0";
#[no_mangle]
#[used]
pub static plugin_type: [u8; 6] = *b"spank\0";
/// `SLURM_VERSION_NUMBER` of the Slurm it is built for (22.05.8); the loader compares its
/// major and minor with its own.
#[no_mangle]
#[used]
pub static plugin_version: u32 = 0x16_05_08;
#[no_mangle]
#[used]
pub static spank_vgpu_version: [u8; 6] = *b"0.1.0\0";

const OPT_MEM: c_int = 1;
const OPT_COMPUTE: c_int = 2;
const OPT_POLICY: c_int = 3;
const OPT_FREQ: c_int = 4;

/// The option table (Slurm keeps the pointers it is given: it lives as long as the library).
struct Options(std::cell::UnsafeCell<[SpankOption; 4]>);
// SAFETY: the table is written by no one; Slurm reads it (through the pointers it is given)
// from the thread that calls the plugin, and so does the plugin.
unsafe impl Sync for Options {}

static OPTIONS: Options = Options(std::cell::UnsafeCell::new([
    SpankOption {
        name: c"vgpu-mem".as_ptr(),
        arginfo: c"SIZE|PCT%".as_ptr(),
        usage: c"Device memory of each of the step's GPUs its tasks may use (vgpu fences it: e.g. 4G, 25%)".as_ptr(),
        has_arg: 1,
        val: OPT_MEM,
        cb: Some(check_option),
    },
    SpankOption {
        name: c"vgpu-compute".as_ptr(),
        arginfo: c"PCT".as_ptr(),
        usage: c"Share of each of the step's GPUs' compute its tasks may use, 1-100 (vgpu fences it)".as_ptr(),
        has_arg: 1,
        val: OPT_COMPUTE,
        cb: Some(check_option),
    },
    SpankOption {
        name: c"vgpu-compute-policy".as_ptr(),
        arginfo: c"strict|fair".as_ptr(),
        usage: c"strict: never above the compute share; fair: idle compute may be borrowed".as_ptr(),
        has_arg: 1,
        val: OPT_POLICY,
        cb: Some(check_option),
    },
    SpankOption {
        name: c"vgpu-freq-sensitivity".as_ptr(),
        arginfo: c"S".as_ptr(),
        usage: c"How much the step's speed depends on the GPU clock, 0-1, for vgpu's carbon planner".as_ptr(),
        has_arg: 1,
        val: OPT_FREQ,
        cb: Some(check_option),
    },
]));

fn option(i: usize) -> *mut SpankOption {
    // SAFETY: `i` < 4 at every call site; the pointer is into a static.
    unsafe { (OPTIONS.0.get() as *mut SpankOption).add(i) }
}

/// What an option's value must be: the one check, at submission (srun, sbatch, salloc) and
/// again in slurmstepd. `Err` is the one line the user sees.
pub fn check(val: c_int, arg: &str) -> Result<(), String> {
    match val {
        OPT_MEM => check_mem(arg).map_err(|e| format!("--vgpu-mem={arg}: {e}")),
        OPT_COMPUTE => match arg.trim().parse::<u32>() {
            Ok(1..=100) => Ok(()),
            _ => Err(format!("--vgpu-compute={arg}: a percentage of each GPU's compute, 1 to 100")),
        },
        OPT_POLICY => match arg.trim() {
            "strict" | "fair" => Ok(()),
            _ => Err(format!("--vgpu-compute-policy={arg}: strict or fair")),
        },
        OPT_FREQ => match arg.trim().parse::<f64>() {
            Ok(s) if (0.0..=1.0).contains(&s) => Ok(()),
            _ => Err(format!("--vgpu-freq-sensitivity={arg}: a number from 0 to 1")),
        },
        _ => Err(format!("unknown vgpu option {val}")),
    }
}

/// `--vgpu-mem`: a size (vgpu's size syntax) or a percentage above 0 and at most 100.
fn check_mem(arg: &str) -> Result<(), String> {
    let arg = arg.trim();
    if let Some(pct) = arg.strip_suffix('%') {
        return match pct.trim().parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 => Ok(()),
            _ => Err("a percentage must be above 0 and at most 100".into()),
        };
    }
    match vgpu_abi::size::parse_size(arg) {
        Ok(0) => Err("a size must be above 0".into()),
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Log one line through Slurm (srun's stderr in srun, the step's output and slurmd's log in
/// slurmstepd).
fn error(line: &str) {
    let line = CString::new(line.replace('\0', " ")).unwrap_or_default();
    // SAFETY: a "%s" format with one NUL-terminated string argument.
    unsafe { slurm_error(c"%s".as_ptr(), line.as_ptr()) };
}

fn info(line: &str) {
    let line = CString::new(line.replace('\0', " ")).unwrap_or_default();
    // SAFETY: a "%s" format with one NUL-terminated string argument.
    unsafe { slurm_info(c"%s".as_ptr(), line.as_ptr()) };
}

/// Run `f` with no panic crossing into Slurm: a panic is -1 (the step or submission fails),
/// with its message.
fn guard(what: &str, f: impl FnOnce() -> c_int) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(rc) => rc,
        Err(_) => {
            error(&format!("vgpu: internal error in {what}; the step is not run unfenced"));
            -1
        }
    }
}

unsafe extern "C" fn check_option(val: c_int, optarg: *const c_char, _remote: c_int) -> c_int {
    guard("an option's check", || {
        let arg = if optarg.is_null() {
            String::new()
        } else {
            // SAFETY: Slurm passes the option's NUL-terminated argument.
            unsafe { CStr::from_ptr(optarg) }.to_string_lossy().into_owned()
        };
        match check(val, &arg) {
            Ok(()) => {
                // Slurm reads options into a plugin only through these callbacks in
                // slurmstepd (spank_option_getopt is not available in init_post_opt).
                if let (Ok(i), Ok(mut values)) = (usize::try_from(val - 1), VALUES.lock()) {
                    if let Some(slot) = values.get_mut(i) {
                        *slot = Some(arg);
                    }
                }
                0
            }
            Err(e) => {
                error(&format!("vgpu: {e}"));
                -1
            }
        }
    })
}

/// The options' values as their callbacks were given them (`OPT_MEM` - 1, …).
static VALUES: Mutex<[Option<String>; 4]> = Mutex::new([None, None, None, None]);

/// The step this slurmstepd began a vGPU for: (job, step, node), for `slurm_spank_exit`.
static BEGAN: Mutex<Option<(u32, String, String)>> = Mutex::new(None);

/// The step's GPUs as its vGPU names them (UUIDs), for each task's `CUDA_VISIBLE_DEVICES`.
static VISIBLE: Mutex<Option<String>> = Mutex::new(None);

/// # Safety
/// Called by Slurm with its handle.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_init(spank: Spank, _ac: c_int, _av: *mut *mut c_char) -> c_int {
    guard("slurm_spank_init", || {
        // SAFETY: no arguments.
        let ctx = unsafe { spank_context() };
        if !matches!(ctx, S_CTX_LOCAL | S_CTX_REMOTE | S_CTX_ALLOCATOR) {
            return 0;
        }
        for i in 0..4 {
            // SAFETY: the handle is Slurm's; the option is a static that outlives it.
            let rc = unsafe { spank_option_register(spank, option(i)) };
            if rc != ESPANK_SUCCESS {
                error(&format!("vgpu: cannot register option {i}: error {rc}"));
                return -1;
            }
        }
        0
    })
}

/// The plugin's arguments in plugstack.conf: `vgpu=PATH`.
fn vgpu_path(ac: c_int, av: *mut *mut c_char) -> String {
    let mut path = "/usr/bin/vgpu".to_string();
    for i in 0..usize::try_from(ac).unwrap_or(0) {
        // SAFETY: Slurm passes `ac` NUL-terminated arguments.
        let arg = unsafe {
            let p = *av.add(i);
            if p.is_null() {
                continue;
            }
            CStr::from_ptr(p).to_string_lossy().into_owned()
        };
        if let Some(p) = arg.strip_prefix("vgpu=") {
            path = p.to_string();
        }
    }
    path
}

/// A variable of the job's environment.
fn getenv(spank: Spank, var: &str) -> Option<String> {
    let name = CString::new(var).ok()?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: the buffer is as long as we say; Slurm NUL-terminates what it writes.
    let rc = unsafe { spank_getenv(spank, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len() as c_int) };
    if rc != ESPANK_SUCCESS {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

fn setenv(spank: Spank, var: &str, val: &str) -> bool {
    let (Ok(k), Ok(v)) = (CString::new(var), CString::new(val)) else {
        return false;
    };
    // SAFETY: two NUL-terminated strings and Slurm's handle.
    unsafe { spank_setenv(spank, k.as_ptr(), v.as_ptr(), 1) == ESPANK_SUCCESS }
}

fn item_u32(spank: Spank, item: c_int) -> Option<u32> {
    let mut value: u32 = 0;
    // SAFETY: these items (S_JOB_UID, S_JOB_ID, S_JOB_STEPID) write one uint32_t / uid_t.
    let rc = unsafe { spank_get_item(spank, item, &mut value as *mut u32) };
    (rc == ESPANK_SUCCESS).then_some(value)
}

/// A Slurm host list (`n1,n2`, `gpu[01-03,07],login1`) as names, in order; a form it does
/// not know is taken as one name.
pub fn expand_hostlist(list: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = list.trim();
    while !rest.is_empty() {
        // One entry: up to a comma outside brackets.
        let mut depth = 0;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '[' => depth += 1,
                    ']' => depth -= 1,
                    _ => {}
                }
                c == ',' && depth == 0
            })
            .map(|(i, _)| i)
            .unwrap_or(rest.len());
        let entry = &rest[..end];
        rest = rest[end..].trim_start_matches(',');
        match (entry.find('['), entry.strip_suffix(']')) {
            (Some(open), Some(body)) => {
                let (prefix, ranges) = (&entry[..open], &body[open + 1..]);
                for range in ranges.split(',') {
                    match range.split_once('-') {
                        Some((a, b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
                            (Ok(x), Ok(y)) if x <= y && y - x < 100_000 => {
                                for n in x..=y {
                                    names.push(format!("{prefix}{n:0width$}", width = a.len()));
                                }
                            }
                            _ => names.push(format!("{prefix}{range}")),
                        },
                        None => names.push(format!("{prefix}{range}")),
                    }
                }
            }
            _ => names.push(entry.to_string()),
        }
    }
    names
}

fn step_name(step: u32) -> String {
    match step {
        SLURM_BATCH_SCRIPT => "batch".into(),
        SLURM_INTERACTIVE_STEP => "interactive".into(),
        n => n.to_string(),
    }
}

/// In slurmstepd, as root, before the tasks: the step's vGPU.
///
/// # Safety
/// Called by Slurm with its handle and the plugin's arguments.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_init_post_opt(spank: Spank, ac: c_int, av: *mut *mut c_char) -> c_int {
    guard("slurm_spank_init_post_opt", || {
        // SAFETY: no arguments.
        if unsafe { spank_context() } != S_CTX_REMOTE {
            return 0;
        }
        begin(spank, &vgpu_path(ac, av))
    })
}

/// Why this step has no vGPU though it asked for one: reported on the task's stderr (the
/// job's output) by `slurm_spank_task_init_privileged`, which then fails the task before it
/// runs. (In init_post_opt the step's output is not set up yet: an error there reaches only
/// slurmd's log, and srun says "Plugin initialization failed".)
static REFUSED: Mutex<Option<String>> = Mutex::new(None);

/// Refuse the step: logged now in slurmd's log, said again in the job's output by each task.
fn refuse(line: String) -> c_int {
    error(&line);
    if let Ok(mut refused) = REFUSED.lock() {
        *refused = Some(line);
    }
    0
}

fn begin(spank: Spank, vgpu: &str) -> c_int {
    let opts: Vec<Option<String>> = VALUES.lock().map(|v| v.to_vec()).unwrap_or_default();
    if opts.len() != 4 {
        return refuse("vgpu: cannot read the step's --vgpu-* options; the step is not run unfenced".into());
    }
    let shards = getenv(spank, "SLURM_SHARDS_ON_NODE").filter(|s| s.trim().parse::<u32>().is_ok_and(|n| n > 0));
    let gpus = getenv(spank, "SLURM_STEP_GPUS").or_else(|| getenv(spank, "SLURM_JOB_GPUS")).unwrap_or_default();
    // A step that holds GPUs and asks nothing: fenced only if its job holds the tflops GRES,
    // which vgpu asks slurmctld (22.05 gives the step no variable for it).
    let if_tflops = opts.iter().all(Option::is_none) && shards.is_none();
    if if_tflops && gpus.trim().is_empty() {
        return 0;
    }
    let (Some(job), Some(step), Some(uid)) = (item_u32(spank, S_JOB_ID), item_u32(spank, S_JOB_STEPID), item_u32(spank, S_JOB_UID)) else {
        return refuse("vgpu: cannot read the step's job id, step id or user from Slurm; the step is not run unfenced".into());
    };
    if step == SLURM_EXTERN_CONT {
        return 0;
    }
    let node = getenv(spank, "SLURMD_NODENAME")
        .or_else(|| {
            let id = item_u32(spank, S_JOB_NODEID)?;
            let list = getenv(spank, "SLURM_STEP_NODELIST").or_else(|| getenv(spank, "SLURM_JOB_NODELIST"))?;
            expand_hostlist(&list).into_iter().nth(id as usize)
        })
        .unwrap_or_default();
    let step = step_name(step);
    let mut cmd = std::process::Command::new(vgpu);
    cmd.args(["slurm", "step-begin", "--job", &job.to_string(), "--step", &step, "--node", &node, "--uid", &uid.to_string()])
        .arg("--stepd")
        .arg(std::process::id().to_string())
        .stdin(std::process::Stdio::null());
    if !gpus.trim().is_empty() {
        cmd.arg("--gpus").arg(gpus.trim());
    }
    for (i, flag) in ["--mem", "--compute", "--compute-policy", "--freq-sensitivity"].iter().enumerate() {
        if let Some(v) = &opts[i] {
            cmd.arg(flag).arg(v);
        }
    }
    if let Some(s) = &shards {
        cmd.arg("--shards").arg(s.trim());
    }
    if if_tflops {
        cmd.arg("--if-tflops");
    }
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) => {
            return refuse(format!("vgpu: node {node} cannot run {vgpu} ({e}): vgpu is not installed there; the step is not run unfenced"));
        }
    };
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let why = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message").trim().to_string();
        let why = why.strip_prefix("vgpu: ").unwrap_or(&why).to_string();
        return refuse(format!("vgpu: node {node}: {why}; the step is not run unfenced"));
    }
    if if_tflops && out.stdout.is_empty() {
        // Its job holds no tflops: nothing of vgpu's for this step.
        return 0;
    }
    // From here the vGPU exists: slurm_spank_exit removes it, whatever happens next.
    if let Ok(mut began) = BEGAN.lock() {
        *began = Some((job, step.clone(), node.clone()));
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let ok = match line.split_once(' ').and_then(|(how, kv)| kv.split_once('=').map(|(k, v)| (how, k, v))) {
            Some(("set", k, v)) => {
                if k == "CUDA_VISIBLE_DEVICES" {
                    if let Ok(mut visible) = VISIBLE.lock() {
                        *visible = Some(v.to_string());
                    }
                }
                setenv(spank, k, v)
            }
            Some(("prepend", k, v)) => match getenv(spank, k).filter(|old| !old.is_empty()) {
                Some(old) => setenv(spank, k, &format!("{v}:{old}")),
                None => setenv(spank, k, v),
            },
            _ => false,
        };
        if !ok {
            return refuse(format!("vgpu: node {node}: cannot set the step's environment ({line:?}); the step is not run unfenced"));
        }
    }
    info(&format!("vgpu: job {job} step {step} on {node} runs in a vGPU"));
    0
}

/// In each task, as root, before it becomes the user: a step vgpu could not fence does not
/// run; the task says why on its stderr (the job's output) and fails.
///
/// # Safety
/// Called by Slurm with its handle.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_task_init_privileged(_spank: Spank, _ac: c_int, _av: *mut *mut c_char) -> c_int {
    guard("slurm_spank_task_init_privileged", || {
        let refused = REFUSED.lock().ok().and_then(|r| r.clone());
        match refused {
            Some(line) => {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "{line}");
                -1
            }
            None => 0,
        }
    })
}

/// In the task, as its user, just before exec: Slurm sets each task's GPU variables after
/// `init_post_opt`, by index; the vGPU names its GPUs by UUID.
///
/// # Safety
/// Called by Slurm with its handle.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_task_init(spank: Spank, _ac: c_int, _av: *mut *mut c_char) -> c_int {
    guard("slurm_spank_task_init", || {
        let visible = VISIBLE.lock().ok().and_then(|v| v.clone());
        if let Some(uuids) = visible {
            if !setenv(spank, "CUDA_VISIBLE_DEVICES", &uuids) {
                error("vgpu: cannot set the task's CUDA_VISIBLE_DEVICES");
                return -1;
            }
        }
        0
    })
}

/// When the step ends (in slurmstepd, as root): its vGPU removed.
///
/// # Safety
/// Called by Slurm with its handle and the plugin's arguments.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_exit(_spank: Spank, ac: c_int, av: *mut *mut c_char) -> c_int {
    guard("slurm_spank_exit", || {
        // SAFETY: no arguments.
        if unsafe { spank_context() } != S_CTX_REMOTE {
            return 0;
        }
        let Some((job, step, node)) = BEGAN.lock().ok().and_then(|mut b| b.take()) else {
            return 0;
        };
        let vgpu = vgpu_path(ac, av);
        let out = std::process::Command::new(&vgpu)
            .args(["slurm", "step-end", "--job", &job.to_string(), "--step", &step, "--node", &node])
            .stdin(std::process::Stdio::null())
            .output();
        match out {
            Ok(out) if out.status.success() => 0,
            Ok(out) => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                error(&format!(
                    "vgpu: node {node}: cannot remove the vGPU of job {job} step {step} ({}); vgpu watch or the next vgpu command removes it",
                    stderr.lines().last().unwrap_or("no message").trim()
                ));
                0
            }
            Err(e) => {
                error(&format!("vgpu: node {node}: cannot run {vgpu} ({e}); vgpu watch or the next vgpu command removes the step's vGPU"));
                0
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_expand_in_order() {
        assert_eq!(expand_hostlist("n1"), ["n1"]);
        assert_eq!(expand_hostlist("n1,n2"), ["n1", "n2"]);
        assert_eq!(expand_hostlist("n[1-2]"), ["n1", "n2"]);
        assert_eq!(expand_hostlist("gpu[01-03,07],login1"), ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]);
    }

    #[test]
    fn option_values_are_checked() {
        assert!(check(OPT_MEM, "4G").is_ok());
        assert!(check(OPT_MEM, "25%").is_ok());
        assert_eq!(check(OPT_MEM, "0").unwrap_err(), "--vgpu-mem=0: a size must be above 0");
        assert!(check(OPT_MEM, "150%").is_err());
        assert!(check(OPT_MEM, "lots").unwrap_err().starts_with("--vgpu-mem=lots: "));
        assert!(check(OPT_COMPUTE, "50").is_ok());
        assert!(check(OPT_COMPUTE, "0").is_err());
        assert!(check(OPT_COMPUTE, "101").is_err());
        assert!(check(OPT_POLICY, "fair").is_ok());
        assert!(check(OPT_POLICY, "loose").is_err());
        assert!(check(OPT_FREQ, "0.5").is_ok());
        assert!(check(OPT_FREQ, "2").is_err());
    }

    /// The hand-written declarations above against Debian's spank.h (libslurm-dev, which
    /// .ci/run installs): the prototypes, the item and context numbers, the option struct
    /// and the version the loader compares.
    #[test]
    fn declarations_match_the_header() {
        let header = std::fs::read_to_string("/usr/include/slurm/spank.h").expect("/usr/include/slurm/spank.h (apt-get install libslurm-dev)");
        let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let header_flat = squash(&header);
        for proto in [
            "spank_err_t spank_option_register (spank_t spank, struct spank_option *opt);",
            "spank_err_t spank_get_item (spank_t spank, spank_item_t item, ...);",
            "spank_err_t spank_getenv (spank_t spank, const char *var, char *buf, int len);",
            "spank_err_t spank_setenv (spank_t spank, const char *var, const char *val, int overwrite);",
            "spank_context_t spank_context (void);",
            "extern void slurm_error (const char *format, ...)",
            "extern void slurm_info (const char *format, ...)",
            "typedef int (*spank_opt_cb_f) (int val, const char *optarg, int remote);",
        ] {
            assert!(header_flat.contains(&squash(proto)), "spank.h no longer declares: {proto}");
        }
        // struct spank_option's fields, in order.
        let mut opt = header_flat.split("struct spank_option {").nth(1).expect("struct spank_option").split("};").next().unwrap_or_default().to_string();
        while let (Some(a), Some(b)) = (opt.find("/*"), opt.find("*/")) {
            opt.replace_range(a..b + 2, "");
        }
        let fields: Vec<String> = opt.split(';').map(squash).filter(|f| !f.is_empty()).collect();
        assert_eq!(fields, ["char * name", "char * arginfo", "char * usage", "int has_arg", "int val", "spank_opt_cb_f cb"]);
        // Enum positions.
        let position = |enum_start: &str, name: &str| -> c_int {
            let body = header.split(enum_start).nth(1).expect(enum_start).split("};").next().unwrap_or_default();
            let names: Vec<&str> = body
                .lines()
                .map(|l| l.split("/*").next().unwrap_or_default().trim().trim_end_matches(','))
                .filter(|l| !l.is_empty())
                .collect();
            names.iter().position(|n| *n == name).unwrap_or_else(|| panic!("{name} not in {enum_start}")) as c_int
        };
        assert_eq!(position("enum spank_item {", "S_JOB_UID"), S_JOB_UID);
        assert_eq!(position("enum spank_item {", "S_JOB_ID"), S_JOB_ID);
        assert_eq!(position("enum spank_item {", "S_JOB_STEPID"), S_JOB_STEPID);
        assert_eq!(position("enum spank_item {", "S_JOB_NODEID"), S_JOB_NODEID);
        assert_eq!(position("enum spank_context {", "S_CTX_LOCAL"), S_CTX_LOCAL);
        assert_eq!(position("enum spank_context {", "S_CTX_REMOTE"), S_CTX_REMOTE);
        assert_eq!(position("enum spank_context {", "S_CTX_ALLOCATOR"), S_CTX_ALLOCATOR);
        let version = std::fs::read_to_string("/usr/include/slurm/slurm_version.h").expect("slurm_version.h");
        let number = version.lines().find_map(|l| l.strip_prefix("#define SLURM_VERSION_NUMBER ")).expect("SLURM_VERSION_NUMBER");
        let number = u32::from_str_radix(number.trim().trim_start_matches("0x"), 16).expect("hex");
        assert_eq!(number >> 8, plugin_version >> 8, "plugin_version's major and minor must be the installed Slurm's");
        let slurm_h = std::fs::read_to_string("/usr/include/slurm/slurm.h").expect("slurm.h");
        assert!(slurm_h.contains("#define SLURM_EXTERN_CONT  (0xfffffffc)"));
        assert!(slurm_h.contains("#define SLURM_BATCH_SCRIPT (0xfffffffb)"));
        assert!(slurm_h.contains("#define SLURM_INTERACTIVE_STEP (0xfffffffa)"));
    }
}

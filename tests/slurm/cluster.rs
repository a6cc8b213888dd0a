//! A real Slurm 22.05 cluster on this machine: `munged` with a key of its own, `slurmctld`,
//! and one `slurmd -N NAME` per node on a port of its own (Debian's build runs several on
//! one host), each node a [`Sim`] of its own (its simulated GPUs, the driver's state, vgpu's
//! config, state and lib directories, in slurmd's environment and so in its slurmstepd's and
//! in the `vgpu` those run). The nodes' gres.conf lines and `Gres=` are `vgpu slurm conf`'s.
//! The plugin is loaded through plugstack.conf (`set_plugin`; srun and each slurmstepd read
//! it when they start, so a test can change it between jobs).
//!
//! Everything it started is killed when it is dropped, pass or fail: munged and slurmctld
//! (its children), every process carrying the cluster's directory in its environment (each
//! srun a test starts and so each task of a job), then each node's Sim (slurmd, its
//! slurmstepds and every task the plugin put in a vGPU carry that node's paths). A cluster
//! that does not come up fails the test with the daemons' logs.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{artefact, processes_carrying, Sim};

/// `nobody`: who submits the jobs.
pub const USER: u32 = 65534;

pub struct Node {
    pub name: String,
    pub sim: Sim,
    port: u16,
    gres: String,
    slurmd: Option<Child>,
}

/// Fields drop in order after `Drop::drop`: the nodes (their Sims kill slurmstepds and
/// fenced tasks), the daemons, then the directory.
pub struct Cluster {
    pub nodes: Vec<Node>,
    daemons: Vec<Child>,
    pub dir: tempfile::TempDir,
    host: String,
}

/// A free TCP port on this machine (bound, read, released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn open_to_all(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod 755");
}

impl Cluster {
    /// Two nodes, `n1` and `n2`, each with one simulated 40 GiB A100, and the plugin loaded.
    pub fn two_nodes() -> Cluster {
        Cluster::start(&[("n1", "NVIDIA A100-SXM4-40GB", "40GiB"), ("n2", "NVIDIA A100-SXM4-40GB", "40GiB")], "")
    }

    /// Nodes given as (name, GPU model, memory), `vgpu_toml` each node's vgpu config.
    pub fn start(nodes: &[(&str, &str, &str)], vgpu_toml: &str) -> Cluster {
        Cluster::start_with(nodes, vgpu_toml, "")
    }

    /// [`Cluster::start`] with lines of slurm.conf of the test's (`{nodes}` in them is the
    /// node list); when they name partitions, the default partition `debug` is left out.
    pub fn start_with(nodes: &[(&str, &str, &str)], vgpu_toml: &str, conf_extra: &str) -> Cluster {
        let gpus: Vec<(&str, Vec<(&str, &str)>)> = nodes.iter().map(|&(name, model, memory)| (name, vec![(model, memory)])).collect();
        let gpus: Vec<(&str, &[(&str, &str)])> = gpus.iter().map(|(name, g)| (*name, g.as_slice())).collect();
        Cluster::start_gpus(&gpus, vgpu_toml, conf_extra)
    }

    /// [`Cluster::start_with`] with nodes given as (name, their GPUs as (model, memory)).
    pub fn start_gpus(nodes: &[(&str, &[(&str, &str)])], vgpu_toml: &str, conf_extra: &str) -> Cluster {
        Cluster::start_with_driver(nodes, "", vgpu_toml, conf_extra)
    }

    /// [`Cluster::start_gpus`], each node's simulated driver configured with the top-level
    /// keys `driver_keys` (e.g. `checkpoint_gbps = 400`) before its devices.
    pub fn start_with_driver(nodes: &[(&str, &[(&str, &str)])], driver_keys: &str, vgpu_toml: &str, conf_extra: &str) -> Cluster {
        let dir = tempfile::Builder::new().prefix("vgpu-slurm-").tempdir().expect("tempdir");
        open_to_all(dir.path());
        // Short, as Slurm compares SlurmctldHost with this host's short name.
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname").trim().split('.').next().unwrap_or_default().to_string();
        let mut cluster = Cluster { nodes: Vec::new(), daemons: Vec::new(), dir, host };
        for sub in ["munge", "ctld", "log", "spool", "dev"] {
            std::fs::create_dir_all(cluster.path(sub)).expect("mkdir");
        }
        // munged: its own key (0400 in a 0700 directory), its socket in a directory anyone
        // may enter (srun runs as the user).
        std::fs::create_dir_all(cluster.path("munge/key")).expect("mkdir");
        std::fs::set_permissions(cluster.path("munge/key"), std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let key: Vec<u8> = (0..1024).map(|i| (i * 7919 % 251) as u8 ^ std::process::id() as u8).collect();
        std::fs::write(cluster.path("munge/key/munge.key"), key).expect("munge key");
        std::fs::set_permissions(cluster.path("munge/key/munge.key"), std::fs::Permissions::from_mode(0o400)).expect("chmod");
        open_to_all(&cluster.path("munge"));
        let munged = Command::new("/usr/sbin/munged")
            .args(["-F", "--force"])
            .arg(format!("--socket={}", cluster.path("munge/socket").display()))
            .arg(format!("--key-file={}", cluster.path("munge/key/munge.key").display()))
            .arg(format!("--pid-file={}", cluster.path("munge/key/munged.pid").display()))
            .arg(format!("--seed-file={}", cluster.path("munge/key/munged.seed").display()))
            .arg(format!("--log-file={}", cluster.path("log/munged.log").display()))
            .env("VGPU_TEST_CLUSTER", cluster.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("munged (apt-get install munge)");
        cluster.daemons.push(munged);
        crate::common::wait_for("munged's socket", || cluster.path("munge/socket").exists());

        // The nodes: a Sim each, readable by the job's user (the shim reads the vGPU's files,
        // the simulated driver its config), their GPUs declared by `vgpu slurm conf`.
        for (i, (name, devices)) in nodes.iter().enumerate() {
            let tables: String = devices.iter().map(|(model, memory)| format!("[[device]]\nname = \"{model}\"\nmemory = \"{memory}\"\n\n")).collect();
            let sim = Sim::with_config(&format!("{driver_keys}\n{tables}"));
            open_to_all(sim.dir.path());
            sim.write_vgpu_config(vgpu_toml);
            // The simulated driver's link directory (run/simulate) exists once vgpu ran.
            sim.vgpu(&["devices"]).assert().success();
            // A device file per GPU, as the driver makes them (/dev/nvidiaN, major 195).
            let dev = cluster.path(&format!("dev/{name}"));
            std::fs::create_dir_all(&dev).expect("mkdir dev");
            for g in 0..devices.len() {
                let file = dev.join(format!("nvidia{g}"));
                let c = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).expect("path");
                // SAFETY: mknod(2) with a NUL-terminated path, a mode and a device number.
                let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(195, (i * 8 + g) as u32)) };
                assert_eq!(rc, 0, "mknod {}: {}", file.display(), std::io::Error::last_os_error());
            }
            let out = sim.vgpu(&["slurm", "conf", "--node", name, "--dev-dir"]).arg(&dev).output().expect("vgpu slurm conf");
            assert!(out.status.success(), "vgpu slurm conf: {}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let gres_conf: String = text.lines().filter(|l| l.starts_with("NodeName=")).map(|l| format!("{l}\n")).collect();
            let gres = text.lines().find(|l| l.starts_with("Gres=")).expect("a Gres= line").to_string();
            let mut all = std::fs::read_to_string(cluster.path("gres.conf")).unwrap_or_default();
            all.push_str(&gres_conf);
            std::fs::write(cluster.path("gres.conf"), all).expect("gres.conf");
            std::fs::create_dir_all(cluster.path(&format!("spool/{name}"))).expect("spool");
            cluster.nodes.push(Node { name: name.to_string(), sim, port: free_port(), gres, slurmd: None });
        }
        cluster.write_conf(free_port(), conf_extra);
        cluster.set_plugin(true);

        let ctld = Command::new("slurmctld")
            .args(["-D", "-i", "-f"])
            .arg(cluster.path("slurm.conf"))
            .env("VGPU_TEST_CLUSTER", cluster.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(cluster.path("log/slurmctld.out")).expect("log")))
            .spawn()
            .expect("slurmctld (apt-get install slurmctld)");
        cluster.daemons.push(ctld);
        for i in 0..cluster.nodes.len() {
            cluster.start_slurmd(i);
        }
        cluster.wait_idle();
        cluster
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write_conf(&self, ctld_port: u16, extra: &str) {
        let d = self.dir.path().display();
        let host = &self.host;
        let mut conf = format!(
            "ClusterName=vgputest\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmctldPort={ctld_port}\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={d}/munge/socket\n\
             CredType=cred/munge\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             StateSaveLocation={d}/ctld\n\
             SlurmdSpoolDir={d}/spool/%n\n\
             SlurmctldPidFile={d}/ctld/slurmctld.pid\n\
             SlurmdPidFile={d}/spool/slurmd.%n.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\n\
             SlurmdLogFile={d}/log/slurmd.%n.log\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             GresTypes=gpu,shard,tflops\n\
             JobCompType=jobcomp/none\n\
             AccountingStorageType=accounting_storage/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             MpiDefault=none\n\
             SwitchType=switch/none\n\
             ReturnToService=2\n\
             KillWait=2\n\
             PlugStackConfig={d}/plugstack.conf\n"
        );
        for node in &self.nodes {
            conf.push_str(&format!(
                "NodeName={} NodeHostname={host} NodeAddr=127.0.0.1 Port={} CPUs=2 {}\n",
                node.name, node.port, node.gres
            ));
        }
        let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        if !extra.contains("PartitionName=") {
            conf.push_str(&format!("PartitionName=debug Nodes={} Default=YES MaxTime=INFINITE State=UP\n", names.join(",")));
        }
        conf.push_str(&extra.replace("{nodes}", &names.join(",")));
        std::fs::write(self.path("slurm.conf"), conf).expect("slurm.conf");
    }

    /// Load spank_vgpu.so (pointing it at the built vgpu), or load nothing.
    pub fn set_plugin(&self, loaded: bool) {
        let text = if loaded { format!("required {} vgpu={}\n", artefact("libspank_vgpu.so").display(), env!("CARGO_BIN_EXE_vgpu")) } else { String::new() };
        std::fs::write(self.path("plugstack.conf"), text).expect("plugstack.conf");
    }

    /// The plugin pointed at a vgpu that is not there (a node without vgpu installed).
    pub fn set_plugin_without_vgpu(&self) {
        let text = format!("required {} vgpu={}\n", artefact("libspank_vgpu.so").display(), self.path("no-vgpu-here").display());
        std::fs::write(self.path("plugstack.conf"), text).expect("plugstack.conf");
    }

    fn start_slurmd(&mut self, i: usize) {
        let conf = self.path("slurm.conf");
        let node = &mut self.nodes[i];
        let mut cmd = Command::new("slurmd");
        cmd.args(["-D", "-N", &node.name, "-f"]).arg(&conf);
        for (k, v) in node.sim.env() {
            cmd.env(k, v);
        }
        // As /etc/slurm/slurm.conf would be: what scontrol, run by vgpu from slurmstepd, reads.
        cmd.env("VGPU_SIMULATE", "1").env("VGPU_LOG", "vgpu=info").env("SLURM_CONF", &conf);
        let log = std::fs::File::create(self.dir.path().join(format!("log/{}.out", node.name))).expect("log");
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::from(log)).spawn().expect("slurmd (apt-get install slurmd)");
        node.slurmd = Some(child);
    }

    /// A Slurm client command (sinfo, scontrol, squeue, …) as root against this cluster.
    pub fn client(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", self.path("slurm.conf")).env("VGPU_TEST_CLUSTER", self.dir.path()).current_dir("/tmp");
        cmd
    }

    /// `srun ARGS…` (or sbatch, salloc) as the user, from /tmp, with nothing of the test's
    /// Slurm or vgpu environment.
    pub fn submit(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = self.submit_as_root(program, args);
        cmd.uid(USER).gid(USER);
        cmd
    }

    /// [`Cluster::submit`] as root (a program only root may run, e.g. a Python under
    /// /root/.pyenv).
    pub fn submit_as_root(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = self.client(program);
        cmd.args(args).env_remove("LD_PRELOAD").env_remove("LD_LIBRARY_PATH").stdin(Stdio::null());
        for (k, _) in std::env::vars() {
            if k.starts_with("SLURM_") && k != "SLURM_CONF" || k.starts_with("VGPU_") && k != "VGPU_TEST_CLUSTER" || k.starts_with("FAKEGPU_") {
                cmd.env_remove(k);
            }
        }
        cmd
    }

    /// Run a client to completion; its output.
    pub fn run(&self, mut cmd: Command) -> Output {
        cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
    }

    /// Each node's state as sinfo says, e.g. `n1 idle`.
    pub fn node_states(&self) -> Vec<(String, String)> {
        let out = self.run({
            let mut c = self.client("sinfo");
            c.args(["-h", "-N", "-o", "%N %T"]);
            c
        });
        // A node in several partitions is listed once for each.
        let mut states: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(n, s)| (n.to_string(), s.trim().to_string())))
            .collect();
        states.sort();
        states.dedup();
        states
    }

    /// Until every node is idle (Slurm's own state); fails with the daemons' logs after 30 s.
    pub fn wait_idle(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let states = self.node_states();
            if states.len() == self.nodes.len() && states.iter().all(|(_, s)| s == "idle") {
                return;
            }
            if Instant::now() > deadline {
                panic!("the Slurm cluster did not come up (sinfo: {states:?})\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The daemons' logs, for a failure's message.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for entry in std::fs::read_dir(self.path("log")).into_iter().flatten().flatten() {
            let body = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let tail: Vec<&str> = body.lines().rev().take(30).collect();
            text.push_str(&format!("--- {}\n", entry.path().display()));
            for l in tail.iter().rev() {
                text.push_str(l);
                text.push('\n');
            }
        }
        text
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).unwrap_or_else(|| panic!("no node {name}"))
    }

    /// `scontrol show node NAME`'s `KEY=value` fields.
    pub fn show(&self, what: &str, id: &str) -> Vec<(String, String)> {
        let out = self.run({
            let mut c = self.client("scontrol");
            c.args(["-o", "show", what, id]);
            c
        });
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect()
    }

    pub fn field(&self, what: &str, id: &str, key: &str) -> Option<String> {
        self.show(what, id).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

impl Node {
    /// The vgpu records, vGPU directories and board slots left on this node.
    pub fn leftovers(&self) -> Vec<PathBuf> {
        let mut left = Vec::new();
        for sub in ["run/workloads", "run/vgpus"] {
            left.extend(std::fs::read_dir(self.sim.path(sub)).into_iter().flatten().flatten().map(|e| e.path()));
        }
        for gpu in std::fs::read_dir(self.sim.path("run/gpus")).into_iter().flatten().flatten() {
            left.extend(std::fs::read_dir(gpu.path()).into_iter().flatten().flatten().map(|e| e.path()));
        }
        left
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let dir = self.dir.path().as_os_str().as_encoded_bytes().to_vec();
        for node in &mut self.nodes {
            if let Some(mut slurmd) = node.slurmd.take() {
                let _ = slurmd.kill();
                let _ = slurmd.wait();
            }
        }
        for round in 0..5 {
            let pids = processes_carrying(&dir);
            for &pid in &pids {
                // SAFETY: kill(2) with a pid and a signal number.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            if pids.is_empty() || round == 4 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for child in &mut self.daemons {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Then each node's Sim (a field, dropped after this): slurmstepds and fenced tasks.
    }
}

//! vgpu as Slurm's GPU fence, against a real Slurm (Debian's 22.05: munged, slurmctld and two
//! `slurmd -N` nodes on this machine, `slurm/cluster.rs`), each node with its own simulated
//! GPUs and vgpu state, `spank_vgpu.so` loaded through plugstack.conf, jobs submitted with
//! srun as `nobody`. Tests wait on Slurm's own state (sinfo, scontrol) and on vgpu's files,
//! never on sleeps. Needs root and the Slurm packages (`.ci/run` installs them); a cluster
//! that cannot start fails the test.
//!
//! An area of the integration harness (tests/integration.rs): each file of tests/slurm/ is
//! a module here. This area: `cargo test --test integration slurm::`; one file's tests:
//! `cargo test --test integration slurm::fence::`.


#[path = "slurm/carbon.rs"]
mod carbon;
#[path = "slurm/cluster.rs"]
mod cluster;
#[path = "slurm/fence.rs"]
mod fence;
#[path = "slurm/node.rs"]
mod node;
#[path = "slurm/preempt.rs"]
mod preempt;

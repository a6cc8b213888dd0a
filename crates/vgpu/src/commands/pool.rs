//! `vgpu pool` (the block map) and `vgpu pool compact`.

use anyhow::Result;
use clap::{Args, Subcommand};

use vgpu_host::context::Context;
use crate::output::print_json;
use crate::output::table;
use vgpu_pool::view::PoolView;
use vgpu_store::read_only::Access;
use vgpu_store::state::Store;

#[derive(Debug, Args)]
pub struct PoolArgs {
    #[command(subcommand)]
    pub command: Option<PoolCommand>,
    /// Print JSON instead of tables
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// Relabel allocations so each owner's blocks are one run and free blocks end each device
    Compact,
}

pub fn run(ctx: &Context, args: &PoolArgs) -> Result<()> {
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    if let Some(PoolCommand::Compact) = args.command {
        return compact(ctx, &store);
    }
    // A listing makes nothing, not even the simulated driver's link directory.
    let gpus = inventory(ctx.nvml_read_only()?)?;
    let view = match Access::take(&store)? {
        // As every command: reconcile, then settle what waits for blocks.
        Access::Writer(lock) => {
            vgpu_host::lifecycle::reconcile_store(&store, &lock);
            let mut pool = vgpu_host::pool_effects::current(ctx, &store, &gpus)?;
            vgpu_host::pool_effects::settle_pool(&store, &lock, &mut pool)?;
            pool.view()
        }
        // The pool as saved: nothing settled, nothing written.
        Access::ReadOnly(_) => vgpu_host::pool_effects::current(ctx, &store, &gpus)?.view(),
    };
    if args.json {
        return print_json(&view);
    }
    print_view(&view);
    Ok(())
}

fn inventory(nvml: Option<vgpu_gpu::Nvml>) -> Result<Vec<vgpu_gpu::GpuInfo>> {
    Ok(match nvml {
        Some(nvml) => nvml.inventory()?,
        None => Vec::new(),
    })
}

/// `vgpu pool compact`: root's, under the store lock (waited for, as every change).
fn compact(ctx: &Context, store: &Store) -> Result<()> {
    if !vgpu_store::read_only::is_root() {
        anyhow::bail!("vgpu pool compact must run as root (through sudo): it rewrites {}", store.state_dir.join(vgpu_host::pool_effects::POOL_FILE).display());
    }
    let gpus = inventory(ctx.nvml()?)?;
    let lock = store.lock()?;
    vgpu_host::lifecycle::reconcile_store(store, &lock);
    let mut pool = vgpu_host::pool_effects::current(ctx, store, &gpus)?;
    vgpu_host::pool_effects::settle_pool(store, &lock, &mut pool)?;
    let moved = pool.compact();
    vgpu_host::pool_effects::save(store, &pool)?;
    println!("{}", if moved { "compacted the pool" } else { "the pool was already compact" });
    Ok(())
}

fn ranges(r: &[[u64; 2]]) -> String {
    if r.is_empty() {
        return "—".into();
    }
    r.iter().map(|[a, b]| if a == b { a.to_string() } else { format!("{a}–{b}") }).collect::<Vec<_>>().join(", ")
}

fn print_view(view: &PoolView) {
    println!(
        "{} blocks of {} TFLOPS ({}): {} used, {} free",
        view.total_blocks, view.block_tflops, view.tflops_precision, view.used_blocks, view.free_blocks
    );
    let regions: Vec<String> = view.regions.iter().map(|r| format!("{} {}", r.kind.as_str(), ranges(&[[r.first, r.last]]))).collect();
    println!("regions: {}", if regions.is_empty() { "—".into() } else { regions.join(", ") });
    let mut devices = table(["KIND", "DEVICE", "TFLOPS", "BLOCKS", "FREE"]);
    for d in &view.devices {
        let name = match (d.nvml_index, &d.id) {
            (Some(i), _) => format!("GPU {i}: {}", d.name),
            (None, Some(id)) => format!("{} ({id})", d.name),
            (None, None) => d.name.clone(),
        };
        devices.add_row([d.kind.as_str().to_string(), name, format!("{}", d.tflops), d.range.map(|r| ranges(&[r])).unwrap_or_else(|| "—".into()), d.free_blocks.to_string()]);
    }
    println!("{devices}");
    if view.allocations.is_empty() {
        println!("No allocations.");
    } else {
        let mut allocs = table(["ID", "NAME", "PRIORITY", "STATE", "BLOCKS", "RANGES"]);
        for a in &view.allocations {
            let state = match &a.suspended_by {
                Some(by) => format!("{} (preempted by {} ({}))", a.state, by.name, by.id),
                None => a.state.to_string(),
            };
            allocs.add_row([a.id.clone(), a.name.clone(), a.priority.to_string(), state, a.blocks.to_string(), ranges(&a.ranges)]);
        }
        println!("{allocs}");
    }
    println!("free: {}", ranges(&view.free));
}

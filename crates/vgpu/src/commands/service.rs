//! `vgpu service create|list|show|remove|scale|update`: services, a command kept running as
//! MIN..MAX replicas, each an ordinary vgpu workload (`vgpu_daemon::service`). The runner (`vgpu
//! watch`, `vgpu service run`) starts and scales them; these commands define them and show
//! what the runner recorded.


use anyhow::Result;
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::commands::run::WorkloadOptions;
use vgpu_store::compute::ComputePolicy;
use vgpu_host::context::Context;
use vgpu_store::error::UsageError;
use crate::output::or_dash;
use crate::output::print_json;
use crate::output::table;
use vgpu_daemon::service::def;
use vgpu_daemon::service::def::ServiceDef;
use vgpu_daemon::service::def::Target;
use vgpu_daemon::service::ServiceError;
use vgpu_daemon::service::ServiceState;
use vgpu_daemon::service::Services;
use vgpu_store::state::Store;

/// The help heading of the service's own options.
const SCALING: &str = "Replicas and scaling";

#[derive(Debug, Args)]
pub struct ServiceArgs {
    #[command(subcommand)]
    pub command: ServiceCommand,
}

#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Define a service: a command kept running as MIN..MAX replicas, each in its own vGPU, scaled by load (run by `vgpu watch` or vgpu-service@NAME.service)
    Create(Box<CreateArgs>),
    /// List services: replicas wanted and running, what they scale on
    List(crate::args::JsonArgs),
    /// Show a service: its definition, replicas, why it is short, the last scaling decisions with their inputs
    Show(NameArgs),
    /// Remove a service (refused while its replicas run, unless --force: the runner then stops them)
    Remove(RemoveArgs),
    /// Set how many replicas a service should have (within its MIN..MAX)
    Scale(ScaleArgs),
    /// Change a service's options; running replicas keep their old ones until they are restarted
    Update(Box<UpdateArgs>),
    /// Run a service's replicas in the foreground (what vgpu-service@NAME.service runs); vgpu watch then leaves the service to it
    Run(crate::commands::service_run::ServiceRunArgs),
}


/// The service's own options (its replicas take `vgpu run`'s, [`WorkloadOptions`]).
#[derive(Debug, Clone, Default, Args)]
pub struct ScalingOptions {
    /// Scale on a signal's mean utilization over the replicas: cpu=70%, mem=80%, gpu=60% (repeatable; `none` on update removes them) [default: no autoscaling]
    #[arg(long = "scale-on", value_name = "SIGNAL=PCT%", help_heading = SCALING)]
    pub scale_on: Vec<String>,
    /// Scale-up acts after one window of higher recommendations [default: 60s]
    #[arg(long, value_name = "DURATION", help_heading = SCALING)]
    pub window: Option<String>,
    /// Scale-down acts only after this long of consistently lower recommendations [default: 120s]
    #[arg(long, value_name = "DURATION", help_heading = SCALING)]
    pub cooldown: Option<String>,
    /// Time between SIGTERM and SIGKILL when a replica is stopped [default: 10s]
    #[arg(long, value_name = "DURATION", help_heading = SCALING)]
    pub grace: Option<String>,
}

#[derive(Debug, Args)]
#[command(trailing_var_arg = true)]
pub struct CreateArgs {
    /// Service name: lowercase letters, digits, '_', '.', '-' (at most 60); replica i is the workload NAME-i
    pub name: String,
    /// How many replicas: MIN-MAX (0 <= MIN <= MAX <= 64, MAX >= 1), or N for exactly N
    #[arg(long, value_name = "MIN-MAX|N", help_heading = SCALING)]
    pub replicas: String,
    #[command(flatten)]
    pub scaling: ScalingOptions,
    #[command(flatten)]
    pub options: WorkloadOptions,
    /// Print the service as JSON
    #[arg(long)]
    pub json: bool,
    /// The command and its arguments; `{replica}` becomes the replica's index (0, 1, …)
    #[arg(required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
#[command(trailing_var_arg = true)]
pub struct UpdateArgs {
    /// Service name
    #[arg(add = crate::args::service_candidates())]
    pub name: String,
    /// New replica range: MIN-MAX or N
    #[arg(long, value_name = "MIN-MAX|N", help_heading = SCALING)]
    pub replicas: Option<String>,
    #[command(flatten)]
    pub scaling: ScalingOptions,
    #[command(flatten)]
    pub options: WorkloadOptions,
    /// Print the service as JSON
    #[arg(long)]
    pub json: bool,
    /// A new command (after --)
    #[arg(value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct NameArgs {
    /// Service name
    #[arg(add = crate::args::service_candidates())]
    pub name: String,
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    /// Service name
    #[arg(add = crate::args::service_candidates())]
    pub name: String,
    /// Remove it even while replicas run: the runner stops them (SIGTERM, SIGKILL after the grace)
    #[arg(long)]
    pub force: bool,
    /// Print what was done as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// Service name
    #[arg(add = crate::args::service_candidates())]
    pub name: String,
    /// Desired replicas, within the service's MIN..MAX (an autoscaled service moves on from there)
    pub replicas: u32,
    /// Print the service as JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(ctx: &Context, args: &ServiceArgs) -> Result<()> {
    match &args.command {
        ServiceCommand::Create(a) => create(ctx, a),
        ServiceCommand::List(a) => list(ctx, a.json),
        ServiceCommand::Show(a) => show(ctx, a),
        ServiceCommand::Remove(a) => remove(ctx, a),
        ServiceCommand::Scale(a) => scale(ctx, a),
        ServiceCommand::Update(a) => update(ctx, a),
        ServiceCommand::Run(a) => crate::commands::service_run::run(ctx, a),
    }
}

/// Errors of the service store at the CLI edge: a missing service or an invalid file is
/// the user's (exit 2).
fn service_error(e: ServiceError) -> anyhow::Error {
    match e {
        ServiceError::NotFound { .. }
        | ServiceError::Invalid { .. }
        | ServiceError::Refused { .. } => UsageError::new(e.to_string()).into(),
        ServiceError::State(s) => anyhow::Error::new(s),
    }
}

fn must_be_root(what: &str) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!(
            "vgpu service {what} must run as root (through sudo): services run as root's workloads"
        );
    }
    Ok(())
}

fn usage<E: std::fmt::Display>(option: &str) -> impl Fn(E) -> anyhow::Error + '_ {
    move |e| UsageError::new(format!("{option}: {e}")).into()
}

/// The definition's values for the options given.
fn apply_options(def: &mut ServiceDef, o: &WorkloadOptions) {
    let r = &mut def.run;
    if !o.gpus.is_empty() {
        r.gpu = o.gpus.clone();
    }
    let set = |to: &mut Option<String>, from: &Option<String>| {
        if from.is_some() {
            to.clone_from(from);
        }
    };
    set(&mut r.gpus, &o.gpu_count);
    set(&mut r.mem, &o.mem);
    r.compute = o.compute.or(r.compute);
    r.compute_policy = o.compute_policy.or(r.compute_policy);
    if let Some(us) = o.turn {
        r.turn = Some(if us % 1000 == 0 { format!("{}ms", us / 1000) } else { format!("{us}us") });
    }
    set(&mut r.partition, &o.partition);
    set(&mut r.tflops, &o.tflops);
    set(&mut r.kind, &o.kind);
    set(&mut r.priority, &o.priority);
    r.freq_sensitivity = o.freq_sensitivity.or(r.freq_sensitivity);
    r.cpus = o.cpus.or(r.cpus);
    set(&mut r.memory, &o.memory);
    r.pids = o.pids.or(r.pids);
    set(&mut r.user, &o.user);
    if !o.env.is_empty() {
        // A variable given again replaces the old value; the others stay.
        let keys: Vec<&str> = o
            .env
            .iter()
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
            .collect();
        r.env
            .retain(|kv| kv.split_once('=').is_none_or(|(k, _)| !keys.contains(&k)));
        r.env.extend(o.env.iter().cloned());
    }
    if o.cwd.is_some() {
        r.cwd.clone_from(&o.cwd);
    }
    r.oversubscribe |= o.oversubscribe;
}

fn apply_scaling(def: &mut ServiceDef, s: &ScalingOptions) -> Result<()> {
    if !s.scale_on.is_empty() {
        def.scale_on = if s.scale_on.iter().any(|t| t == "none") {
            Vec::new()
        } else {
            s.scale_on
                .iter()
                .map(|t| t.parse::<Target>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(usage("--scale-on"))?
        };
    }
    for (option, text, to) in [
        ("--window", &s.window, &mut def.window),
        ("--cooldown", &s.cooldown, &mut def.cooldown),
        ("--grace", &s.grace, &mut def.grace),
    ] {
        if let Some(text) = text {
            *to = def::parse_duration(text).map_err(usage(option))?;
        }
    }
    Ok(())
}

/// Checks `def` as `vgpu run` would check replica 0 (clap's rules and run's validation,
/// `[policy]` included, without running anything), then records what the runner (root)
/// must not decide again for a sudo caller: the user and the priority `run` gave them.
fn validate(ctx: &Context, def: &mut ServiceDef) -> Result<()> {
    def.check().map_err(|e| UsageError::new(e.message))?;
    crate::commands::run::sudo_caller()?;
    let argv = ["vgpu".to_string(), "run".to_string()]
        .into_iter()
        .chain(def.option_args(0));
    let run_args = crate::commands::run::parse_args(argv)
        .map_err(|e| UsageError::new(vgpu_store::error::one_line_clap_error(&e.render().to_string())))?;
    let request =
        crate::commands::run::validate(ctx, &run_args).map_err(|e| match e
            .downcast_ref::<vgpu_store::error::NotRunnable>()
        {
            Some(not) => UsageError::new(format!(
                "command {:?}: {}",
                not.program,
                if not.missing {
                    "not found"
                } else {
                    "cannot be executed"
                }
            ))
            .into(),
            None => e,
        })?;
    let sudo_uid = std::env::var("SUDO_UID").ok();
    if vgpu_store::identity::sudo_caller(sudo_uid.as_deref())
        .map_err(|e| UsageError::new(e.to_string()))?
        .is_some()
    {
        def.run
            .user
            .get_or_insert_with(|| request.user.name.clone());
        def.run
            .priority
            .get_or_insert_with(|| request.priority.get().to_string());
    }
    Ok(())
}

/// Through sudo, only a service whose replicas run as the caller may be changed.
fn check_owner(def: &ServiceDef) -> Result<()> {
    let sudo_uid = std::env::var("SUDO_UID").ok();
    let Some(caller) = vgpu_store::identity::sudo_caller(sudo_uid.as_deref())
        .map_err(|e| UsageError::new(e.to_string()))?
    else {
        return Ok(());
    };
    let user = def
        .run
        .user
        .as_deref()
        .map(|u| u.split(':').next().unwrap_or(u));
    if user != Some(caller.name.as_str()) && user != Some(caller.uid.to_string().as_str()) {
        vgpu_store::usage!("service {}: its replicas run as {}; through sudo, only your own services can be changed", def.name, user.unwrap_or("root"));
    }
    Ok(())
}

fn create(ctx: &Context, args: &CreateArgs) -> Result<()> {
    if !def::valid_name(&args.name) {
        vgpu_store::usage!("invalid service name {:?}: lowercase letters, digits, '_', '.', '-', starting with a letter or digit, at most {}", args.name, def::MAX_NAME_LEN);
    }
    let (min, max) = def::parse_replicas(&args.replicas).map_err(usage("--replicas"))?;
    let mut service = ServiceDef {
        name: args.name.clone(),
        min,
        max,
        run: vgpu_host::workload_file::Options::default(),
        command: args.command.clone(),
        scale_on: Vec::new(),
        window: def::DEFAULT_WINDOW,
        cooldown: def::DEFAULT_COOLDOWN,
        grace: def::DEFAULT_GRACE,
    };
    apply_scaling(&mut service, &args.scaling)?;
    apply_options(&mut service, &args.options);
    validate(ctx, &mut service)?;
    must_be_root("create")?;
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let _lock = store.lock()?;
    let services = Services::new(&ctx.lib_dir);
    match services.load(&args.name) {
        Err(ServiceError::NotFound { .. }) => {}
        _ => vgpu_store::usage!("service {:?} already exists (see `vgpu service show {}`; change it with `vgpu service update`)", args.name, args.name),
    }
    if services.state(&args.name).map_err(service_error)?.stopping {
        vgpu_store::usage!(
            "service {:?} is being removed: its replicas are still stopping",
            args.name
        );
    }
    services.save(&service).map_err(service_error)?;
    let state = ServiceState {
        desired: min,
        ..Default::default()
    };
    services
        .save_state(&service.name, &state)
        .map_err(service_error)?;
    let view = Listed::of(ctx, &service, &state);
    if args.json {
        return print_json(&view);
    }
    println!(
        "created service {} ({}-{} replicas, {} wanted now): {}",
        service.name,
        min,
        max,
        min,
        services.def_path(&service.name).display()
    );
    // A workload that took a replica's name before the service existed keeps that
    // replica out until it ends (`vgpu run --name NAME-<i>` is refused from now on).
    let (running, _) = store.workloads();
    for held in running.iter().filter(|w| w.service.as_ref().is_none_or(|s| s.name != service.name)) {
        if let Some(index) = held.name.strip_prefix(&format!("{}-", service.name)).and_then(|i| i.parse::<u32>().ok()).filter(|i| *i < max) {
            if held.name == format!("{}-{index}", service.name) {
                vgpu_host::notice!("replica {index}'s name {} is held by workload {} of user {}: that replica starts once it ends", held.name, held.id, held.user.name);
            }
        }
    }
    if runner_of(ctx, &service.name).is_none() {
        vgpu_host::notice!("{}", no_runner_hint(&service.name));
    }
    Ok(())
}

/// For a command that changes service `name`: root, the store lock, the definition, and
/// the caller's right to it (through sudo, only a service whose replicas run as the caller).
fn open_own(ctx: &Context, what: &str, name: &str) -> Result<(Store, vgpu_store::state::StoreLock, Services, ServiceDef)> {
    must_be_root(what)?;
    let store = Store::new(&ctx.state_dir, &ctx.lib_dir);
    let lock = store.lock()?;
    let services = Services::new(&ctx.lib_dir);
    let service = services.load(name).map_err(service_error)?;
    check_owner(&service)?;
    Ok((store, lock, services, service))
}

fn update(ctx: &Context, args: &UpdateArgs) -> Result<()> {
    let (_store, _lock, services, mut service) = open_own(ctx, "update", &args.name)?;
    if let Some(replicas) = &args.replicas {
        (service.min, service.max) = def::parse_replicas(replicas).map_err(usage("--replicas"))?;
    }
    apply_scaling(&mut service, &args.scaling)?;
    apply_options(&mut service, &args.options);
    if !args.command.is_empty() {
        service.command.clone_from(&args.command);
    }
    validate(ctx, &mut service)?;
    services.save(&service).map_err(service_error)?;
    let mut state = services.state(&service.name).map_err(service_error)?;
    let clamped = state.desired.clamp(service.min, service.max);
    if clamped != state.desired {
        state.desired = clamped;
        services
            .save_state(&service.name, &state)
            .map_err(service_error)?;
    }
    if args.json {
        return print_json(&Listed::of(ctx, &service, &state));
    }
    let running = state.running().count();
    println!(
        "updated service {}{}",
        service.name,
        if running > 0 {
            format!("; its {running} running replica(s) keep their old options until restarted")
        } else {
            String::new()
        }
    );
    Ok(())
}

fn scale(ctx: &Context, args: &ScaleArgs) -> Result<()> {
    let (_store, _lock, services, service) = open_own(ctx, "scale", &args.name)?;
    if !(service.min..=service.max).contains(&args.replicas) {
        vgpu_store::usage!("service {}: {} replicas is outside its range {}-{} (change it with `vgpu service update {} --replicas MIN-MAX`)", service.name, args.replicas, service.min, service.max, service.name);
    }
    let mut state = services.state(&service.name).map_err(service_error)?;
    let before = state.desired;
    state.desired = args.replicas;
    services
        .save_state(&service.name, &state)
        .map_err(service_error)?;
    if args.json {
        return print_json(&Listed::of(ctx, &service, &state));
    }
    println!(
        "service {}: {} replicas wanted (was {before}){}",
        service.name,
        args.replicas,
        if service.scale_on.is_empty() {
            ""
        } else {
            "; the autoscaler moves on from there"
        }
    );
    Ok(())
}

/// What `service remove --json` prints.
#[derive(Serialize)]
struct Removed<'a> {
    name: &'a str,
    /// Replicas that were running: the runner stops them (`--force`).
    stopping_replicas: u32,
}

fn remove(ctx: &Context, args: &RemoveArgs) -> Result<()> {
    let (store, _lock, services, service) = open_own(ctx, "remove", &args.name)?;
    let mut state = services.state(&service.name).map_err(service_error)?;
    // Replicas that run: the workload records naming this service (`vgpu run --service`
    // writes the name before the workload starts, so a replica admitted a moment ago counts
    // even before the runner's state lists it), and those the state lists whose record is
    // still there (even damaged: it may still run).
    let (workloads, _) = store.workloads();
    let mut running: Vec<String> =
        workloads.iter().filter(|w| w.service.as_ref().is_some_and(|s| s.name == service.name)).map(|w| w.id.clone()).collect();
    for id in state.running().filter_map(|r| r.workload_id.as_deref()).filter(|id| store.workload_path(id).exists()) {
        if !running.iter().any(|r| r == id) {
            running.push(id.to_string());
        }
    }
    let stopping = running.len() as u32;
    if stopping == 0 {
        services.remove(&service.name).map_err(service_error)?;
    } else if args.force {
        state.stopping = true;
        state.desired = 0;
        services
            .save_state(&service.name, &state)
            .map_err(service_error)?;
        services.remove_def(&service.name).map_err(service_error)?;
    } else {
        vgpu_store::usage!("service {} has {stopping} running replica(s) ({}): `vgpu service scale {} 0` first (if its MIN is 0), or --force to have the runner stop them", service.name, running.join(", "), service.name);
    }
    if args.json {
        return print_json(&Removed {
            name: &service.name,
            stopping_replicas: stopping,
        });
    }
    if stopping > 0 {
        println!(
            "removed service {}; the runner stops its {stopping} replica(s)",
            service.name
        );
    } else {
        println!("removed service {}", service.name);
    }
    Ok(())
}

/// A scaling target as the JSON shows it.
#[derive(Serialize)]
struct TargetJson {
    signal: &'static str,
    target_pct: f64,
}

/// The replicas' `vgpu run` options, as given (null when not given).
#[derive(Serialize)]
struct OptionsJson<'a> {
    gpu: &'a [String],
    gpus: Option<&'a str>,
    mem: Option<&'a str>,
    compute_pct: Option<u32>,
    compute_policy: Option<ComputePolicy>,
    /// `--turn`, as given (`"2ms"`).
    turn: Option<&'a str>,
    partition: Option<&'a str>,
    tflops: Option<&'a str>,
    kind: Option<&'a str>,
    priority: Option<&'a str>,
    freq_sensitivity: Option<f64>,
    cpus: Option<f64>,
    memory: Option<&'a str>,
    pids: Option<u64>,
    user: Option<&'a str>,
    env: &'a [String],
    cwd: Option<String>,
    oversubscribe: bool,
}

/// One service as `service list --json` (and create/update/scale --json) prints it.
#[derive(Serialize)]
struct Listed<'a> {
    name: &'a str,
    min_replicas: u32,
    max_replicas: u32,
    desired_replicas: u32,
    running_replicas: u32,
    /// Why fewer than desired run, as the runner last said.
    short: Option<&'a str>,
    /// Removed with --force; the runner is stopping its replicas.
    stopping: bool,
    /// What runs it now: "service-run" (`vgpu service run NAME`), "watch" (`vgpu watch`),
    /// or null: nothing, its replicas are neither started nor restarted.
    runner: Option<&'static str>,
    scale_on: Vec<TargetJson>,
    window_ms: u64,
    cooldown_ms: u64,
    grace_ms: u64,
    command: &'a [String],
    options: OptionsJson<'a>,
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn pct(ratio: f64) -> f64 {
    (ratio * 1000.0).round() / 10.0
}

/// What runs service `name` now: the holder of its runner lock (`vgpu service run`), else
/// the watch (which runs every service not held so), else nothing.
fn runner_of(ctx: &Context, name: &str) -> Option<&'static str> {
    use vgpu_daemon::watch::instance::held;
    use vgpu_daemon::watch::instance::running;
    use vgpu_daemon::watch::instance::Running;
    let watch = running(&ctx.state_dir);
    match (held(&vgpu_daemon::service::runner::lock_path(ctx, name)), &watch) {
        // The watch takes a service's lock too while it runs it.
        (Running::Yes(Some(holder)), Running::Yes(Some(watch))) if holder == *watch => Some("watch"),
        (Running::Yes(_), _) => Some("service-run"),
        (_, Running::Yes(_)) => Some("watch"),
        _ => None,
    }
}

/// The line that says nothing runs a service, and how to have it run.
fn no_runner_hint(name: &str) -> String {
    format!(
        "nothing runs service {name} now: start `vgpu watch` (systemctl enable --now vgpu-watch.service), \
         or `vgpu service run {name}` (systemctl enable --now vgpu-service@{name}.service)"
    )
}

impl<'a> Listed<'a> {
    fn of(ctx: &Context, def: &'a ServiceDef, state: &'a ServiceState) -> Listed<'a> {
        let r = &def.run;
        Listed {
            runner: runner_of(ctx, &def.name),
            name: &def.name,
            min_replicas: def.min,
            max_replicas: def.max,
            desired_replicas: state.desired,
            running_replicas: state.running().count() as u32,
            short: state.short.as_deref(),
            stopping: state.stopping,
            scale_on: def
                .scale_on
                .iter()
                .map(|t| TargetJson {
                    signal: t.signal.as_str(),
                    target_pct: pct(t.target),
                })
                .collect(),
            window_ms: ms(def.window),
            cooldown_ms: ms(def.cooldown),
            grace_ms: ms(def.grace),
            command: &def.command,
            options: OptionsJson {
                gpu: &r.gpu,
                gpus: r.gpus.as_deref(),
                mem: r.mem.as_deref(),
                compute_pct: r.compute,
                compute_policy: r.compute_policy,
                turn: r.turn.as_deref(),
                partition: r.partition.as_deref(),
                tflops: r.tflops.as_deref(),
                kind: r.kind.as_deref(),
                priority: r.priority.as_deref(),
                freq_sensitivity: r.freq_sensitivity,
                cpus: r.cpus,
                memory: r.memory.as_deref(),
                pids: r.pids,
                user: r.user.as_deref(),
                env: &r.env,
                cwd: r.cwd.as_ref().map(|c| c.display().to_string()),
                oversubscribe: r.oversubscribe,
            },
        }
    }
}

/// A damaged service file, as `service list --json` reports it.
#[derive(Serialize)]
struct DamagedJson {
    error: String,
}

#[derive(Serialize)]
struct ListedAll<'a> {
    services: Vec<Listed<'a>>,
    damaged: Vec<DamagedJson>,
}

fn list(ctx: &Context, json: bool) -> Result<()> {
    let services = Services::new(&ctx.lib_dir);
    let (defs, damaged) = services.list().map_err(service_error)?;
    let states: Vec<ServiceState> = defs
        .iter()
        .map(|d| services.state(&d.name).unwrap_or_default())
        .collect();
    let listed: Vec<Listed> = defs
        .iter()
        .zip(&states)
        .map(|(d, s)| Listed::of(ctx, d, s))
        .collect();
    for e in &damaged {
        tracing::warn!("{e}");
    }
    if json {
        return print_json(&ListedAll {
            services: listed,
            damaged: damaged
                .iter()
                .map(|e| DamagedJson {
                    error: e.to_string(),
                })
                .collect(),
        });
    }
    if listed.is_empty() {
        println!("No services.");
        return Ok(());
    }
    let mut t = table([
        "NAME", "REPLICAS", "DESIRED", "RUNNING", "SCALE ON", "COMMAND",
    ]);
    for (l, d) in listed.iter().zip(&defs) {
        t.add_row([
            l.name.to_string(),
            format!("{}-{}", l.min_replicas, l.max_replicas),
            l.desired_replicas.to_string(),
            if l.stopping {
                format!("{} (stopping)", l.running_replicas)
            } else {
                l.running_replicas.to_string()
            },
            if d.scale_on.is_empty() {
                "—".into()
            } else {
                d.scale_on
                    .iter()
                    .map(Target::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            shell_words(&d.command),
        ]);
    }
    println!("{t}");
    Ok(())
}

/// A replica as `service show --json` prints it.
#[derive(Serialize)]
struct ReplicaJson<'a> {
    index: u32,
    name: String,
    workload_id: Option<&'a str>,
    restarts: u32,
    last_exit: Option<i32>,
    next_start_unix_ms: Option<u64>,
}

#[derive(Serialize)]
struct ValueJson {
    signal: &'static str,
    value_pct: f64,
    target_pct: f64,
    replicas: u32,
    recommended_replicas: u32,
}

#[derive(Serialize)]
struct DecisionJson<'a> {
    at_unix_ms: u64,
    current_replicas: u32,
    recommended_replicas: u32,
    desired_replicas: u32,
    values: Vec<ValueJson>,
    reason: &'a str,
}

#[derive(Serialize)]
struct Shown<'a> {
    #[serde(flatten)]
    service: Listed<'a>,
    replicas: Vec<ReplicaJson<'a>>,
    decisions: Vec<DecisionJson<'a>>,
}

fn show(ctx: &Context, args: &NameArgs) -> Result<()> {
    let services = Services::new(&ctx.lib_dir);
    let service = services.load(&args.name).map_err(service_error)?;
    let state = services.state(&service.name).map_err(service_error)?;
    let shown = Shown {
        service: Listed::of(ctx, &service, &state),
        replicas: state
            .replicas
            .iter()
            .map(|r| ReplicaJson {
                index: r.index,
                name: format!("{}-{}", service.name, r.index),
                workload_id: r.workload_id.as_deref(),
                restarts: r.restarts,
                last_exit: r.last_exit,
                next_start_unix_ms: r.next_start_unix_ms,
            })
            .collect(),
        decisions: state
            .decisions
            .iter()
            .map(|d| DecisionJson {
                at_unix_ms: d.at_unix_ms,
                current_replicas: d.current,
                recommended_replicas: d.recommended,
                desired_replicas: d.desired,
                values: d
                    .values
                    .iter()
                    .map(|v| ValueJson {
                        signal: v.signal.as_str(),
                        value_pct: pct(v.value),
                        target_pct: pct(v.target),
                        replicas: v.replicas,
                        recommended_replicas: v.recommended,
                    })
                    .collect(),
                reason: &d.reason,
            })
            .collect(),
    };
    if args.json {
        return print_json(&shown);
    }
    let l = &shown.service;
    println!(
        "service {}: {} of {} wanted replicas running (range {}-{}){}",
        l.name,
        l.running_replicas,
        l.desired_replicas,
        l.min_replicas,
        l.max_replicas,
        if l.stopping { "; being removed" } else { "" }
    );
    match l.runner {
        Some("service-run") => println!("run by: vgpu service run {}", l.name),
        Some(_) => println!("run by: vgpu watch"),
        None => println!("run by: {}", no_runner_hint(l.name)),
    }
    if let Some(short) = l.short {
        println!("short: {short}");
    }
    let targets = if service.scale_on.is_empty() {
        "nothing (a fixed count: `vgpu service scale`)".to_string()
    } else {
        service
            .scale_on
            .iter()
            .map(Target::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "scales on: {targets}; window {}, cooldown {}, grace {}",
        humantime::format_duration(service.window),
        humantime::format_duration(service.cooldown),
        humantime::format_duration(service.grace)
    );
    println!("command: {}", shell_words(&service.command));
    let options = service.options_text();
    println!(
        "options: {}",
        if options.is_empty() {
            "none".to_string()
        } else {
            options.join(" ")
        }
    );
    println!("file: {}", services.def_path(&service.name).display());
    if !shown.replicas.is_empty() {
        let mut t = table(["REPLICA", "WORKLOAD", "RESTARTS", "LAST EXIT", "NEXT START"]);
        for r in &shown.replicas {
            t.add_row([
                r.name.clone(),
                or_dash(r.workload_id),
                r.restarts.to_string(),
                or_dash(r.last_exit),
                or_dash(r.next_start_unix_ms.map(time)),
            ]);
        }
        println!("{t}");
    }
    if shown.decisions.is_empty() {
        println!("No scaling decisions yet.");
        return Ok(());
    }
    let mut t = table(["TIME", "CURRENT", "DESIRED", "VALUES", "REASON"]);
    for d in &shown.decisions {
        let values: Vec<String> = d
            .values
            .iter()
            .map(|v| {
                format!(
                    "{} {}% (target {}%, {} replica(s))",
                    v.signal, v.value_pct, v.target_pct, v.replicas
                )
            })
            .collect();
        t.add_row([
            time(d.at_unix_ms),
            d.current_replicas.to_string(),
            d.desired_replicas.to_string(),
            if values.is_empty() {
                "—".into()
            } else {
                values.join(", ")
            },
            d.reason.to_string(),
        ]);
    }
    println!("{t}");
    Ok(())
}

fn time(unix_ms: u64) -> String {
    humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms),
    )
    .to_string()
}

/// The command as one line, each argument quoted when it needs to be.
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,{}@%+".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

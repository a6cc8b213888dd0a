// vgpu starts from C's `main`, not through Rust's runtime start: see `vgpu::start` for why
// and for what that start did that `start::run` does instead.
#![no_main]

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::FromArgMatches as _;

use vgpu::cli::Cli;
use vgpu_host::config::ConfigError;
use vgpu_host::context::Context;
use vgpu_host::context::Origin;
use vgpu_store::error::exit_code_for;
use vgpu_store::error::UsageError;

/// The process's entry, as C's `main`.
#[no_mangle]
pub extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    vgpu::start::run(vgpu_main)
}

fn vgpu_main() -> u8 {
    // Files and directories get explicit modes where they are made; a known umask makes sure
    // nothing vgpu creates can ever be wider than asked, whatever started it (cron: 000).
    // SAFETY: umask only swaps the process's file-creation mask; no thread runs yet.
    unsafe { libc::umask(0o022) };
    // A shell asking for completions (COMPLETE=SHELL, from `vgpu completions SHELL`'s
    // script) is answered here, and vgpu exits: nothing below runs.
    clap_complete::CompleteEnv::with_factory(vgpu::cli::command).var(vgpu::commands::completions::COMPLETE_VAR).complete();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cmd = vgpu::cli::parsing_command(&argv);
    // What clap has to say (help, a usage error) it says from the whole command.
    let mut matches = match cmd.try_get_matches_from(&argv).or_else(|_| vgpu::cli::command().try_get_matches_from(&argv)) {
        Ok(m) => m,
        Err(e) => return clap_error(e),
    };
    // Asked before the options are taken out of the matches below (said after the words).
    let root_only_option = root_only_option(&matches);
    // Taken out, not copied (`from_arg_matches` copies every match first).
    let cli = match Cli::from_arg_matches_mut(&mut matches) {
        Ok(cli) => cli,
        Err(e) => return clap_error(e),
    };
    if let Some(words) = vgpu::cli::stray_words(&cli.command, &argv) {
        eprintln!("vgpu: error: `{words}` before `--` is no option's value: vgpu's options go before `--`, each with its value in one word (--mem 4G), and the command after it");
        return vgpu_store::error::EXIT_USAGE;
    }
    if let Some(option) = root_only_option {
        eprintln!("vgpu: error: {option} is root's own setting: through sudo, vgpu uses root's config and directories (user guide: Security model)");
        return vgpu_store::error::EXIT_USAGE;
    }
    init_logging(cli.verbose, cli.quiet);
    if let Some(refusal) = vgpu::cli::root_only(&cli.command) {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("vgpu: error: {refusal}");
            return 1;
        }
    }
    // A listing piped into `head` ends quietly when the pipe closes (SIGPIPE, exit 141 in
    // a shell), as coreutils do, instead of panicking on EPIPE. Not `run` (it must outlive
    // its terminal to tear its workload down) nor `watch` (a daemon).
    if !matches!(*cli.command, vgpu::cli::Command::Run(_) | vgpu::cli::Command::Watch(_)) {
        // SAFETY: restoring a signal's default disposition; no other thread runs yet.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // A tenant can shrink its own usage file under our mapping: that must not kill root's
    // command (see vgpu_abi::mapping::truncation_guard).
    if let Err(e) = vgpu_abi::mapping::truncation_guard::install() {
        tracing::warn!("cannot install the SIGBUS guard: {e}");
    }
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            // One line: the error and its causes, outermost first.
            eprintln!("vgpu: error: {err:#}");
            exit_code_for(&err)
        }
    }
}

/// Through sudo by a user other than root (`SUDO_UID` set, not 0), `--config`,
/// `--state-dir` and `--lib-dir` given on the command line are refused: root's commands
/// would otherwise take their `[policy]` (who may run as whom, priorities), the workload
/// records and the service definitions from the caller's files. sudo cannot filter
/// arguments the way its `env_reset` keeps `VGPU_CONFIG` and the like root's.
fn root_only_option(matches: &clap::ArgMatches) -> Option<&'static str> {
    let option = [("config", "--config"), ("state_dir", "--state-dir"), ("lib_dir", "--lib-dir")]
        .into_iter()
        .find(|(id, _)| matches.value_source(id) == Some(ValueSource::CommandLine))
        .map(|(_, option)| option)?;
    // Who is a sudo caller, as `vgpu run` decides it: an unreadable SUDO_UID is one too.
    match vgpu_store::identity::sudo_caller(std::env::var("SUDO_UID").ok().as_deref()) {
        Ok(None) => None,
        Ok(Some(_)) | Err(_) => Some(option),
    }
}

/// Help and version go to stdout as clap writes them (exit 0), and so does the help shown
/// for a missing subcommand (exit 2). Every other parse error is one line, like vgpu's own
/// usage errors, and exit 2.
fn clap_error(e: clap::Error) -> u8 {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
        _ => {
            eprintln!("vgpu: error: {}", vgpu_store::error::one_line_clap_error(&e.render().to_string()));
            vgpu_store::error::EXIT_USAGE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    let origin = Origin { config: cli.config.clone(), state_dir: cli.state_dir.clone(), lib_dir: cli.lib_dir.clone(), simulate: cli.simulate };
    let ctx = match Context::load(origin) {
        Ok(ctx) => ctx,
        Err(e @ ConfigError::Invalid { .. }) => return Err(UsageError::new(e.to_string()).into()),
        // A config file named on the command line that cannot be read is the caller's
        // mistake, as the user guide says (docs/scripting.md): exit 2.
        Err(ConfigError::Read { path, source }) if cli.config.is_some() => {
            return Err(UsageError::new(format!("cannot read config {}: {source}", path.display())).into())
        }
        Err(e) => return Err(e.into()),
    };
    // Reconcile re-plans the clocks when it cleans up a dead workload: it needs the settings.
    vgpu_host::carbon::follow::install(&ctx);
    vgpu::cli::dispatch(&ctx, &cli.command)
}

/// `-q` and `-v` govern every line on stderr but errors: the log's (through tracing) and
/// the notices (`vgpu_host::notice::notice`). On the command line they win over `VGPU_LOG`.
fn init_logging(verbose: u8, quiet: bool) {
    vgpu_host::notice::set_quiet(quiet);
    let env = std::env::var("VGPU_LOG").ok();
    let directives = vgpu::output::log_filter(verbose, quiet, env.as_deref());
    let filter = tracing_subscriber::EnvFilter::try_new(&directives).unwrap_or_else(|e| {
        eprintln!("vgpu: warning: VGPU_LOG={directives:?} is not a log filter ({e}); logging warnings");
        tracing_subscriber::EnvFilter::new(vgpu::output::log_filter(0, false, None))
    });
    // A log line that cannot be written (stderr a closed pipe) is dropped: tracing's own
    // report of that failure would panic the thread that logged, e.g. `vgpu run`'s signal relay.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .event_format(vgpu::output::LogFormat)
        .init();
}

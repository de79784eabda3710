//! `attnc`: the command-line driver. `args.rs` is what clap parses, `cmd/`
//! what each command does (reading and writing files, printing diagnostics),
//! `progress.rs` what it draws while it works; everything else is a library
//! call. This file only dispatches.

mod args;
mod cmd;
mod progress;

use args::{Cli, Command};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ui = progress::Ui::new(cli.quiet);
    attnc_runtime::gpu::exec::FULL_ERRORS.store(cli.verbose, std::sync::atomic::Ordering::Relaxed);
    let result = match cli.command {
        Command::Check(a) => cmd::check::check(a, &ui),
        Command::Run(a) => cmd::run::run(a, &ui),
        Command::Compile(a) => cmd::compile::compile(a, &ui),
        Command::Bench(a) => cmd::bench::bench(a, &ui),
        Command::Explain(a) => cmd::inspect::explain(a, &ui),
        Command::Ir(a) => cmd::inspect::ir(a, &ui),
        Command::Grad(a) => cmd::grad::grad(a, &ui),
        Command::Fmt(a) => cmd::check::fmt(a),
        Command::ExplainError(a) => cmd::check::explain_error(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(cmd::Failed) => ExitCode::FAILURE,
    }
}

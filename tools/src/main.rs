//! `sinter`: the command line of the sinter compiler.
//!
//! Each subcommand lives in its own module with an `Args` struct and a `run` function. Every
//! failure is an [`error::CliError`], which knows its exit code: 0 ok, 1 the program (IR) is wrong,
//! 2 a run-time input, file or argument is wrong. Nothing here panics on user input.

mod check;
mod error;
mod eval;
mod feeds;
mod program;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// sinter: an ahead-of-time compiler for ML graphs written in the `.sir` IR.
#[derive(Parser)]
#[command(
    name = "sinter",
    version,
    after_help = "Exit status: 0 on success, 1 when the program (.sir) has errors, \
                  2 for bad inputs, files or arguments."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parse and verify a program; print the type of every named value.
    Check(check::Args),
    /// Run a program on the reference interpreter and write its outputs as .npy files.
    Eval(eval::Args),
}

fn main() -> ExitCode {
    // clap prints its own usage errors and exits with 2 (0 for --help and --version).
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Eval(args) => eval::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            err.report();
            ExitCode::from(err.exit_code())
        }
    }
}

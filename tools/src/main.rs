//! `sinter`: the command line of the sinter compiler.
//!
//! Each subcommand lives in its own module with an `Args` struct and a `run` function. Every
//! failure is an [`error::CliError`], which knows its exit code: 0 ok, 1 the program (IR) is wrong,
//! 2 a run-time input, file or argument is wrong. Nothing here panics on user input.

mod artifact;
mod check;
mod compile;
mod console;
mod error;
mod eval;
mod feeds;
mod generate;
mod import;
mod inspect;
mod outputs;
mod program;
mod run;
mod train;
mod units;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// sinter: an ahead-of-time compiler for ML graphs written in the `.sir` IR.
#[derive(Parser)]
#[command(
    name = "sinter",
    version,
    after_help = "Exit status: 0 on success, 1 when the program (.sir) has errors, \
                  2 for bad inputs, files, artifacts or arguments (and when no GPU adapter is \
                  available)."
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
    /// Compile a program into an artifact (.sart) that `sinter run` executes on a GPU.
    Compile(compile::Args),
    /// Run a compiled artifact on the GPU and write its outputs as .npy files.
    Run(run::Args),
    /// Show what an artifact holds: kernels, arena map, dispatches, I/O manifest, WGSL.
    Inspect(inspect::Args),
    /// Train: run a training program step after step over a data set of .npy files.
    Train(Box<train::Args>),
    /// Import an ONNX model: write it as a .sir program and its weights as safetensors.
    Import(import::Args),
    /// Write text with a language model: its prompt and continuation, one token at a time,
    /// with a key/value cache that the compiler derives from the forward program.
    Generate(Box<generate::Args>),
}

/// The optimizer makes and frees millions of small e-graph and program allocations; mimalloc
/// took 28% off the GPT-2-small step's `optimize` against glibc's malloc (BENCHMARKS.md,
/// "Optimizer time").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    quiet_mesa_on_headless_machines();
    // clap prints its own usage errors and exits with 2 (0 for --help and --version).
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Eval(args) => eval::run(&args),
        Command::Compile(args) => compile::run(&args),
        Command::Run(args) => run::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Train(args) => train::run(&args),
        Command::Import(args) => import::run(&args),
        Command::Generate(args) => generate::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            err.report();
            ExitCode::from(err.exit_code())
        }
    }
}

/// Mesa's Vulkan drivers (lavapipe included) print "XDG_RUNTIME_DIR is invalid or not set" on
/// every device creation when the variable is missing, as it is on servers and in containers.
/// Compute never uses the window-system paths that read it, so point it at the temp folder.
fn quiet_mesa_on_headless_machines() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // SAFETY: called first thing in `main`, before any thread exists.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
}

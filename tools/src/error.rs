//! [`CliError`]: every way a command fails, with the exit code it maps to.

use std::path::PathBuf;

use sinter_compiler::CompileError;
use sinter_compiler::autodiff::AutodiffError;
use sinter_ir::artifact::ArtifactError;
use sinter_ir::interp::EvalError;
use sinter_runtime::RuntimeError;
use sinter_runtime::io::IoError;

/// Exit code when the program (the `.sir` file) is wrong.
pub const EXIT_PROGRAM: u8 = 1;
/// Exit code when run-time inputs, files or arguments are wrong.
pub const EXIT_INPUT: u8 = 2;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The program does not parse or verify; `rendered` holds the diagnostics with source
    /// snippets, ready to print.
    #[error("{rendered}")]
    Program { rendered: String },
    #[error("cannot read {}: {source}", path.display())]
    ReadSource {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create the output directory {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    WriteFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file that is not a readable artifact; `hint` says what it seems to be instead.
    #[error("{}: {source}{hint}", path.display())]
    BadArtifact {
        path: PathBuf,
        source: ArtifactError,
        hint: &'static str,
    },
    #[error(transparent)]
    TensorFile(#[from] IoError),
    /// A bad `--input` or `--weights` tensor: unknown, duplicate, missing or mistyped.
    #[error("{0}")]
    Feed(String),
    #[error("evaluation failed: {0}")]
    Eval(#[from] EvalError),
    #[error("autodiff failed: {0}")]
    Autodiff(#[from] AutodiffError),
    /// The compiler refused the program (or failed: internal errors say so).
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// Loading or running an artifact failed: no adapter, a limit the adapter lacks, a bad
    /// input or weight.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Training stopped: the loss read at `step` is not finite (`since`: the last step whose
    /// loss was read finite, 0 if none).
    #[error(
        "training diverged: the loss is {loss} at step {step} (it was finite when last read, at \
         step {since}); stopped{}. Lower the learning rate, clip gradients (`clip_norm=`), or \
         check the data",
        if *saved { " without saving weights" } else { "" }
    )]
    Diverged {
        step: u64,
        loss: f64,
        since: u64,
        saved: bool,
    },
    /// An ONNX model that cannot be imported (unsupported op, attribute or dtype; open
    /// dimensions; a malformed file).
    #[error("{}: {source}", path.display())]
    Import {
        path: PathBuf,
        source: sinter_onnx::ImportError,
    },
    /// An argument value clap cannot check by itself (e.g. a kernel name that the artifact
    /// lacks).
    #[error("{0}")]
    Arg(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Program { .. }
            | CliError::Autodiff(_)
            | CliError::Compile(_)
            | CliError::Import { .. } => EXIT_PROGRAM,
            // The interpreter cannot run ops that a compiler pass must rewrite first (`grad`), nor
            // an ill-typed node: both are properties of the program.
            CliError::Eval(EvalError::NeedsPass { .. } | EvalError::Type { .. }) => EXIT_PROGRAM,
            CliError::ReadSource { .. }
            | CliError::CreateDir { .. }
            | CliError::WriteFile { .. }
            | CliError::BadArtifact { .. }
            | CliError::Runtime(_)
            | CliError::Arg(_)
            | CliError::TensorFile(_)
            | CliError::Feed(_)
            | CliError::Diverged { .. }
            | CliError::Eval(_) => EXIT_INPUT,
        }
    }

    /// Prints the error to stderr: diagnostics as rendered, anything else after `error: `.
    pub fn report(&self) {
        match self {
            CliError::Program { rendered } => {
                crate::console::eprintln(rendered.trim_end_matches('\n'))
            }
            other => crate::console::eprintln(&format!("error: {other}")),
        }
    }
}

//! `sinter run FILE.sart --input NAME=F.npy … [--out DIR] [--steps N] [--weights W.safetensors]
//! [--save-weights W.safetensors] [--verbose]`: run a compiled artifact on the GPU.
//!
//! Everything that can be checked without a GPU is checked first, against the artifact's I/O
//! manifest: the artifact itself, every input and every weight. Only then is an adapter opened.

use std::path::PathBuf;
use std::time::Instant;

use sinter_runtime::Session;
use sinter_runtime::io::HostTensor;

use crate::error::CliError;
use crate::feeds::{self, Feed, Signature};
use crate::{artifact, console, outputs, units};

#[derive(clap::Args)]
pub struct Args {
    /// The compiled artifact (from `sinter compile`).
    file: PathBuf,
    /// An input tensor: the input's name and a .npy file (f32 or i32, C order). Repeat for each
    /// input.
    #[arg(short, long = "input", value_name = "NAME=FILE", value_parser = feeds::parse_feed)]
    inputs: Vec<Feed>,
    /// Directory to write each output to, as NAME.npy (created if needed).
    #[arg(short, long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Run the graph N times with the same inputs (a training graph's assigns take effect
    /// between steps); the outputs are those of the last step.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    steps: u32,
    /// Params and states to start from, by name; those the file lacks keep the artifact's
    /// initial values.
    #[arg(short, long, value_name = "FILE.safetensors")]
    weights: Option<PathBuf>,
    /// After the run, write every param and state to this file.
    #[arg(long, value_name = "FILE.safetensors")]
    save_weights: Option<PathBuf>,
    /// Also print the adapter and what loading built.
    #[arg(short, long)]
    verbose: bool,
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let artifact = artifact::read(&args.file)?;
    let signature = Signature::of_artifact(&artifact);
    let inputs = feeds::load_inputs(&signature, &args.inputs)?;
    let weights = match &args.weights {
        Some(path) => feeds::load_weights(&signature, path)?,
        None => Default::default(),
    };
    if let Some(dir) = &args.out {
        outputs::create_dir(dir)?;
    }

    let mut session = Session::load(artifact)?;
    if args.verbose {
        console::println(&format!("adapter: {}", session.gpu().describe()))?;
        let r = session.report();
        console::println(&format!(
            "loaded: {} kernels ({} with subgroups), {} pipelines ({} without loop bounding, {} without \
             index clamping), {} bind group layouts, {} bind groups, {} dispatches per step, arena {}, param \
             blocks {}",
            r.kernels,
            r.subgroup_kernels,
            r.pipelines,
            r.unbounded_loop_kernels,
            r.unchecked_index_kernels,
            r.bind_group_layouts,
            r.bind_groups,
            r.dispatches,
            units::bytes(r.arena_bytes),
            units::bytes(r.uniform_bytes),
        ))?;
    }
    if !weights.is_empty() {
        let weights: Vec<(String, HostTensor)> = weights.into_iter().collect();
        session.load_weights(&weights)?;
    }

    let feeds: Vec<(&str, &HostTensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let start = Instant::now();
    let result = match args.steps {
        1 => session.run(&feeds)?,
        n => session.run_steps(n, &feeds)?,
    };
    let elapsed = start.elapsed();
    console::println(&if args.steps == 1 {
        format!("ran 1 step in {}", units::duration(elapsed))
    } else {
        format!(
            "ran {} steps in {} ({} per step)",
            args.steps,
            units::duration(elapsed),
            units::duration(elapsed / args.steps)
        )
    })?;

    outputs::report(&result.into_vec(), args.out.as_deref())?;
    if let Some(path) = &args.save_weights {
        outputs::save_weights(&session, path)?;
    }
    Ok(())
}

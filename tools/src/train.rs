//! `sinter train FILE.sir|FILE.sart --data DIR --steps N …`: run a training program step after
//! step over a data set on the GPU, reading the loss back only every K steps.
//!
//! A `.sir` file is compiled first (as `sinter compile` would). Each step feeds the next batch
//! of samples ([`data`]) and submits one run that reads nothing back, so steps queue up on the
//! GPU back to back; every K steps (and at the last) the run also reads the loss output, which
//! waits for the steps before it. That loss goes to the progress bar and the CSV log. With
//! `--eval`, a forward-only program scores the params on held-out data ([`eval`]).

mod checkpoint;
mod data;
mod eval;
mod plot;

use std::fs::File;
use std::io::{BufWriter, IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressState, ProgressStyle};
use sinter_ir::TensorType;
use sinter_ir::artifact::{Artifact, Role};
use sinter_runtime::Session;
use sinter_runtime::io::HostTensor;

use crate::error::CliError;
use crate::feeds::{self, Feed};
use crate::{artifact, console, program, units};
use data::{DataSet, Order};
use eval::{AccuracySpec, Evaluator};
use sinter_cli::flags::{Precision, TargetArgs};

#[derive(clap::Args)]
#[command(after_long_help = TRAIN_HELP)]
pub struct Args {
    /// The training program: a .sir file (compiled first) or a compiled .sart artifact. Its
    /// `assign`s (e.g. from `train LOSS with adamw(...)`) update the params every step.
    file: PathBuf,
    /// Directory with one NAME.npy per batched input NAME: an input of type [B, rest...] reads
    /// [S, rest...] samples (S >= B, the same S for every input).
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Number of training steps (one batch each).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    steps: u64,
    /// An input fed whole, the same every step, instead of batched from --data (for scalars
    /// and other inputs without a sample dimension). Repeat for each.
    #[arg(short, long = "input", value_name = "NAME=FILE", value_parser = feeds::parse_feed)]
    inputs: Vec<Feed>,
    /// The output holding the loss (a scalar).
    #[arg(long, value_name = "NAME", default_value = "loss")]
    loss: String,
    /// Read the loss back every K steps (and after the last): shown in the progress bar and
    /// written to --log. Steps in between read nothing back.
    #[arg(long, value_name = "K", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    log_every: u64,
    /// Write `step,loss,elapsed_s` to this CSV file every K steps (--log-every).
    #[arg(long, value_name = "FILE.csv")]
    log: Option<PathBuf>,
    /// Shuffle the samples every epoch, from this seed (default: file order).
    #[arg(long, value_name = "S")]
    shuffle_seed: Option<u64>,
    /// Params and states to start from, by name; those the file lacks keep their initial
    /// values.
    #[arg(short, long, value_name = "FILE.safetensors")]
    weights: Option<PathBuf>,
    /// `mixed`: compile a .sir program's products in f16 with its gradients scaled, as
    /// PyTorch's autocast with a GradScaler (`sinter compile --precision`); the loss scale and
    /// the steps skipped for non-finite gradients are reported. An artifact keeps the
    /// precision it was compiled with.
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    precision: Precision,
    /// The device a .sir program (and the --eval program) is compiled for, as in `sinter
    /// compile`: with cooperative matrices (`--target h200`, `--tensor-cores`) a mixed-precision
    /// step runs its f16 products and attention on tensor cores.
    #[command(flatten)]
    target: TargetArgs,
    /// After training, write every param and state (optimizer moments included) here.
    #[arg(long, value_name = "FILE.safetensors")]
    save_weights: Option<PathBuf>,
    /// After training, write a checkpoint to this folder: every param and state and where the
    /// run stands (runs done, shuffle seed), for --resume.
    #[arg(long, value_name = "DIR")]
    save_checkpoint: Option<PathBuf>,
    /// Go on from a checkpoint folder (--save-checkpoint): its weights, and the data where the
    /// run stopped; --steps more steps follow, the same as if the run had never stopped.
    #[arg(long, value_name = "DIR", conflicts_with = "weights")]
    resume: Option<PathBuf>,
    /// A forward-only program (.sir or .sart) to score the params on held-out data: same param
    /// names, no `train`/`assign`. Its loss output (--loss) is averaged over the batches.
    #[arg(long, value_name = "FILE", requires = "eval_data")]
    eval: Option<PathBuf>,
    /// Held-out data for --eval, laid out as --data for the eval program's inputs.
    #[arg(long, value_name = "DIR", requires = "eval")]
    eval_data: Option<PathBuf>,
    /// Also evaluate every K steps (default: only after the last step).
    #[arg(long, value_name = "K", requires = "eval",
          value_parser = clap::value_parser!(u64).range(1..))]
    eval_every: Option<u64>,
    /// Draw the loss curve (every loss read back, see --log-every) and, with --eval, the
    /// held-out loss at each evaluation, to this file after training (or when the loss
    /// diverges).
    #[arg(long, value_name = "FILE.svg|FILE.png")]
    plot: Option<PathBuf>,
    /// With --eval: report the share of rows of the output LOGITS ([..., classes]) whose largest
    /// entry is at the class the input LABELS (i32) gives.
    #[arg(long, value_name = "LOGITS=LABELS", requires = "eval",
          value_parser = eval::parse_accuracy)]
    accuracy: Option<AccuracySpec>,
}

const TRAIN_HELP: &str = "\
Data: for every input NAME of type [B, rest...], DIR/NAME.npy holds [S, rest...] samples of the \
same dtype (f32 or i32, C order), S >= B and the same S for every input. Each step takes B \
samples, the same indices from every file; an epoch takes S/B batches, in file order or \
shuffled per epoch with --shuffle-seed (the S mod B samples left over are skipped that epoch). \
Inputs without a batch dimension (scalars) must be given with --input.

Checks before step 1: every sample of every data file (held-out data included): i32 inputs that \
index something (embedding ids, class labels) within their range, f32 inputs finite; the error \
names the file, the sample and the value. The --save-weights path must be writable. Training stops \
(exit 2, weights not saved) when a loss read back is NaN or infinite, naming the step.

Output: a progress bar on stderr (when it is a terminal) with the step, the last loss read and \
steps/s; on stdout a summary with the final loss and throughput, held-out scores and where \
weights went.

Example:
  sinter train ir-spec/examples/digits_mlp.sir --data ir-spec/examples/data/digits/train \\
    --steps 1000 --shuffle-seed 1 --log loss.csv --plot loss.svg --save-weights digits.safetensors \\
    --eval ir-spec/examples/digits_mlp_eval.sir --eval-data ir-spec/examples/data/digits/test \\
    --accuracy logits=labels";

pub fn run(args: &Args) -> Result<(), CliError> {
    // Everything that can be checked is checked before step 1: every data file and every
    // value in it, the eval program and its data, and every path written to.
    let artifact = load(&args.file, args)?;
    let inputs = slots(&artifact, Role::Input);
    let bounds = index_bounds(&artifact);
    let fixed = args
        .inputs
        .iter()
        .map(|f| {
            let (name, t) = data::read_fixed(&f.name, &f.path, &inputs)?;
            let bound = bounds.iter().find(|(n, _)| *n == name).map(|(_, b)| *b);
            data::check_values(&name, &f.path, &t, 1, bound, "")?;
            Ok((name, t))
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    let mut data = DataSet::load(&args.data, &inputs, fixed.clone())?;
    data.check_values(&bounds)?;
    check_loss(&artifact, &args.loss)?;
    if artifact.assigns.is_empty() && artifact.updated_in_place.is_empty() {
        console::eprintln(&format!(
            "warning: `{}` assigns nothing, so training will not change any param; add \
             `train LOSS with OPT(...)` (or `assign` statements) to the program",
            artifact.graph
        ));
    }
    if let Some(path) = &args.save_weights {
        check_writable(path)?;
    }
    let resumed = match &args.resume {
        Some(dir) => {
            let c = checkpoint::Checkpoint::load(dir)?;
            c.check(
                dir,
                &artifact.graph,
                data.samples(),
                data.batch_size(),
                args.shuffle_seed,
            )?;
            Some(c)
        }
        None => None,
    };
    let shuffle_seed = resumed
        .as_ref()
        .map_or(args.shuffle_seed, |c| c.shuffle_seed);
    let first = resumed.as_ref().map_or(0, |c| c.runs);
    let plot_format = match &args.plot {
        Some(path) => {
            let format = plot::format_of(path)?;
            check_writable(path)?;
            Some(format)
        }
        None => None,
    };
    let mut curve = plot::Curve::default();
    let trained = slots(&artifact, Role::Param);
    let graph = artifact.graph.clone();
    let mut evaluator = match (&args.eval, &args.eval_data) {
        (Some(file), Some(dir)) => Some(Evaluator::new(
            load(file, args)?,
            dir,
            &fixed,
            &args.loss,
            args.accuracy.clone(),
            &trained,
        )?),
        _ => None,
    };
    let mut log = args.log.as_deref().map(LossLog::create).transpose()?;

    let mut session = Session::load(artifact)?;
    if let Some(path) = &args.weights {
        session.load_weights_file(path)?;
    }
    if let Some(dir) = &args.resume {
        session.load_weights_file(checkpoint::Checkpoint::weights(dir))?;
        console::println(&format!(
            "resuming from {} after step {first}",
            dir.display()
        ))?;
    }
    let order = shuffle_seed.map_or(Order::InOrder, Order::Shuffled);
    console::println(&describe_run(&graph, &session, &data, args, shuffle_seed))?;

    let bar = progress_bar(args.steps);
    let loss_name = [args.loss.as_str()];
    let start = Instant::now();
    let mut last: Option<(u64, f64)> = None;
    let mut last_finite: Option<(u64, f64)> = None;
    let last_step = first + args.steps;
    for step in first + 1..=last_step {
        let read_loss = step % args.log_every == 0 || step == last_step;
        let feeds = data.batch(step as usize - 1, order);
        let read: &[&str] = if read_loss { &loss_name } else { &[] };
        let outputs = session.run_reading(&feeds, read)?;
        bar.inc(1);
        if let Some(t) = outputs.get(&args.loss) {
            let loss = scalar(t);
            let elapsed = start.elapsed();
            last = Some((step, loss));
            match scaler_state(&session)? {
                Some((scale, skipped)) => bar.set_message(format!(
                    "loss {loss:.4}, loss scale {scale}, {skipped} skipped"
                )),
                None => bar.set_message(format!("loss {loss:.4}")),
            }
            if let Some(log) = &mut log {
                log.write(step, loss, elapsed)?;
            }
            curve.train.push((step, loss));
            if !loss.is_finite() {
                bar.finish_and_clear();
                draw_plot(args, plot_format, &graph, &curve)?;
                let since = last_finite.map_or(0, |(s, _)| s);
                return Err(CliError::Diverged {
                    step,
                    loss,
                    since,
                    saved: args.save_weights.is_some(),
                });
            }
            last_finite = Some((step, loss));
        }
        if let (Some(ev), Some(k)) = (&mut evaluator, args.eval_every)
            && step % k == 0
            && step != last_step
        {
            let score = ev.run(&session)?;
            curve.held_out.extend(score.loss.map(|l| (step, l)));
            bar.suspend(|| {
                console::println(&format!("eval at step {step}: {}", score.describe()))
            })?;
        }
    }
    let elapsed = start.elapsed();
    bar.finish_and_clear();

    let per_epoch = data.batches_per_epoch() as f64;
    let mut summary = format!(
        "trained {} steps ({:.1} epochs) in {}: {:.1} steps/s",
        args.steps,
        args.steps as f64 / per_epoch,
        units::duration(elapsed),
        args.steps as f64 / elapsed.as_secs_f64().max(1e-9),
    );
    if let Some((step, loss)) = last {
        summary.push_str(&format!("; loss {loss:.4} at step {step}"));
    }
    console::println(&summary)?;
    if let Some(scaler) = describe_scaler(&session)? {
        console::println(&scaler)?;
    }
    if let Some(log) = log {
        log.finish()?;
    }
    if let Some(ev) = &mut evaluator {
        let score = ev.run(&session)?;
        curve.held_out.extend(score.loss.map(|l| (last_step, l)));
        let dir = args.eval_data.as_deref().unwrap_or(Path::new("?"));
        console::println(&format!("eval on {}: {}", dir.display(), score.describe()))?;
    }
    draw_plot(args, plot_format, &graph, &curve)?;
    if let Some(path) = &args.save_weights {
        crate::outputs::save_weights(&session, path)?;
    }
    if let Some(dir) = &args.save_checkpoint {
        let c = checkpoint::Checkpoint {
            graph,
            runs: last_step,
            shuffle_seed,
            samples: data.samples(),
            batch: data.batch_size(),
        };
        c.save(dir, &session)?;
        console::println(&format!(
            "checkpoint after step {last_step} -> {}",
            dir.display()
        ))?;
    }
    Ok(())
}

/// The gradient scaler's scale and skipped steps (`--precision mixed`), or `None` for a
/// program without one.
fn scaler_state(session: &Session) -> Result<Option<(f64, f64)>, CliError> {
    use sinter_compiler::loss_scale::{SCALE, SKIPPED};
    let has = |name: &str| {
        session
            .artifact()
            .slots(Role::State)
            .any(|s| s.name == name)
    };
    if !has(SCALE) || !has(SKIPPED) {
        return Ok(None);
    }
    let scale = scalar(&session.read_persistent(SCALE)?);
    let skipped = scalar(&session.read_persistent(SKIPPED)?);
    Ok(Some((scale, skipped)))
}

/// The gradient scaler's state after training, or `None` for a program without one.
fn describe_scaler(session: &Session) -> Result<Option<String>, CliError> {
    Ok(scaler_state(session)?.map(|(scale, skipped)| {
        format!("loss scale {scale}; {skipped} steps skipped for non-finite gradients")
    }))
}

/// Draws `curve` to `--plot`, if given (`format` is its checked format), and says where.
fn draw_plot(
    args: &Args,
    format: Option<plot::Format>,
    graph: &str,
    curve: &plot::Curve,
) -> Result<(), CliError> {
    if let (Some(path), Some(format)) = (&args.plot, format) {
        plot::draw(path, format, &format!("training `{graph}`"), curve)?;
        console::println(&format!("loss curve: {}", path.display()))?;
    }
    Ok(())
}

/// A `.sir` program compiled at `args`' precision for its target, or a `.sart` artifact
/// read.
fn load(path: &Path, args: &Args) -> Result<Artifact, CliError> {
    if path.extension().is_some_and(|e| e == "sir") {
        let graph = program::load(path)?;
        let options = sinter_compiler::Options {
            target: args.target.target().map_err(CliError::Arg)?,
            flash: sinter_compiler::flash::variant::Choices {
                tensor_cores: args.target.tensor_cores,
                ..Default::default()
            },
            precision: args.precision.into(),
            ..sinter_compiler::Options::default()
        };
        Ok(sinter_compiler::compile(&graph, &options)?.artifact)
    } else {
        artifact::read(path)
    }
}

fn slots(artifact: &Artifact, role: Role) -> Vec<(String, TensorType)> {
    artifact
        .slots(role)
        .map(|s| (s.name.clone(), s.ty.clone()))
        .collect()
}

/// The i32 inputs that index something, with their bound (from the manifest).
fn index_bounds(artifact: &Artifact) -> Vec<(String, u64)> {
    artifact
        .slots(Role::Input)
        .filter_map(|s| Some((s.name.clone(), s.index_bound?)))
        .collect()
}

/// Fails unless `path` can be written: a missing file is created (and removed again), an
/// existing one opened for writing without truncating it; so a run never trains for hours to
/// lose its weights at the end.
fn check_writable(path: &Path) -> Result<(), CliError> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|source| CliError::WriteFile {
            path: path.to_path_buf(),
            source,
        })?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// The loss must be a one-element f32 output.
fn check_loss(artifact: &Artifact, name: &str) -> Result<(), CliError> {
    let outputs = slots(artifact, Role::Output);
    match outputs.iter().find(|(n, _)| n == name) {
        Some((_, ty)) if ty.dtype.is_float() && ty.numel() == 1 => Ok(()),
        Some((_, ty)) => Err(CliError::Arg(format!(
            "the loss output `{name}` must be a scalar f32, but it is {ty}"
        ))),
        None => {
            let list: Vec<String> = outputs
                .iter()
                .map(|(n, ty)| format!("`{n}`: {ty}"))
                .collect();
            Err(CliError::Arg(format!(
                "program `{}` has no output `{name}` to read the loss from; name the loss \
                 output with --loss NAME (its outputs: {})",
                artifact.graph,
                if list.is_empty() {
                    "none".to_string()
                } else {
                    list.join(", ")
                }
            )))
        }
    }
}

/// `training `digits_mlp` on ADAPTER: 1497 samples of `x`, `labels` in batches of 32 (46 per
/// epoch, shuffled with seed 1); loss read every 10 steps`
fn describe_run(
    graph: &str,
    session: &Session,
    data: &DataSet,
    args: &Args,
    shuffle_seed: Option<u64>,
) -> String {
    let batched: Vec<String> = session
        .inputs()
        .filter(|s| !args.inputs.iter().any(|f| f.name == s.name))
        .map(|s| format!("`{}`", s.name))
        .collect();
    let order = match shuffle_seed {
        Some(seed) => format!("shuffled with seed {seed}"),
        None => "in file order".to_string(),
    };
    let data = if batched.is_empty() {
        "no batched inputs".to_string()
    } else {
        format!(
            "{} samples of {} in batches of {} ({} per epoch, {order})",
            data.samples(),
            batched.join(", "),
            data.batch_size(),
            data.batches_per_epoch()
        )
    };
    format!(
        "training `{graph}` on {}: {data}; loss read every {} steps",
        session.gpu().describe(),
        args.log_every
    )
}

fn progress_bar(steps: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps);
    let style = ProgressStyle::with_template(
        "{bar:30.cyan/blue} step {pos}/{len}  {msg}  {rate}  eta {eta}",
    )
    .expect("the template is valid")
    .with_key(
        "rate",
        |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.1} steps/s", state.per_sec());
        },
    );
    bar.set_style(style);
    bar
}

fn scalar(t: &HostTensor) -> f64 {
    t.data.to_f64().first().copied().unwrap_or(f64::NAN)
}

/// The CSV loss log: `step,loss,elapsed_s`, one row per loss read, flushed as it goes.
struct LossLog {
    path: PathBuf,
    out: BufWriter<File>,
}

impl LossLog {
    fn create(path: &Path) -> Result<LossLog, CliError> {
        let file = File::create(path).map_err(|source| CliError::WriteFile {
            path: path.to_path_buf(),
            source,
        })?;
        let mut log = LossLog {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
        };
        log.line("step,loss,elapsed_s")?;
        Ok(log)
    }

    fn write(&mut self, step: u64, loss: f64, elapsed: Duration) -> Result<(), CliError> {
        // The loss was an f32 on the GPU: its shortest round-trip form.
        let loss = loss as f32;
        self.line(&format!("{step},{loss},{:.6}", elapsed.as_secs_f64()))
    }

    fn line(&mut self, line: &str) -> Result<(), CliError> {
        writeln!(self.out, "{line}")
            .and_then(|()| self.out.flush())
            .map_err(|source| CliError::WriteFile {
                path: self.path.clone(),
                source,
            })
    }

    fn finish(mut self) -> Result<(), CliError> {
        self.out.flush().map_err(|source| CliError::WriteFile {
            path: self.path,
            source,
        })
    }
}

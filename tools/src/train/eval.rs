//! Held-out evaluation: a forward-only program (`--eval`) run over held-out data (`--eval-data`)
//! with the params being trained.
//!
//! The eval program is loaded once, in a session of its own. Each evaluation copies the
//! training session's current params into it by name, runs every full batch of the held-out
//! data in file order, and averages the loss output (when the program has one) and, with
//! `--accuracy LOGITS=LABELS`, counts the rows of LOGITS whose largest entry is at the index
//! LABELS gives.

use std::path::Path;

use sinter_ir::TensorType;
use sinter_ir::artifact::{Artifact, Role};
use sinter_runtime::Session;
use sinter_runtime::io::{HostTensor, TensorData};

use super::data::{DataSet, Order};
use crate::error::CliError;

/// `--accuracy LOGITS=LABELS`.
#[derive(Clone, Debug)]
pub struct AccuracySpec {
    pub logits: String,
    pub labels: String,
}

/// clap's value parser for `LOGITS=LABELS`.
pub fn parse_accuracy(spec: &str) -> Result<AccuracySpec, String> {
    match spec.split_once('=') {
        Some((logits, labels)) if !logits.is_empty() && !labels.is_empty() => Ok(AccuracySpec {
            logits: logits.to_string(),
            labels: labels.to_string(),
        }),
        _ => Err(format!(
            "expected LOGITS=LABELS, an output and an input of the eval program (for example \
             logits=labels), got `{spec}`"
        )),
    }
}

/// One evaluation's results.
#[derive(Clone, Debug, PartialEq)]
pub struct Score {
    /// Mean of the loss output over the batches, if the program outputs the loss.
    pub loss: Option<f64>,
    /// Correct predictions and predictions made, with `--accuracy`.
    pub accuracy: Option<(usize, usize)>,
    /// Samples evaluated, and samples in the data (the last partial batch is skipped).
    pub samples: (usize, usize),
}

impl Score {
    /// `loss 0.0812, accuracy 97.67% (293/300)`, noting skipped samples.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(loss) = self.loss {
            parts.push(format!("loss {loss:.4}"));
        }
        if let Some((correct, total)) = self.accuracy {
            let percent = 100.0 * correct as f64 / total.max(1) as f64;
            parts.push(format!("accuracy {percent:.2}% ({correct}/{total})"));
        }
        if parts.is_empty() {
            parts.push("ran (the program outputs neither the loss nor --accuracy)".into());
        }
        let (used, all) = self.samples;
        if used < all {
            parts.push(format!(
                "over {used} of {all} samples (the rest do not fill a batch)"
            ));
        }
        parts.join(", ")
    }
}

pub struct Evaluator {
    session: Session,
    data: DataSet,
    /// The eval program's params: all are copied from the training session.
    params: Vec<String>,
    loss: Option<String>,
    accuracy: Option<AccuracySpec>,
}

impl Evaluator {
    /// Checks the eval program against the training program's params and the data, then
    /// loads it. `fixed` are the `--input` tensors; those the eval program declares are fed to
    /// it too.
    pub fn new(
        artifact: Artifact,
        dir: &Path,
        fixed: &[(String, HostTensor)],
        loss: &str,
        accuracy: Option<AccuracySpec>,
        trained: &[(String, TensorType)],
    ) -> Result<Evaluator, CliError> {
        let program = format!("the eval program `{}`", artifact.graph);
        let updated = artifact.assigns.iter().map(|a| &a.target);
        if let Some(target) = updated.chain(&artifact.updated_in_place).next() {
            return Err(CliError::Arg(format!(
                "{program} assigns `{target}`: evaluating it would change the params it is meant \
                 to score; give a forward-only program (without `train` or `assign`)"
            )));
        }
        let mut params = Vec::new();
        for slot in artifact.slots(Role::Param) {
            match trained.iter().find(|(n, _)| *n == slot.name) {
                Some((_, ty)) if *ty == slot.ty => params.push(slot.name.clone()),
                Some((_, ty)) => {
                    return Err(CliError::Arg(format!(
                        "{program} declares param `{}` as {}, but the trained program has it \
                         as {ty}",
                        slot.name, slot.ty
                    )));
                }
                None => {
                    return Err(CliError::Arg(format!(
                        "{program} has param `{}` ({}), which the trained program lacks, so it \
                         would be scored with its initial value",
                        slot.name, slot.ty
                    )));
                }
            }
        }
        let outputs: Vec<&str> = artifact
            .slots(Role::Output)
            .map(|s| s.name.as_str())
            .collect();
        let loss = artifact
            .slots(Role::Output)
            .find(|s| s.name == loss && s.ty.numel() == 1)
            .map(|s| s.name.clone());
        let inputs: Vec<(String, TensorType)> = artifact
            .slots(Role::Input)
            .map(|s| (s.name.clone(), s.ty.clone()))
            .collect();
        if let Some(spec) = &accuracy {
            check_accuracy(&artifact, spec, &outputs, &inputs, &program)?;
        }
        let fixed: Vec<(String, HostTensor)> = fixed
            .iter()
            .filter(|(n, _)| inputs.iter().any(|(i, _)| i == n))
            .cloned()
            .collect();
        let data = DataSet::load(dir, &inputs, fixed)?;
        let bounds: Vec<(String, u64)> = artifact
            .slots(Role::Input)
            .filter_map(|s| Some((s.name.clone(), s.index_bound?)))
            .collect();
        data.check_values(&bounds)?;
        let session = Session::load(artifact)?;
        Ok(Evaluator {
            session,
            data,
            params,
            loss,
            accuracy,
        })
    }

    /// Scores the current params of `trained` on the held-out data.
    pub fn run(&mut self, trained: &Session) -> Result<Score, CliError> {
        let weights: Vec<(String, HostTensor)> = trained
            .weights()?
            .into_iter()
            .filter(|(n, _)| self.params.contains(n))
            .collect();
        self.session.load_weights(&weights)?;
        let mut read: Vec<&str> = Vec::new();
        if let Some(loss) = &self.loss {
            read.push(loss);
        }
        if let Some(spec) = &self.accuracy {
            read.push(&spec.logits);
        }
        let (mut loss_sum, mut correct, mut total) = (0.0, 0, 0);
        let batches = self.data.batches_per_epoch();
        for b in 0..batches {
            let feeds = self.data.batch(b, Order::InOrder);
            let labels = self
                .accuracy
                .as_ref()
                .and_then(|spec| feeds.iter().find(|(n, _)| *n == spec.labels))
                .map(|(_, t)| (*t).clone());
            let out = self.session.run_reading(&feeds, &read)?;
            if let Some(loss) = self.loss.as_deref().and_then(|n| out.get(n)) {
                loss_sum += scalar(loss);
            }
            if let (Some(spec), Some(labels)) = (&self.accuracy, labels)
                && let Some(logits) = out.get(&spec.logits)
            {
                let (c, t) = count_correct(logits, &labels);
                correct += c;
                total += t;
            }
        }
        let used = batches * self.data.batch_size();
        Ok(Score {
            loss: self.loss.as_ref().map(|_| loss_sum / batches.max(1) as f64),
            accuracy: self.accuracy.as_ref().map(|_| (correct, total)),
            samples: (used, self.data.samples().max(used)),
        })
    }
}

fn check_accuracy(
    artifact: &Artifact,
    spec: &AccuracySpec,
    outputs: &[&str],
    inputs: &[(String, TensorType)],
    program: &str,
) -> Result<(), CliError> {
    let Some(logits) = artifact.slots(Role::Output).find(|s| s.name == spec.logits) else {
        return Err(CliError::Arg(format!(
            "--accuracy {}={}: `{}` is not an output of {program}; its outputs are {}",
            spec.logits,
            spec.labels,
            spec.logits,
            outputs.join(", ")
        )));
    };
    let Some((_, labels)) = inputs.iter().find(|(n, _)| *n == spec.labels) else {
        let names: Vec<&str> = inputs.iter().map(|(n, _)| n.as_str()).collect();
        return Err(CliError::Arg(format!(
            "--accuracy {}={}: `{}` is not an input of {program}; its inputs are {}",
            spec.logits,
            spec.labels,
            spec.labels,
            names.join(", ")
        )));
    };
    let classes = logits.ty.shape.last().copied().unwrap_or(0);
    let fits = logits.ty.dtype.is_float()
        && classes > 0
        && !labels.dtype.is_float()
        && labels.numel() * classes == logits.ty.numel();
    if !fits {
        return Err(CliError::Arg(format!(
            "--accuracy {}={}: needs f32 logits [..., classes] and i32 labels with one label \
             per row of logits, but `{}` is {} and `{}` is {labels}",
            spec.logits, spec.labels, spec.logits, logits.ty, spec.labels
        )));
    }
    Ok(())
}

fn scalar(t: &HostTensor) -> f64 {
    t.data.to_f64().first().copied().unwrap_or(f64::NAN)
}

/// Rows of `logits` (`[..., classes]`) whose first largest entry is at the index `labels`
/// gives; returns (correct, rows).
pub fn count_correct(logits: &HostTensor, labels: &HostTensor) -> (usize, usize) {
    let (TensorData::F32(logits_data), TensorData::I32(labels)) = (&logits.data, &labels.data)
    else {
        return (0, 0);
    };
    let classes = logits.shape.last().copied().unwrap_or(1).max(1);
    let correct = logits_data
        .chunks_exact(classes)
        .zip(labels)
        .filter(|(row, label)| {
            let best = row
                .iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
                    if v > bv { (i, v) } else { (bi, bv) }
                })
                .0;
            usize::try_from(**label).is_ok_and(|l| l == best)
        })
        .count();
    (correct, labels.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accuracy_counts_argmax_rows() {
        let logits = HostTensor::f32(vec![3, 2], vec![0.1, 0.9, 2.0, -1.0, 0.5, 0.5]);
        let labels = HostTensor::i32(vec![3], vec![1, 1, 0]);
        // Row 2 ties: the first largest entry (index 0) is the prediction.
        assert_eq!(count_correct(&logits, &labels), (2, 3));
    }

    #[test]
    fn scores_describe_themselves() {
        let score = Score {
            loss: Some(0.08123),
            accuracy: Some((293, 300)),
            samples: (288, 300),
        };
        assert_eq!(
            score.describe(),
            "loss 0.0812, accuracy 97.67% (293/300), over 288 of 300 samples (the rest do not \
             fill a batch)"
        );
        assert!(parse_accuracy("logits").is_err());
        assert!(parse_accuracy("=labels").is_err());
        let spec = parse_accuracy("logits=labels").unwrap();
        assert_eq!(
            (spec.logits.as_str(), spec.labels.as_str()),
            ("logits", "labels")
        );
    }
}

//! Training data: one `.npy` file of samples per batched input, cut into batches.
//!
//! An input of type `[B, rest…]` is *batched*: `DIR/NAME.npy` holds `[S, rest…]`, S samples
//! (S ≥ B) of the same dtype, and every step feeds B of them. All batched inputs share B and S,
//! and one step takes the same sample indices from each. An epoch visits every sample at most
//! once: the S samples (in file order, or shuffled per epoch with a seed) are cut into S / B
//! batches of B; the S mod B left over are skipped that epoch (with a shuffle, different ones
//! each epoch). Inputs given with `--input` are fed whole, the same every step.
//!
//! Every file is checked before anything runs; a mismatch names the input, the file, what was
//! expected and what the file holds.

use std::path::{Path, PathBuf};

use sinter_ir::TensorType;
use sinter_runtime::io::{HostTensor, TensorData, read_npy};

use crate::error::CliError;

/// A batched input's samples and the batch it assembles them into.
#[derive(Debug)]
struct Batched {
    name: String,
    /// The file the samples came from.
    path: PathBuf,
    /// `[S, rest…]`, as read.
    samples: HostTensor,
    /// `[B, rest…]`, refilled by [`DataSet::batch`].
    batch: HostTensor,
    /// Elements per sample: the product of `rest`.
    stride: usize,
}

/// Every input of a program, ready to feed step after step.
#[derive(Debug)]
pub struct DataSet {
    batched: Vec<Batched>,
    /// Inputs fed whole every step (`--input NAME=FILE`).
    fixed: Vec<(String, HostTensor)>,
    /// Samples per file (S) and per batch (B); 0 and 1 when nothing is batched.
    samples: usize,
    batch: usize,
    /// The shuffled order of the current epoch: (epoch, permutation of the samples).
    shuffled: Option<(usize, Vec<usize>)>,
}

/// Which samples each step takes.
#[derive(Clone, Copy, Debug)]
pub enum Order {
    /// File order, every epoch.
    InOrder,
    /// A new permutation every epoch, from this seed and the epoch number.
    Shuffled(u64),
}

impl DataSet {
    /// Reads the data of every input of `inputs` (name and declared type, in manifest order):
    /// those in `fixed` as given, the others from `dir/NAME.npy`.
    pub fn load(
        dir: &Path,
        inputs: &[(String, TensorType)],
        fixed: Vec<(String, HostTensor)>,
    ) -> Result<DataSet, CliError> {
        for (i, (name, _)) in fixed.iter().enumerate() {
            if fixed[..i].iter().any(|(n, _)| n == name) {
                return Err(CliError::Feed(format!("input `{name}` is given twice")));
            }
        }
        let mut batched: Vec<Batched> = Vec::new();
        for (name, ty) in inputs {
            if fixed.iter().any(|(n, _)| n == name) {
                continue;
            }
            let Some((&b, rest)) = ty.shape.split_first() else {
                return Err(CliError::Feed(format!(
                    "input `{name}` is a scalar ({ty}), so it has no batch dimension to take \
                     samples along: give it with --input {name}=FILE.npy"
                )));
            };
            let path = dir.join(format!("{name}.npy"));
            let wanted = || {
                let d: Vec<String> = rest.iter().map(usize::to_string).collect();
                format!(
                    "{}[{}]",
                    ty.dtype,
                    ["S".to_string()]
                        .into_iter()
                        .chain(d)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            if !path.is_file() {
                return Err(CliError::Feed(format!(
                    "input `{name}` ({ty}): no data file {}; the data directory must hold one \
                     {} file of S >= {b} samples per batched input (or give it with --input)",
                    path.display(),
                    wanted()
                )));
            }
            let samples = read_npy(&path)?;
            let actual = samples.ty();
            if actual.dtype != ty.dtype || samples.shape.get(1..) != Some(rest) {
                let rank = if rest.is_empty() {
                    "one value per sample".to_string()
                } else {
                    format!("samples of shape {rest:?}")
                };
                return Err(CliError::Feed(format!(
                    "input `{name}` is {ty}, so {} must hold {} ({rank}), but it holds {actual}",
                    path.display(),
                    wanted()
                )));
            }
            let s = samples.shape[0];
            if s < b {
                return Err(CliError::Feed(format!(
                    "input `{name}`: {} holds {s} samples, fewer than the batch of {b} that \
                     `{name}` ({ty}) takes per step",
                    path.display()
                )));
            }
            if let Some(first) = batched.first() {
                let (b0, s0) = (first.batch.shape[0], first.samples.shape[0]);
                if b != b0 {
                    return Err(CliError::Feed(format!(
                        "batched inputs disagree on the batch size: `{}` takes {b0} samples per \
                         step but `{name}` ({ty}) takes {b}",
                        first.name
                    )));
                }
                if s != s0 {
                    return Err(CliError::Feed(format!(
                        "sample counts differ: {} holds {s0} samples of `{}`, but {} holds {s} \
                         samples of `{name}`; every batched input needs one sample per example",
                        dir.join(format!("{}.npy", first.name)).display(),
                        first.name,
                        path.display()
                    )));
                }
            }
            let stride: usize = rest.iter().product();
            let batch = HostTensor {
                shape: ty.shape.clone(),
                data: match samples.data {
                    TensorData::F32(_) => TensorData::F32(vec![0.0; b * stride]),
                    TensorData::I32(_) => TensorData::I32(vec![0; b * stride]),
                    TensorData::F16(_) => TensorData::F16(vec![half::f16::ZERO; b * stride]),
                },
            };
            batched.push(Batched {
                name: name.clone(),
                path: path.clone(),
                samples,
                batch,
                stride,
            });
        }
        let (samples, batch) = batched
            .first()
            .map_or((0, 1), |f| (f.samples.shape[0], f.batch.shape[0]));
        Ok(DataSet {
            batched,
            fixed,
            samples,
            batch,
            shuffled: None,
        })
    }

    /// Checks every sample of every batched input before anything runs (a bad value found at
    /// step 500 would waste the steps before it): i32 inputs that index something (`bounds`:
    /// input name and the rows or classes it indexes) within range, f32 inputs finite. The
    /// error names the file, the sample, the position in it and the value.
    pub fn check_values(&self, bounds: &[(String, u64)]) -> Result<(), CliError> {
        for b in &self.batched {
            let bound = bounds.iter().find(|(n, _)| *n == b.name).map(|(_, v)| *v);
            check_values(&b.name, &b.path, &b.samples, b.stride, bound, "sample")?;
        }
        Ok(())
    }

    /// Samples per data file (0 when no input is batched).
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Samples per step.
    pub fn batch_size(&self) -> usize {
        self.batch
    }

    /// Steps per epoch (1 when no input is batched: every step is the same).
    pub fn batches_per_epoch(&self) -> usize {
        if self.batched.is_empty() {
            1
        } else {
            self.samples / self.batch
        }
    }

    /// The inputs of step `step` (0-based): batch `step mod batches_per_epoch` of epoch
    /// `step / batches_per_epoch`, then the fixed inputs.
    pub fn batch(&mut self, step: usize, order: Order) -> Vec<(&str, &HostTensor)> {
        let per_epoch = self.batches_per_epoch();
        let (epoch, index) = (step / per_epoch, step % per_epoch);
        if !self.batched.is_empty() {
            let rows: Vec<usize> = match order {
                Order::InOrder => (index * self.batch..(index + 1) * self.batch).collect(),
                Order::Shuffled(seed) => {
                    if self.shuffled.as_ref().is_none_or(|(e, _)| *e != epoch) {
                        let perm = permutation(self.samples, seed, epoch as u64);
                        self.shuffled = Some((epoch, perm));
                    }
                    let (_, perm) = self.shuffled.as_ref().expect("set above");
                    perm[index * self.batch..(index + 1) * self.batch].to_vec()
                }
            };
            for b in &mut self.batched {
                gather(&b.samples.data, &mut b.batch.data, b.stride, &rows);
            }
        }
        self.batched
            .iter()
            .map(|b| (b.name.as_str(), &b.batch))
            .chain(self.fixed.iter().map(|(n, t)| (n.as_str(), t)))
            .collect()
    }
}

/// See [`DataSet::check_values`]; `unit` names what a block of `stride` values is (a sample,
/// or for a whole tensor fed every step, nothing).
pub fn check_values(
    name: &str,
    path: &Path,
    t: &HostTensor,
    stride: usize,
    bound: Option<u64>,
    unit: &str,
) -> Result<(), CliError> {
    let at = |flat: usize| {
        if unit.is_empty() {
            format!("position {flat}")
        } else {
            let stride = stride.max(1);
            let within = if stride > 1 {
                format!(", position {}", flat % stride)
            } else {
                String::new()
            };
            format!("{unit} {}{within}", flat / stride)
        }
    };
    match (&t.data, bound) {
        (TensorData::I32(values), Some(bound)) => {
            if let Some((flat, v)) =
                (values.iter().enumerate()).find(|&(_, &v)| v < 0 || v as u64 >= bound)
            {
                return Err(CliError::Feed(format!(
                    "{}: {} of input `{name}` holds {v}, outside 0..{bound} (`{name}` indexes \
                     {bound} embedding rows or classes)",
                    path.display(),
                    at(flat)
                )));
            }
        }
        (TensorData::F32(_) | TensorData::F16(_), _) => {
            let values = t.data.to_f64();
            if let Some((flat, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                return Err(CliError::Feed(format!(
                    "{}: {} of input `{name}` is {v}; training data must be finite",
                    path.display(),
                    at(flat)
                )));
            }
        }
        (TensorData::I32(_), None) => {}
    }
    Ok(())
}

/// Copies sample `rows[i]` of `from` to sample `i` of `to`.
fn gather(from: &TensorData, to: &mut TensorData, stride: usize, rows: &[usize]) {
    fn copy<T: Copy>(from: &[T], to: &mut [T], stride: usize, rows: &[usize]) {
        for (dst, &r) in to.chunks_exact_mut(stride.max(1)).zip(rows) {
            dst.copy_from_slice(&from[r * stride..(r + 1) * stride]);
        }
    }
    match (from, to) {
        (TensorData::F32(f), TensorData::F32(t)) => copy(f, t, stride, rows),
        (TensorData::I32(f), TensorData::I32(t)) => copy(f, t, stride, rows),
        _ => unreachable!("a batch has the dtype of its samples"),
    }
}

/// A permutation of `0..n` for one epoch: a Fisher–Yates shuffle driven by SplitMix64, seeded
/// from `seed` and `epoch`, so a run is reproducible on any machine.
pub fn permutation(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut rng = SplitMix64(seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03));
    let mut perm: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        perm.swap(i, j);
    }
    perm
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and good enough to shuffle data.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn list(names: &[&str]) -> String {
    if names.is_empty() {
        "(none)".to_string()
    } else {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Reads an `--input NAME=FILE` fed whole every step, checked against the input's type.
pub fn read_fixed(
    name: &str,
    path: &Path,
    inputs: &[(String, TensorType)],
) -> Result<(String, HostTensor), CliError> {
    let Some((_, ty)) = inputs.iter().find(|(n, _)| n == name) else {
        let names: Vec<&str> = inputs.iter().map(|(n, _)| n.as_str()).collect();
        return Err(CliError::Feed(format!(
            "--input {name}=…: the program has no input `{name}`; its inputs are {}",
            list(&names)
        )));
    };
    let tensor = read_npy(path)?;
    if tensor.ty() != *ty {
        return Err(CliError::Feed(format!(
            "input `{name}` must be {ty}, but {} holds {}",
            path.display(),
            tensor.ty()
        )));
    }
    Ok((name.to_string(), tensor))
}

#[cfg(test)]
mod tests {
    use super::*;

    use sinter_ir::DType;

    fn write(dir: &Path, name: &str, t: &HostTensor) {
        sinter_runtime::io::write_npy(&dir.join(format!("{name}.npy")), t).unwrap();
    }

    fn ty(dtype: DType, shape: &[usize]) -> TensorType {
        TensorType {
            dtype,
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn permutations_are_permutations_and_differ_per_epoch() {
        let a = permutation(100, 7, 0);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_ne!(a, permutation(100, 7, 1));
        assert_ne!(a, permutation(100, 8, 0));
        assert_eq!(a, permutation(100, 7, 0));
        assert!(permutation(0, 1, 0).is_empty());
    }

    #[test]
    fn batches_take_the_same_rows_of_every_input() {
        let dir = tempfile::tempdir().unwrap();
        // 5 samples of x: [i, 10 i]; labels: i. Batches of 2: 2 per epoch, 1 sample left over.
        let x: Vec<f32> = (0..5).flat_map(|i| [i as f32, 10.0 * i as f32]).collect();
        write(dir.path(), "x", &HostTensor::f32(vec![5, 2], x));
        write(dir.path(), "y", &HostTensor::i32(vec![5], (0..5).collect()));
        let inputs = vec![
            ("x".to_string(), ty(DType::F32, &[2, 2])),
            ("y".to_string(), ty(DType::I32, &[2])),
        ];
        let mut data = DataSet::load(dir.path(), &inputs, Vec::new()).unwrap();
        assert_eq!(
            (data.samples(), data.batch_size(), data.batches_per_epoch()),
            (5, 2, 2)
        );
        let labels = |data: &mut DataSet, step, order| {
            let feeds = data.batch(step, order);
            let TensorData::I32(y) = &feeds[1].1.data else {
                panic!()
            };
            let TensorData::F32(x) = &feeds[0].1.data else {
                panic!()
            };
            for (i, &label) in y.iter().enumerate() {
                assert_eq!(x[2 * i + 1], 10.0 * label as f32);
            }
            y.clone()
        };
        assert_eq!(labels(&mut data, 0, Order::InOrder), [0, 1]);
        assert_eq!(labels(&mut data, 1, Order::InOrder), [2, 3]);
        assert_eq!(labels(&mut data, 2, Order::InOrder), [0, 1]);
        let mut seen: Vec<i32> = (0..2)
            .flat_map(|s| labels(&mut data, s, Order::Shuffled(3)))
            .collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 4, "an epoch repeats no sample");
    }

    #[test]
    fn bad_values_name_file_sample_and_value() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut labels: Vec<i32> = (0..2000).map(|i| i % 10).collect();
        labels[1000] = 12;
        write(d, "y", &HostTensor::i32(vec![2000], labels));
        let mut x = vec![0.5f32; 2000 * 3];
        x[3 * 1500 + 2] = f32::NAN;
        write(d, "x", &HostTensor::f32(vec![2000, 3], x));
        let inputs = vec![
            ("x".to_string(), ty(DType::F32, &[32, 3])),
            ("y".to_string(), ty(DType::I32, &[32])),
        ];
        let data = DataSet::load(d, &inputs, Vec::new()).unwrap();
        let err = |bounds: &[(String, u64)]| match data.check_values(bounds) {
            Err(CliError::Feed(m)) => m,
            other => panic!("{other:?}"),
        };
        let message = err(&[("y".to_string(), 10)]);
        assert!(
            message.contains("x.npy: sample 1500, position 2 of input `x` is NaN"),
            "{message}"
        );
        write(d, "x", &HostTensor::f32(vec![2000, 3], vec![0.5; 6000]));
        let data = DataSet::load(d, &inputs, Vec::new()).unwrap();
        let message = match data.check_values(&[("y".to_string(), 10)]) {
            Err(CliError::Feed(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(
            message.contains("y.npy: sample 1000 of input `y` holds 12, outside 0..10"),
            "{message}"
        );
        assert!(data.check_values(&[("y".to_string(), 13)]).is_ok());
    }

    #[test]
    fn bad_data_names_the_input() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, "x", &HostTensor::f32(vec![4, 3], vec![0.0; 12]));
        write(d, "y", &HostTensor::i32(vec![5], vec![0; 5]));
        write(d, "z", &HostTensor::f32(vec![4], vec![0.0; 4]));
        let err = |inputs: &[(&str, TensorType)]| {
            let inputs: Vec<(String, TensorType)> = inputs
                .iter()
                .map(|(n, t)| (n.to_string(), t.clone()))
                .collect();
            match DataSet::load(d, &inputs, Vec::new()) {
                Err(CliError::Feed(m)) => m,
                other => panic!("{other:?}"),
            }
        };
        let x = ("x", ty(DType::F32, &[2, 3]));
        for (inputs, expected) in [
            (
                vec![("w", ty(DType::F32, &[2]))],
                "input `w` (f32[2]): no data file",
            ),
            (vec![("x", ty(DType::F32, &[2, 4]))], "holds f32[4, 3]"),
            (vec![("x", ty(DType::I32, &[2, 3]))], "must hold i32[S, 3]"),
            (
                vec![("x", ty(DType::F32, &[8, 3]))],
                "4 samples, fewer than the batch of 8",
            ),
            (vec![("s", ty(DType::F32, &[]))], "input `s` is a scalar"),
            (
                vec![x.clone(), ("y", ty(DType::I32, &[2]))],
                "sample counts differ",
            ),
            (
                vec![x, ("z", ty(DType::F32, &[3]))],
                "disagree on the batch size",
            ),
        ] {
            let message = err(&inputs);
            assert!(message.contains(expected), "{message}");
        }
    }
}

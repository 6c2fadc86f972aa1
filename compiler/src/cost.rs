//! The cost model: the estimated time of a kernel on the [`Target`], from plain shapes and
//! types. The optimizer's extraction (`optimize::extract`) prices e-graph nodes through it; it
//! knows nothing of e-graphs.
//!
//! Each kernel costs a launch, the bytes it moves at memory bandwidth, and its arithmetic:
//! fused kernels at the elementwise rate, matrix products at the product rate, flash kernels through their variant ([`crate::flash::variant`]) at
//! the flash rate over the blocks their mask leaves live, divided by how well their workgroups
//! balance over the SMs ([`busiest_sm`], the one simulator of workgroups on SMs). Only ratios
//! matter; the rates are the target's ([`crate::target::Rates`]).

use sinter_ir::{DType, TensorType};

use crate::flash::variant::{self, Choices, Form, LaunchOrder, Variant};
use crate::flash::{FlashKind, FlashSpec, interval};
use crate::fused::{Inst, Level, Program};
use crate::matmul;
use crate::target::Target;

/// The cost of a node whose result cannot be stored: finite, so that cost differences stay
/// numbers, and larger than any real step.
pub const INFEASIBLE_NS: f64 = 1e15;

/// What prices kernels: the target and the choices a compile forces on kernel variants.
#[derive(Clone, Debug, Default)]
pub struct CostModel {
    pub target: Target,
    pub flash: Choices,
    pub matmul: matmul::Forced,
}

impl CostModel {
    pub fn new(target: Target, flash: Choices, matmul: matmul::Forced) -> CostModel {
        CostModel {
            target,
            flash,
            matmul,
        }
    }

    /// Fixed cost of one dispatch.
    pub fn launch(&self) -> f64 {
        self.target.rates.launch_ns
    }

    /// Time to move `bytes` at the sustained bandwidth.
    pub fn bytes(&self, bytes: f64) -> f64 {
        bytes / self.target.rates.bytes_per_ns
    }

    /// Time of `flops` elementwise operations.
    pub fn flops(&self, flops: f64) -> f64 {
        flops / self.target.rates.flops_per_ns
    }

    /// A kernel that only moves data (convolution, pooling, gathers, concatenation): a launch
    /// and its bytes.
    pub fn data(&self, bytes: f64) -> f64 {
        self.launch() + self.bytes(bytes)
    }

    /// A fused kernel of `p` over operands of `operand_bytes` storing `out_bytes` (its first
    /// output): a launch, each operand read once per loop that reads it (re-reads of a row
    /// mostly hit the cache: a quarter of the bytes each), the outputs written once, the
    /// arithmetic.
    pub fn fused(&self, p: &Program, operand_bytes: &[f64], out_bytes: f64) -> f64 {
        let levels = p.levels();
        let mut reads = vec![0usize; p.operands.len()];
        let mut regions: Vec<Vec<u32>> = p.phases.iter().map(|ph| vec![ph.value]).collect();
        regions.push(p.outputs.iter().map(|o| o.value).collect());
        for roots in &regions {
            let mut need = vec![false; p.insts.len()];
            for &r in roots {
                need[r as usize] = true;
            }
            for i in (0..p.insts.len()).rev() {
                if need[i] {
                    match &p.insts[i] {
                        Inst::Map(_, args) => {
                            for &a in args {
                                need[a as usize] = true;
                            }
                        }
                        Inst::Load(o) if levels[i] == Level::Element || regions.len() == 1 => {
                            reads[*o as usize] += 1
                        }
                        Inst::Load(o) => reads[*o as usize] = reads[*o as usize].max(1),
                        Inst::Const(_) | Inst::Coord(_) | Inst::Reduced(_) => {}
                    }
                }
            }
        }
        let read: f64 = operand_bytes
            .iter()
            .zip(&reads)
            .map(|(&b, &r)| {
                b * if r == 0 {
                    0.0
                } else {
                    1.0 + 0.25 * (r - 1) as f64
                }
            })
            .sum();
        let extra_outputs: f64 = p.outputs[1..]
            .iter()
            .map(|o| {
                crate::fused::eval::shape_of(p, &o.access)
                    .iter()
                    .product::<usize>() as f64
                    * o.access.dtype.size_bytes() as f64
            })
            .sum();
        self.launch() + self.bytes(read + out_bytes + extra_outputs) + self.flops(p.flops() as f64)
    }

    /// A matrix product `a · b` into `out` (batched, broadcasting): a launch, its operands and
    /// result once, and its arithmetic: on the FMA units at the target's flat product rate
    /// ([`crate::target::Rates::product_flops_per_ns`], the rate the flash kernels' were
    /// fitted against), on tensor cores (two `f16` operands, [`matmul::form`]) as the variant
    /// lowering will choose prices it ([`matmul::choose`]).
    pub fn matmul(&self, a: &TensorType, b: &TensorType, out: &TensorType) -> f64 {
        let k = a.shape[a.rank() - 1];
        let flops = 2.0 * out.numel() as f64 * k as f64;
        let io =
            self.launch() + self.bytes((a.size_bytes() + b.size_bytes() + out.size_bytes()) as f64);
        // (1-D operands are promoted to matrices before any product is priced)
        let f16 = a.dtype == DType::F16 && b.dtype == DType::F16 && out.rank() >= 2;
        let rows = if f16 { out.shape[out.rank() - 2] } else { 0 };
        match matmul::form(&self.target, f16, rows) {
            matmul::Form::Fma => io + flops / self.target.rates.product_flops_per_ns,
            form @ matmul::Form::TensorCores => {
                let r = out.rank();
                let shape = matmul::Shape {
                    batch: out.shape[..r - 2].iter().product(),
                    m: out.shape[r - 2],
                    n: out.shape[r - 1],
                    k,
                };
                let max_binding = self.target.limits.max_binding;
                io + matmul::choose(&self.target, shape, self.matmul, max_binding, form).1
            }
        }
    }

    /// A flash kernel of `spec` over inputs of `types`: a launch, its operands and results
    /// once, and its products (those of the blocks its mask leaves live) at the flash rate,
    /// divided by its workgroups' balance over the SMs. Where the merge pass will make a dQ
    /// kernel part of its attention's whole backward ([`variant::merges`]), the dQ kernel costs
    /// that kernel's dQ share: one product, over key blocks, and the partial sums written and
    /// added.
    pub fn flash(&self, spec: &FlashSpec, types: &[TensorType]) -> f64 {
        let rates = &self.target.rates;
        let outs = spec.output_types(types);
        let bytes: f64 = types
            .iter()
            .chain(&outs)
            .map(|t| t.size_bytes() as f64)
            .sum();
        let (q, v) = (&types[0], &types[2]);
        let (d, dv) = (q.shape[q.rank() - 1] as f64, v.shape[v.rank() - 1] as f64);
        let merged = spec.kind == FlashKind::BackwardDq
            && variant::merges(&self.target, &self.flash, spec, q, v);
        // a dQ share runs in the whole backward: its rows are keys
        let runs_as = if merged {
            FlashSpec {
                kind: FlashKind::Backward,
                ..spec.clone()
            }
        } else {
            spec.clone()
        };
        let chosen = variant::choose(&self.target, &self.flash, &runs_as, q, v);
        let (rows, cols) = block(&chosen, runs_as.kind, d as usize, dv as usize);
        let scores: f64 = spec.score.domain.iter().map(|&n| n as f64).product::<f64>()
            * interval::live_fraction(&spec.score, rows, cols);
        let speedup = match (chosen.form, spec.kind) {
            (Form::Plain(_), _) => 1.0,
            (Form::TensorCores, FlashKind::Forward) => rates.flash.tensor_core_forward,
            (Form::TensorCores, _) => rates.flash.tensor_core_backward,
        };
        let products = match spec.kind {
            FlashKind::Forward => d + dv,
            FlashKind::BackwardDq if merged => d,
            FlashKind::BackwardDq => d + 2.0 * dv,
            FlashKind::BackwardDkDv => 2.0 * d + 2.0 * dv,
            FlashKind::Backward => 3.0 * d + 2.0 * dv,
        };
        let r = spec.score.domain.len();
        let batch: usize = spec.score.domain[..r - 2].iter().product();
        let by_keys = matches!(runs_as.kind, FlashKind::BackwardDkDv | FlashKind::Backward);
        let per_block = interval::live_per_row_block(&spec.score, rows, by_keys);
        // the workgroups in the kernel's launch order, each its live share of columns (the
        // whole backward's groups by their snake walks)
        let works = match runs_as.kind {
            FlashKind::Backward => variant::group_works(&per_block, chosen.blocks),
            _ => per_block,
        };
        let balance = balance(&works, batch, chosen.launch, rates.sms);
        let (launch, bytes) = if merged {
            let dq = q.size_bytes() as f64;
            (0.0, (2 * chosen.blocks + 1) as f64 * dq)
        } else {
            (self.launch(), bytes)
        };
        // the tensor-core backward's pass over dO for its gradient scale (`FlashScale`),
        // shared by the dQ and dK/dV kernels
        let scale_pass = if chosen.scales_gradients(spec.kind) {
            (self.launch() + self.bytes(types[3].size_bytes() as f64)) / 2.0
        } else {
            0.0
        };
        launch
            + scale_pass
            + self.bytes(bytes)
            + 2.0 * scores * products / rates.flash.flops_per_ns / speedup / balance
    }
}

/// The rows and columns of a flash kernel's blocks under `v` (for the live share of its score
/// space).
fn block(v: &Variant, kind: FlashKind, d: usize, dv: usize) -> (usize, usize) {
    match v.form {
        Form::Plain(t) => (t.rows, t.cols),
        Form::TensorCores if kind == FlashKind::Forward => (variant::TC_ROWS, variant::TC_COLS),
        Form::TensorCores => (variant::TC_ROWS, variant::tc_backward_cols(d, dv)),
    }
}

/// The share of `sms` SMs' time that `batch` rounds of workgroups with works `per_block` keep
/// busy when each starts, in `order`, on the SM that frees first ([`busiest_sm`]).
fn balance(per_block: &[f64], batch: usize, order: LaunchOrder, sms: usize) -> f64 {
    // integer work units (1/1024 of a full block) keep the simulation's order total
    let units: Vec<u64> = per_block
        .iter()
        .map(|&w| (w * 1024.0).round() as u64)
        .collect();
    let total: u64 = units.iter().sum::<u64>() * batch as u64;
    if total == 0 || sms == 0 {
        return 1.0;
    }
    let launches = order
        .launches(units.len(), batch)
        .into_iter()
        .map(|b| units[b]);
    let makespan = busiest_sm(launches, sms);
    total as f64 / (makespan.max(1) * sms as u64) as f64
}

/// The time the busiest of `sms` SMs works when workgroups of the given works start one after
/// the other, in order, each on the SM that frees first (one at a time per SM): the one
/// simulator of how a dispatch's workgroups spread over the GPU. Equal works need no
/// simulation: the busiest SM runs `⌈n / sms⌉` of them.
pub fn busiest_sm(works: impl Iterator<Item = u64>, sms: usize) -> u64 {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let works: Vec<u64> = works.collect();
    if sms == 0 || works.is_empty() {
        return 0;
    }
    if works.iter().all(|&w| w == works[0]) {
        return works.len().div_ceil(sms) as u64 * works[0];
    }
    let mut free: BinaryHeap<Reverse<u64>> = (0..sms).map(|_| Reverse(0)).collect();
    for w in works {
        let Reverse(t) = free.pop().unwrap_or(Reverse(0));
        free.push(Reverse(t + w));
    }
    free.into_iter().map(|Reverse(t)| t).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A product of f16 operands on a target with cooperative matrices is priced as the
    /// tensor-core variant lowering chooses (its estimate, plus launch and bytes); elsewhere,
    /// and for f32 operands, at the flat product rate.
    #[test]
    fn f16_products_are_priced_on_tensor_cores_where_they_run_there() {
        let price = |target: Target, dtype| {
            let model = CostModel::new(target, Choices::default(), matmul::Forced::default());
            let ty = |shape: [usize; 2]| TensorType::new(dtype, shape.to_vec());
            let (a, b, out) = (ty([2048, 768]), ty([768, 2304]), ty([2048, 2304]));
            let io = model.launch()
                + model.bytes((a.size_bytes() + b.size_bytes() + out.size_bytes()) as f64);
            (model.matmul(&a, &b, &out), io)
        };
        let shape = matmul::Shape {
            batch: 1,
            m: 2048,
            n: 2304,
            k: 768,
        };
        let forced = matmul::Forced::default();
        let form = matmul::Form::TensorCores;
        let (_, product) = matmul::choose(&Target::h200(), shape, forced, u64::MAX, form);
        let (tc, io) = price(Target::h200(), DType::F16);
        assert!(
            (tc - (io + product)).abs() < 1e-6,
            "{tc} vs {io} + {product}"
        );
        let (fma, _) = price(Target::portable(), DType::F16);
        assert!(tc < fma, "{tc} vs {fma}");
        assert_eq!(
            price(Target::h200(), DType::F32),
            price(Target::portable(), DType::F32)
        );
    }

    #[test]
    fn the_busiest_sm_sets_the_time() {
        // equal works: whole waves, the last one partial
        assert_eq!(busiest_sm([5; 264].into_iter(), 132), 10);
        assert_eq!(busiest_sm([5; 265].into_iter(), 132), 15);
        // the heaviest started last is the tail
        assert_eq!(busiest_sm([1, 1, 1, 4].into_iter(), 2), 5);
        assert_eq!(busiest_sm([4, 1, 1, 1].into_iter(), 2), 4);
        assert_eq!(busiest_sm(std::iter::empty(), 2), 0);
    }

    /// The balance of `batch` rounds of `per_block` in the launch order the variant choice
    /// gives them on 132 SMs.
    fn in_launch_order(batch: usize, per_block: &[f64]) -> f64 {
        balance(
            per_block,
            batch,
            LaunchOrder::of(per_block, batch, 132),
            132,
        )
    }

    /// Blocks of rising work (causal query blocks) balance better started heaviest first,
    /// which is the order [`balance`] simulates for them; equal blocks balance whole waves.
    #[test]
    fn heaviest_first_evens_out_causal_blocks() {
        let rising: Vec<f64> = (1..=16).map(|b| b as f64 / 16.0).collect();
        let heavy_first = in_launch_order(48, &rising);
        // the same works in dispatch order, lightest first: the order simulated by hand
        let mut free = vec![0.0f64; 132];
        for _ in 0..48 {
            for &w in &rising {
                let i = (0..free.len())
                    .min_by(|&a, &b| free[a].total_cmp(&free[b]))
                    .unwrap_or(0);
                free[i] += w;
            }
        }
        let total: f64 = rising.iter().sum::<f64>() * 48.0;
        let in_order = total / (free.iter().copied().fold(0.0, f64::max) * 132.0);
        assert!(heavy_first > 0.95, "{heavy_first}");
        assert!(
            heavy_first > in_order + 0.05,
            "{heavy_first} against {in_order}"
        );
        assert_eq!(in_launch_order(2, &[1.0; 66]), 1.0);
        assert!((in_launch_order(1, &[1.0; 133]) - 133.0 / 264.0).abs() < 1e-9);
    }
}

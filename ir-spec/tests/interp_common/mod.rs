//! Shared helpers of the `interp_*` tests: a tiny deterministic PRNG, one-node graphs, and
//! tolerant comparison.
#![allow(dead_code)]

use std::collections::HashMap;

use sinter_ir::interp::{EvalError, Tensor, evaluate};
use sinter_ir::{Attrs, Graph, Op};

/// xorshift64*: deterministic test data, independent of the crate's own SplitMix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1)
    }

    pub fn bits(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.bits() >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// Non-zero values in ±[0.1, 2).
    pub fn nonzero(&mut self) -> f64 {
        let m = self.uniform(0.1, 2.0);
        if self.bits() & 1 == 0 { m } else { -m }
    }

    pub fn tensor(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::f32(shape.to_vec(), (0..n).map(|_| self.nonzero()).collect())
    }

    pub fn positive(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::f32(
            shape.to_vec(),
            (0..n).map(|_| self.uniform(0.1, 3.0)).collect(),
        )
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.bits() % n as u64) as usize
    }
}

/// Evaluates one `op` node on `inputs` (named `x0`, `x1`, …) through a graph and `evaluate`.
pub fn run(op: Op, attrs: Attrs, inputs: &[Tensor]) -> Result<Vec<Tensor>, EvalError> {
    let mut g = Graph::new("t");
    let mut feed = HashMap::new();
    let mut ids = Vec::new();
    for (i, t) in inputs.iter().enumerate() {
        let name = format!("x{i}");
        ids.push(g.add_input(name.clone(), t.ty.clone()).unwrap());
        feed.insert(name, t.clone());
    }
    let outs = g.add_node(op, &ids, attrs, None).unwrap();
    for o in outs {
        g.add_output(o);
    }
    let ev = evaluate(&g, &feed, &HashMap::new())?;
    Ok(ev.outputs.into_iter().map(|(_, t)| t).collect())
}

/// [`run`] for a single-result op that must succeed.
pub fn run1(op: Op, attrs: Attrs, inputs: &[Tensor]) -> Tensor {
    run(op, attrs, inputs).unwrap().remove(0)
}

/// Asserts equal shapes and elements within `tol` (absolute, or relative for large values).
pub fn assert_close(actual: &Tensor, expected: &Tensor, tol: f64, what: &str) {
    assert_eq!(actual.ty, expected.ty, "{what}: type");
    for (i, (&a, &e)) in actual.data.iter().zip(&expected.data).enumerate() {
        let ok = (a.is_nan() && e.is_nan()) || a == e || (a - e).abs() <= tol * e.abs().max(1.0);
        assert!(
            ok,
            "{what}: element {i}: got {a}, expected {e}\n  got {actual}\n  expected {expected}"
        );
    }
}

/// C-order strides of a shape.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// The multi-index of flat position `flat` in `shape`.
pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for a in (0..shape.len()).rev() {
        idx[a] = flat % shape[a];
        flat /= shape[a];
    }
    idx
}

/// Element of `t` at an index into a shape `t` broadcasts to (numpy rules).
pub fn at_broadcast(t: &Tensor, idx: &[usize]) -> f64 {
    let pad = idx.len() - t.rank();
    let st = strides(t.shape());
    let offset: usize = (0..t.rank())
        .map(|a| {
            if t.shape()[a] == 1 {
                0
            } else {
                idx[a + pad] * st[a]
            }
        })
        .sum();
    t.data[offset]
}

pub fn f(shape: &[usize], data: &[f64]) -> Tensor {
    Tensor::f32(shape.to_vec(), data.to_vec())
}

pub fn i(shape: &[usize], data: &[i64]) -> Tensor {
    Tensor::i32(shape.to_vec(), data.to_vec())
}

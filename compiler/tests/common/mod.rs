//! What the compiler's integration tests share: programs through the front half of the
//! pipeline, random inputs, comparison up to rounding.
#![allow(dead_code)] // each test binary uses its part

use std::collections::HashMap;

use sinter_ir::interp::Tensor;
use sinter_ir::{DType, Graph, ValueDef};

/// xorshift64*, for inputs.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// ±[0.25, 1.25), never zero.
    pub fn nonzero(&mut self) -> f64 {
        let m = 0.25 + self.unit();
        if self.next() & 1 == 0 { m } else { -m }
    }
}

pub fn program(src: &str) -> Graph {
    let g = sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t.sir", src)));
    let g = sinter_ir::expand::expand_composites(&g);
    let g = sinter_compiler::autodiff::differentiate(&g)
        .expect("differentiable")
        .graph;
    sinter_ir::decompose::decompose(&g)
}

pub fn inputs(g: &Graph, rng: &mut Rng) -> (HashMap<String, Tensor>, HashMap<String, Tensor>) {
    let mut feed = HashMap::new();
    let mut persistent = HashMap::new();
    for v in g.value_ids() {
        let value = g.value(v);
        let n = value.ty.numel();
        let t = match value.ty.dtype {
            // small non-negative ints: valid labels and ids for every program here
            DType::I32 => Tensor::i32(
                value.ty.shape.clone(),
                (0..n).map(|i| (i % 3) as i64).collect(),
            ),
            DType::F32 | DType::F16 => Tensor::new(
                value.ty.clone(),
                (0..n)
                    .map(|_| value.ty.dtype.round(rng.nonzero()))
                    .collect(),
            ),
        };
        match value.def {
            ValueDef::Input => {
                feed.insert(value.name.clone(), t);
            }
            ValueDef::State(_) if value.ty.shape.is_empty() => {
                // step counters: a valid step
                persistent.insert(value.name.clone(), Tensor::f32(vec![], vec![2.0]));
            }
            ValueDef::Param(_) => {
                persistent.insert(value.name.clone(), t);
            }
            ValueDef::State(_) => {
                // optimizer moments: second moments must not be negative
                let data = t.data.iter().map(|v| v.abs()).collect();
                persistent.insert(
                    value.name.clone(),
                    Tensor::f32(value.ty.shape.clone(), data),
                );
            }
            ValueDef::Node { .. } => {}
        }
    }
    (feed, persistent)
}

/// Equal up to rounding: within 1e-6 of the largest |value| of `b`. Fused kernels hold their
/// literals as f32 (as the GPU does) where the interpreter keeps f64, and sums are reordered.
pub fn close(a: &Tensor, b: &Tensor) -> bool {
    let scale = b.data.iter().fold(1e-300f64, |m, v| m.max(v.abs()));
    a.ty == b.ty
        && a.data
            .iter()
            .zip(&b.data)
            .all(|(&x, &y)| (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= 1e-6 * scale)
}

/// Asserts that `got` holds `want`'s results (outputs or assigns, `kind` says which): the same
/// names in the same order, each value [`close`] to its own; `context` ends a failure's message.
pub fn assert_results(
    kind: &str,
    got: &[(String, Tensor)],
    want: &[(String, Tensor)],
    context: &str,
) {
    let names = |v: &[(String, Tensor)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(got), names(want), "{kind} names\n{context}");
    for ((name, a), (_, w)) in got.iter().zip(want) {
        assert!(close(a, w), "{kind} {name}\n got {a}\n want {w}\n{context}");
    }
}

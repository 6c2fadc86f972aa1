//! Elementwise ops: unary math, broadcasting binary ops and comparisons, `where`, `cast`.
//!
//! NaN propagates as in PyTorch: `maximum`/`minimum` (and `relu`) return NaN when an operand is
//! NaN; comparisons with NaN are false (0.0), as IEEE says.

use crate::attr::key;
use crate::interp::node::Cx;
use crate::interp::special::{gelu_erf, gelu_tanh};
use crate::interp::tensor::{Tensor, View};
use crate::op::Op;
use crate::types::DType;

/// The scalar function of an elementwise op (unary, binary or comparison) at `args`; for
/// `gelu`, `gelu_tanh` picks the tanh approximation. The one place that says what each
/// elementwise op computes (the fused kernels' evaluator in the compiler calls it too).
pub fn scalar(op: Op, gelu_tanh_form: bool, args: &[f64]) -> f64 {
    let x = args[0];
    let y = || args[1];
    match op {
        Op::Neg => -x,
        Op::Abs => x.abs(),
        Op::Exp => x.exp(),
        Op::Log => x.ln(),
        Op::Sqrt => x.sqrt(),
        Op::Rsqrt => 1.0 / x.sqrt(),
        Op::Reciprocal => 1.0 / x,
        Op::Square => x * x,
        Op::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        Op::Sigmoid => sigmoid(x),
        Op::Tanh => x.tanh(),
        Op::Silu => x * sigmoid(x),
        Op::Sin => x.sin(),
        Op::Cos => x.cos(),
        Op::Gelu if gelu_tanh_form => gelu_tanh(x),
        Op::Gelu => gelu_erf(x),
        Op::Add => x + y(),
        Op::Sub => x - y(),
        Op::Mul => x * y(),
        Op::Div => x / y(),
        Op::Pow => x.powf(y()),
        Op::Maximum => nan_or(x, y(), f64::max),
        Op::Minimum => nan_or(x, y(), f64::min),
        Op::Eq => truth(x == y()),
        Op::Lt => truth(x < y()),
        Op::Le => truth(x <= y()),
        Op::Gt => truth(x > y()),
        Op::Ge => truth(x >= y()),
        Op::Where => {
            if x != 0.0 {
                y()
            } else {
                args[2]
            }
        }
        other => unreachable!("`{}` is not elementwise", other.name()),
    }
}

/// A unary op of [`crate::op::OpClass::Unary`].
pub(crate) fn unary(cx: &Cx) -> Tensor {
    let tanh_form =
        cx.op == Op::Gelu && cx.attrs.of(key::APPROXIMATE) == crate::attr::GeluForm::Tanh;
    let x = cx.x(0);
    let data = x
        .data
        .iter()
        .map(|&v| scalar(cx.op, tanh_form, &[v]))
        .collect();
    Tensor::new(cx.out().clone(), data)
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn nan_or(a: f64, b: f64, pick: fn(f64, f64) -> f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        pick(a, b)
    }
}

fn truth(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

/// A binary op or comparison, with numpy broadcasting to the result's shape.
pub(crate) fn binary(cx: &Cx) -> Tensor {
    let shape = &cx.out().shape;
    let a = View::broadcast(cx.x(0), shape).gather();
    let b = View::broadcast(cx.x(1), shape).gather();
    let data = a
        .iter()
        .zip(&b)
        .map(|(&a, &b)| scalar(cx.op, false, &[a, b]))
        .collect();
    Tensor::new(cx.out().clone(), data)
}

/// `where(cond, a, b)`: `a` where `cond != 0`, else `b`.
pub(crate) fn select(cx: &Cx) -> Tensor {
    let shape = &cx.out().shape;
    let cond = View::broadcast(cx.x(0), shape).gather();
    let a = View::broadcast(cx.x(1), shape).gather();
    let b = View::broadcast(cx.x(2), shape).gather();
    let data = (0..cond.len())
        .map(|i| if cond[i] != 0.0 { a[i] } else { b[i] })
        .collect();
    Tensor::new(cx.out().clone(), data)
}

/// `cast`: to i32 truncates toward zero, saturating at the i32 range, NaN becoming 0 (the GPU
/// does the same); to f32 is exact for every i32 and f16; to f16 rounds to nearest, ties to
/// even (through f32), past 65504 to ±inf.
pub(crate) fn cast(cx: &Cx) -> Tensor {
    let x = cx.x(0);
    let data = match cx.out().dtype {
        DType::F32 => x.data.clone(),
        DType::I32 => x.data.iter().map(|&v| to_i32(v) as f64).collect(),
        DType::F16 => x.data.iter().map(|&v| DType::F16.round(v)).collect(),
    };
    Tensor::new(cx.out().clone(), data)
}

/// f64 to i32 as `cast` does it.
pub fn to_i32(v: f64) -> i32 {
    v as i32 // Rust's `as`: truncation toward zero, saturating, NaN to 0
}

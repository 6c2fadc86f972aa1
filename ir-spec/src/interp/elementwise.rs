//! Elementwise ops: unary math, broadcasting binary ops and comparisons, `where`, `cast`.
//!
//! NaN propagates as in PyTorch: `maximum`/`minimum` (and `relu`) return NaN when an operand is
//! NaN; comparisons with NaN are false (0.0), as IEEE says.

use crate::interp::node::Cx;
use crate::interp::special::{gelu_erf, gelu_tanh};
use crate::interp::tensor::{Tensor, View};
use crate::op::Op;
use crate::types::DType;

/// A unary op of [`crate::op::OpClass::Unary`].
pub(crate) fn unary(cx: &Cx) -> Tensor {
    let f: fn(f64) -> f64 = match cx.op {
        Op::Neg => |x| -x,
        Op::Abs => f64::abs,
        Op::Exp => f64::exp,
        Op::Log => f64::ln,
        Op::Sqrt => f64::sqrt,
        Op::Rsqrt => |x| 1.0 / x.sqrt(),
        Op::Reciprocal => |x| 1.0 / x,
        Op::Square => |x| x * x,
        Op::Relu => |x| if x < 0.0 { 0.0 } else { x },
        Op::Sigmoid => sigmoid,
        Op::Tanh => f64::tanh,
        Op::Silu => |x| x * sigmoid(x),
        Op::Sin => f64::sin,
        Op::Cos => f64::cos,
        Op::Gelu => match cx.attrs.str("approximate") {
            "tanh" => gelu_tanh,
            _ => gelu_erf,
        },
        other => unreachable!("`{}` is not unary", other.name()),
    };
    let x = cx.x(0);
    Tensor::new(cx.out().clone(), x.data.iter().map(|&v| f(v)).collect())
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
    let f: fn(f64, f64) -> f64 = match cx.op {
        Op::Add => |a, b| a + b,
        Op::Sub => |a, b| a - b,
        Op::Mul => |a, b| a * b,
        Op::Div => |a, b| a / b,
        Op::Pow => f64::powf,
        Op::Maximum => |a, b| nan_or(a, b, f64::max),
        Op::Minimum => |a, b| nan_or(a, b, f64::min),
        Op::Eq => |a, b| truth(a == b),
        Op::Lt => |a, b| truth(a < b),
        Op::Le => |a, b| truth(a <= b),
        Op::Gt => |a, b| truth(a > b),
        Op::Ge => |a, b| truth(a >= b),
        other => unreachable!("`{}` is not binary", other.name()),
    };
    let shape = &cx.out().shape;
    let a = View::broadcast(cx.x(0), shape).gather();
    let b = View::broadcast(cx.x(1), shape).gather();
    let data = a.iter().zip(&b).map(|(&a, &b)| f(a, b)).collect();
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
/// does the same); to f32 is exact for every i32.
pub(crate) fn cast(cx: &Cx) -> Tensor {
    let x = cx.x(0);
    let data = match cx.out().dtype {
        DType::F32 => x.data.clone(),
        DType::I32 => x.data.iter().map(|&v| to_i32(v) as f64).collect(),
    };
    Tensor::new(cx.out().clone(), data)
}

/// f64 to i32 as `cast` does it.
pub(crate) fn to_i32(v: f64) -> i32 {
    v as i32 // Rust's `as`: truncation toward zero, saturating, NaN to 0
}

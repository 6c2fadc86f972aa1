//! Elementwise ONNX ops: math, activations, comparisons, logic, `Where`, `Clip`, `Cast`.

use sinter_ir::{Attrs, DType, GeluForm, Op, ValueId, key};

use super::{Args, Results, binary, f32_value, float, one, unary};
use crate::error::Problem;
use crate::import::{Importer, Val};
use crate::literal::{Elem, dtype};

pub fn translate(cx: &mut Importer, op: &str, args: &Args) -> Result<Option<Results>, Problem> {
    let direct = match op {
        "Neg" => Some(Op::Neg),
        "Abs" => Some(Op::Abs),
        "Exp" => Some(Op::Exp),
        "Log" => Some(Op::Log),
        "Sqrt" => Some(Op::Sqrt),
        "Reciprocal" => Some(Op::Reciprocal),
        "Relu" => Some(Op::Relu),
        "Sigmoid" => Some(Op::Sigmoid),
        "Tanh" => Some(Op::Tanh),
        "Sin" => Some(Op::Sin),
        "Cos" => Some(Op::Cos),
        _ => None,
    };
    if let Some(sop) = direct {
        let x = f32_value(cx, args.input(0)?)?;
        return float(unary(cx, sop, x)?).map(Some);
    }
    let binary_op = match op {
        "Add" => Some(Op::Add),
        "Sub" => Some(Op::Sub),
        "Mul" => Some(Op::Mul),
        "Div" => Some(Op::Div),
        "Pow" => Some(Op::Pow),
        _ => None,
    };
    if let Some(sop) = binary_op {
        if args.input(0)?.1.elem() == Elem::Int {
            return Err(Problem::unsupported(format!(
                "`{op}` on integers computed at run time (sinter's arithmetic is f32 only)"
            )));
        }
        let a = f32_value(cx, args.input(0)?)?;
        let b = f32_value(cx, args.input(1)?)?;
        return float(binary(cx, sop, a, b)?).map(Some);
    }
    let result = match op {
        "Max" | "Min" | "Sum" | "Mean" => variadic(cx, op, args)?,
        "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" => compare(cx, op, args)?,
        "Not" | "And" | "Or" | "Xor" => logic(cx, op, args)?,
        "Where" => select(cx, args)?,
        "Clip" => clip(cx, args)?,
        "Cast" | "CastLike" => cast(cx, op, args)?,
        "Identity" | "Dropout" => identity(args)?,
        "IsNaN" | "IsInf" => test_special(cx, op, args)?,
        _ => match activation(cx, op, args)? {
            Some(id) => float(id)?,
            None => return Ok(None),
        },
    };
    Ok(Some(result))
}

/// Activations and math written with several sinter ops.
fn activation(cx: &mut Importer, op: &str, args: &Args) -> Result<Option<ValueId>, Problem> {
    let a = args.attrs;
    let known = [
        "Softplus",
        "Softsign",
        "LeakyRelu",
        "Elu",
        "Selu",
        "Celu",
        "ThresholdedRelu",
        "HardSigmoid",
        "HardSwish",
        "Mish",
        "PRelu",
        "Gelu",
        "Erf",
        "Sign",
        "Tan",
        "Sinh",
        "Cosh",
    ];
    if !known.contains(&op) {
        return Ok(None);
    }
    let x = f32_value(cx, args.input(0)?)?;
    let c = |cx: &mut Importer, v: f64| cx.scalar(v);
    let id = match op {
        "Softplus" => {
            let e = unary(cx, Op::Exp, x)?;
            let one = c(cx, 1.0)?;
            let s = binary(cx, Op::Add, e, one)?;
            unary(cx, Op::Log, s)?
        }
        "Softsign" => {
            let ax = unary(cx, Op::Abs, x)?;
            let one = c(cx, 1.0)?;
            let d = binary(cx, Op::Add, ax, one)?;
            binary(cx, Op::Div, x, d)?
        }
        "LeakyRelu" => {
            let alpha = c(cx, a.float("alpha", 0.01))?;
            negative_part(cx, x, |cx, x| binary(cx, Op::Mul, x, alpha))?
        }
        "PRelu" => {
            let slope = f32_value(cx, args.input(1)?)?;
            negative_part(cx, x, |cx, x| binary(cx, Op::Mul, x, slope))?
        }
        "Elu" => {
            let alpha = a.float("alpha", 1.0);
            negative_part(cx, x, |cx, x| expm1_scaled(cx, x, alpha))?
        }
        "Selu" => {
            let alpha = a.float("alpha", 1.673_263_192_176_818_8);
            let gamma = c(cx, a.float("gamma", 1.050_701_022_148_132_3))?;
            let y = negative_part(cx, x, |cx, x| expm1_scaled(cx, x, alpha))?;
            binary(cx, Op::Mul, y, gamma)?
        }
        "Celu" => {
            // max(0, x) + min(0, alpha·(exp(x/alpha) − 1))
            let alpha = a.float("alpha", 1.0);
            let zero = c(cx, 0.0)?;
            let pos = binary(cx, Op::Maximum, x, zero)?;
            let inv = c(cx, 1.0 / alpha)?;
            let scaled = binary(cx, Op::Mul, x, inv)?;
            let em = expm1_scaled(cx, scaled, alpha)?;
            let neg = binary(cx, Op::Minimum, em, zero)?;
            binary(cx, Op::Add, pos, neg)?
        }
        "ThresholdedRelu" => {
            let alpha = c(cx, a.float("alpha", 1.0))?;
            let keep = binary(cx, Op::Gt, x, alpha)?;
            let zero = c(cx, 0.0)?;
            cx.op(Op::Where, &[keep, x, zero], Attrs::new())?
        }
        "HardSigmoid" => hard_sigmoid(cx, x, a.float("alpha", 0.2), a.float("beta", 0.5))?,
        "HardSwish" => {
            let h = hard_sigmoid(cx, x, 1.0 / 6.0, 0.5)?;
            binary(cx, Op::Mul, x, h)?
        }
        "Mish" => {
            let e = unary(cx, Op::Exp, x)?;
            let one = c(cx, 1.0)?;
            let s = binary(cx, Op::Add, e, one)?;
            let sp = unary(cx, Op::Log, s)?;
            let t = unary(cx, Op::Tanh, sp)?;
            binary(cx, Op::Mul, x, t)?
        }
        "Gelu" => {
            let approximate = a.string("approximate", "none");
            let Some(approximate) = GeluForm::from_name(&approximate) else {
                return Err(Problem::unsupported(format!(
                    "approximate=\"{approximate}\""
                )));
            };
            cx.op(
                Op::Gelu,
                &[x],
                Attrs::new().and(key::APPROXIMATE, approximate),
            )?
        }
        "Erf" => erf(cx, x)?,
        "Sign" => {
            let zero = c(cx, 0.0)?;
            let p = binary(cx, Op::Gt, x, zero)?;
            let n = binary(cx, Op::Lt, x, zero)?;
            binary(cx, Op::Sub, p, n)?
        }
        "Tan" => {
            let s = unary(cx, Op::Sin, x)?;
            let co = unary(cx, Op::Cos, x)?;
            binary(cx, Op::Div, s, co)?
        }
        // "Sinh" | "Cosh": (eˣ ∓ e⁻ˣ) / 2
        _ => {
            let e = unary(cx, Op::Exp, x)?;
            let nx = unary(cx, Op::Neg, x)?;
            let en = unary(cx, Op::Exp, nx)?;
            let combine = if op == "Sinh" { Op::Sub } else { Op::Add };
            let s = binary(cx, combine, e, en)?;
            let half = c(cx, 0.5)?;
            binary(cx, Op::Mul, s, half)?
        }
    };
    Ok(Some(id))
}

/// `x < 0 ? f(x) : x` (NaN stays NaN).
fn negative_part(
    cx: &mut Importer,
    x: ValueId,
    f: impl FnOnce(&mut Importer, ValueId) -> Result<ValueId, Problem>,
) -> Result<ValueId, Problem> {
    let zero = cx.scalar(0.0)?;
    let negative = binary(cx, Op::Lt, x, zero)?;
    let fx = f(cx, x)?;
    cx.op(Op::Where, &[negative, fx, x], Attrs::new())
}

/// `alpha·(eˣ − 1)`.
fn expm1_scaled(cx: &mut Importer, x: ValueId, alpha: f64) -> Result<ValueId, Problem> {
    let e = unary(cx, Op::Exp, x)?;
    let one = cx.scalar(1.0)?;
    let em = binary(cx, Op::Sub, e, one)?;
    let alpha = cx.scalar(alpha)?;
    binary(cx, Op::Mul, em, alpha)
}

/// `max(0, min(1, alpha·x + beta))`.
fn hard_sigmoid(cx: &mut Importer, x: ValueId, alpha: f64, beta: f64) -> Result<ValueId, Problem> {
    let alpha = cx.scalar(alpha)?;
    let beta = cx.scalar(beta)?;
    let ax = binary(cx, Op::Mul, x, alpha)?;
    let y = binary(cx, Op::Add, ax, beta)?;
    let one = cx.scalar(1.0)?;
    let zero = cx.scalar(0.0)?;
    let y = binary(cx, Op::Minimum, y, one)?;
    binary(cx, Op::Maximum, y, zero)
}

/// erf from sinter's exact-erf `gelu`: for |x| ≥ ½, `erf(x) = 2·Φ(√2·x) − 1` with
/// `Φ(z) = gelu(z)/z`; below ½, where that quotient would lose relative precision, the Taylor
/// series `2/√π·(x − x³/3 + x⁵/10 − x⁷/42 + x⁹/216 − x¹¹/1320)` (truncation error below 2·10⁻⁸
/// relative). The quotient's operand is replaced by 1 where the series is used, so neither
/// branch divides by zero (nor produces a NaN gradient).
fn erf(cx: &mut Importer, x: ValueId) -> Result<ValueId, Problem> {
    let ax = unary(cx, Op::Abs, x)?;
    let half = cx.scalar(0.5)?;
    let small = binary(cx, Op::Lt, ax, half)?;
    // series: x·Σ cₖ·x²ᵏ, Horner in x²
    let x2 = unary(cx, Op::Square, x)?;
    let coefficients = [
        1.0,
        -1.0 / 3.0,
        1.0 / 10.0,
        -1.0 / 42.0,
        1.0 / 216.0,
        -1.0 / 1320.0,
    ];
    let mut acc = cx.scalar(coefficients[coefficients.len() - 1])?;
    for &ck in coefficients.iter().rev().skip(1) {
        let m = binary(cx, Op::Mul, acc, x2)?;
        let k = cx.scalar(ck)?;
        acc = binary(cx, Op::Add, m, k)?;
    }
    let scale = cx.scalar(2.0 / std::f64::consts::PI.sqrt())?;
    let series = binary(cx, Op::Mul, acc, x)?;
    let series = binary(cx, Op::Mul, series, scale)?;
    // large: 2·gelu(z)/z − 1, z = √2·x (1 where the series applies)
    let sqrt2 = cx.scalar(std::f64::consts::SQRT_2)?;
    let z = binary(cx, Op::Mul, x, sqrt2)?;
    let one = cx.scalar(1.0)?;
    let z = cx.op(Op::Where, &[small, one, z], Attrs::new())?;
    let g = cx.op(Op::Gelu, &[z], Attrs::new())?;
    let phi = binary(cx, Op::Div, g, z)?;
    let two = cx.scalar(2.0)?;
    let twice = binary(cx, Op::Mul, phi, two)?;
    let large = binary(cx, Op::Sub, twice, one)?;
    cx.op(Op::Where, &[small, series, large], Attrs::new())
}

/// `Max`, `Min`, `Sum`, `Mean` over one or more operands (broadcasting).
fn variadic(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    let sop = match op {
        "Max" => Op::Maximum,
        "Min" => Op::Minimum,
        _ => Op::Add,
    };
    let mut acc: Option<ValueId> = None;
    let mut count = 0;
    for operand in args.all() {
        let v = f32_value(cx, operand)?;
        count += 1;
        acc = Some(match acc {
            None => v,
            Some(a) => binary(cx, sop, a, v)?,
        });
    }
    let acc = acc.ok_or_else(|| Problem::invalid("no operands"))?;
    if op == "Mean" && count > 1 {
        let n = cx.scalar(f64::from(count))?;
        return float(binary(cx, Op::Div, acc, n)?);
    }
    float(acc)
}

/// Both operands of a comparison or `Where`, with one sinter dtype.
fn same_dtype(cx: &mut Importer, args: &Args, first: usize) -> Result<(ValueId, ValueId), Problem> {
    let a = args.input(first)?;
    let b = args.input(first + 1)?;
    let both_int = a.1.elem() == Elem::Int && b.1.elem() == Elem::Int;
    if both_int {
        Ok((cx.value(a)?, cx.value(b)?))
    } else {
        Ok((f32_value(cx, a)?, f32_value(cx, b)?))
    }
}

fn compare(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    let sop = match op {
        "Equal" => Op::Eq,
        "Less" => Op::Lt,
        "LessOrEqual" => Op::Le,
        "Greater" => Op::Gt,
        _ => Op::Ge,
    };
    let (a, b) = same_dtype(cx, args, 0)?;
    one(Val::Dynamic {
        id: binary(cx, sop, a, b)?,
        elem: Elem::Bool,
    })
}

/// Logic on booleans, which sinter holds as f32 0.0/1.0.
fn logic(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    let a = f32_value(cx, args.input(0)?)?;
    let id = match op {
        "Not" => {
            let one = cx.scalar(1.0)?;
            binary(cx, Op::Sub, one, a)?
        }
        _ => {
            let b = f32_value(cx, args.input(1)?)?;
            match op {
                "And" => binary(cx, Op::Mul, a, b)?,
                "Or" => binary(cx, Op::Maximum, a, b)?,
                _ => {
                    let d = binary(cx, Op::Sub, a, b)?;
                    unary(cx, Op::Abs, d)?
                }
            }
        }
    };
    one(Val::Dynamic {
        id,
        elem: Elem::Bool,
    })
}

fn select(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    let cond = cx.value(args.input(0)?)?;
    let elem = args.input(1)?.1.elem();
    let (a, b) = same_dtype(cx, args, 1)?;
    let elem = if cx.graph.ty(a).dtype == DType::I32 {
        Elem::Int
    } else if elem == Elem::Int {
        Elem::Float
    } else {
        elem
    };
    one(Val::Dynamic {
        id: cx.op(Op::Where, &[cond, a, b], Attrs::new())?,
        elem,
    })
}

fn clip(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    let mut y = f32_value(cx, args.input(0)?)?;
    if let Some(lo) = args.operand(1) {
        let lo = f32_value(cx, lo)?;
        y = binary(cx, Op::Maximum, y, lo)?;
    }
    if let Some(hi) = args.operand(2) {
        let hi = f32_value(cx, hi)?;
        y = binary(cx, Op::Minimum, y, hi)?;
    }
    float(y)
}

/// `Cast` (attribute `to`) and `CastLike` (the dtype of operand 1).
fn cast(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    let x = args.input(0)?;
    args.attrs.ignore("saturate");
    args.attrs.ignore("round_mode");
    let target = if op == "Cast" {
        let to = args.attrs.int("to", 0) as i32;
        match to {
            dtype::FLOAT => Elem::Float,
            dtype::INT32 | dtype::INT64 => Elem::Int,
            dtype::BOOL => Elem::Bool,
            other => {
                return Err(Problem::unsupported(format!(
                    "cast to {} (sinter has f32 and i32)",
                    dtype::name(other)
                )));
            }
        }
    } else {
        args.input(1)?.1.elem()
    };
    let v = cx.value(x)?;
    let from = cx.graph.ty(v).dtype;
    let id = match (target, from) {
        (Elem::Bool, _) => {
            // x ≠ 0
            let v = if from == DType::I32 {
                cx.op(Op::Cast, &[v], Attrs::new().and(key::DTYPE, DType::F32))?
            } else {
                v
            };
            let zero = cx.scalar(0.0)?;
            let is_zero = binary(cx, Op::Eq, v, zero)?;
            let one = cx.scalar(1.0)?;
            binary(cx, Op::Sub, one, is_zero)?
        }
        (t, f) if t.dtype() == f => v,
        (t, _) => cx.op(Op::Cast, &[v], Attrs::new().and(key::DTYPE, t.dtype()))?,
    };
    one(Val::Dynamic { id, elem: target })
}

fn identity(args: &Args) -> Result<Results, Problem> {
    // Dropout in inference: the identity. Its mask output is all true, and training_mode must
    // be off (a constant false).
    args.attrs.ignore("seed");
    if let Some(training) = args.literal(2, "Dropout's training_mode")?
        && training.data.iter().any(|&v| v != 0.0)
    {
        return Err(Problem::unsupported(
            "Dropout with training_mode=true (random masks at run time)",
        ));
    }
    if args.wants(1) {
        return Err(Problem::unsupported("Dropout's mask output"));
    }
    let x = args.input(0)?;
    Ok(vec![Some(x.1.clone())])
}

fn test_special(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    let x = f32_value(cx, args.input(0)?)?;
    let id = if op == "IsNaN" {
        let same = binary(cx, Op::Eq, x, x)?;
        let one = cx.scalar(1.0)?;
        binary(cx, Op::Sub, one, same)?
    } else {
        let positive = args.attrs.int("detect_positive", 1) != 0;
        let negative = args.attrs.int("detect_negative", 1) != 0;
        // never true, of x's shape: x < −inf
        let below = cx.scalar(f64::NEG_INFINITY)?;
        let mut acc = binary(cx, Op::Lt, x, below)?;
        for (on, v) in [(positive, f64::INFINITY), (negative, f64::NEG_INFINITY)] {
            if on {
                let c = cx.scalar(v)?;
                let e = binary(cx, Op::Eq, x, c)?;
                acc = binary(cx, Op::Add, acc, e)?;
            }
        }
        acc
    };
    one(Val::Dynamic {
        id,
        elem: Elem::Bool,
    })
}

//! Reductions: `ReduceSum`, `ReduceMean`, `ReduceMax`, `ReduceMin`, `ReduceLogSumExp`,
//! `ReduceL1`, `ReduceL2`, `ReduceSumSquare`, `ReduceLogSum`, `ArgMax`/`ArgMin`, and the prefix
//! sum `CumSum`.

use sinter_ir::{Attrs, Op, ValueId, key};

use super::shape::{axes_operand, normalized};
use super::{Args, Results, f32_value, float, one, unary};
use crate::error::Problem;
use crate::import::{Importer, Val};
use crate::literal::{Elem, Literal};

pub fn translate(cx: &mut Importer, op: &str, args: &Args) -> Result<Option<Results>, Problem> {
    let (pre, reduce, post): (Option<Op>, Op, Option<Op>) = match op {
        "ReduceSum" => (None, Op::Sum, None),
        "ReduceMean" => (None, Op::Mean, None),
        "ReduceMax" => (None, Op::Max, None),
        "ReduceMin" => (None, Op::Min, None),
        "ReduceLogSumExp" => (None, Op::Logsumexp, None),
        "ReduceL1" => (Some(Op::Abs), Op::Sum, None),
        "ReduceL2" => (Some(Op::Square), Op::Sum, Some(Op::Sqrt)),
        "ReduceSumSquare" => (Some(Op::Square), Op::Sum, None),
        "ReduceLogSum" => (None, Op::Sum, Some(Op::Log)),
        "ArgMax" | "ArgMin" => return arg_reduce(cx, op, args).map(Some),
        "CumSum" => return cumsum(cx, args).map(Some),
        _ => return Ok(None),
    };
    let x = f32_value(cx, args.input(0)?)?;
    let rank = cx.shape_of(x).len();
    let keepdim = args.attrs.int("keepdims", 1) != 0;
    let noop = args.attrs.int("noop_with_empty_axes", 0) != 0;
    let axes = match axes_operand(args, 1)? {
        Some(a) if !a.is_empty() => normalized(&a, rank)?,
        _ if noop => return float(x).map(Some),
        _ => (0..rank).collect(),
    };
    let mut v = x;
    if let Some(p) = pre {
        v = unary(cx, p, v)?;
    }
    if rank > 0 {
        let mut sorted = axes;
        sorted.sort_unstable();
        v = cx.op(
            reduce,
            &[v],
            Attrs::new()
                .and(key::AXES, sorted)
                .and(key::KEEPDIM, keepdim),
        )?;
    }
    if let Some(p) = post {
        v = unary(cx, p, v)?;
    }
    float(v).map(Some)
}

fn arg_reduce(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    let last = args.attrs.int("select_last_index", 0) != 0;
    let mut x: ValueId = f32_value(cx, args.input(0)?)?;
    let rank = cx.shape_of(x).len();
    let a = super::axis(args.attrs.int("axis", 0), rank, "axis")?;
    let keepdim = args.attrs.int("keepdims", 1) != 0;
    if op == "ArgMin" {
        x = unary(cx, Op::Neg, x)?;
    }
    let id = cx.op(
        Op::Argmax,
        &[x],
        Attrs::new()
            .and(key::AXIS, a)
            .and(key::KEEPDIM, keepdim)
            .and(key::LAST, last),
    )?;
    one(Val::Dynamic {
        id,
        elem: Elem::Int,
    })
}

/// `CumSum`'s axis (normalized) and attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CumsumForm {
    pub axis: usize,
    pub exclusive: bool,
    pub reverse: bool,
}

/// `CumSum`'s form for an operand `x` of class `elem` and rank `rank`: the axis operand must be
/// known at import time (sinter's `cumsum` takes its axis as an attribute) and be one int32 or
/// int64 value, negative counting from the end. The folder and the translation both read it here.
pub fn cumsum_form(args: &Args, elem: Elem, rank: usize) -> Result<CumsumForm, Problem> {
    let exclusive = args.attrs.int("exclusive", 0) != 0;
    let reverse = args.attrs.int("reverse", 0) != 0;
    let axis = match args.input(1)? {
        (_, Val::Static(l)) => cumsum_axis(l)?,
        (name, Val::Dynamic { .. }) => {
            return Err(Problem::NotStatic(format!(
                "the axis (`{name}`) is computed at run time; sinter's `cumsum` takes its axis \
                 as an attribute, so it"
            )));
        }
    };
    if elem == Elem::Bool {
        return Err(Problem::invalid(
            "CumSum of a boolean tensor (ONNX's CumSum sums numbers)",
        ));
    }
    if rank == 0 {
        return Err(Problem::invalid(format!(
            "CumSum of a scalar: its axis ({axis}) must name an axis, and a scalar has none"
        )));
    }
    Ok(CumsumForm {
        axis: super::axis(axis, rank, "axis")?,
        exclusive,
        reverse,
    })
}

/// The raw value of `CumSum`'s axis operand: one integer, as a scalar or a one-element 1-D tensor.
fn cumsum_axis(axis: &Literal) -> Result<i64, Problem> {
    let kind = match axis.elem {
        Elem::Int => "",
        Elem::Float => "float ",
        Elem::Bool => "boolean ",
    };
    if !kind.is_empty() || axis.rank() > 1 || axis.data.len() != 1 {
        return Err(Problem::invalid(format!(
            "CumSum's axis must be one int32 or int64 value (a scalar or a one-element 1-D \
             tensor), got a {kind}tensor of shape {:?}",
            axis.shape
        )));
    }
    Ok(axis.as_ints()[0])
}

/// `CumSum` of a run-time `x` (constant operands are folded by [`crate::fold`]): sinter's
/// `cumsum`, which is f32 only.
fn cumsum(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    let x = args.input(0)?;
    let rank = match &x.1 {
        Val::Static(l) => l.rank(),
        Val::Dynamic { id, .. } => cx.shape_of(*id).len(),
    };
    let elem = x.1.elem();
    let form = cumsum_form(args, elem, rank)?;
    // With the axis known, a constant `x` would have been folded: `x` is computed at run time.
    if elem == Elem::Int {
        return Err(Problem::unsupported(format!(
            "`CumSum` of integers computed at run time (`{}`): sinter's `cumsum` is f32 only, and \
             sinter has no integer arithmetic at run time (integers are computed at import time, \
             from shapes and constants)",
            x.0
        )));
    }
    let v = cx.value(x)?;
    let id = cx.op(
        Op::Cumsum,
        &[v],
        Attrs::new()
            .and(key::AXIS, form.axis)
            .and(key::EXCLUSIVE, form.exclusive)
            .and(key::REVERSE, form.reverse),
    )?;
    float(id)
}

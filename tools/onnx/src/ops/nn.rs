//! Neural-network ops: `MatMul`, `Gemm`, `Conv`, `ConvTranspose`, pooling, the
//! normalizations, `Softmax`/`LogSoftmax`/`Hardmax` and `SoftmaxCrossEntropyLoss`.

use sinter_ir::{Attrs, DType, Op, Reduction, ValueId, key};

use super::{Args, Operand, Results, axis, binary, f32_value, float, unary};
use crate::error::Problem;
use crate::import::{Importer, Val};
use crate::literal::{Elem, Literal};

pub fn translate(cx: &mut Importer, op: &str, args: &Args) -> Result<Option<Results>, Problem> {
    let result = match op {
        "MatMul" => {
            let a = f32_value(cx, args.input(0)?)?;
            let b = f32_value(cx, args.input(1)?)?;
            float(binary(cx, Op::Matmul, a, b)?)?
        }
        "Gemm" => gemm(cx, args)?,
        "Conv" => conv(cx, args)?,
        "ConvTranspose" => conv_transpose(cx, args)?,
        "MaxPool" | "AveragePool" | "LpPool" => pool(cx, op, args)?,
        "LpNormalization" => {
            // x / ‖x‖ₚ along `axis` (p = 1 or 2)
            let x = f32_value(cx, args.input(0)?)?;
            let rank = cx.shape_of(x).len();
            let a = axis(args.attrs.int("axis", -1), rank, "axis")?;
            let p = args.attrs.int_in("p", 2, &[1, 2])?;
            let m = unary(cx, if p == 1 { Op::Abs } else { Op::Square }, x)?;
            let keep = Attrs::new().and(key::AXES, vec![a]).and(key::KEEPDIM, true);
            let mut norm = cx.op(Op::Sum, &[m], keep)?;
            if p == 2 {
                norm = unary(cx, Op::Sqrt, norm)?;
            }
            float(binary(cx, Op::Div, x, norm)?)?
        }
        "GlobalAveragePool" | "GlobalMaxPool" => {
            let x = f32_value(cx, args.input(0)?)?;
            let rank = cx.shape_of(x).len();
            let reduce = if op == "GlobalMaxPool" {
                Op::Max
            } else {
                Op::Mean
            };
            let axes: Vec<usize> = (2..rank).collect();
            float(cx.op(
                reduce,
                &[x],
                Attrs::new().and(key::AXES, axes).and(key::KEEPDIM, true),
            )?)?
        }
        "BatchNormalization" => batch_norm(cx, args)?,
        "LayerNormalization" | "RMSNormalization" => normalization(cx, op, args)?,
        "GroupNormalization" | "InstanceNormalization" => group_norm(cx, op, args)?,
        "Softmax" | "LogSoftmax" => {
            let x = f32_value(cx, args.input(0)?)?;
            let rank = cx.shape_of(x).len();
            let a = axis(args.attrs.int("axis", -1), rank, "axis")?;
            let sop = if op == "Softmax" {
                Op::Softmax
            } else {
                Op::LogSoftmax
            };
            float(cx.op(sop, &[x], Attrs::new().and(key::AXIS, a))?)?
        }
        "Hardmax" => {
            let x = f32_value(cx, args.input(0)?)?;
            let shape = cx.shape_of(x);
            let a = axis(args.attrs.int("axis", -1), shape.len(), "axis")?;
            let at = cx.op(
                Op::Argmax,
                &[x],
                Attrs::new().and(key::AXIS, a).and(key::KEEPDIM, true),
            )?;
            let at = cx.op(Op::Cast, &[at], Attrs::new().and(key::DTYPE, DType::F32))?;
            let index = cx.op(
                Op::Iota,
                &[],
                Attrs::new().and(key::SHAPE, shape).and(key::AXIS, a),
            )?;
            float(binary(cx, Op::Eq, index, at)?)?
        }
        "SoftmaxCrossEntropyLoss" | "NegativeLogLikelihoodLoss" => class_loss(cx, op, args)?,
        "Attention" => attention(cx, args)?,
        _ => return Ok(None),
    };
    Ok(Some(result))
}

fn gemm(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    let mut a = f32_value(cx, args.input(0)?)?;
    let mut b = f32_value(cx, args.input(1)?)?;
    for (v, attr) in [(&mut a, "transA"), (&mut b, "transB")] {
        if args.attrs.int(attr, 0) != 0 {
            *v = cx.op(
                Op::Transpose,
                &[*v],
                Attrs::new().and(key::DIM0, 0).and(key::DIM1, 1),
            )?;
        }
    }
    let mut y = binary(cx, Op::Matmul, a, b)?;
    let alpha = args.attrs.float("alpha", 1.0);
    if alpha != 1.0 {
        let s = cx.scalar(alpha)?;
        y = binary(cx, Op::Mul, y, s)?;
    }
    let beta = args.attrs.float("beta", 1.0);
    if let Some(c) = args.operand(2) {
        let mut c = f32_value(cx, c)?;
        if beta != 1.0 {
            let s = cx.scalar(beta)?;
            c = binary(cx, Op::Mul, c, s)?;
        }
        y = binary(cx, Op::Add, y, c)?;
    }
    float(y)
}

/// The window attributes of a convolution or pooling node over `spatial` axes, from a kernel of
/// `kernel` extents and an input of `input` extents: (strides, symmetric pads, dilations).
struct Window {
    stride: Vec<usize>,
    pad: Vec<usize>,
    dilation: Vec<usize>,
}

fn window(
    args: &Args,
    input: &[usize],
    kernel: &[usize],
    default_dilation: bool,
) -> Result<Window, Problem> {
    let n = kernel.len();
    let list = |name: &str, default: usize| -> Result<Vec<usize>, Problem> {
        match args.attrs.ints(name) {
            None => Ok(vec![default; n]),
            Some(v) if v.len() == n && v.iter().all(|&x| x >= 1) => {
                Ok(v.iter().map(|&x| x as usize).collect())
            }
            Some(v) => Err(Problem::invalid(format!("{name} {v:?}"))),
        }
    };
    let stride = list("strides", 1)?;
    let dilation = if default_dilation {
        vec![1; n]
    } else {
        list("dilations", 1)?
    };
    let auto_pad = args.attrs.string("auto_pad", "NOTSET");
    let pads: Vec<i64> = match auto_pad.as_str() {
        "NOTSET" => args.attrs.ints("pads").unwrap_or_else(|| vec![0; 2 * n]),
        "VALID" => {
            args.attrs.ignore("pads");
            vec![0; 2 * n]
        }
        "SAME_UPPER" | "SAME_LOWER" => {
            args.attrs.ignore("pads");
            let mut begin = Vec::new();
            let mut end = Vec::new();
            for i in 0..n {
                let out = input[i].div_ceil(stride[i]);
                let span = (kernel[i] - 1) * dilation[i] + 1;
                let total = ((out - 1) * stride[i] + span).saturating_sub(input[i]) as i64;
                let small = total / 2;
                let (b, e) = if auto_pad == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                };
                begin.push(b);
                end.push(e);
            }
            begin.into_iter().chain(end).collect()
        }
        other => return Err(Problem::unsupported(format!("auto_pad=\"{other}\""))),
    };
    if pads.len() != 2 * n {
        return Err(Problem::invalid(format!("pads {pads:?}")));
    }
    if pads[..n] != pads[n..] || pads.iter().any(|&p| p < 0) {
        return Err(Problem::unsupported(format!(
            "asymmetric pads {pads:?} (sinter pads both sides of an axis alike)"
        )));
    }
    Ok(Window {
        stride,
        pad: pads[..n].iter().map(|&p| p as usize).collect(),
        dilation,
    })
}

/// A 1-D (rank 3) convolution or pooling operand lifted to 2-D by a height axis of 1; rank 4
/// as it is.
fn lift(cx: &mut Importer, x: ValueId, what: &str) -> Result<(ValueId, bool), Problem> {
    let s = cx.shape_of(x);
    match s.len() {
        4 => Ok((x, false)),
        3 => {
            let y = cx.op(
                Op::Reshape,
                &[x],
                Attrs::new().and(key::SHAPE, vec![s[0], s[1], 1, s[2]]),
            )?;
            Ok((y, true))
        }
        r => Err(Problem::unsupported(format!(
            "{what} over {} spatial axes (sinter's are 2-D; 1-D is lifted)",
            r.saturating_sub(2)
        ))),
    }
}

/// Undoes [`lift`].
fn lower(cx: &mut Importer, y: ValueId, lifted: bool) -> Result<ValueId, Problem> {
    if !lifted {
        return Ok(y);
    }
    let s = cx.shape_of(y);
    cx.op(
        Op::Reshape,
        &[y],
        Attrs::new().and(key::SHAPE, vec![s[0], s[1], s[3]]),
    )
}

/// A 1-D window list made 2-D (height 1) when the op was lifted.
fn lifted_pair(v: &[usize], lifted: bool, fill: usize) -> Vec<usize> {
    if lifted { vec![fill, v[0]] } else { v.to_vec() }
}

fn check_kernel_shape(args: &Args, kernel: &[usize]) -> Result<(), Problem> {
    if let Some(k) = args.attrs.ints("kernel_shape")
        && k.iter().map(|&v| v as usize).collect::<Vec<_>>() != kernel
    {
        return Err(Problem::invalid(format!(
            "kernel_shape {k:?} differs from the weight's {kernel:?}"
        )));
    }
    Ok(())
}

fn conv_attrs(w: &Window, lifted: bool, groups: usize) -> Attrs {
    Attrs::new()
        .and(key::STRIDE, lifted_pair(&w.stride, lifted, 1))
        .and(key::PADDING, lifted_pair(&w.pad, lifted, 0))
        .and(key::DILATION, lifted_pair(&w.dilation, lifted, 1))
        .and(key::GROUPS, groups)
}

/// The operands and window of a convolution (`op` names it in errors).
struct ConvParts {
    x: ValueId,
    w: ValueId,
    xs: Vec<usize>,
    ws: Vec<usize>,
    win: Window,
    groups: usize,
}

fn conv_parts(cx: &mut Importer, args: &Args, op: &str) -> Result<ConvParts, Problem> {
    let x = f32_value(cx, args.input(0)?)?;
    let w = f32_value(cx, args.input(1)?)?;
    let xs = cx.shape_of(x);
    let ws = cx.shape_of(w);
    if ws.len() != xs.len() || xs.len() < 3 {
        return Err(Problem::invalid(format!(
            "{op} of {xs:?} with weight {ws:?}"
        )));
    }
    check_kernel_shape(args, &ws[2..])?;
    let win = window(args, &xs[2..], &ws[2..], false)?;
    let groups = args.attrs.int("group", 1).max(1) as usize;
    Ok(ConvParts {
        x,
        w,
        xs,
        ws,
        win,
        groups,
    })
}

fn conv(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    let ConvParts {
        x, w, win, groups, ..
    } = conv_parts(cx, args, "Conv")?;
    let (x4, lifted) = lift(cx, x, "Conv")?;
    let (w4, _) = lift(cx, w, "Conv")?;
    let mut operands = vec![x4, w4];
    if let Some(b) = args.operand(2) {
        operands.push(f32_value(cx, b)?);
    }
    let y = cx.op(Op::Conv2d, &operands, conv_attrs(&win, lifted, groups))?;
    float(lower(cx, y, lifted)?)
}

/// `ConvTranspose` is the adjoint of a convolution: sinter's `conv2d_grad_input`, with the
/// ONNX weight `[C_in, C_out/group, kH, kW]` read as the forward convolution's `[O, C/g, …]`.
fn conv_transpose(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    if args.attrs.has("output_shape") {
        return Err(Problem::unsupported(
            "ConvTranspose's output_shape attribute",
        ));
    }
    if args.attrs.string("auto_pad", "NOTSET") != "NOTSET" {
        return Err(Problem::unsupported("ConvTranspose with auto_pad"));
    }
    let ConvParts {
        x,
        w,
        xs,
        ws,
        win,
        groups,
    } = conv_parts(cx, args, "ConvTranspose")?;
    let n = ws.len() - 2;
    let extra = match args.attrs.ints("output_padding") {
        None => vec![0; n],
        Some(v) if v.len() == n => v.iter().map(|&p| p.max(0) as usize).collect(),
        Some(v) => return Err(Problem::invalid(format!("output_padding {v:?}"))),
    };
    let mut out = vec![xs[0], ws[1] * groups];
    for i in 0..n {
        let full =
            win.stride[i] * (xs[2 + i] - 1) + extra[i] + (ws[2 + i] - 1) * win.dilation[i] + 1;
        if full <= 2 * win.pad[i] || extra[i] >= win.stride[i] {
            return Err(Problem::unsupported(format!(
                "ConvTranspose output extent on spatial axis {i} (pads {:?}, output_padding {extra:?})",
                win.pad
            )));
        }
        out.push(full - 2 * win.pad[i]);
    }
    let (x4, lifted) = lift(cx, x, "ConvTranspose")?;
    let (w4, _) = lift(cx, w, "ConvTranspose")?;
    let input_shape = lifted_pair(&out[2..], lifted, 1);
    let input_shape: Vec<usize> = out[..2].iter().chain(&input_shape).copied().collect();
    let attrs = conv_attrs(&win, lifted, groups).and(key::INPUT_SHAPE, input_shape);
    let mut y = cx.op(Op::Conv2dGradInput, &[x4, w4], attrs)?;
    y = lower(cx, y, lifted)?;
    if let Some(b) = args.operand(2) {
        let b = f32_value(cx, b)?;
        let b = per_channel(cx, b, out.len())?;
        y = binary(cx, Op::Add, y, b)?;
    }
    float(y)
}

fn pool(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    let x = f32_value(cx, args.input(0)?)?;
    let xs = cx.shape_of(x);
    let kernel: Vec<usize> = args
        .attrs
        .ints("kernel_shape")
        .ok_or_else(|| Problem::invalid("kernel_shape is required"))?
        .iter()
        .map(|&k| k.max(1) as usize)
        .collect();
    if kernel.len() + 2 != xs.len() {
        return Err(Problem::invalid(format!(
            "kernel {kernel:?} for input {xs:?}"
        )));
    }
    if args
        .attrs
        .ints("dilations")
        .is_some_and(|d| d.iter().any(|&v| v != 1))
    {
        return Err(Problem::unsupported(
            "pooling with dilations (sinter's pools are dense)",
        ));
    }
    if args.wants(1) {
        return Err(Problem::unsupported("MaxPool's Indices output"));
    }
    args.attrs.ignore("storage_order");
    let win = window(args, &xs[2..], &kernel, true)?;
    let ceil = args.attrs.int("ceil_mode", 0) != 0;
    // per spatial axis, the elements ceil_mode's partial last window reads past the padding
    let mut extra = vec![0; kernel.len()];
    for i in 0..kernel.len() {
        let span = xs[2 + i] + 2 * win.pad[i];
        if span < kernel[i] {
            return Err(Problem::invalid("the window does not fit the padded input"));
        }
        if ceil {
            extra[i] = partial_window(xs[2 + i], win.pad[i], kernel[i], win.stride[i]);
        }
        let include_pad = args.attrs.int("count_include_pad", 0) != 0;
        let partial = extra[i] > 0;
        if partial && (op == "LpPool" || (include_pad && win.pad.iter().any(|&p| p > 0))) {
            return Err(Problem::unsupported(format!(
                "{op} with ceil_mode=1 where it adds a partial window{} (MaxPool and \
                 AveragePool without counted padding take it)",
                if op == "LpPool" {
                    ""
                } else {
                    " and counts the padding"
                }
            )));
        }
        if 2 * win.pad[i] > kernel[i] {
            return Err(Problem::unsupported(format!(
                "pads {:?} larger than half the kernel {kernel:?}",
                win.pad
            )));
        }
    }
    let (x4, lifted) = lift(cx, x, op)?;
    // Partial windows read the input continued past its padding: by -inf for MaxPool, which no
    // window's maximum takes (each starts inside the input or its left padding); by zeros for
    // AveragePool, whose divisor is then the in-bounds count (below).
    let extra = lifted_pair(&extra, lifted, 0);
    let partial = extra.iter().any(|&n| n > 0);
    let fill = if op == "MaxPool" {
        f64::NEG_INFINITY
    } else {
        0.0
    };
    let x4 = continued(cx, x4, &extra, fill)?;
    let attrs = Attrs::new()
        .and(key::KERNEL, lifted_pair(&kernel, lifted, 1))
        .and(key::STRIDE, lifted_pair(&win.stride, lifted, 1))
        .and(key::PADDING, lifted_pair(&win.pad, lifted, 0));
    let y = if op == "MaxPool" {
        cx.op(Op::MaxPool2d, &[x4], attrs)?
    } else if op == "LpPool" {
        // (Σ |x|ᵖ)^(1/p) over each window, padding counting 0
        let p = args.attrs.int("p", 2).max(1) as f64;
        let ax = unary(cx, Op::Abs, x4)?;
        let pc = cx.scalar(p)?;
        let powered = binary(cx, Op::Pow, ax, pc)?;
        let mean = cx.op(Op::AvgPool2d, &[powered], attrs)?;
        let count = cx.scalar(kernel.iter().product::<usize>() as f64)?;
        let sum = binary(cx, Op::Mul, mean, count)?;
        let inv = cx.scalar(1.0 / p)?;
        binary(cx, Op::Pow, sum, inv)?
    } else {
        let sum_like = cx.op(Op::AvgPool2d, &[x4], attrs.clone())?;
        let include_pad = args.attrs.int("count_include_pad", 0) != 0;
        if !partial && (include_pad || win.pad.iter().all(|&p| p == 0)) {
            sum_like
        } else {
            // Divide by the in-bounds count instead: the average of ones (zeros where the
            // input was continued) over each window.
            let ones = cx.scalar(1.0)?;
            let mut shape = cx.shape_of(x4);
            for (axis, n) in extra.iter().enumerate() {
                shape[2 + axis] -= n;
            }
            let ones = cx.op(
                Op::BroadcastTo,
                &[ones],
                Attrs::new().and(key::SHAPE, shape),
            )?;
            let ones = continued(cx, ones, &extra, 0.0)?;
            let frac = cx.op(Op::AvgPool2d, &[ones], attrs)?;
            binary(cx, Op::Div, sum_like, frac)?
        }
    };
    float(lower(cx, y, lifted)?)
}

/// `x4` (`[N, C, H, W]`) continued along H and W by `extra[0]` and `extra[1]` elements of
/// `fill`.
fn continued(
    cx: &mut Importer,
    mut x4: ValueId,
    extra: &[usize],
    fill: f64,
) -> Result<ValueId, Problem> {
    for (axis, &n) in extra.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let mut shape = cx.shape_of(x4);
        shape[2 + axis] = n;
        let value = cx.scalar(fill)?;
        let block = cx.op(
            Op::BroadcastTo,
            &[value],
            Attrs::new().and(key::SHAPE, shape),
        )?;
        x4 = cx.op(
            Op::Concat,
            &[x4, block],
            Attrs::new().and(key::AXIS, 2 + axis),
        )?;
    }
    Ok(x4)
}

/// The elements past its padding that `ceil_mode`'s last window reads along an axis of `len`
/// with padding `pad` on each side: PyTorch's and ONNX's rule, ceil((len + 2·pad − k) / s) + 1
/// windows, less the last where it would start in the right padding.
fn partial_window(len: usize, pad: usize, k: usize, s: usize) -> usize {
    let span = len + 2 * pad;
    let mut windows = (span - k).div_ceil(s) + 1;
    if (windows - 1) * s >= len + pad {
        windows -= 1;
    }
    ((windows - 1) * s + k).saturating_sub(span)
}

/// A per-channel vector `[C]` shaped `[C, 1, …]` to broadcast over `[N, C, …]` of rank `rank`.
fn per_channel(cx: &mut Importer, v: ValueId, rank: usize) -> Result<ValueId, Problem> {
    let c = cx.shape_of(v).iter().product::<usize>();
    let shape: Vec<usize> = std::iter::once(c)
        .chain(std::iter::repeat_n(1, rank.saturating_sub(2)))
        .collect();
    if cx.shape_of(v) == shape {
        return Ok(v);
    }
    cx.op(Op::Reshape, &[v], Attrs::new().and(key::SHAPE, shape))
}

fn batch_norm(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    if args.attrs.int("training_mode", 0) != 0 || args.wants(1) {
        return Err(Problem::unsupported(
            "BatchNormalization in training mode (batch statistics); export the model in \
             eval mode",
        ));
    }
    args.attrs.ignore("momentum");
    let eps = args.attrs.float("epsilon", 1e-5);
    let x = f32_value(cx, args.input(0)?)?;
    let rank = cx.shape_of(x).len();
    // Running statistics persist but are not trained.
    for i in [3, 4] {
        cx.freeze(&args.input(i)?.0);
    }
    let [scale, bias, mean, var] = [1, 2, 3, 4].map(|i| args.input(i));
    let mut vals = Vec::new();
    for o in [scale?, bias?, mean?, var?] {
        let v = f32_value(cx, o)?;
        vals.push(per_channel(cx, v, rank)?);
    }
    let (scale, bias, mean, var) = (vals[0], vals[1], vals[2], vals[3]);
    let eps = cx.scalar(eps)?;
    let ve = binary(cx, Op::Add, var, eps)?;
    let inv = unary(cx, Op::Rsqrt, ve)?;
    let k = binary(cx, Op::Mul, scale, inv)?;
    let centered = binary(cx, Op::Sub, x, mean)?;
    let y = binary(cx, Op::Mul, centered, k)?;
    float(binary(cx, Op::Add, y, bias)?)
}

/// A scale or bias operand as the vector `[n]` sinter's norms take (it may be given with
/// leading ones, or as one value), or zeros of `[n]` when absent.
fn vector(cx: &mut Importer, o: Option<&Operand>, n: usize, fill: f64) -> Result<ValueId, Problem> {
    let Some(o) = o else {
        return cx.literal(Literal::new(Elem::Float, vec![n], vec![fill; n]));
    };
    let v = f32_value(cx, o)?;
    let s = cx.shape_of(v);
    let count: usize = s.iter().product();
    if s == [n] {
        Ok(v)
    } else if count == n {
        cx.op(Op::Reshape, &[v], Attrs::new().and(key::SHAPE, vec![n]))
    } else if count == 1 {
        let r = if s.is_empty() {
            v
        } else {
            cx.op(
                Op::Reshape,
                &[v],
                Attrs::new().and(key::SHAPE, Vec::<usize>::new()),
            )?
        };
        cx.op(Op::BroadcastTo, &[r], Attrs::new().and(key::SHAPE, vec![n]))
    } else {
        Err(Problem::unsupported(format!(
            "a scale or bias of shape {s:?} for {n} normalized elements"
        )))
    }
}

/// `LayerNormalization` and `RMSNormalization` over the axes from `axis` on: sinter's
/// `layer_norm`/`rms_norm` (which normalize the last axis) on the value with those axes
/// flattened into one. LayerNormalization's optional `Mean` and `InvStdDev` outputs are
/// computed beside it.
fn normalization(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    let rms = op == "RMSNormalization";
    args.attrs.ignore("stash_type");
    let eps = args.attrs.float("epsilon", 1e-5);
    let x = f32_value(cx, args.input(0)?)?;
    let shape = cx.shape_of(x);
    let a = axis(args.attrs.int("axis", -1), shape.len(), "axis")?;
    let d: usize = shape[a..].iter().product();
    let gamma = vector(cx, args.operand(1), d, 1.0)?;
    let flat: Vec<usize> = shape[..a].iter().copied().chain([d]).collect();
    let xf = if flat == shape {
        x
    } else {
        cx.op(
            Op::Reshape,
            &[x],
            Attrs::new().and(key::SHAPE, flat.clone()),
        )?
    };
    let eps_attr = Attrs::new().and(key::EPS, eps);
    let mut y = if rms {
        cx.op(Op::RmsNorm, &[xf, gamma], eps_attr)?
    } else {
        let beta = vector(cx, args.operand(2), d, 0.0)?;
        cx.op(Op::LayerNorm, &[xf, gamma, beta], eps_attr)?
    };
    if flat != shape {
        y = cx.op(
            Op::Reshape,
            &[y],
            Attrs::new().and(key::SHAPE, shape.clone()),
        )?;
    }
    let mut out = vec![Some(Val::Dynamic {
        id: y,
        elem: Elem::Float,
    })];
    if !rms && (args.wants(1) || args.wants(2)) {
        // statistics of each row, shaped as x with the normalized axes of extent 1
        let stat_shape: Vec<usize> = shape[..a]
            .iter()
            .copied()
            .chain(std::iter::repeat_n(1, shape.len() - a))
            .collect();
        let last = flat.len() - 1;
        let keep = Attrs::new()
            .and(key::AXES, vec![last])
            .and(key::KEEPDIM, true);
        let mean = cx.op(Op::Mean, &[xf], keep.clone())?;
        let centered = binary(cx, Op::Sub, xf, mean)?;
        let sq = unary(cx, Op::Square, centered)?;
        let var = cx.op(Op::Mean, &[sq], keep)?;
        let eps = cx.scalar(eps)?;
        let ve = binary(cx, Op::Add, var, eps)?;
        let inv = unary(cx, Op::Rsqrt, ve)?;
        for v in [mean, inv] {
            let r = cx.op(
                Op::Reshape,
                &[v],
                Attrs::new().and(key::SHAPE, stat_shape.clone()),
            )?;
            out.push(Some(Val::Dynamic {
                id: r,
                elem: Elem::Float,
            }));
        }
    }
    Ok(out)
}

/// `GroupNormalization` (scale and bias per channel since opset 21, per group before) and
/// `InstanceNormalization` (one group per channel).
fn group_norm(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    args.attrs.ignore("stash_type");
    let eps = args.attrs.float("epsilon", 1e-5);
    let x = f32_value(cx, args.input(0)?)?;
    let shape = cx.shape_of(x);
    if shape.len() < 3 {
        return Err(Problem::unsupported(format!(
            "{op} of rank {}",
            shape.len()
        )));
    }
    let c = shape[1];
    let groups = if op == "InstanceNormalization" {
        c
    } else {
        args.attrs.int("num_groups", 0).max(0) as usize
    };
    if groups == 0 || !c.is_multiple_of(groups) {
        return Err(Problem::invalid(format!(
            "{groups} groups for {c} channels"
        )));
    }
    let mut params = Vec::new();
    for i in [1, 2] {
        let o = args.input(i)?;
        let v = f32_value(cx, o)?;
        let n: usize = cx.shape_of(v).iter().product();
        let v = if n == c {
            vector(cx, Some(o), c, 0.0)?
        } else if n == groups {
            // one value per group, repeated over its channels
            let g = cx.op(
                Op::Reshape,
                &[v],
                Attrs::new().and(key::SHAPE, vec![groups, 1]),
            )?;
            let g = cx.op(
                Op::BroadcastTo,
                &[g],
                Attrs::new().and(key::SHAPE, vec![groups, c / groups]),
            )?;
            cx.op(Op::Reshape, &[g], Attrs::new().and(key::SHAPE, vec![c]))?
        } else {
            return Err(Problem::invalid(format!(
                "a scale or bias of {n} values for {c} channels"
            )));
        };
        params.push(v);
    }
    float(cx.op(
        Op::GroupNorm,
        &[x, params[0], params[1]],
        Attrs::new().and(key::GROUPS, groups).and(key::EPS, eps),
    )?)
}

/// `SoftmaxCrossEntropyLoss` and `NegativeLogLikelihoodLoss`. Without class weights and
/// `ignore_index`, the softmax loss is sinter's `cross_entropy` (over `[N, C]`, with the class
/// axis of `[N, C, d…]` moved last); otherwise each element's loss is `−w[t]·logp[n, t, d…]`
/// picked by a one-hot mask of the targets (an ignored target weighs 0), reduced as ONNX does
/// (`mean` divides by the sum of the weights).
fn class_loss(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    let reduction = args.attrs.string("reduction", "mean");
    let Some(reduction) = Reduction::from_name(&reduction) else {
        return Err(Problem::unsupported(format!("reduction=\"{reduction}\"")));
    };
    let scores = f32_value(cx, args.input(0)?)?;
    let labels = args.input(1)?;
    if labels.1.elem() != Elem::Int {
        return Err(Problem::invalid("targets must be integers"));
    }
    let labels = cx.value(labels)?;
    let s = cx.shape_of(scores);
    if s.len() < 2 {
        return Err(Problem::invalid(format!("scores of shape {s:?}")));
    }
    let softmax = op == "SoftmaxCrossEntropyLoss";
    let ignore = args
        .attrs
        .has("ignore_index")
        .then(|| args.attrs.int("ignore_index", 0));
    let weights = args.operand(2);
    let native = softmax && weights.is_none() && ignore.is_none();
    let log_prob = if softmax && (args.wants(1) || !native) {
        Some(cx.op(Op::LogSoftmax, &[scores], Attrs::new().and(key::AXIS, 1))?)
    } else {
        None
    };
    let loss = if native {
        native_cross_entropy(cx, scores, labels, reduction)?
    } else {
        let logp = log_prob.unwrap_or(scores);
        let w = weights.map(|w| f32_value(cx, w)).transpose()?;
        picked_loss(cx, logp, labels, w, ignore, reduction)?
    };
    let mut out = vec![Some(Val::Dynamic {
        id: loss,
        elem: Elem::Float,
    })];
    if softmax && args.wants(1) {
        out.push(log_prob.map(|id| Val::Dynamic {
            id,
            elem: Elem::Float,
        }));
    }
    Ok(out)
}

/// sinter's `cross_entropy` on `[N, C, d…]` scores and `[N, d…]` labels.
fn native_cross_entropy(
    cx: &mut Importer,
    scores: ValueId,
    labels: ValueId,
    reduction: Reduction,
) -> Result<ValueId, Problem> {
    let s = cx.shape_of(scores);
    let (n, c) = (s[0], s[1]);
    let rest: Vec<usize> = s[2..].to_vec();
    let rows: usize = n * rest.iter().product::<usize>();
    // [N, C, d…] → [N·d…, C]; labels [N, d…] → [N·d…]
    let (logits, flat_labels) = if rest.is_empty() {
        (scores, labels)
    } else {
        let perm: Vec<usize> = std::iter::once(0)
            .chain(2..s.len())
            .chain(std::iter::once(1))
            .collect();
        let p = cx.op(Op::Permute, &[scores], Attrs::new().and(key::PERM, perm))?;
        let l = cx.op(
            Op::Reshape,
            &[p],
            Attrs::new().and(key::SHAPE, vec![rows, c]),
        )?;
        let t = cx.op(
            Op::Reshape,
            &[labels],
            Attrs::new().and(key::SHAPE, vec![rows]),
        )?;
        (l, t)
    };
    let mut loss = cx.op(
        Op::CrossEntropy,
        &[logits, flat_labels],
        Attrs::new().and(key::REDUCTION, reduction),
    )?;
    if reduction == Reduction::None && !rest.is_empty() {
        let shape: Vec<usize> = std::iter::once(n).chain(rest).collect();
        loss = cx.op(Op::Reshape, &[loss], Attrs::new().and(key::SHAPE, shape))?;
    }
    Ok(loss)
}

/// `−w[t]·logp[n, t, d…]` per element, reduced.
fn picked_loss(
    cx: &mut Importer,
    logp: ValueId,
    labels: ValueId,
    weights: Option<ValueId>,
    ignore: Option<i64>,
    reduction: Reduction,
) -> Result<ValueId, Problem> {
    let s = cx.shape_of(logp);
    let rank = s.len();
    let class = cx.op(
        Op::Iota,
        &[],
        Attrs::new().and(key::SHAPE, s.clone()).and(key::AXIS, 1),
    )?;
    let t = cx.op(
        Op::Cast,
        &[labels],
        Attrs::new().and(key::DTYPE, DType::F32),
    )?;
    let t1 = cx.op(Op::Unsqueeze, &[t], Attrs::new().and(key::AXIS, 1))?;
    let hot = binary(cx, Op::Eq, class, t1)?;
    let zero = cx.scalar(0.0)?;
    let at_class = Attrs::new().and(key::AXES, vec![1]);
    let chosen = cx.op(Op::Where, &[hot, logp, zero], Attrs::new())?;
    let picked = cx.op(Op::Sum, &[chosen], at_class.clone())?;
    let mut weight = match weights {
        Some(w) => {
            let w = per_channel(cx, w, rank)?;
            let spread = cx.op(Op::Where, &[hot, w, zero], Attrs::new())?;
            Some(cx.op(Op::Sum, &[spread], at_class)?)
        }
        None => None,
    };
    if let Some(i) = ignore {
        let i = cx.scalar(i as f64)?;
        let ignored = binary(cx, Op::Eq, t, i)?;
        let one = cx.scalar(1.0)?;
        let keep = binary(cx, Op::Sub, one, ignored)?;
        weight = Some(match weight {
            Some(w) => binary(cx, Op::Mul, w, keep)?,
            None => keep,
        });
    }
    let mut loss = unary(cx, Op::Neg, picked)?;
    if let Some(w) = weight {
        loss = binary(cx, Op::Mul, loss, w)?;
    }
    Ok(match (reduction, weight) {
        (Reduction::None, _) => loss,
        (Reduction::Sum, _) => cx.op(Op::Sum, &[loss], Attrs::new())?,
        (Reduction::Mean, None) => cx.op(Op::Mean, &[loss], Attrs::new())?,
        (Reduction::Mean, Some(w)) => {
            let total = cx.op(Op::Sum, &[loss], Attrs::new())?;
            let weight_sum = cx.op(Op::Sum, &[w], Attrs::new())?;
            binary(cx, Op::Div, total, weight_sum)?
        }
    })
}

/// `Attention` (opset 23) as sinter's `attention`: 3-D operands `[B, S, H·D]` split into heads
/// (`q_num_heads`, `kv_num_heads`), grouped-query heads repeated, a past key and value
/// prepended (and returned as the present ones), a boolean or additive mask (shorter masks are
/// padded with "excluded" as ONNX does), `is_causal` (top-left aligned in both) and `scale`.
fn attention(cx: &mut Importer, args: &Args) -> Result<Results, Problem> {
    if args.attrs.float("softcap", 0.0) != 0.0 {
        return Err(Problem::unsupported(
            "softcap (sinter's attention has no score capping)",
        ));
    }
    if args.wants(3) || args.attrs.int("qk_matmul_output_mode", 0) != 0 {
        return Err(Problem::unsupported("the qk_matmul_output output"));
    }
    if args.operand(6).is_some() {
        return Err(Problem::unsupported("nonpad_kv_seqlen"));
    }
    args.attrs.ignore("softmax_precision");
    let q = f32_value(cx, args.input(0)?)?;
    let k = f32_value(cx, args.input(1)?)?;
    let v = f32_value(cx, args.input(2)?)?;
    let three_d = cx.shape_of(q).len() == 3;
    let heads = |name: &str| args.attrs.int(name, 0).max(0) as usize;
    let (q, k, v) = if three_d {
        (
            split_heads(cx, q, heads("q_num_heads"))?,
            split_heads(cx, k, heads("kv_num_heads"))?,
            split_heads(cx, v, heads("kv_num_heads"))?,
        )
    } else {
        args.attrs.ignore("q_num_heads");
        args.attrs.ignore("kv_num_heads");
        (q, k, v)
    };
    let mut present = Vec::new();
    let mut kv = [k, v];
    for (i, slot) in kv.iter_mut().enumerate() {
        if let Some(past) = args.operand(4 + i) {
            let past = f32_value(cx, past)?;
            *slot = cx.op(Op::Concat, &[past, *slot], Attrs::new().and(key::AXIS, 2))?;
        }
        present.push(*slot);
    }
    let [k, v] = kv;
    let (qs, ks) = (cx.shape_of(q), cx.shape_of(k));
    if qs.len() != 4 || ks.len() != 4 || qs[1] % ks[1].max(1) != 0 {
        return Err(Problem::invalid(format!("query {qs:?} and key {ks:?}")));
    }
    let group = qs[1] / ks[1];
    let (k, v) = (repeat_heads(cx, k, group)?, repeat_heads(cx, v, group)?);
    let mut attrs = Attrs::new().and(key::CAUSAL, args.attrs.int("is_causal", 0) != 0);
    if args.attrs.has("scale") {
        attrs = attrs.and(key::SCALE, args.attrs.float("scale", 1.0));
    }
    let mut operands = vec![q, k, v];
    if let Some(m) = args.operand(3) {
        let boolean = m.1.elem() == Elem::Bool;
        let mut mask = if boolean {
            cx.value(m)?
        } else {
            f32_value(cx, m)?
        };
        let ms = cx.shape_of(mask);
        let total = ks[2];
        let have = ms.last().copied().unwrap_or(1);
        if have < total {
            // columns past the mask are excluded
            let fill = cx.scalar(if boolean { 0.0 } else { f64::NEG_INFINITY })?;
            let mut shape = ms.clone();
            if let Some(last) = shape.last_mut() {
                *last = total - have;
            }
            let pad = cx.op(
                Op::BroadcastTo,
                &[fill],
                Attrs::new().and(key::SHAPE, shape),
            )?;
            let last = ms.len() - 1;
            mask = cx.op(Op::Concat, &[mask, pad], Attrs::new().and(key::AXIS, last))?;
        }
        attrs = attrs.and(
            key::MASK_KIND,
            if boolean {
                sinter_ir::MaskKind::Boolean
            } else {
                sinter_ir::MaskKind::Additive
            },
        );
        operands.push(mask);
    }
    let mut y = cx.op(Op::Attention, &operands, attrs)?;
    if three_d {
        let s = cx.shape_of(y);
        y = cx.op(
            Op::Permute,
            &[y],
            Attrs::new().and(key::PERM, vec![0, 2, 1, 3]),
        )?;
        y = cx.op(
            Op::Reshape,
            &[y],
            Attrs::new().and(key::SHAPE, vec![s[0], s[2], s[1] * s[3]]),
        )?;
    }
    let mut out = vec![Some(Val::Dynamic {
        id: y,
        elem: Elem::Float,
    })];
    for id in present {
        out.push(Some(Val::Dynamic {
            id,
            elem: Elem::Float,
        }));
    }
    Ok(out)
}

/// `[B, S, H·D]` → `[B, H, S, D]`.
fn split_heads(cx: &mut Importer, x: ValueId, heads: usize) -> Result<ValueId, Problem> {
    let s = cx.shape_of(x);
    if heads == 0 || s.len() != 3 || !s[2].is_multiple_of(heads) {
        return Err(Problem::invalid(format!(
            "{heads} heads for a 3-D operand {s:?}"
        )));
    }
    let y = cx.op(
        Op::Reshape,
        &[x],
        Attrs::new().and(key::SHAPE, vec![s[0], s[1], heads, s[2] / heads]),
    )?;
    cx.op(
        Op::Permute,
        &[y],
        Attrs::new().and(key::PERM, vec![0, 2, 1, 3]),
    )
}

/// `[B, H, S, D]` tiled `group` times along the heads, as ONNX's grouped-query attention does
/// (query head `h` reads key and value head `h mod H`).
fn repeat_heads(cx: &mut Importer, x: ValueId, group: usize) -> Result<ValueId, Problem> {
    if group == 1 {
        return Ok(x);
    }
    let s = cx.shape_of(x);
    let y = cx.op(
        Op::Reshape,
        &[x],
        Attrs::new().and(key::SHAPE, vec![s[0], 1, s[1], s[2], s[3]]),
    )?;
    let y = cx.op(
        Op::BroadcastTo,
        &[y],
        Attrs::new().and(key::SHAPE, vec![s[0], group, s[1], s[2], s[3]]),
    )?;
    cx.op(
        Op::Reshape,
        &[y],
        Attrs::new().and(key::SHAPE, vec![s[0], s[1] * group, s[2], s[3]]),
    )
}

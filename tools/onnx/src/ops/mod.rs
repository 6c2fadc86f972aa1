//! Translations of ONNX ops into sinter ops, one function per op family. Every translation
//! either reproduces the ONNX op exactly (up to f32 rounding) or returns a [`Problem`] that says
//! which attribute value, dtype or operand it does not cover.

mod elementwise;
mod nn;
mod reduce;
pub mod shape;

pub use reduce::{CumsumForm, cumsum_form};

use sinter_ir::{Attrs, Op, ValueId};

use crate::attrs::NodeAttrs;
use crate::error::Problem;
use crate::import::{Importer, Val};
use crate::literal::{Elem, Literal};

/// A node's attributes, operands (`None` for an omitted optional one) and output count.
pub struct Args<'a> {
    pub attrs: &'a NodeAttrs<'a>,
    pub operands: &'a [Option<(String, Val)>],
    pub outputs: usize,
}

/// An operand: its ONNX name and value.
pub type Operand = (String, Val);

impl Args<'_> {
    /// Operand `i`, which ONNX requires.
    pub fn input(&self, i: usize) -> Result<&Operand, Problem> {
        self.operand(i)
            .ok_or_else(|| Problem::invalid(format!("required operand {i} is missing")))
    }

    /// Operand `i` if given.
    pub fn operand(&self, i: usize) -> Option<&Operand> {
        self.operands.get(i).and_then(Option::as_ref)
    }

    /// The import-time value of operand `i` (`what` names it in the error).
    pub fn literal(&self, i: usize, what: &str) -> Result<Option<&Literal>, Problem> {
        match self.operand(i) {
            None => Ok(None),
            Some((_, Val::Static(l))) => Ok(Some(l)),
            Some((name, Val::Dynamic { .. })) => {
                Err(Problem::NotStatic(format!("{what} (`{name}`)")))
            }
        }
    }

    /// Every operand given, in order.
    pub fn all(&self) -> impl Iterator<Item = &Operand> {
        self.operands.iter().flatten()
    }

    /// Whether output `i` is requested.
    pub fn wants(&self, i: usize) -> bool {
        i < self.outputs
    }
}

/// Results of a translation: one per ONNX output (`None` for outputs it does not produce).
pub type Results = Vec<Option<Val>>;

pub fn one(v: Val) -> Result<Results, Problem> {
    Ok(vec![Some(v)])
}

pub fn float(id: ValueId) -> Result<Results, Problem> {
    one(Val::Dynamic {
        id,
        elem: Elem::Float,
    })
}

/// Translates one ONNX node. Nodes whose operands are all known at import time are folded when
/// their op is one of the cheap shape and index ops ([`crate::fold`]).
pub fn translate(cx: &mut Importer, op: &str, args: &Args) -> Result<Results, Problem> {
    let constant = (args.operands.iter().flatten()).all(|(_, v)| matches!(v, Val::Static(_)));
    if constant && let Some(folded) = crate::fold::fold(op, args)? {
        return Ok(folded.into_iter().map(|l| Some(Val::Static(l))).collect());
    }
    if let Some(result) = elementwise::translate(cx, op, args)? {
        return Ok(result);
    }
    if let Some(result) = shape::translate(cx, op, args)? {
        return Ok(result);
    }
    if let Some(result) = reduce::translate(cx, op, args)? {
        return Ok(result);
    }
    if let Some(result) = nn::translate(cx, op, args)? {
        return Ok(result);
    }
    Err(Problem::UnsupportedOp {
        why: if constant && !args.operands.is_empty() {
            format!(
                "`{op}` on constant operands: the import-time folder does not evaluate it, and \
                 {}",
                unsupported_reason(op)
            )
        } else {
            unsupported_reason(op)
        },
    })
}

/// Why an op has no translation.
fn unsupported_reason(op: &str) -> String {
    let needs_op = |what: &str| format!("`{op}` needs a new sinter op ({what})");
    match op {
        "Floor" | "Ceil" | "Round" => needs_op("rounding of f32 values"),
        "Mod" | "BitShift" | "BitwiseAnd" | "BitwiseOr" | "BitwiseXor" | "BitwiseNot" => {
            needs_op("integer arithmetic at run time")
        }
        "TopK" => needs_op("sorting"),
        "Unique" | "NonZero" | "NonMaxSuppression" => {
            format!("`{op}` has a data-dependent result; sinter's shapes are static")
        }
        "ScatterND" | "ScatterElements" | "GatherND" | "GatherElements" => {
            needs_op("gather/scatter with run-time indices along any axis")
        }
        "Resize" | "Upsample" | "GridSample" => needs_op("interpolation"),
        "If" | "Loop" | "Scan" | "LSTM" | "GRU" | "RNN" => {
            format!("`{op}` is control flow; a sinter graph is straight-line")
        }
        "RandomNormal" | "RandomUniform" | "RandomNormalLike" | "RandomUniformLike"
        | "Bernoulli" | "Multinomial" => needs_op("random numbers at run time"),
        "Asin" | "Acos" | "Atan" | "Asinh" | "Acosh" | "Atanh" => needs_op("inverse trigonometry"),
        "ReduceProd" => needs_op("a product reduction"),
        "Det"
        | "Einsum"
        | "LRN"
        | "MaxUnpool"
        | "MaxRoiPool"
        | "RoiAlign"
        | "DFT"
        | "STFT"
        | "Col2Im"
        | "CenterCropPad"
        | "DeformConv"
        | "QuantizeLinear"
        | "DequantizeLinear"
        | "QLinearConv"
        | "QLinearMatMul"
        | "ConvInteger"
        | "MatMulInteger"
        | "DynamicQuantizeLinear"
        | "StringNormalizer"
        | "TfIdfVectorizer"
        | "RegexFullMatch"
        | "StringConcat"
        | "StringSplit"
        | "ImageDecoder"
        | "Optional"
        | "OptionalGetElement"
        | "OptionalHasElement"
        | "SequenceAt"
        | "SequenceConstruct"
        | "SequenceEmpty"
        | "SequenceErase"
        | "SequenceInsert"
        | "SequenceLength"
        | "SequenceMap"
        | "SplitToSequence"
        | "ConcatFromSequence"
        | "ReverseSequence"
        | "Compress"
        | "AffineGrid"
        | "BlackmanWindow"
        | "HannWindow"
        | "HammingWindow"
        | "MelWeightMatrix"
        | "Hardmax"
        | "Shrink"
        | "Binarizer"
        | "RotaryEmbedding"
        | "TensorScatter"
        | "Swish"
        | "BitCast" => {
            format!("`{op}` has no translation into sinter's op set")
        }
        _ => format!("`{op}` is not an op sinter imports"),
    }
}

/// A unary sinter op on an f32 operand.
pub fn unary(cx: &mut Importer, op: Op, x: ValueId) -> Result<ValueId, Problem> {
    cx.op(op, &[x], Attrs::new())
}

/// A binary sinter op.
pub fn binary(cx: &mut Importer, op: Op, a: ValueId, b: ValueId) -> Result<ValueId, Problem> {
    cx.op(op, &[a, b], Attrs::new())
}

/// The f32 sinter value of a float operand. An integer literal is converted; an integer value
/// computed at run time is refused, since sinter's arithmetic is f32 only.
pub fn f32_value(cx: &mut Importer, operand: &Operand) -> Result<ValueId, Problem> {
    match &operand.1 {
        Val::Static(l) if l.elem == Elem::Int => {
            let mut l = l.clone();
            l.elem = Elem::Float;
            cx.literal(l)
        }
        Val::Dynamic {
            elem: Elem::Int, ..
        } => Err(Problem::unsupported(format!(
            "integer operand `{}` computed at run time: sinter's arithmetic ops are f32 only \
             (integers are computed at import time, from shapes and constants)",
            operand.0
        ))),
        _ => cx.value(operand),
    }
}

/// Normalizes an ONNX axis (negative counts from the end) for a tensor of rank `rank`.
pub fn axis(a: i64, rank: usize, what: &str) -> Result<usize, Problem> {
    let r = rank as i64;
    if a < -r || a >= r.max(1) {
        return Err(Problem::invalid(format!(
            "{what} {a} is out of range for rank {rank}"
        )));
    }
    Ok(if a < 0 { (a + r) as usize } else { a as usize })
}

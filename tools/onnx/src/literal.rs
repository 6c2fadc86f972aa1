//! [`Literal`]: a tensor whose value is known at import time (an initializer, a `Constant`, a
//! value folded from shapes), decoded from ONNX's `TensorProto`.

use sinter_ir::interp::Tensor;
use sinter_ir::types::TensorType;

use crate::proto::TensorProto;

/// What an ONNX value is, as far as sinter's two dtypes go: floats become `f32`, integers `i32`
/// and booleans `f32` 0.0/1.0 (what sinter's comparisons produce).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Elem {
    Float,
    Int,
    Bool,
}

impl Elem {
    /// The sinter dtype a value of this class has at run time.
    pub fn dtype(self) -> sinter_ir::DType {
        match self {
            Elem::Float | Elem::Bool => sinter_ir::DType::F32,
            Elem::Int => sinter_ir::DType::I32,
        }
    }
}

/// ONNX's `TensorProto.DataType` codes that sinter reads.
pub mod dtype {
    pub const FLOAT: i32 = 1;
    pub const UINT8: i32 = 2;
    pub const INT8: i32 = 3;
    pub const UINT16: i32 = 4;
    pub const INT16: i32 = 5;
    pub const INT32: i32 = 6;
    pub const INT64: i32 = 7;
    pub const BOOL: i32 = 9;
    pub const FLOAT16: i32 = 10;
    pub const DOUBLE: i32 = 11;
    pub const UINT32: i32 = 12;
    pub const UINT64: i32 = 13;
    pub const BFLOAT16: i32 = 16;

    /// ONNX's name of a dtype code, for messages.
    pub fn name(code: i32) -> String {
        let known = [
            (FLOAT, "float"),
            (UINT8, "uint8"),
            (INT8, "int8"),
            (UINT16, "uint16"),
            (INT16, "int16"),
            (INT32, "int32"),
            (INT64, "int64"),
            (8, "string"),
            (BOOL, "bool"),
            (FLOAT16, "float16"),
            (DOUBLE, "double"),
            (UINT32, "uint32"),
            (UINT64, "uint64"),
            (14, "complex64"),
            (15, "complex128"),
            (BFLOAT16, "bfloat16"),
        ];
        known
            .iter()
            .find(|(c, _)| *c == code)
            .map_or_else(|| format!("dtype code {code}"), |(_, n)| n.to_string())
    }
}

/// The class of a value of ONNX dtype `code` that flows at run time: floats are f32 (`double`,
/// `float16` and `bfloat16` would change precision, so they are refused), integers of every
/// width are i32 (their values must fit, which feeding checks), booleans f32 0/1.
pub fn runtime_elem(code: i32) -> Result<Elem, String> {
    match literal_elem(code) {
        Ok(Elem::Float) if code != dtype::FLOAT => Err(format!(
            "dtype {} (sinter computes in f32: a float input must be float32)",
            dtype::name(code)
        )),
        other => other,
    }
}

/// The class of a constant of ONNX dtype `code`: any real number type can be read at import
/// time (a double or float16 constant is rounded to f32 when it must exist at run time).
pub(crate) fn literal_elem(code: i32) -> Result<Elem, String> {
    match code {
        dtype::FLOAT | dtype::DOUBLE | dtype::FLOAT16 | dtype::BFLOAT16 => Ok(Elem::Float),
        dtype::UINT8
        | dtype::INT8
        | dtype::UINT16
        | dtype::INT16
        | dtype::INT32
        | dtype::INT64
        | dtype::UINT32
        | dtype::UINT64 => Ok(Elem::Int),
        dtype::BOOL => Ok(Elem::Bool),
        other => Err(format!(
            "dtype {} has no sinter equivalent",
            dtype::name(other)
        )),
    }
}

/// A tensor known at import time. Every element is kept as an `f64` (integers exactly up to
/// 2⁵³, which shapes and indices never reach; larger ones, such as `INT64_MAX` used as "to the
/// end" by `Slice`, saturate when read back as `i64`).
#[derive(Clone, Debug, PartialEq)]
pub struct Literal {
    pub elem: Elem,
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Literal {
    pub fn new(elem: Elem, shape: Vec<usize>, data: Vec<f64>) -> Literal {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Literal { elem, shape, data }
    }

    pub fn scalar(elem: Elem, v: f64) -> Literal {
        Literal::new(elem, Vec::new(), vec![v])
    }

    /// A 1-D integer tensor (a shape, axes).
    pub fn ints(values: &[i64]) -> Literal {
        Literal::new(
            Elem::Int,
            vec![values.len()],
            values.iter().map(|&v| v as f64).collect(),
        )
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The elements as integers (truncated, saturating).
    pub fn as_ints(&self) -> Vec<i64> {
        self.data.iter().map(|&v| v as i64).collect()
    }

    /// The value as a sinter interpreter tensor (`f32` or `i32`), or why it cannot be one.
    pub fn to_tensor(&self) -> Result<Tensor, String> {
        if self.shape.contains(&0) {
            return Err(format!(
                "an empty tensor (shape {:?}); sinter has no empty tensors",
                self.shape
            ));
        }
        let ty = TensorType::new(self.elem.dtype(), self.shape.clone());
        let data = match self.elem {
            Elem::Float => self.data.iter().map(|&v| f64::from(v as f32)).collect(),
            Elem::Bool => self
                .data
                .iter()
                .map(|&v| if v != 0.0 { 1.0 } else { 0.0 })
                .collect(),
            Elem::Int => {
                if let Some(v) = self
                    .data
                    .iter()
                    .find(|&&v| v < f64::from(i32::MIN) || v > f64::from(i32::MAX))
                {
                    return Err(format!("the integer {v} does not fit sinter's i32"));
                }
                self.data.clone()
            }
        };
        Ok(Tensor::new(ty, data))
    }

    /// Decodes a `TensorProto` (data inline in typed fields or in `raw_data`).
    pub fn from_proto(t: &TensorProto) -> Result<Literal, String> {
        if t.data_location == Some(1) {
            return Err(
                "its data is stored in an external file, which sinter does not read; \
                        save the model with onnx.save(model, path, save_as_external_data=False)"
                    .to_string(),
            );
        }
        let code = t.data_type.unwrap_or(0);
        let elem = literal_elem(code)?;
        let shape = t
            .dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("negative dimension {d}")))
            .collect::<Result<Vec<usize>, String>>()?;
        let numel = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or("its element count overflows")?;
        let data = match &t.raw_data {
            Some(raw) if !raw.is_empty() || numel == 0 => decode_raw(code, raw)?,
            _ => typed_fields(t, code),
        };
        if data.len() != numel {
            return Err(format!(
                "shape {shape:?} holds {numel} elements but the tensor has {}",
                data.len()
            ));
        }
        Ok(Literal::new(elem, shape, data))
    }
}

fn typed_fields(t: &TensorProto, code: i32) -> Vec<f64> {
    match code {
        dtype::FLOAT => t.float_data.iter().map(|&v| f64::from(v)).collect(),
        dtype::DOUBLE => t.double_data.clone(),
        dtype::INT64 => t.int64_data.iter().map(|&v| v as f64).collect(),
        dtype::UINT32 | dtype::UINT64 => t.uint64_data.iter().map(|&v| v as f64).collect(),
        dtype::FLOAT16 => t
            .int32_data
            .iter()
            .map(|&v| half_to_f64(v as u16))
            .collect(),
        dtype::BFLOAT16 => t
            .int32_data
            .iter()
            .map(|&v| f64::from(f32::from_bits((v as u32) << 16)))
            .collect(),
        // int32, int16, int8, uint16, uint8 and bool all live in `int32_data`.
        _ => t.int32_data.iter().map(|&v| f64::from(v)).collect(),
    }
}

fn decode_raw(code: i32, raw: &[u8]) -> Result<Vec<f64>, String> {
    fn chunks<const N: usize>(raw: &[u8], f: impl Fn([u8; N]) -> f64) -> Result<Vec<f64>, String> {
        if !raw.len().is_multiple_of(N) {
            return Err(format!(
                "raw_data has {} bytes, not a multiple of the element size {N}",
                raw.len()
            ));
        }
        Ok(raw
            .chunks_exact(N)
            .map(|c| {
                let mut b = [0u8; N];
                b.copy_from_slice(c);
                f(b)
            })
            .collect())
    }
    match code {
        dtype::FLOAT => chunks(raw, |b| f64::from(f32::from_le_bytes(b))),
        dtype::DOUBLE => chunks(raw, f64::from_le_bytes),
        dtype::FLOAT16 => chunks(raw, |b| half_to_f64(u16::from_le_bytes(b))),
        dtype::BFLOAT16 => chunks(raw, |b: [u8; 2]| {
            f64::from(f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16))
        }),
        dtype::INT8 => chunks(raw, |b: [u8; 1]| f64::from(i8::from_le_bytes(b))),
        dtype::UINT8 | dtype::BOOL => chunks(raw, |b: [u8; 1]| f64::from(b[0])),
        dtype::INT16 => chunks(raw, |b| f64::from(i16::from_le_bytes(b))),
        dtype::UINT16 => chunks(raw, |b| f64::from(u16::from_le_bytes(b))),
        dtype::INT32 => chunks(raw, |b| f64::from(i32::from_le_bytes(b))),
        dtype::UINT32 => chunks(raw, |b| f64::from(u32::from_le_bytes(b))),
        dtype::INT64 => chunks(raw, |b| i64::from_le_bytes(b) as f64),
        dtype::UINT64 => chunks(raw, |b| u64::from_le_bytes(b) as f64),
        other => Err(format!(
            "dtype {} has no sinter equivalent",
            dtype::name(other)
        )),
    }
}

/// IEEE 754 binary16 to f64.
fn half_to_f64(bits: u16) -> f64 {
    let sign = if bits >> 15 == 1 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let mantissa = f64::from(bits & 0x3ff);
    sign * match exponent {
        0 => mantissa * 2f64.powi(-24),
        0x1f if mantissa == 0.0 => f64::INFINITY,
        0x1f => f64::NAN,
        e => (1.0 + mantissa / 1024.0) * 2f64.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves() {
        assert_eq!(half_to_f64(0x3c00), 1.0);
        assert_eq!(half_to_f64(0xc000), -2.0);
        assert_eq!(half_to_f64(0x0001), 2f64.powi(-24));
        assert!(half_to_f64(0x7e00).is_nan());
        assert_eq!(half_to_f64(0x7c00), f64::INFINITY);
    }

    #[test]
    fn raw_and_typed_data_agree() {
        let typed = TensorProto {
            dims: vec![2],
            data_type: Some(dtype::INT64),
            int64_data: vec![-3, 7],
            ..Default::default()
        };
        let raw = TensorProto {
            dims: vec![2],
            data_type: Some(dtype::INT64),
            raw_data: Some([(-3i64).to_le_bytes(), 7i64.to_le_bytes()].concat()),
            ..Default::default()
        };
        assert_eq!(Literal::from_proto(&typed), Literal::from_proto(&raw));
        let short = TensorProto {
            dims: vec![3],
            ..raw
        };
        assert!(Literal::from_proto(&short).unwrap_err().contains("holds 3"));
    }
}

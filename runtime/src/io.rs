//! Host tensors and their files: `.npy` for single tensors, safetensors for named sets (weights).
//!
//! sinter tensors are f32, f16 or i32 in C order. Readers also accept what numpy writes by
//! default for Python floats and ints (`<f8`, `<i8`) and narrow them with a check; everything else (big-endian
//! data, Fortran order, other dtypes, structured arrays) is rejected with a message that names the
//! file and what it found.
//!
//! **Invariant:** no reader panics or allocates more than the file's size on any input: every
//! length in a header is checked against the bytes actually present before it is used.

use std::fmt;
use std::path::{Path, PathBuf};

use sinter_artifact::{DType, TensorType};
#[cfg(feature = "interp")]
use sinter_ir::interp::Tensor;

/// Elements of a host tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    I32(Vec<i32>),
    F16(Vec<half::f16>),
}

impl TensorData {
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::I32(_) => DType::I32,
            TensorData::F16(_) => DType::F16,
        }
    }

    /// Every element as an f64 (exact for every dtype).
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            TensorData::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            TensorData::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            TensorData::F16(v) => v.iter().map(|&x| f64::from(x)).collect(),
        }
    }
}

/// A tensor in host memory, elements in C order.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl HostTensor {
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> HostTensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        HostTensor {
            shape,
            data: TensorData::F32(data),
        }
    }

    pub fn i32(shape: Vec<usize>, data: Vec<i32>) -> HostTensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        HostTensor {
            shape,
            data: TensorData::I32(data),
        }
    }

    pub fn f16(shape: Vec<usize>, data: Vec<half::f16>) -> HostTensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        HostTensor {
            shape,
            data: TensorData::F16(data),
        }
    }

    pub fn ty(&self) -> TensorType {
        TensorType::new(self.data.dtype(), self.shape.clone())
    }

    /// Converts an interpreter tensor: f64 rounds to the nearest f32 (f16); i32 values are exact
    /// in f64.
    /// (Feature `interp`, which links the IR crate for its interpreter.)
    #[cfg(feature = "interp")]
    pub fn from_interp(t: &Tensor) -> HostTensor {
        let data = match t.ty.dtype {
            DType::F32 => TensorData::F32(t.data.iter().map(|&v| v as f32).collect()),
            DType::I32 => TensorData::I32(t.data.iter().map(|&v| v as i32).collect()),
            DType::F16 => TensorData::F16(
                t.data
                    .iter()
                    .map(|&v| half::f16::from_f32(v as f32))
                    .collect(),
            ),
        };
        HostTensor {
            shape: t.ty.shape.clone(),
            data,
        }
    }

    #[cfg(feature = "interp")]
    pub fn to_interp(&self) -> Tensor {
        Tensor {
            ty: self.ty(),
            data: self.data.to_f64(),
        }
    }

    /// The elements as little-endian bytes (the arena's layout).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match &self.data {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// Reads a tensor of type `ty` from little-endian bytes; the length must match exactly.
    pub fn from_le_bytes(ty: &TensorType, bytes: &[u8]) -> Result<HostTensor, IoError> {
        let expected = ty.size_bytes();
        if bytes.len() != expected {
            return Err(IoError::ByteLength {
                ty: ty.clone(),
                expected,
                actual: bytes.len(),
            });
        }
        let words = bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
        let data = match ty.dtype {
            DType::F32 => TensorData::F32(words.map(f32::from_le_bytes).collect()),
            DType::I32 => TensorData::I32(words.map(i32::from_le_bytes).collect()),
            DType::F16 => TensorData::F16(
                bytes
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
        };
        Ok(HostTensor {
            shape: ty.shape.clone(),
            data,
        })
    }
}

/// A tensor file that could not be read or written. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a .npy file: {reason}", path.display())]
    NotNpy { path: PathBuf, reason: String },
    #[error(
        "{} is truncated or corrupt: its header describes {expected} bytes of data, but {actual} bytes follow",
        path.display()
    )]
    DataLength {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error("{}: unsupported dtype {found}; sinter reads {supported}", path.display())]
    UnsupportedDType {
        path: PathBuf,
        found: String,
        supported: &'static str,
    },
    #[error(
        "{}: data is in Fortran order; sinter reads C order (save numpy.ascontiguousarray(a))",
        path.display()
    )]
    FortranOrder { path: PathBuf },
    #[error(
        "{}: data is big-endian ('{found}'); sinter reads little-endian (save a.astype('<{}'))",
        path.display(), &found[1..]
    )]
    BigEndian { path: PathBuf, found: String },
    #[error("{}: shape {shape:?} has too many elements", path.display())]
    TooLarge { path: PathBuf, shape: Vec<u64> },
    #[error("{}: {what} {value} at flat index {index} does not fit in {target}", path.display())]
    OutOfRange {
        path: PathBuf,
        what: &'static str,
        value: String,
        index: usize,
        target: DType,
    },
    #[error("{} is not a safetensors file: {reason}", path.display())]
    NotSafetensors { path: PathBuf, reason: String },
    #[error("{}: tensor `{name}` has dtype {found}; sinter reads F32 and I32", path.display())]
    SafetensorsDType {
        path: PathBuf,
        name: String,
        found: String,
    },
    #[error("{}: cannot write tensor `{name}`: {reason}", path.display())]
    BadTensor {
        path: PathBuf,
        name: String,
        reason: String,
    },
    #[error("a {ty} tensor needs {expected} bytes, got {actual}")]
    ByteLength {
        ty: TensorType,
        expected: usize,
        actual: usize,
    },
}

// ---------------------------------------------------------------------------------------------
// .npy

const NPY_MAGIC: &[u8] = b"\x93NUMPY";
const NPY_SUPPORTED: &str = "'<f4', '<f2' and '<i4' (and '<f8', '<i8', converted)";

/// The element encodings sinter reads from `.npy`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum NpyDType {
    F4,
    I4,
    F8,
    I8,
    F2,
}

impl NpyDType {
    fn size(self) -> u64 {
        match self {
            NpyDType::F2 => 2,
            NpyDType::F4 | NpyDType::I4 => 4,
            NpyDType::F8 | NpyDType::I8 => 8,
        }
    }
}

/// Decodes the bytes of a `.npy` file holding little-endian f32/i32 (or f64/i64, narrowed) in
/// C order; `path` names the file in errors. Any bytes give a tensor or an error, never a
/// panic (fuzzed: `sinter-tests`' `fuzz` targets).
pub fn npy_from_bytes(path: &Path, bytes: &[u8]) -> Result<HostTensor, IoError> {
    let not_npy = |reason: String| IoError::NotNpy {
        path: path.to_path_buf(),
        reason,
    };
    if bytes.len() < 8 || &bytes[..6] != NPY_MAGIC {
        return Err(not_npy(
            "it does not start with the npy magic \\x93NUMPY".into(),
        ));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (header_len, header_start) = match major {
        1 if bytes.len() >= 10 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        1..=3 => return Err(not_npy("the file ends inside the header".into())),
        _ => return Err(not_npy(format!("unknown format version {major}.{minor}"))),
    };
    let header_end = header_start + header_len;
    let Some(header) = bytes.get(header_start..header_end) else {
        return Err(not_npy(format!(
            "the header claims {header_len} bytes but the file ends after {}",
            bytes.len() - header_start
        )));
    };
    let header =
        std::str::from_utf8(header).map_err(|_| not_npy("the header is not valid text".into()))?;
    let header = NpyHeader::parse(header).map_err(|e| not_npy(format!("bad header: {e}")))?;

    let dtype = match header.descr.as_str() {
        "<f4" => NpyDType::F4,
        "<i4" => NpyDType::I4,
        "<f8" => NpyDType::F8,
        "<i8" => NpyDType::I8,
        "<f2" => NpyDType::F2,
        d if d.starts_with('>') && matches!(&d[1..], "f4" | "i4" | "f8" | "i8" | "f2") => {
            return Err(IoError::BigEndian {
                path: path.to_path_buf(),
                found: d.to_string(),
            });
        }
        d => {
            return Err(IoError::UnsupportedDType {
                path: path.to_path_buf(),
                found: format!("'{d}'{}", describe_npy_dtype(d)),
                supported: NPY_SUPPORTED,
            });
        }
    };
    if header.fortran_order && header.shape.len() > 1 {
        return Err(IoError::FortranOrder {
            path: path.to_path_buf(),
        });
    }
    let too_large = || IoError::TooLarge {
        path: path.to_path_buf(),
        shape: header.shape.clone(),
    };
    let numel = header
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(too_large)?;
    let expected = numel.checked_mul(dtype.size()).ok_or_else(too_large)?;
    let data = &bytes[header_end..];
    if data.len() as u64 != expected {
        return Err(IoError::DataLength {
            path: path.to_path_buf(),
            expected,
            actual: data.len() as u64,
        });
    }
    let shape = header
        .shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| too_large()))
        .collect::<Result<Vec<usize>, IoError>>()?;

    let data = match dtype {
        NpyDType::F2 => TensorData::F16(
            data.chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        NpyDType::F4 => TensorData::F32(
            data.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        NpyDType::I4 => TensorData::I32(
            data.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        NpyDType::F8 => {
            let mut out = Vec::with_capacity(numel as usize);
            for (index, c) in data.chunks_exact(8).enumerate() {
                let v = f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                let narrowed = v as f32;
                if v.is_finite() && !narrowed.is_finite() {
                    return Err(IoError::OutOfRange {
                        path: path.to_path_buf(),
                        what: "f64 value",
                        value: v.to_string(),
                        index,
                        target: DType::F32,
                    });
                }
                out.push(narrowed);
            }
            TensorData::F32(out)
        }
        NpyDType::I8 => {
            let mut out = Vec::with_capacity(numel as usize);
            for (index, c) in data.chunks_exact(8).enumerate() {
                let v = i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                let narrowed = i32::try_from(v).map_err(|_| IoError::OutOfRange {
                    path: path.to_path_buf(),
                    what: "i64 value",
                    value: v.to_string(),
                    index,
                    target: DType::I32,
                })?;
                out.push(narrowed);
            }
            TensorData::I32(out)
        }
    };
    Ok(HostTensor { shape, data })
}

/// A readable name for common numpy dtype strings, for error messages.
fn describe_npy_dtype(descr: &str) -> &'static str {
    let kind = descr.trim_start_matches(['<', '>', '|', '=']);
    match kind {
        "f2" => " (float16)",
        "f8" => " (float64)",
        "i1" => " (int8)",
        "i2" => " (int16)",
        "u1" => " (uint8)",
        "u2" => " (uint16)",
        "u4" => " (uint32)",
        "u8" => " (uint64)",
        "b1" => " (bool)",
        "c8" | "c16" => " (complex)",
        "O" => " (Python objects)",
        _ if kind.starts_with('[') => " (structured array)",
        _ => "",
    }
}

/// Encodes `t` as a version 1.0 `.npy` file (`<f4`, `<f2` or `<i4`, C order); `path` names the
/// file in errors.
pub fn npy_to_bytes(path: &Path, t: &HostTensor) -> Result<Vec<u8>, IoError> {
    let descr = match t.data.dtype() {
        DType::F32 => "<f4",
        DType::I32 => "<i4",
        DType::F16 => "<f2",
    };
    let type_str: npyz::TypeStr = descr.parse().expect("a valid numpy type string");
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    let mut bytes = Vec::with_capacity(128 + t.ty().size_bytes());
    /// The `.npy` encoding of `v` with `type_str` and `shape` into `bytes`.
    fn encode<T: npyz::Serialize + npyz::AutoSerialize + Copy>(
        bytes: &mut Vec<u8>,
        type_str: &npyz::TypeStr,
        shape: &[u64],
        v: &[T],
    ) -> std::io::Result<()> {
        use npyz::WriterBuilder;
        let mut w = npyz::WriteOptions::<T>::new()
            .dtype(npyz::DType::Plain(type_str.clone()))
            .shape(shape)
            .writer(bytes)
            .begin_nd()?;
        w.extend(v.iter().copied())?;
        w.finish()
    }
    let write = |bytes: &mut Vec<u8>| match &t.data {
        TensorData::F32(v) => encode(bytes, &type_str, &shape, v),
        TensorData::I32(v) => encode(bytes, &type_str, &shape, v),
        TensorData::F16(v) => encode(bytes, &type_str, &shape, v),
    };
    write(&mut bytes).map_err(|source| IoError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(bytes)
}

/// The three keys of an npy header dict.
#[derive(Debug, PartialEq)]
struct NpyHeader {
    descr: String,
    fortran_order: bool,
    shape: Vec<u64>,
}

/// A Python literal as it appears in npy headers.
#[derive(Debug, PartialEq)]
enum PyValue {
    Str(String),
    Bool(bool),
    Int(u64),
    Seq(Vec<PyValue>),
    Dict(Vec<(PyValue, PyValue)>),
    None,
}

impl fmt::Display for PyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PyValue::Str(s) => write!(f, "'{s}'"),
            PyValue::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            PyValue::Int(v) => write!(f, "{v}"),
            PyValue::None => f.write_str("None"),
            PyValue::Seq(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            PyValue::Dict(_) => f.write_str("{...}"),
        }
    }
}

impl NpyHeader {
    fn parse(text: &str) -> Result<NpyHeader, String> {
        let mut p = PyParser {
            src: text.as_bytes(),
            pos: 0,
            depth: 0,
        };
        let value = p.value()?;
        p.skip_ws();
        if p.pos != p.src.len() {
            return Err(format!("unexpected text after the dict at byte {}", p.pos));
        }
        let PyValue::Dict(entries) = value else {
            return Err("the header is not a dict".into());
        };
        // NumPy's own reader keeps the last of repeated keys and refuses any other key: reading
        // such a header differently from NumPy would be worse than refusing it.
        for (i, (key, _)) in entries.iter().enumerate() {
            let PyValue::Str(name) = key else {
                return Err(format!("the header has the key {key}, not a string"));
            };
            if !["descr", "fortran_order", "shape"].contains(&name.as_str()) {
                return Err(format!(
                    "the header has the key '{name}'; NumPy headers hold exactly 'descr', \
                     'fortran_order' and 'shape'"
                ));
            }
            if entries[..i].iter().any(|(k, _)| k == key) {
                return Err(format!("the header has the key '{name}' twice"));
            }
        }
        let get = |key: &str| {
            entries
                .iter()
                .find(|(k, _)| matches!(k, PyValue::Str(s) if s == key))
                .map(|(_, v)| v)
                .ok_or_else(|| format!("the header has no '{key}'"))
        };
        let descr = match get("descr")? {
            PyValue::Str(s) => s.clone(),
            other => other.to_string(),
        };
        let fortran_order = match get("fortran_order")? {
            PyValue::Bool(b) => *b,
            other => return Err(format!("'fortran_order' is {other}, not True or False")),
        };
        let shape = match get("shape")? {
            PyValue::Seq(items) => items
                .iter()
                .map(|d| match d {
                    PyValue::Int(v) => Ok(*v),
                    other => Err(format!("'shape' has the entry {other}, not an integer")),
                })
                .collect::<Result<Vec<u64>, String>>()?,
            other => return Err(format!("'shape' is {other}, not a tuple")),
        };
        Ok(NpyHeader {
            descr,
            fortran_order,
            shape,
        })
    }
}

/// A recursive-descent parser for the Python literals of npy headers; nesting is bounded.
struct PyParser<'a> {
    src: &'a [u8],
    pos: usize,
    depth: usize,
}

const MAX_DEPTH: usize = 16;

impl PyParser<'_> {
    fn skip_ws(&mut self) {
        while self.pos < self.src.len() && self.src[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.src.get(self.pos).copied()
    }

    fn value(&mut self) -> Result<PyValue, String> {
        let at = self.pos;
        match self.peek() {
            None => Err("the header ends early".into()),
            Some(b'{') => self.nested(b'}', true),
            Some(b'(') => self.nested(b')', false),
            Some(b'[') => self.nested(b']', false),
            Some(q @ (b'\'' | b'"')) => {
                self.pos += 1;
                let start = self.pos;
                while self.pos < self.src.len() && self.src[self.pos] != q {
                    self.pos += 1;
                }
                if self.pos == self.src.len() {
                    return Err(format!("unterminated string at byte {at}"));
                }
                let s = String::from_utf8_lossy(&self.src[start..self.pos]).into_owned();
                self.pos += 1;
                Ok(PyValue::Str(s))
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.pos;
                while self.pos < self.src.len() && self.src[self.pos].is_ascii_digit() {
                    self.pos += 1;
                }
                let digits = std::str::from_utf8(&self.src[start..self.pos]).unwrap_or("");
                let v = digits
                    .parse::<u64>()
                    .map_err(|_| format!("integer {digits} is too large"))?;
                // Python 2 long suffix.
                if matches!(self.src.get(self.pos), Some(b'L' | b'l')) {
                    self.pos += 1;
                }
                Ok(PyValue::Int(v))
            }
            Some(b'-') => Err(format!("negative number at byte {at}")),
            Some(c) if c.is_ascii_alphabetic() => {
                let start = self.pos;
                while self.pos < self.src.len() && self.src[self.pos].is_ascii_alphanumeric() {
                    self.pos += 1;
                }
                match &self.src[start..self.pos] {
                    b"True" => Ok(PyValue::Bool(true)),
                    b"False" => Ok(PyValue::Bool(false)),
                    b"None" => Ok(PyValue::None),
                    word => Err(format!(
                        "unexpected word `{}` at byte {at}",
                        String::from_utf8_lossy(word)
                    )),
                }
            }
            Some(c) => Err(format!(
                "unexpected character {:?} at byte {at}",
                char::from(c)
            )),
        }
    }

    /// A dict, tuple or list: the opening bracket is next; items separated by commas, a
    /// trailing comma allowed.
    fn nested(&mut self, close: u8, dict: bool) -> Result<PyValue, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err("the header nests too deeply".into());
        }
        self.pos += 1;
        let mut items = Vec::new();
        let mut entries = Vec::new();
        loop {
            if self.peek() == Some(close) {
                self.pos += 1;
                break;
            }
            let item = self.value()?;
            if dict {
                if self.peek() != Some(b':') {
                    return Err(format!("expected `:` at byte {}", self.pos));
                }
                self.pos += 1;
                entries.push((item, self.value()?));
            } else {
                items.push(item);
            }
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(c) if c == close => {}
                _ => {
                    return Err(format!(
                        "expected `,` or `{}` at byte {}",
                        char::from(close),
                        self.pos
                    ));
                }
            }
        }
        self.depth -= 1;
        Ok(if dict {
            PyValue::Dict(entries)
        } else {
            PyValue::Seq(items)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// safetensors

/// Decodes every tensor of a safetensors file, sorted by name; `path` names the file in
/// errors. Any bytes give tensors or an error, never a panic.
pub fn safetensors_from_bytes(
    path: &Path,
    bytes: &[u8],
) -> Result<Vec<(String, HostTensor)>, IoError> {
    use safetensors::{Dtype, SafeTensors};
    let file = SafeTensors::deserialize(bytes).map_err(|e| IoError::NotSafetensors {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut out = Vec::with_capacity(file.len());
    for (name, view) in file.tensors() {
        let ty = match view.dtype() {
            Dtype::F32 => TensorType::f32(view.shape().to_vec()),
            Dtype::I32 => TensorType::i32(view.shape().to_vec()),
            Dtype::F16 => TensorType::new(DType::F16, view.shape().to_vec()),
            other => {
                return Err(IoError::SafetensorsDType {
                    path: path.to_path_buf(),
                    name,
                    found: other.to_string(),
                });
            }
        };
        // The view's length was validated against shape and dtype by `deserialize`.
        let t =
            HostTensor::from_le_bytes(&ty, view.data()).map_err(|e| IoError::NotSafetensors {
                path: path.to_path_buf(),
                reason: format!("tensor `{name}`: {e}"),
            })?;
        out.push((name, t));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Encodes named tensors as a safetensors file (F32 / F16 / I32, little-endian); `path` names
/// the file in errors.
pub fn safetensors_to_bytes(
    path: &Path,
    tensors: &[(String, HostTensor)],
) -> Result<Vec<u8>, IoError> {
    use safetensors::{Dtype, tensor::TensorView};
    let bytes: Vec<(String, Vec<u8>)> = tensors
        .iter()
        .map(|(name, t)| (name.clone(), t.to_le_bytes()))
        .collect();
    let mut views = Vec::with_capacity(tensors.len());
    for ((name, t), (_, data)) in tensors.iter().zip(&bytes) {
        let dtype = match t.data.dtype() {
            DType::F32 => Dtype::F32,
            DType::I32 => Dtype::I32,
            DType::F16 => Dtype::F16,
        };
        let view =
            TensorView::new(dtype, t.shape.clone(), data).map_err(|e| IoError::BadTensor {
                path: path.to_path_buf(),
                name: name.clone(),
                reason: e.to_string(),
            })?;
        views.push((name.as_str(), view));
    }
    let serialized = safetensors::serialize(views, None).map_err(|e| IoError::BadTensor {
        path: path.to_path_buf(),
        name: String::new(),
        reason: e.to_string(),
    })?;
    Ok(serialized)
}

#[cfg(not(target_arch = "wasm32"))]
pub use crate::native::{read_npy, read_safetensors, write_npy, write_safetensors};

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> tempfile::TempDir {
        tempfile::tempdir().expect("temp dir")
    }

    fn sample_f32() -> HostTensor {
        HostTensor::f32(
            vec![2, 3],
            vec![0.5, -1.0, 3.25, f32::MAX, f32::MIN_POSITIVE, -0.0],
        )
    }

    fn sample_i32() -> HostTensor {
        HostTensor::i32(vec![4], vec![0, -7, i32::MAX, i32::MIN])
    }

    /// An npy file with the given header dict text and data bytes (version 1.0, padded).
    fn npy_bytes(dict: &str, data: &[u8]) -> Vec<u8> {
        let mut header = dict.as_bytes().to_vec();
        while !(10 + header.len() + 1).is_multiple_of(64) {
            header.push(b' ');
        }
        header.push(b'\n');
        let mut out = NPY_MAGIC.to_vec();
        out.extend([1, 0]);
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header);
        out.extend(data);
        out
    }

    fn parse(bytes: &[u8]) -> Result<HostTensor, String> {
        npy_from_bytes(Path::new("t.npy"), bytes).map_err(|e| e.to_string())
    }

    #[test]
    fn npy_round_trips() {
        let dir = tmp();
        for t in [
            sample_f32(),
            sample_i32(),
            HostTensor::f32(vec![], vec![2.5]),
            HostTensor::i32(vec![2, 0, 3], vec![]),
        ] {
            let path = dir.path().join("t.npy");
            write_npy(&path, &t).unwrap();
            assert_eq!(read_npy(&path).unwrap(), t);
        }
    }

    #[test]
    fn npy_f8_and_i8_are_narrowed() {
        let f8 = npy_bytes(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
            &[1.5f64, -2.0, 1e-3]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        );
        assert_eq!(
            parse(&f8),
            Ok(HostTensor::f32(vec![3], vec![1.5, -2.0, 1e-3]))
        );
        let i8 = npy_bytes(
            "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 1), }",
            &[5i64, -3]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        );
        assert_eq!(parse(&i8), Ok(HostTensor::i32(vec![2, 1], vec![5, -3])));
    }

    #[test]
    fn narrowing_checks_range() {
        let big = npy_bytes(
            "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
            &[1i64, 1 << 40]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        );
        let err = parse(&big).unwrap_err();
        assert!(
            err.contains("1099511627776") && err.contains("index 1"),
            "{err}"
        );
        let huge = npy_bytes(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }",
            &1e300f64.to_le_bytes(),
        );
        assert!(parse(&huge).unwrap_err().contains("does not fit in f32"));
        // Infinities and NaN stay what they are.
        let inf = npy_bytes(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }",
            &f64::INFINITY.to_le_bytes(),
        );
        assert_eq!(
            parse(&inf),
            Ok(HostTensor::f32(vec![1], vec![f32::INFINITY]))
        );
    }

    #[test]
    fn npy_reads_files_written_by_npyz() {
        let dir = tmp();
        let path = dir.path().join("z.npy");
        npyz::to_file_1d(&path, [1.0f64, 2.0, 3.0]).unwrap();
        assert_eq!(
            read_npy(&path).unwrap(),
            HostTensor::f32(vec![3], vec![1.0, 2.0, 3.0])
        );
    }

    #[test]
    fn npy_rejections_name_the_problem() {
        let four = [0u8; 16];
        #[rustfmt::skip]
        let cases: &[(Vec<u8>, &str)] = &[
            (b"PK\x03\x04 this is a zip".to_vec(), "not a .npy file: it does not start with the npy magic"),
            (b"".to_vec(), "does not start with the npy magic"),
            (b"\x93NUMPY\x01".to_vec(), "does not start with the npy magic"),
            (b"\x93NUMPY\x01\x00\x05".to_vec(), "ends inside the header"),
            (b"\x93NUMPY\x09\x00\x00\x00".to_vec(), "unknown format version 9.0"),
            (b"\x93NUMPY\x01\x00\xff\xff{'descr'".to_vec(), "header claims 65535 bytes"),
            (b"\x93NUMPY\x02\x00\xff\xff\xff\xff{".to_vec(), "header claims 4294967295 bytes"),
            (npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", &four), "big-endian ('>f4')"),
            (npy_bytes("{'descr': '<i4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", &four), "the key 'descr' twice"),
            (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'extra': 1}", &four), "the key 'extra'"),
            (npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", &four), "Fortran order"),
            (npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", &four), "unsupported dtype '<c8' (complex)"),
            (npy_bytes("{'descr': '|u1', 'fortran_order': False, 'shape': (16,), }", &four), "unsupported dtype '|u1' (uint8)"),
            (npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", &four), "structured array"),
            (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", &four), "describes 20 bytes of data, but 16 bytes follow"),
            (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", &four), "describes 8 bytes of data, but 16 bytes follow"),
            (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296), }", &four), "too many elements"),
            (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (18446744073709551616,), }", &four), "too large"),
            (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", &four), "negative number"),
            (npy_bytes("{'descr': '<f4', 'shape': (4,), }", &four), "no 'fortran_order'"),
            (npy_bytes("{'descr': '<f4', 'fortran_order': 0, 'shape': (4,), }", &four), "not True or False"),
            (npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': 4, }", &four), "not a tuple"),
            (npy_bytes("{'descr': '<f4' 'fortran_order': False}", &four), "expected `,` or `}`"),
            (npy_bytes("{'descr: '<f4'}", &four), "bad header"),
            (npy_bytes(&"(".repeat(10_000), &four), "nests too deeply"),
            (npy_bytes("[1, 2]", &four), "not a dict"),
        ];
        for (bytes, expected) in cases {
            let err = parse(bytes).unwrap_err();
            assert!(err.contains("t.npy"), "{err}");
            assert!(err.contains(expected), "expected {expected:?} in: {err}");
        }
    }

    #[test]
    fn npy_survives_every_truncation_and_garbage() {
        let dir = tmp();
        let path = dir.path().join("t.npy");
        write_npy(&path, &sample_f32()).unwrap();
        let good = std::fs::read(&path).unwrap();
        for n in 0..good.len() {
            assert!(parse(&good[..n]).is_err(), "prefix of {n} bytes parsed");
        }
        // Flip every byte of the header in turn: never a panic.
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0xa5;
            let _ = parse(&bad);
        }
    }

    #[test]
    fn unreadable_file_names_path() {
        let err = read_npy(Path::new("/nonexistent/dir/x.npy")).unwrap_err();
        assert!(matches!(err, IoError::Read { .. }));
        assert!(err.to_string().contains("/nonexistent/dir/x.npy"), "{err}");
    }

    #[test]
    fn safetensors_round_trip() {
        let dir = tmp();
        let path = dir.path().join("w.safetensors");
        let tensors = vec![
            ("b".to_string(), sample_i32()),
            ("a.weight".to_string(), sample_f32()),
            ("s".to_string(), HostTensor::f32(vec![], vec![7.0])),
        ];
        write_safetensors(&path, &tensors).unwrap();
        let mut expected = tensors.clone();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(read_safetensors(&path).unwrap(), expected);
    }

    #[test]
    fn safetensors_rejects_other_dtypes() {
        use safetensors::{Dtype, tensor::TensorView};
        let dir = tmp();
        let path = dir.path().join("w.safetensors");
        let data = [0u8; 8];
        let view = TensorView::new(Dtype::F64, vec![1], &data).unwrap();
        std::fs::write(&path, safetensors::serialize([("w", view)], None).unwrap()).unwrap();
        let err = read_safetensors(&path).unwrap_err().to_string();
        assert!(
            err.contains("w.safetensors") && err.contains("`w`") && err.contains("F64"),
            "{err}"
        );
    }

    #[test]
    fn safetensors_survives_corruption() {
        let dir = tmp();
        let path = dir.path().join("w.safetensors");
        write_safetensors(&path, &[("a".into(), sample_f32())]).unwrap();
        let good = std::fs::read(&path).unwrap();
        let p = Path::new("w.safetensors");
        for n in 0..good.len() {
            let err = safetensors_from_bytes(p, &good[..n])
                .unwrap_err()
                .to_string();
            assert!(err.contains("not a safetensors file"), "{err}");
        }
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x5a;
            let _ = safetensors_from_bytes(p, &bad);
        }
        let err = safetensors_from_bytes(p, b"\x93NUMPY not safetensors").unwrap_err();
        assert!(err.to_string().contains("w.safetensors"), "{err}");
    }

    #[test]
    fn le_bytes_round_trip_and_check_length() {
        let t = sample_f32();
        assert_eq!(
            HostTensor::from_le_bytes(&t.ty(), &t.to_le_bytes()).unwrap(),
            t
        );
        let err = HostTensor::from_le_bytes(&t.ty(), &[0; 5]).unwrap_err();
        assert_eq!(err.to_string(), "a f32[2, 3] tensor needs 24 bytes, got 5");
    }

    #[cfg(feature = "interp")]
    #[test]
    fn interp_conversion() {
        let t = sample_i32();
        assert_eq!(HostTensor::from_interp(&t.to_interp()), t);
        let f = sample_f32();
        assert_eq!(HostTensor::from_interp(&f.to_interp()), f);
        let exact = Tensor {
            ty: TensorType::f32(vec![2]),
            data: vec![0.1, 1e40],
        };
        let h = HostTensor::from_interp(&exact);
        assert_eq!(h.data, TensorData::F32(vec![0.1f32, f32::INFINITY]));
    }
}

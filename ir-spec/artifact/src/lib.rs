//! sinter's artifact schema: what the compiler writes and the runtime reads — tensor types,
//! initializers (generated bit for bit as IR.md specifies) and the `.sart` file format. It knows
//! nothing of the IR's ops, parser or interpreter, so a runtime can depend on it alone.

pub mod artifact;
pub mod generation;
pub mod init;
pub mod types;

pub use init::Init;
pub use types::{DType, Shape, TensorType};

/// A float as the text format writes it: shortest round-trip digits, always with a `.` or an
/// exponent; `nan`, `inf`, `-inf`.
pub fn format_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let s = format!("{v:?}");
    if s.contains(['.', 'e', 'E']) {
        s
    } else {
        format!("{s}.0")
    }
}

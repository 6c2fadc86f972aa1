//! Library part of the command line: what the `sinter` and `sinter-bench` binaries and the
//! tests share.

pub mod flags;
pub mod gpt;
pub mod llama;

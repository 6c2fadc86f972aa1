//! Writing command output without `println!`'s panic when the reader goes away (`sinter inspect
//! m.sart | head`): a closed pipe ends the output quietly, any other write error is reported.
//!
//! Everything sinter prints may hold text from files (tensor names from `.npy`, safetensors and
//! artifacts, source lines in diagnostics). Characters that would not show or would drive the
//! terminal (control characters such as ESC, byte order marks, bidirectional overrides) are
//! printed as visible stand-ins (`␛`, `�`; see [`sinter_ir::diag::visible`]).

use std::io::Write as _;
use std::path::PathBuf;

use crate::error::CliError;

/// Writes `text` to stdout, invisible characters made visible.
pub fn print(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    let text = sinter_ir::diag::visible(text);
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(CliError::WriteFile {
            path: PathBuf::from("<stdout>"),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Writes `line` and a newline to stdout.
pub fn println(line: &str) -> Result<(), CliError> {
    print(&format!("{line}\n"))
}

/// Writes `line` and a newline to stderr, invisible characters made visible (a closed stderr is
/// ignored: there is nowhere left to report it).
pub fn eprintln(line: &str) {
    let text = format!("{}\n", sinter_ir::diag::visible(line));
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

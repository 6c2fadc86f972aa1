//! Writing command output to stdout without `println!`'s panic when the reader goes away
//! (`sinter inspect m.sart | head`): a closed pipe ends the output quietly, any other write error
//! is reported.

use std::io::Write as _;
use std::path::PathBuf;

use crate::error::CliError;

/// Writes `text` to stdout as is.
pub fn print(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
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

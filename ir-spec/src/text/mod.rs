//! The `.sir` text format: lexer, parser (which verifies as it builds), printer.
//!
//! [`parse`] turns text into a verified [`Graph`] or reports every independent error of the file
//! as [`Diagnostics`]; [`print()`] writes a graph back as text that parses to an equal graph.
//!
//! # Grammar
//!
//! ```text
//! file       = sep* "graph" NAME "{" (sep | stmt)* "}" sep*
//! sep        = NEWLINE | ";"
//! stmt       = decl | let | assign | output | train            (each ends at NEWLINE, ";" or "}")
//! decl       = "input" NAME ":" type
//!            | ("param" | "state") NAME ":" type "=" init
//! type       = DTYPE "[" (EXTENT ("," EXTENT)* ","?)? "]"     (f32[], f32[64, 784]; EXTENT >= 1)
//! init       = ("zeros" | "ones") ("(" ")")?
//!            | "full" "(" number ")" | "full" "(" "value" "=" number ")"
//!            | "normal" ("(" init_args ")")?                  (mean=0, std=1, seed=0)
//!            | "uniform" ("(" init_args ")")?                 (lo=0, hi=1, seed=0)
//! init_args  = NAME "=" number ("," NAME "=" number)* ","?     (mean/std/seed or lo/hi/seed)
//! let        = NAME ("," NAME)* "=" (call | number)
//! assign     = "assign" NAME "=" expr
//! output     = "output" NAME ("," NAME)*
//! train      = "train" NAME "with" NAME "(" (train_arg ("," train_arg)* ","?)? ")"
//! train_arg  = "params" "=" "[" (NAME ("," NAME)* ","?)? "]" | NAME "=" attr_value
//! expr       = call | NAME | number
//! call       = OP "(" (arg ("," arg)* ","?)? ")"               (operands before attributes)
//! arg        = expr | NAME "=" attr_value
//! number     = "-"? (INT | FLOAT | "inf")
//! attr_value = "-"? (INT | FLOAT | "inf") | STRING | "true" | "false"
//!            | "[" (attr_value ("," attr_value)* ","?)? "]"
//! ```
//!
//! Lexical rules:
//! - `NAME`, `OP`, `DTYPE` are identifiers `[A-Za-z_][A-Za-z0-9_.]*` (dots allowed after the
//!   first character, for weight names like `layer1.weight`). The keywords `graph input param
//!   state assign output true false` and the literal words `inf nan` cannot be names. `train`
//!   is a keyword only at the start of a statement and when a name follows it (`train = relu(x)`
//!   names a value `train`); `with` only right after `train LOSS`.
//! - `INT` is `[0-9]+`; `FLOAT` is `[0-9]+ ("." [0-9]+)? ([eE] [+-]? [0-9]+)?` with a fraction
//!   or an exponent. A letter right after a number is an error (`12ab`, `1.`).
//! - `STRING` is `"..."` on one line, with the escapes `\"` and `\\`.
//! - `#` starts a comment that runs to the end of the line. Spaces, tabs and `\r` separate
//!   tokens. Inside `(...)` and `[...]` newlines are insignificant, so a call may span lines.
//!
//! Meaning:
//! - Names must be defined before use, everywhere, and are defined once (values are immutable).
//! - `NAME = call` names the call's results (`N1, N2 = grad(...)` for multi-result ops: `grad`,
//!   `sgd` with a momentum buffer, `adam`, `adamw`). Nested calls and numeric literal operands
//!   make unnamed values with generated names `_N`; a generated-looking name such as `_7` may
//!   also be written explicitly. `NAME = number` defines a named scalar `constant`;
//!   `NAME = other_name` (an alias) is an error.
//! - A numeric literal operand is a scalar f32 `constant` (it broadcasts). Attribute ints must
//!   fit in an `i64`; initializer seeds are `u64`.
//! - Ops, their operands and attributes come from the op table ([`crate::op`]); every node is
//!   checked by the shape rules ([`crate::infer`]) as it is built.
//! - `assign TARGET = SOURCE` gives a param or state its value for the next run (once per
//!   target); `output` may appear several times, its names appended in order.
//! - Initializers: `std >= 0`, `lo < hi`, all finite; `full` may be `inf` or `-inf`; seeds are
//!   integers from 0 to 2^64 - 1. Init arguments are numbers (an int is read as a float).
//! - `train LOSS with OPT(attr=value, ..., clip_norm=X, params=[P1, ...])`, `OPT` one of `sgd`,
//!   `adam`, `adamw` with that op's attributes, expands (through [`crate::train::add_training`])
//!   into zero-initialized optimizer states (`P.m`, `P.v`, `train.step`, or
//!   `P.momentum_buf`), `P1.grad, ... = grad(LOSS, P1, ...)`, optional global-norm clipping
//!   (`train.grad_norm`, `train.clip_scale`, `P.grad.clipped`), the optimizer nodes
//!   (`P.next`, `P.m.next`, ...) and an `assign` for every param and state. `params` defaults
//!   to every param declared before the statement; at most one `train` per graph; its
//!   generated names must be free. The printer prints the expansion, not the statement.
//!
//! Errors: every independent error is reported, in source order. After a syntax error the
//! parser skips to the next newline outside brackets or the next `;` (or to a line that clearly
//! starts a new statement, so an unclosed `(` does not swallow the file). A statement that fails poisons
//! the names it defines; later uses of a poisoned name are not reported again.
//!
//! Printing puts statements in value-arena order, `assign`s and one `output` line last, and
//! omits attributes equal to their static default. Values that are single-use, unnamed and
//! positioned so that reparsing recreates the same arena are printed nested. Names must be
//! valid identifiers and floats must not be NaN for the printed text to parse.

mod ast;
mod initializer;
mod lexer;
mod lower;
mod parser;
mod printer;
mod suggest;
#[cfg(test)]
mod tests;

use crate::diag::Diagnostics;
use crate::graph::Graph;

/// Words that cannot be used as names.
pub(crate) const KEYWORDS: [&str; 8] = [
    "graph", "input", "param", "state", "assign", "output", "true", "false",
];

/// How deeply calls and lists may nest in one statement (bounds the parser's recursion).
pub(crate) const MAX_NESTING: usize = 64;

/// How deeply the printer nests calls in one statement; deeper chains become statements.
pub(crate) const MAX_INLINE_DEPTH: usize = 16;

/// Parses `.sir` text into a graph, verifying every node (types, shapes, attributes) as it is
/// built. On failure, returns every independent error in source order.
pub fn parse(src: &str) -> Result<Graph, Diagnostics> {
    let mut diags = Vec::new();
    let tokens = lexer::lex(src, &mut diags);
    let file = parser::parse_tokens(src, &tokens, &mut diags);
    let graph = lower::lower(&file, &mut diags);
    if diags.is_empty() {
        Ok(graph)
    } else {
        diags.sort_by_key(|d| (d.span.start, d.span.end));
        Err(Diagnostics(diags))
    }
}

/// The text of a `.sir` file read as bytes. When they are not UTF-8, the error holds the text
/// with each invalid sequence replaced by `�` (to render against) and a diagnostic at the first
/// one, with its line and column.
pub fn decode(bytes: &[u8]) -> Result<&str, (String, Diagnostics)> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(text),
        Err(e) => {
            let lossy = String::from_utf8_lossy(bytes).into_owned();
            let at = e.valid_up_to();
            let bad = e.error_len().unwrap_or(bytes.len() - at);
            let shown: Vec<String> = bytes[at..at + bad]
                .iter()
                .map(|b| format!("0x{b:02x}"))
                .collect();
            // The prefix is valid, so the replacement character sits right after it.
            let diag = crate::diag::Diagnostic::error(
                format!("the file is not UTF-8: byte {at} is {}", shown.join(" ")),
                at..at + '\u{fffd}'.len_utf8(),
            )
            .with_label("not UTF-8")
            .with_help("save the file as UTF-8; outside comments and strings .sir is ASCII");
            Err((lossy, Diagnostics(vec![diag])))
        }
    }
}

/// Prints a graph as `.sir` text; `parse(&print(g))` gives back a graph equal to `g`.
pub fn print(g: &Graph) -> String {
    printer::print(g)
}

/// A byte range of the source; `Copy`, unlike `Range<usize>`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span { start, end }
    }

    /// From the start of `self` to the end of `other`.
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start, other.end.max(self.start))
    }

    pub fn range(self) -> std::ops::Range<usize> {
        self.start..self.end
    }
}

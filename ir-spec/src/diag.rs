//! Diagnostics with source spans, rendered with codespan-reporting.
//!
//! A [`Diagnostic`] says *what* is wrong (`message`), *where* (`span`, a byte range of the source,
//! with a short `label` under the caret), and *how to fix it* (`notes`, rendered as
//! `= help: ...`). `secondary` points at related places, such as the earlier definition of a
//! redefined name. [`Diagnostics`] is the error type of [`crate::text::parse`]: every independent
//! error of a file, in source order.

use std::fmt;
use std::ops::Range;

use codespan_reporting::diagnostic::{Diagnostic as Report, Label};
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term::{self, Config};

/// One error at one place in the source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// What is wrong, in one sentence.
    pub message: String,
    /// The byte range the caret points at.
    pub span: Range<usize>,
    /// A few words under the caret (may be empty).
    pub label: String,
    /// How to fix it; each note is rendered as `= help: ...`.
    pub notes: Vec<String>,
    /// Related places, each with its own label (e.g. "first defined here").
    pub secondary: Vec<(Range<usize>, String)>,
}

impl Diagnostic {
    /// An error at `span` with a message and no label.
    pub fn error(message: impl Into<String>, span: Range<usize>) -> Diagnostic {
        Diagnostic {
            message: message.into(),
            span,
            label: String::new(),
            notes: Vec::new(),
            secondary: Vec::new(),
        }
    }

    /// Sets the label under the caret.
    pub fn with_label(mut self, label: impl Into<String>) -> Diagnostic {
        self.label = label.into();
        self
    }

    /// Adds a hint on how to fix the error.
    pub fn with_help(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    /// Adds a hint when there is one.
    pub fn with_optional_help(self, note: Option<String>) -> Diagnostic {
        match note {
            Some(note) => self.with_help(note),
            None => self,
        }
    }

    /// Points at a related place.
    pub fn with_secondary(mut self, span: Range<usize>, label: impl Into<String>) -> Diagnostic {
        self.secondary.push((span, label.into()));
        self
    }

    fn to_report(&self, src: &str) -> Report<()> {
        let mut labels =
            vec![Label::primary((), clamp(&self.span, src)).with_message(self.label.clone())];
        for (span, label) in &self.secondary {
            labels.push(Label::secondary((), clamp(span, src)).with_message(label.clone()));
        }
        Report::error()
            .with_message(self.message.clone())
            .with_labels(labels)
            .with_notes(self.notes.iter().map(|n| format!("help: {n}")).collect())
    }
}

/// Keeps a span inside the source and on character boundaries, so rendering never fails.
fn clamp(span: &Range<usize>, src: &str) -> Range<usize> {
    let fix = |mut i: usize| {
        i = i.min(src.len());
        while !src.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let start = fix(span.start);
    start..fix(span.end).max(start)
}

/// All the errors of one source file, in source order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// Renders every diagnostic like rustc does, without color:
    /// `error: msg`, `┌─ file:line:col`, the source line with a caret, then `= help: ...`.
    pub fn render(&self, file_name: &str, src: &str) -> String {
        let file = SimpleFile::new(file_name, src);
        let config = Config::default();
        let mut out = String::new();
        for d in &self.0 {
            match term::emit_into_string(&config, &file, &d.to_report(src)) {
                Ok(text) => out.push_str(&text),
                // Unreachable with clamped spans; fall back to the bare message.
                Err(_) => out.push_str(&format!("error: {}\n", d.message)),
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter()
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            f.write_str(&d.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_caret_and_help() {
        let src = "graph g {\n  y = relux(x)\n}\n";
        let d = Diagnostic::error("unknown op `relux`", 16..21)
            .with_label("not an op")
            .with_help("did you mean `relu`?");
        let text = Diagnostics(vec![d]).render("t.sir", src);
        assert!(text.starts_with("error: unknown op `relux`\n"), "{text}");
        assert!(text.contains("┌─ t.sir:2:7"), "{text}");
        assert!(text.contains("^^^^^ not an op"), "{text}");
        assert!(text.contains("= help: did you mean `relu`?"), "{text}");
    }

    #[test]
    fn out_of_range_spans_do_not_panic() {
        let d = Diagnostic::error("x", 5..100).with_secondary(200..300, "y");
        let text = Diagnostics(vec![d]).render("t.sir", "é");
        assert!(text.starts_with("error: x"));
        let empty = Diagnostics(vec![Diagnostic::error("e", 0..0)]).render("t.sir", "");
        assert!(empty.starts_with("error: e"));
    }

    #[test]
    fn display_lists_messages() {
        let d = Diagnostics(vec![
            Diagnostic::error("a", 0..0),
            Diagnostic::error("b", 0..0),
        ]);
        assert_eq!(d.to_string(), "a\nb");
    }
}

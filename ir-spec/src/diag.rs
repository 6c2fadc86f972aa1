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

/// A text with its invisible characters replaced by visible ones, and where each byte of the
/// original went.
struct Visible {
    text: String,
    /// `(original byte offset, shown byte offset)` at every replaced character and after it.
    moves: Vec<(usize, usize)>,
}

impl Visible {
    fn of(src: &str) -> Visible {
        let mut text = String::with_capacity(src.len());
        let mut moves = Vec::new();
        for (at, c) in src.char_indices() {
            match stand_in(c) {
                Some(v) => {
                    moves.push((at, text.len()));
                    text.push(v);
                    moves.push((at + c.len_utf8(), text.len()));
                }
                None => text.push(c),
            }
        }
        Visible { text, moves }
    }

    /// Where byte `at` of the original is in the shown text.
    fn offset(&self, at: usize) -> usize {
        let i = self.moves.partition_point(|&(from, _)| from <= at);
        match i.checked_sub(1).map(|i| self.moves[i]) {
            Some((from, to)) => to + (at - from),
            None => at,
        }
    }

    fn span(&self, span: &Range<usize>) -> Range<usize> {
        self.offset(span.start)..self.offset(span.end)
    }
}

/// What a character that would not show is displayed as: C0 controls as their control
/// pictures (`␀`, `␛`), delete as `␡`, other invisible characters as `�`. Newlines and tabs
/// show as themselves.
fn stand_in(c: char) -> Option<char> {
    match c {
        '\n' | '\t' => None,
        '\0'..='\u{1f}' => char::from_u32(0x2400 + c as u32),
        '\u{7f}' => Some('\u{2421}'),
        c if is_invisible(c) => Some('\u{fffd}'),
        _ => None,
    }
}

/// Control characters and the format characters that print as nothing (soft hyphen, byte
/// order mark, zero-width and bidirectional-override characters).
pub fn is_invisible(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}')
}

/// `text` with every character that would not show on a terminal replaced by a visible
/// stand-in (see [`Diagnostics::render`]); newlines and tabs are kept.
pub fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    if text.chars().any(|c| stand_in(c).is_some()) {
        std::borrow::Cow::Owned(Visible::of(text).text)
    } else {
        std::borrow::Cow::Borrowed(text)
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
    ///
    /// Characters that would not show on a terminal (control characters, a byte order mark,
    /// zero-width and bidirectional-override characters) are shown as visible stand-ins — a
    /// control picture such as `␀`, or `�` — so the caret has something to point at and the
    /// file cannot drive the terminal; the file name gets the same treatment.
    pub fn render(&self, file_name: &str, src: &str) -> String {
        let shown = Visible::of(src);
        let file_name = Visible::of(file_name).text;
        let file = SimpleFile::new(file_name.as_str(), shown.text.as_str());
        let config = Config::default();
        let mut out = String::new();
        for d in &self.0 {
            let d = Diagnostic {
                span: shown.span(&d.span),
                secondary: (d.secondary.iter())
                    .map(|(span, label)| (shown.span(span), label.clone()))
                    .collect(),
                ..d.clone()
            };
            match term::emit_into_string(&config, &file, &d.to_report(&shown.text)) {
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
    fn invisible_characters_show_and_carets_stay_aligned() {
        // A NUL in the middle of a line, an escape sequence in a name, a BOM.
        let src = "graph g {\n  y = re\0lu(x)\n  \u{1b}[2J\u{feff}z\n}\n";
        let nul = src.find('\0').unwrap();
        let d = Diagnostic::error("unexpected character U+0000 (NUL)", nul..nul + 1);
        let text = Diagnostics(vec![d]).render("t\u{1b}.sir", src);
        assert!(!text.contains('\0') && !text.contains('\u{1b}'), "{text}");
        assert!(text.contains("┌─ t␛.sir:2:9"), "{text}");
        assert!(text.contains("y = re␀lu(x)"), "{text}");
        let line = text.lines().find(|l| l.contains("re␀lu")).unwrap();
        let caret = text.lines().find(|l| l.trim_end().ends_with('^')).unwrap();
        assert_eq!(
            caret.chars().count(),
            line.chars().position(|c| c == '␀').unwrap() + 1,
            "{text}"
        );
        let bom = src.find('\u{feff}').unwrap();
        let d = Diagnostic::error("bom", bom..bom + 3);
        let text = Diagnostics(vec![d]).render("t.sir", src);
        assert!(text.contains("␛[2J�z"), "{text}");
        assert_eq!(visible("a\tb\nc\u{7}"), "a\tb\nc␇");
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

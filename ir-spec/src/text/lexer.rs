//! The lexer: source text to tokens. Errors become [`TokenKind::Error`] tokens plus a
//! diagnostic, so the parser can skip the statement without reporting it again.

use super::Span;
use crate::diag::{Diagnostic, is_invisible};

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum TokenKind {
    /// A name or keyword; its text is the span's text.
    Ident,
    /// Decimal digits; converted by context (extent, int attribute, seed, float).
    Int,
    /// A number with a fraction or an exponent, already read.
    Float(f64),
    /// A string literal, escapes decoded.
    Str(String),
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    Comma,
    Equals,
    Colon,
    Semi,
    Minus,
    Newline,
    /// Something that did not lex; already reported.
    Error,
    Eof,
}

#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub kind: TokenKind,
    pub span: Span,
}

impl TokenKind {
    /// How the token is named in "expected X, found Y" messages.
    pub fn describe(&self) -> &'static str {
        match self {
            TokenKind::Ident => "a name",
            TokenKind::Int | TokenKind::Float(_) => "a number",
            TokenKind::Str(_) => "a string",
            TokenKind::LParen => "`(`",
            TokenKind::RParen => "`)`",
            TokenKind::LBracket => "`[`",
            TokenKind::RBracket => "`]`",
            TokenKind::LBrace => "`{`",
            TokenKind::RBrace => "`}`",
            TokenKind::Comma => "`,`",
            TokenKind::Equals => "`=`",
            TokenKind::Colon => "`:`",
            TokenKind::Semi => "`;`",
            TokenKind::Minus => "`-`",
            TokenKind::Newline => "the end of the line",
            TokenKind::Error => "an invalid token",
            TokenKind::Eof => "the end of the file",
        }
    }

    pub fn is_open(&self) -> bool {
        matches!(
            self,
            TokenKind::LParen | TokenKind::LBracket | TokenKind::LBrace
        )
    }

    pub fn is_close(&self) -> bool {
        matches!(
            self,
            TokenKind::RParen | TokenKind::RBracket | TokenKind::RBrace
        )
    }
}

/// Whether `c` may start an identifier.
pub(crate) fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

/// Whether `c` may continue an identifier (dots allow `layer1.weight`).
pub(crate) fn is_ident_continue(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

/// Splits `src` into tokens, always ending with [`TokenKind::Eof`].
pub(crate) fn lex(src: &str, diags: &mut Vec<Diagnostic>) -> Vec<Token> {
    let mut lexer = Lexer {
        src,
        pos: 0,
        tokens: Vec::new(),
        diags,
    };
    lexer.run();
    lexer.tokens
}

struct Lexer<'s, 'd> {
    src: &'s str,
    pos: usize,
    tokens: Vec<Token>,
    diags: &'d mut Vec<Diagnostic>,
}

impl Lexer<'_, '_> {
    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn peek_second(&self) -> Option<char> {
        let mut chars = self.src[self.pos..].chars();
        chars.next();
        chars.next()
    }

    fn bump_while(&mut self, pred: impl Fn(char) -> bool) {
        while let Some(c) = self.peek() {
            if !pred(c) {
                break;
            }
            self.pos += c.len_utf8();
        }
    }

    fn push(&mut self, kind: TokenKind, start: usize) {
        self.tokens.push(Token {
            kind,
            span: Span::new(start, self.pos),
        });
    }

    fn error(&mut self, start: usize, diag: Diagnostic) {
        self.diags.push(diag);
        self.push(TokenKind::Error, start);
    }

    fn run(&mut self) {
        // A byte order mark that some editors put first is not part of the text.
        if self.src.starts_with('\u{feff}') {
            self.pos = '\u{feff}'.len_utf8();
        }
        while let Some(c) = self.peek() {
            let start = self.pos;
            match c {
                '\n' => {
                    self.pos += 1;
                    self.push(TokenKind::Newline, start);
                }
                ' ' | '\t' | '\r' => self.pos += 1,
                '#' => self.bump_while(|c| c != '\n'),
                '"' => self.string(),
                c if c.is_ascii_digit() => self.number(),
                c if is_ident_start(c) => {
                    self.bump_while(is_ident_continue);
                    self.push(TokenKind::Ident, start);
                }
                _ => match punctuation(c) {
                    Some(kind) => {
                        self.pos += 1;
                        self.push(kind, start);
                    }
                    None => self.unexpected_chars(),
                },
            }
        }
        let end = self.src.len();
        self.tokens.push(Token {
            kind: TokenKind::Eof,
            span: Span::new(end, end),
        });
    }

    /// A run of characters that start no token, reported once.
    fn unexpected_chars(&mut self) {
        let start = self.pos;
        if let Some(c) = self.peek() {
            self.pos += c.len_utf8();
        }
        self.bump_while(|c| !starts_token(c));
        let text = &self.src[start..self.pos];
        let shown: Vec<String> = text.chars().map(describe_char).collect();
        let mut diag = Diagnostic::error(
            format!(
                "unexpected character{} {}",
                plural(text.chars().count()),
                shown.join(" ")
            ),
            start..self.pos,
        )
        .with_label("not part of the .sir syntax");
        if text.chars().any(is_invisible) {
            diag = diag.with_help(
                "the file holds characters that do not show: control characters, byte order \
                 marks or zero-width spaces; remove them",
            );
        } else if !text.is_ascii() {
            diag = diag.with_help("names are ASCII: letters, digits, `_` and `.`");
        }
        self.error(start, diag);
    }

    /// `123`, `1.5`, `2e-3`, `1.5E+10`. A letter right after the number is an error.
    fn number(&mut self) {
        let start = self.pos;
        self.bump_while(|c| c.is_ascii_digit());
        let mut is_float = false;
        if self.peek() == Some('.') && self.peek_second().is_some_and(|c| c.is_ascii_digit()) {
            is_float = true;
            self.pos += 1;
            self.bump_while(|c| c.is_ascii_digit());
        }
        if matches!(self.peek(), Some('e' | 'E')) {
            let after_e = self.src[self.pos + 1..].trim_start_matches(['+', '-']);
            let sign_len = self.src.len() - self.pos - 1 - after_e.len();
            if sign_len <= 1 && after_e.starts_with(|c: char| c.is_ascii_digit()) {
                is_float = true;
                self.pos += 1 + sign_len;
                self.bump_while(|c| c.is_ascii_digit());
            }
        }
        if self.peek().is_some_and(is_ident_continue) {
            self.bump_while(is_ident_continue);
            let text = &self.src[start..self.pos];
            let diag = Diagnostic::error(format!("malformed number `{text}`"), start..self.pos)
                .with_label("not a number")
                .with_help(
                    "numbers look like `3`, `0.5`, `1e-5` or `2.5E+3`; \
                     names cannot start with a digit",
                );
            self.error(start, diag);
            return;
        }
        if !is_float {
            self.push(TokenKind::Int, start);
            return;
        }
        let text = &self.src[start..self.pos];
        match text.parse::<f64>() {
            Ok(v) if v.is_finite() => self.push(TokenKind::Float(v), start),
            _ => {
                let diag = Diagnostic::error(
                    format!("float literal `{text}` is out of range"),
                    start..self.pos,
                )
                .with_label("does not fit in an f64")
                .with_help("write `inf` for infinity");
                self.error(start, diag);
            }
        }
    }

    /// `"..."` with `\"` and `\\` escapes, on one line.
    fn string(&mut self) {
        let start = self.pos;
        self.pos += 1;
        let mut value = String::new();
        let mut bad_escape = None;
        loop {
            match self.peek() {
                None | Some('\n') => {
                    let diag = Diagnostic::error("unterminated string", start..self.pos)
                        .with_label("this string has no closing `\"`")
                        .with_help("strings end on the line they start on");
                    self.error(start, diag);
                    return;
                }
                Some('"') => {
                    self.pos += 1;
                    break;
                }
                Some('\\') => {
                    let escape_start = self.pos;
                    self.pos += 1;
                    match self.peek() {
                        Some(c @ ('"' | '\\')) => {
                            value.push(c);
                            self.pos += 1;
                        }
                        Some('\n') | None => {}
                        Some(c) => {
                            self.pos += c.len_utf8();
                            bad_escape.get_or_insert(escape_start..self.pos);
                        }
                    }
                }
                Some(c) => {
                    value.push(c);
                    self.pos += c.len_utf8();
                }
            }
        }
        match bad_escape {
            Some(span) => {
                let text = &self.src[span.clone()];
                let diag = Diagnostic::error(format!("unknown escape `{text}` in string"), span)
                    .with_label("not an escape")
                    .with_help("the escapes are `\\\"` and `\\\\`");
                self.error(start, diag);
            }
            None => self.push(TokenKind::Str(value), start),
        }
    }
}

/// Whether `c` begins a token or is skipped whitespace (everything else is an error).
fn starts_token(c: char) -> bool {
    matches!(c, '\n' | ' ' | '\t' | '\r' | '#' | '"')
        || c.is_ascii_digit()
        || is_ident_start(c)
        || punctuation(c).is_some()
}

fn punctuation(c: char) -> Option<TokenKind> {
    Some(match c {
        '(' => TokenKind::LParen,
        ')' => TokenKind::RParen,
        '[' => TokenKind::LBracket,
        ']' => TokenKind::RBracket,
        '{' => TokenKind::LBrace,
        '}' => TokenKind::RBrace,
        ',' => TokenKind::Comma,
        '=' => TokenKind::Equals,
        ':' => TokenKind::Colon,
        ';' => TokenKind::Semi,
        '-' => TokenKind::Minus,
        _ => return None,
    })
}

/// A character as a message shows it: `` `c` ``, or its code point (and name) when it would not
/// show on a terminal.
pub(crate) fn describe_char(c: char) -> String {
    if !is_invisible(c) {
        return format!("`{c}`");
    }
    let name = match c {
        '\0' => " (NUL)",
        '\u{feff}' => " (byte order mark)",
        '\u{1b}' => " (escape)",
        '\u{7f}' => " (delete)",
        '\u{200b}' => " (zero-width space)",
        _ => "",
    };
    format!("U+{:04X}{name}", c as u32)
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

//! Text to token ids and back for `sinter generate`: a vocabulary file (one JSON string per line,
//! line `i` the text of token `i`, as `ir-spec/examples/data/text/vocab.txt`), or raw bytes
//! (token `b` is the byte `b`).
//!
//! A prompt is split greedily: at each point the longest token whose text starts there. For a
//! character vocabulary that is one token per character; for a vocabulary of longer pieces it
//! is a plain longest-match tokenizer (not the merges of the tokenizer a model was trained
//! with, which a vocabulary list does not carry).

use std::collections::HashMap;
use std::path::Path;

use crate::error::CliError;

/// How token ids become text.
pub enum Vocabulary {
    /// Token `b` is the byte `b` (256 tokens).
    Bytes,
    /// Token `i` is `pieces[i]`.
    Pieces {
        pieces: Vec<String>,
        ids: HashMap<String, i32>,
        /// The longest piece, in characters.
        longest: usize,
    },
}

impl Vocabulary {
    /// Reads a vocabulary file: every line one JSON string, none repeated.
    pub fn read(path: &Path) -> Result<Vocabulary, CliError> {
        let bytes = std::fs::read(path).map_err(|source| CliError::ReadSource {
            path: path.to_path_buf(),
            source,
        })?;
        let bad =
            |line: usize, why: String| CliError::Arg(format!("{}:{line}: {why}", path.display()));
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            let line = bytes[..e.valid_up_to()]
                .iter()
                .filter(|&&b| b == b'\n')
                .count()
                + 1;
            bad(line, "not UTF-8".into())
        })?;
        let mut pieces = Vec::new();
        let mut ids = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let piece: String = serde_json::from_str(line).map_err(|e| {
                bad(
                    i + 1,
                    format!("expected a JSON string (the text of token {i}), got `{line}`: {e}"),
                )
            })?;
            if piece.is_empty() {
                return Err(bad(i + 1, format!("token {i} is the empty string")));
            }
            if let Some(first) = ids.insert(piece.clone(), i as i32) {
                return Err(bad(
                    i + 1,
                    format!("token {i} repeats the text of token {first}"),
                ));
            }
            pieces.push(piece);
        }
        if pieces.is_empty() {
            return Err(bad(1, "the vocabulary is empty".into()));
        }
        let longest = pieces.iter().map(|p| p.chars().count()).max().unwrap_or(1);
        Ok(Vocabulary::Pieces {
            pieces,
            ids,
            longest,
        })
    }

    /// Tokens in the vocabulary.
    pub fn len(&self) -> usize {
        match self {
            Vocabulary::Bytes => 256,
            Vocabulary::Pieces { pieces, .. } => pieces.len(),
        }
    }

    /// The prompt's token ids; a piece of it that no token covers is an error naming it.
    pub fn encode(&self, text: &str) -> Result<Vec<i32>, CliError> {
        match self {
            Vocabulary::Bytes => Ok(text.bytes().map(i32::from).collect()),
            Vocabulary::Pieces { ids, longest, .. } => {
                let starts: Vec<usize> = text
                    .char_indices()
                    .map(|(i, _)| i)
                    .chain([text.len()])
                    .collect();
                let mut out = Vec::new();
                let mut at = 0; // index into `starts`
                while at + 1 < starts.len() {
                    let found = (1..=(*longest).min(starts.len() - 1 - at))
                        .rev()
                        .find_map(|n| {
                            ids.get(&text[starts[at]..starts[at + n]])
                                .map(|&id| (id, n))
                        });
                    let Some((id, n)) = found else {
                        let c = text[starts[at]..].chars().next().expect("inside the text");
                        return Err(CliError::Arg(format!(
                            "the prompt's character {c:?} (at character {at}) is in no token of \
                             the vocabulary"
                        )));
                    };
                    out.push(id);
                    at += n;
                }
                Ok(out)
            }
        }
    }

    /// A decoder that turns tokens into text as they come.
    pub fn decoder(&self) -> TextStream<'_> {
        TextStream {
            vocab: self,
            pending: Vec::new(),
        }
    }
}

/// Text of tokens as they come: with raw bytes, a character split over several tokens is
/// written once it is whole (bytes that cannot start or continue one become `�`).
pub struct TextStream<'a> {
    vocab: &'a Vocabulary,
    pending: Vec<u8>,
}

impl TextStream<'_> {
    /// The text that `token` completes (token ids are below the vocabulary's length).
    pub fn push(&mut self, token: i32) -> String {
        match self.vocab {
            Vocabulary::Pieces { pieces, .. } => pieces[token as usize].clone(),
            Vocabulary::Bytes => {
                self.pending.push(token as u8);
                let mut out = String::new();
                loop {
                    match std::str::from_utf8(&self.pending) {
                        Ok(s) => {
                            out.push_str(s);
                            self.pending.clear();
                            return out;
                        }
                        Err(e) => {
                            let valid = e.valid_up_to();
                            out.push_str(
                                std::str::from_utf8(&self.pending[..valid]).expect("valid prefix"),
                            );
                            match e.error_len() {
                                // an incomplete character at the end: wait for its next bytes
                                None => {
                                    self.pending.drain(..valid);
                                    return out;
                                }
                                Some(n) => {
                                    out.push('\u{fffd}');
                                    self.pending.drain(..valid + n);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// What is left at the end (an incomplete character as `�`).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(list: &[&str]) -> Vocabulary {
        let pieces: Vec<String> = list.iter().map(|s| s.to_string()).collect();
        let ids = (pieces.iter().enumerate())
            .map(|(i, p)| (p.clone(), i as i32))
            .collect();
        let longest = pieces.iter().map(|p| p.chars().count()).max().unwrap();
        Vocabulary::Pieces {
            pieces,
            ids,
            longest,
        }
    }

    #[test]
    fn longest_pieces_first() {
        let v = pieces(&["a", "b", "ab", "abc", "é"]);
        assert_eq!(v.encode("abcabé").unwrap(), vec![3, 2, 4]);
        assert_eq!(v.encode("ba").unwrap(), vec![1, 0]);
        let e = v.encode("abx").unwrap_err().to_string();
        assert!(e.contains("'x'") && e.contains("character 2"), "{e}");
    }

    #[test]
    fn bytes_stream_whole_characters() {
        let v = Vocabulary::Bytes;
        let ids = v.encode("hé!").unwrap();
        assert_eq!(ids, vec![104, 0xc3, 0xa9, 33]);
        let mut s = v.decoder();
        let text: Vec<String> = ids.iter().map(|&t| s.push(t)).collect();
        assert_eq!(text, vec!["h", "", "é", "!"]);
        // a stray continuation byte, then a character cut short at the end
        let mut s = v.decoder();
        assert_eq!(s.push(0xa9), "\u{fffd}");
        assert_eq!(s.push(0xc3), "");
        assert_eq!(s.finish(), "\u{fffd}");
    }
}

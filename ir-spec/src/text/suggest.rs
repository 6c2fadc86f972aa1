//! "Did you mean" suggestions by edit distance.

/// The candidate closest to `word`, when it is close enough to be a likely typo, as a hint.
pub(crate) fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    closest(word, candidates).map(|c| format!("did you mean `{c}`?"))
}

/// The candidate with the smallest edit distance to `word` (ties: the first), if that distance
/// is at most a third of the word's length (and at least 1 edit is always allowed).
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1);
    let mut best: Option<(usize, &str)> = None;
    for candidate in candidates {
        if candidate == word {
            continue;
        }
        let d = edit_distance(word, candidate);
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, candidate));
        }
    }
    best.map(|(_, c)| c)
}

/// Levenshtein distance with adjacent transpositions counted as one edit, over chars.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows: the one before last (for transpositions), the last, and the current.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut last: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut current = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            current[j] = (last[j] + 1)
                .min(current[j - 1] + 1)
                .min(last[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                current[j] = current[j].min(before[j - 2] + 1);
            }
        }
        before = std::mem::replace(&mut last, current);
    }
    last[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("relu", "relu"), 0);
        assert_eq!(edit_distance("relux", "relu"), 1);
        assert_eq!(edit_distance("mtamul", "matmul"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn suggestions() {
        let ops = ["relu", "matmul", "softmax", "sum"];
        assert_eq!(closest("rleu", ops), Some("relu"));
        assert_eq!(closest("softmx", ops), Some("softmax"));
        assert_eq!(closest("conv", ops), None);
        assert_eq!(closest("x", ["y", "xx"]), Some("y"));
    }
}

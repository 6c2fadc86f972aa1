"""Builds the character-level language-modelling data for `sinter train` from `text.txt`.

Writes, next to this script:
    vocab.txt    the vocabulary: every distinct character of the text, sorted by code point,
                 one per line as a JSON string ("\\n" for the newline); line i is token id i
    ids.npy      i32 [S, T]  ids[s] = the tokens of text[s : s + T]
    targets.npy  i32 [S, T]  targets[s] = the tokens of text[s + 1 : s + T + 1] (next characters)

with T = 16 (the context of `transformer_train.sir`) and one window starting at every character
that leaves room for its targets: S = len(text) - T. Needs numpy only.

    python3 ir-spec/examples/data/text/make.py
"""

import json
import os

import numpy as np

T = 16


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "text.txt"), encoding="utf-8") as f:
        text = f.read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    tokens = np.array([index[c] for c in text], dtype="<i4")
    s = len(tokens) - T
    starts = np.arange(s)[:, None] + np.arange(T)[None, :]
    ids = tokens[starts]
    targets = tokens[starts + 1]
    np.save(os.path.join(here, "ids.npy"), ids)
    np.save(os.path.join(here, "targets.npy"), targets)
    with open(os.path.join(here, "vocab.txt"), "w", encoding="utf-8") as f:
        for c in vocab:
            f.write(json.dumps(c) + "\n")
    print(f"{len(text)} characters, vocabulary {len(vocab)}, ids/targets i32{list(ids.shape)}")


if __name__ == "__main__":
    main()

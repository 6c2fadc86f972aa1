"""Writes the inputs of the browser tests (committed; rerun after changing this file).

batch32/: the first 32 images and labels of the digits training split (the shapes of mlp.sir and
digits_mlp.sir); cnn/: 8 random 12x12 images and labels for cnn.sir (seed 7); decode/: 2 random
sequences of 12 tokens below 24 for ir-spec/tests/decode/llama_tiny.sir (seed 8).
"""
import os

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
digits = os.path.join(here, "..", "..", "..", "..", "ir-spec", "examples", "data", "digits", "train")


def save(folder, x, labels):
    os.makedirs(os.path.join(here, folder), exist_ok=True)
    np.save(os.path.join(here, folder, "x.npy"), np.ascontiguousarray(x, dtype="<f4"))
    np.save(os.path.join(here, folder, "labels.npy"), np.ascontiguousarray(labels, dtype="<i4"))


save("batch32", np.load(os.path.join(digits, "x.npy"))[:32], np.load(os.path.join(digits, "labels.npy"))[:32])
rng = np.random.default_rng(7)
save("cnn", rng.uniform(0.0, 1.0, (8, 1, 12, 12)), rng.integers(0, 10, 8))
ids = np.random.default_rng(8).integers(0, 24, (2, 12))
os.makedirs(os.path.join(here, "decode"), exist_ok=True)
np.save(os.path.join(here, "decode", "ids.npy"), np.ascontiguousarray(ids, dtype="<i4"))

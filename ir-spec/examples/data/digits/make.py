"""Builds the digits data set for `sinter train` from the copy scikit-learn ships.

Source: `sklearn/datasets/data/digits.csv.gz` of an installed scikit-learn (`pip install
scikit-learn`); nothing is downloaded. Each of its 1797 rows holds the 64 pixels of one 8x8
image (integers 0..16, row-major) and then the digit (0..9).

Writes, next to this script:
    train/x.npy       f32 [1497, 64]  pixels / 16, so in [0, 1]
    train/labels.npy  i32 [1497]      digit of each image
    test/x.npy        f32 [300, 64]
    test/labels.npy   i32 [300]

The split is fixed: the rows are shuffled by a Fisher-Yates shuffle driven by SplitMix64 with
seed 0 (written out below, so it does not depend on numpy's generators), the first 1497 of the
shuffled order are the training split and the last 300 the test split. Each split keeps the
original row order. Run it again and the files come out byte for byte the same.

    python3 ir-spec/examples/data/digits/make.py
"""

import gzip
import os

import numpy as np
import sklearn

N_TEST = 300
SEED = 0
MASK = (1 << 64) - 1


def splitmix64(state):
    """Yields 64-bit outputs of SplitMix64 (Steele, Lea, Flood 2014) from `state`."""
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        yield z ^ (z >> 31)


def permutation(n, seed):
    """A Fisher-Yates shuffle of 0..n-1 (j = r mod (i + 1); the bias is below 1e-15)."""
    order = list(range(n))
    rng = splitmix64(seed)
    for i in range(n - 1, 0, -1):
        j = next(rng) % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    source = os.path.join(os.path.dirname(sklearn.__file__), "datasets", "data", "digits.csv.gz")
    with gzip.open(source, "rt") as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.int64)
    assert rows.shape == (1797, 65), rows.shape
    pixels, labels = rows[:, :64], rows[:, 64]
    assert pixels.min() >= 0 and pixels.max() <= 16 and set(labels) == set(range(10))

    order = permutation(len(rows), SEED)
    test = sorted(order[-N_TEST:])
    train = sorted(order[:-N_TEST])
    for name, idx in [("train", train), ("test", test)]:
        out = os.path.join(here, name)
        os.makedirs(out, exist_ok=True)
        x = (pixels[idx] / 16.0).astype("<f4")
        y = labels[idx].astype("<i4")
        np.save(os.path.join(out, "x.npy"), x)
        np.save(os.path.join(out, "labels.npy"), y)
        counts = np.bincount(y, minlength=10).tolist()
        print(f"{name}: x {x.dtype}{list(x.shape)}, labels {y.dtype}{list(y.shape)}, per digit {counts}")


if __name__ == "__main__":
    main()

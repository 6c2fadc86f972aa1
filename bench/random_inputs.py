"""Write random .npy inputs for every input of a compiled artifact.

usage: sinter inspect MODEL.sart --json | python3 bench/random_inputs.py OUT_DIR [INT_BOUND]

f32 inputs get values in +-[0.25, 1] (never zero); i32 inputs get values in [0, INT_BOUND)
(default 10, below every class count and vocabulary of the bundled examples). Prints the
`--input NAME=FILE` arguments for `sinter run`.
"""
import json
import os
import sys

import numpy as np

out = sys.argv[1]
bound = int(sys.argv[2]) if len(sys.argv) > 2 else 10
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(1)
args = []
for t in json.load(sys.stdin)["tensors"]:
    if t["role"] != "input":
        continue
    shape = t["shape"]
    if t["dtype"] == "f32":
        v = rng.uniform(0.25, 1.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
        v = v.astype("<f4")
    else:
        v = rng.integers(0, bound, size=shape).astype("<i4")
    path = os.path.join(out, t["name"] + ".npy")
    np.save(path, v)
    args.append(f"--input {t['name']}={path}")
print(" ".join(args))

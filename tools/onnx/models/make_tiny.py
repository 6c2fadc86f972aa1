"""Writes the small hand-built ONNX models the CLI tests import (no PyTorch needed):

- tiny_mlp.onnx: Flatten-by-Reshape through a Shape -> Gather -> Unsqueeze -> Concat chain (folded
  at import time), Gemm (transB), Relu, MatMul, Add, Softmax; dynamic batch dimension `batch`;
  with tiny_mlp_x.npy (batch 2) and tiny_mlp_y.npy, the output numpy computes for it;
- tiny_old_opset.onnx: the same graph marked opset 11 (refused);
- tiny_unsupported.onnx: a TopK node named `top` (refused, naming the node and op).

Run: python3 tools/onnx/models/make_tiny.py (onnx==1.19.0, numpy).
"""

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(7)

w1 = rng.standard_normal((8, 12)).astype(np.float32) * 0.3  # Gemm transB: [out, in]
b1 = rng.standard_normal(8).astype(np.float32) * 0.1
w2 = rng.standard_normal((8, 5)).astype(np.float32) * 0.3
b2 = rng.standard_normal(5).astype(np.float32) * 0.1


def mlp(opset):
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc1.weight", "fc1.bias"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("MatMul", ["a", "fc2.weight"], ["m"]),
        helper.make_node("Add", ["m", "fc2.bias"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    inits = [
        numpy_helper.from_array(w1, "fc1.weight"),
        numpy_helper.from_array(b1, "fc1.bias"),
        numpy_helper.from_array(w2, "fc2.weight"),
        numpy_helper.from_array(b2, "fc2.bias"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([0], np.int64), "axes0"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if opset >= 13:
        onnx.checker.check_model(model)
    return model


def unsupported():
    graph = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["values", "indices"], name="top")],
        "tiny_unsupported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array([3], np.int64), "k")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


onnx.save(mlp(17), os.path.join(HERE, "tiny_mlp.onnx"))
onnx.save(mlp(11), os.path.join(HERE, "tiny_old_opset.onnx"))
onnx.save(unsupported(), os.path.join(HERE, "tiny_unsupported.onnx"))

x = rng.standard_normal((2, 3, 4)).astype(np.float32)
h = np.maximum(x.reshape(2, -1) @ w1.T + b1, 0)
logits = h @ w2 + b2
e = np.exp(logits - logits.max(axis=-1, keepdims=True))
np.save(os.path.join(HERE, "tiny_mlp_x.npy"), x)
np.save(os.path.join(HERE, "tiny_mlp_y.npy"), (e / e.sum(axis=-1, keepdims=True)).astype(np.float32))

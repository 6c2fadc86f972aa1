"""Exports the two small PyTorch models sinter's ONNX tests import, with PyTorch's outputs:

- cnn.onnx: a digits classifier on 8x8 images given flattened ([batch, 64], as the bundled
  data/digits has them): view -> Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d -> Conv2d -> ReLU ->
  global average pool -> Flatten -> Linear -> logits [batch, 10];
- transformer.onnx: a character language model: Embedding + learned positions -> one
  TransformerEncoderLayer (4 heads, causal mask, GELU, pre-norm) -> LayerNorm -> Linear -> logits
  [batch, seq, vocab] from int64 ids [batch, seq] (saved as int32, which sinter feeds).

Each is exported in eval mode with a dynamic batch dimension `batch` (opset 17, TorchScript
exporter), with NAME_input.npy (batch 4) and NAME_output.npy, what PyTorch computed for it.

Run: python3 tools/onnx/models/export_torch.py (torch 2.x, onnx 1.19, numpy; CPU only).
"""

import os

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(0)


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = x.view(x.shape[0], 1, 8, 8)
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.relu(self.conv2(x))
        x = x.mean(dim=(2, 3))
        return self.fc(torch.flatten(x, 1))


class Transformer(nn.Module):
    def __init__(self, vocab=32, seq=16, d=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.block = nn.TransformerEncoderLayer(
            d, 4, 64, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, ids):
        h = self.embed(ids) + self.pos
        h = self.block(h, src_mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


def export(name, model, example, input_name):
    model.eval()
    with torch.no_grad():
        out = model(example)
    torch.onnx.export(
        model,
        (example,),
        os.path.join(HERE, f"{name}.onnx"),
        input_names=[input_name],
        output_names=["logits"],
        dynamic_axes={input_name: {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    fed = example.numpy()  # sinter takes int64 ids as i32
    np.save(os.path.join(HERE, f"{name}_input.npy"), fed.astype(np.int32) if fed.dtype == np.int64 else fed)
    np.save(os.path.join(HERE, f"{name}_output.npy"), out.numpy())


cnn = Cnn()
with torch.no_grad():  # running statistics other than the defaults, so the test sees them
    cnn.bn1.running_mean.uniform_(-0.2, 0.2)
    cnn.bn1.running_var.uniform_(0.5, 1.5)
digits = np.load(os.path.join(HERE, "../../../ir-spec/examples/data/digits/test/x.npy"))
export("cnn", cnn, torch.from_numpy(digits[:4].astype(np.float32)), "x")
export("transformer", Transformer(), torch.randint(0, 32, (4, 16)), "ids")

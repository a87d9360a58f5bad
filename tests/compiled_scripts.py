"""Scripts, as their users write them, for the tests of a model compiled in place (`model.compile()`)."""

COMPILED_INFERENCE = """\
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))

model = Net().cuda().eval()
model.compile(mode="reduce-overhead")  # as gpudoctor's diff wrote it for transformer_infer_b1
x = torch.randn(1, 256, device="cuda")
with torch.no_grad():
    for step in range(1_000_000):
        y = model(x)
raise SystemExit("a timer should have ended the process first")
"""

"""A captured CUDA graph replayed in a loop (GPU only): a small MLP's forward, static input buffer."""

import argparse

import _window
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000000)
args = parser.parse_args()
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]).cuda().eval()
static_in = torch.randn(64, 512, device="cuda")
stream = torch.cuda.Stream()
stream.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(stream), torch.no_grad():
    for _ in range(3):
        model(static_in)
torch.cuda.current_stream().wait_stream(stream)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph), torch.no_grad():
    static_out = model(static_in)
for _i in range(args.steps):
    static_in.copy_(torch.randn(64, 512, device="cuda"))
    graph.replay()
    _window.tick()

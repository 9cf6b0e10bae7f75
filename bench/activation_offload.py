#!/usr/bin/env python3
"""Activation offload on resnet50, in the shape of hfai's CPUOffload table: for each offload ratio, the
device peak and the step time zeroplan measured (`zeroplan run`, one rank) beside what it predicted
(`zeroplan simulate` from a profile of this machine); then the same model under PyTorch's own
torch.autograd.graph.save_on_cpu (everything offloaded, no overlap), as hfai compared themselves with it;
then the side lane: at each ratio the slowdown against ratio 0 beside the seconds the copies took on the
side lane (the copy thread on CPU, the copy stream on CUDA). A slowdown below the copies' own time is
the overlap.

  .venv/bin/python bench/activation_offload.py --zeroplan build/zeroplan            # resnet50, 224x224
  .venv/bin/python bench/activation_offload.py --zeroplan build/zeroplan --preset resnet-tiny --batch 4

The PyTorch model is profiles/src/torch/zoo/resnet.cpp in Python (torchvision's ResNet v1.5 layout, the
same unit boundaries), trained with the same Adam and cross-entropy on random images. Its device peak is
measured with torch.cuda.max_memory_allocated on CUDA and, on CPU, from torch.profiler's memory figures
(each op's own allocations less its frees, summed in op order above the model and optimizer states, plus
those states: a lower bound, a peak inside one op is not seen). On a CPU-only machine
save_on_cpu keeps every saved tensor where it is (they are already on the CPU): its row shows what the
hooks cost, not a smaller peak. zeroplan's CPU runs keep a device pool (the counting allocator) and a
host pool apart, so its rows do move bytes.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYOUTS = {"resnet18": (False, (2, 2, 2, 2)), "resnet50": (True, (3, 4, 6, 3))}
PRESETS = {"resnet50": ("resnet50", 224, 1000, 64), "resnet18": ("resnet18", 224, 1000, 64),
           "resnet-tiny": ("resnet18", 64, 10, 8)}


def conv(i, o, k, s):
    return nn.Conv2d(i, o, k, stride=s, padding=k // 2, bias=False)


class Basic(nn.Module):
    expansion = 1

    def __init__(self, i, p, s):
        super().__init__()
        self.conv1, self.bn1, self.conv2, self.bn2 = conv(i, p, 3, s), nn.BatchNorm2d(p), conv(p, p, 3, 1), nn.BatchNorm2d(p)
        self.down = nn.Sequential(conv(i, p, 1, s), nn.BatchNorm2d(p)) if s != 1 or i != p else None

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (self.down(x) if self.down is not None else x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, i, p, s):
        super().__init__()
        self.conv1, self.bn1 = conv(i, p, 1, 1), nn.BatchNorm2d(p)
        self.conv2, self.bn2 = conv(p, p, 3, s), nn.BatchNorm2d(p)
        self.conv3, self.bn3 = conv(p, 4 * p, 1, 1), nn.BatchNorm2d(4 * p)
        self.down = nn.Sequential(conv(i, 4 * p, 1, s), nn.BatchNorm2d(4 * p)) if s != 1 or i != 4 * p else None

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


def resnet(layout, classes, width):
    bottleneck, blocks = LAYOUTS[layout]
    block = Bottleneck if bottleneck else Basic
    layers = [conv(3, width, 7, 2), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    i = width
    for s, n in enumerate(blocks):
        for b in range(n):
            layers.append(block(i, width << s, 2 if s > 0 and b == 0 else 1))
            i = (width << s) * block.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(i, classes)]
    return nn.Sequential(*layers)


def pytorch_rows(args, device):
    layout, image, classes, width = PRESETS[args.preset]
    torch.manual_seed(0)
    model = resnet(layout, classes, width).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, 3, image, image, device=device)
    y = torch.randint(0, classes, (args.batch,), device=device)
    rows = []
    for name, offload in (("PyTorch", False), ("PyTorch save_on_cpu", True)):
        def step():
            opt.zero_grad(set_to_none=True)
            if offload:
                with torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda"):
                    loss = F.cross_entropy(model(x), y)
            else:
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()

        step()  # warm-up: Adam's state exists from here
        times = []
        for _ in range(args.steps - 1):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            step()
            peak = torch.cuda.max_memory_allocated()
        else:
            from torch.profiler import ProfilerActivity, profile
            states = sum(p.numel() * p.element_size() for p in model.parameters())
            states += sum(b.numel() * b.element_size() for b in model.buffers())
            states += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                step()
            # Each op's own allocations less its frees, in the order the ops started (so a peak inside one
            # op is not seen: a lower bound).
            events = sorted((e for e in prof.events() if e.self_cpu_memory_usage != 0), key=lambda e: e.time_range.start)
            live = top = 0
            for e in events:
                live += e.self_cpu_memory_usage
                top = max(top, live)
            peak = states + top
        rows.append({"name": name, "device_peak_bytes": peak, "step_time_s": statistics.median(times)})
    return rows


def zp(args, *cmd):
    subprocess.run([args.zeroplan, "-q", *cmd], check=True)


def zeroplan_rows(args, work):
    layout, image, classes, width = PRESETS[args.preset]
    model = ["--model", "resnet", "--preset", args.preset]
    cluster, profile = os.path.join(work, "cluster.json"), os.path.join(work, "profile.json")
    zp(args, "probe", "--quick", "-o", cluster)
    zp(args, "profile", *model, "--batch", str(args.batch), "--batches", str(args.batch), "--threads", str(args.threads),
       "--repeats", "2", "-o", profile)
    rows = []
    for r in args.ratios:
        sets = ["--set", f"offload.activations_ratio={r}", "--global-batch", str(args.batch)]
        pred, run = os.path.join(work, f"pred_{r}.json"), os.path.join(work, f"run_{r}.json")
        zp(args, "simulate", "--model", profile, "--cluster", cluster, "--world-size", "1", *sets, "-o", pred)
        zp(args, "run", "--nproc", "1", "--threads", str(args.threads), *model, *sets, "--steps", str(args.steps),
           "--warmup", "1", "-o", run)
        p, m = json.load(open(pred)), json.load(open(run))
        off = m.get("offloaded_activations", [])
        rows.append({"ratio": r,
                     "predicted_device_peak_bytes": p["device"]["peak_bytes"],
                     "measured_device_peak_bytes": m["peaks"][0]["device_peak_bytes"],
                     "predicted_host_peak_bytes": p["host"]["peak_bytes"],
                     "measured_host_peak_bytes": m["peaks"][0]["host_peak_bytes"],
                     "predicted_step_time_s": p["step_time_s"],
                     "measured_step_time_s": m["step_time_median_s"],
                     # the side lane's copies, by direction (one `side_lane` phase in runs before 2026-11-29)
                     "copies_s": sum(m["phase_times_s"].get(k, 0.0) for k in ("d2h", "h2d", "side_lane")),
                     "offloaded_bytes": sum(u["offloaded_bytes"] for u in off),
                     "saved_bytes": sum(u["bytes"] for u in off)})
    return rows


def mb(b):
    return f"{b / 2**20:,.1f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zeroplan", default="build/zeroplan")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="resnet50")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4, help="steps per run, the first a warm-up")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (the side lane takes another core)")
    ap.add_argument("--ratios", type=float, nargs="+", default=[0, 0.1, 0.5, 1])
    ap.add_argument("--device", default="cpu", help="PyTorch's device (zeroplan runs on cpu here)")
    ap.add_argument("-o", "--output", help="JSON with every row")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as work:
        zrows = zeroplan_rows(args, work)
    prows = pytorch_rows(args, torch.device(args.device))
    print(f"{args.preset}, batch {args.batch}, {args.threads} thread(s), device {args.device}")
    print("| run | offload ratio | device peak measured | predicted | step time measured | predicted |")
    print("|---|---|---|---|---|---|")
    for r in zrows:
        print(f"| zeroplan | {r['ratio']:g} | {mb(r['measured_device_peak_bytes'])} | {mb(r['predicted_device_peak_bytes'])} | "
              f"{r['measured_step_time_s']:.3f} s | {r['predicted_step_time_s']:.3f} s |")
    for r in prows:
        ratio = "1 (all)" if "save_on_cpu" in r["name"] else "0"
        print(f"| {r['name']} | {ratio} | {mb(r['device_peak_bytes'])} | | {r['step_time_s']:.3f} s | |")
    print()
    print("| offload ratio | sent to the host | slowdown vs ratio 0 | side-lane copies alone | overlapped |")
    print("|---|---|---|---|---|")
    base = zrows[0]["measured_step_time_s"]
    for r in zrows[1:]:
        slow = r["measured_step_time_s"] - base
        lane = r["copies_s"]
        hidden = 1 - max(slow, 0) / lane if lane > 0 else 0
        print(f"| {r['ratio']:g} | {mb(r['offloaded_bytes'])} of {mb(r['saved_bytes'])} | {slow * 1e3:+.1f} ms | "
              f"{lane * 1e3:.1f} ms | {100 * hidden:.0f}% |")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"zeroplan": zrows, "pytorch": prows, "preset": args.preset, "batch": args.batch}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The executor benchmark (issue 4): zeroplan's step time per ZeRO stage against stage 0, against a
single process, and against PyTorch's own implementations from the same wheel on the same machine.

One run, sequentially (never two at once): zeroplan with one process (--nproc 1), zeroplan stages 0-3
on N ranks (Gloo on 127.0.0.1), then bench/pytorch_baselines.py: one process, DDP,
ZeroRedundancyOptimizer and FSDP2 fully_shard on N ranks (torchrun, Gloo over lo). Same model
(zeroplan's gpt, gpt2-small shape by default, with --seq positions), same per-rank micro batch (global
batch = micro batch x ranks; the single process runs one micro batch), same Adam (lr 1e-3), same steps
and warm-up, OMP_NUM_THREADS=--threads in every rank. Figure: median step time after warm-up, each step
timed as its slowest rank. Prints a markdown table (and a per-phase one), writes every document and
summary.json into --out-dir. The machine may be shared: before each config it waits until other
processes use at most --max-others of the cores, measures the CPU they take during the run (column
"other load"), and re-runs a config they disturbed (--retries).

  .venv/bin/python bench/executor_bench.py                       # gpt2-small, seq 128, micro batch 1
  .venv/bin/python bench/executor_bench.py --seq 64 --steps 4 --only zp-s0,pt-ddp
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name, label, kind, stage / mode, ranks (None = --nproc)
CONFIGS = [
    ("zp-single", "zeroplan, 1 process", "zeroplan", 0, 1),
    ("zp-s0", "zeroplan stage 0", "zeroplan", 0, None),
    ("zp-s1", "zeroplan stage 1", "zeroplan", 1, None),
    ("zp-s2", "zeroplan stage 2", "zeroplan", 2, None),
    ("zp-s3", "zeroplan stage 3", "zeroplan", 3, None),
    ("pt-single", "PyTorch, 1 process", "pytorch", "single", 1),
    ("pt-ddp", "PyTorch DDP", "pytorch", "ddp", None),
    ("pt-zero1", "PyTorch DDP + ZeroRedundancyOptimizer", "pytorch", "zero1", None),
    ("pt-fsdp2", "PyTorch FSDP2 fully_shard", "pytorch", "fsdp2", None),
]
# PyTorch config -> its zeroplan counterpart
COUNTERPART = {"pt-single": "zp-single", "pt-ddp": "zp-s0", "pt-zero1": "zp-s1", "pt-fsdp2": "zp-s3"}
LABEL = {c[0]: c[1] for c in CONFIGS}


def config_name(base, kind, adam):
    """PyTorch runs with a non-default Adam get their own name (pt-ddp-fused), so runs can be merged."""
    return base if kind == "zeroplan" or adam == "default" else f"{base}-{adam}"


def base_name(name):
    return name if name in LABEL else name.rsplit("-", 1)[0]


def label_of(name):
    base = base_name(name)
    return LABEL[base] + ("" if base == name else f" (Adam {name.rsplit('-', 1)[1]}=True)")


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_busy_s():
    """CPU seconds all processes of the machine have used (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def others_share(window_s=5.0):
    """Share of all cores other processes used over the next window_s (nothing of ours runs meanwhile)."""
    busy0, t0 = cpu_busy_s(), time.time()
    time.sleep(window_s)
    return (cpu_busy_s() - busy0) / ((time.time() - t0) * os.cpu_count())


def wait_for_quiet(max_others, max_wait_s):
    """Waits (up to max_wait_s) until other processes use at most max_others of the cores; returns their share."""
    t0 = time.time()
    while True:
        share = others_share()
        if share <= max_others:
            return share
        if time.time() - t0 >= max_wait_s:
            print(f"other processes still use {100 * share:.0f}% of the cores after {max_wait_s:.0f} s: measuring anyway",
                  file=sys.stderr)
            return share
        print(f"other processes use {100 * share:.0f}% of the cores: waiting", file=sys.stderr, flush=True)
        time.sleep(15)


def zeroplan_cmd(a, stage, ranks, out):
    opts = f"layers={a.layers},hidden={a.hidden},heads={a.heads},seq={a.seq},vocab={a.vocab}"
    cmd = [a.zeroplan, "run", "--nproc", str(ranks), "--model", "gpt", "--opt", opts,
           "--set", f"zero_stage={stage}", "--set", f"micro_batch={a.micro_batch}",
           "--global-batch", str(a.micro_batch * ranks), "--steps", str(a.steps), "--warmup", str(a.warmup),
           "-o", out]
    if stage == 3:
        cmd += ["--set", f"reshard_after_forward={'true' if a.reshard_after_forward else 'false'}"]
    return cmd


def pytorch_cmd(a, mode, ranks, out):
    script = os.path.join(ROOT, "bench", "pytorch_baselines.py")
    args = [script, "--mode", mode, "--layers", str(a.layers), "--hidden", str(a.hidden), "--heads", str(a.heads),
            "--seq", str(a.seq), "--vocab", str(a.vocab), "--micro-batch", str(a.micro_batch),
            "--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", str(a.threads), "--adam", a.adam,
            "--reshard-after-forward" if a.reshard_after_forward else "--no-reshard-after-forward", "-o", out]
    if mode == "single":
        return [a.python] + args
    return [a.torchrun, "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1", "--master-port",
            str(a.port)] + args


def run_one(a, name, kind, what, ranks):
    out = os.path.join(a.out_dir, f"{name}.json")
    log = os.path.join(a.out_dir, f"{name}.log")
    cmd = zeroplan_cmd(a, what, ranks, out) if kind == "zeroplan" else pytorch_cmd(a, what, ranks, out)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if os.path.exists(out):
        os.remove(out)
    load = load1()
    print(f"[{name}] load {load:.2f}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    t0, busy0, ours0 = time.time(), cpu_busy_s(), children_cpu_s()
    try:
        with open(log, "w") as lf:
            rc = subprocess.run(cmd, env=env, stdout=lf, stderr=subprocess.STDOUT, timeout=a.timeout).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    wall = time.time() - t0
    # CPU time other processes took from the machine while this config ran, as a share of all cores.
    others = max(0.0, (cpu_busy_s() - busy0) - (children_cpu_s() - ours0)) / (wall * os.cpu_count())
    res = {"name": name, "kind": kind, "ranks": ranks, "command": cmd, "rc": rc, "wall_s": wall, "load_before": load,
           "others_cpu_share": others}
    doc = None
    if os.path.exists(out):
        with open(out) as f:
            doc = json.load(f)
    if rc == 0 and doc is not None and "error" not in doc:
        res["median_s"] = doc["step_time_median_s"]
        res["phases"] = doc.get("phase_times_s", {})
        res["backend"] = doc.get("environment", {}).get("backend", "")
        res["losses"] = doc.get("losses", [])
        if kind == "pytorch":
            res["parameters"] = doc.get("parameters")
        print(f"[{name}] median step {res['median_s']:.3f} s ({wall:.0f} s wall, other processes used "
              f"{100 * others:.0f}% of the cores)", file=sys.stderr, flush=True)
    else:
        err = doc.get("error") if doc else None
        if err is None:
            with open(log) as f:
                lines = [ln.rstrip() for ln in f if ln.strip()]
            err = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "?")
        res["error"] = f"exit {rc}: {err}"
        print(f"[{name}] FAILED {res['error']} (log {log})", file=sys.stderr, flush=True)
    return res


def fmt_ratio(x, y):
    return f"{x / y:.2f}" if x is not None and y else "—"


def percentile(values, q):
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def spread(out_dir, name):
    """p10-p90 of the timed steps, from the config's document."""
    try:
        with open(os.path.join(out_dir, f"{name}.json")) as f:
            doc = json.load(f)
        timed = doc["step_times_s"][doc["warmup_steps"]:]
        return f"{percentile(timed, 10):.2f}-{percentile(timed, 90):.2f}"
    except (OSError, KeyError, ValueError):
        return ""


def tables(results):
    """results: dicts with name, ranks, median_s or error, phases, others_cpu_share, out_dir."""
    by = {r["name"]: r for r in results}
    t = lambda n: by.get(n, {}).get("median_s")
    s0 = t("zp-s0")
    order = [c[0] for c in CONFIGS]
    names = sorted(by, key=lambda n: (order.index(base_name(n)), n))
    rows = ["| config | ranks | median step (s) | p10-p90 (s) | / zeroplan stage 0 | / single process | "
            "zeroplan / this | / own compute | other load |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        r = by[name]
        label = label_of(name)
        if "median_s" not in r:
            rows.append(f"| {label} | {r['ranks']} | failed: {r['error']} | | | | | | |")
            continue
        single = t("zp-single" if r["kind"] == "zeroplan" else config_name("pt-single", "pytorch",
                                                                           name.rsplit("-", 1)[1] if base_name(name) != name else "default"))
        vs = ""
        if base_name(name) in COUNTERPART:
            zp = COUNTERPART[base_name(name)]
            vs = f"{fmt_ratio(t(zp), r['median_s'])} ({LABEL[zp]})"
        # A zeroplan step over its own compute: the forward, backward, optimizer and zero_grad spans (what the
        # step would take if every collective hid behind compute).
        own = ""
        if r["kind"] == "zeroplan" and r.get("phases"):
            compute = sum(r["phases"].get(k, 0.0) for k in ("data", "forward", "backward", "optimizer", "zero_grad"))
            own = fmt_ratio(r["median_s"], compute) if compute > 0 else ""
        rows.append(f"| {label} | {r['ranks']} | {r['median_s']:.3f} | {spread(r['out_dir'], name)} | "
                    f"{fmt_ratio(r['median_s'], s0)} | {fmt_ratio(r['median_s'], single)} | {vs} | {own} | "
                    f"{100 * r['others_cpu_share']:.0f}% |")
    main = "\n".join(rows)

    cols = []
    for r in results:
        for k in r.get("phases", {}):
            if k not in cols:
                cols.append(k)
    first = ["data", "forward", "backward", "optimizer", "comm_wait", "all_reduce", "all_gather", "reduce_scatter"]
    cols = [n for n in first if n in cols] + [n for n in cols if n not in first]
    prow = ["| config | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for name in names:
        r = by[name]
        if "phases" not in r:
            continue
        cells = [f"{r['phases'][n]:.3f}" if n in r["phases"] else "" for n in cols]
        prow.append(f"| {label_of(name)} | " + " | ".join(cells) + " |")
    return main, "\n".join(prow)


def transports(results):
    """How the ranks exchanged: zeroplan's run records name their backend (shm: shared memory between the
    ranks of one machine; gloo), PyTorch's runs use Gloo."""
    ours = sorted({r["backend"] for r in results if r.get("kind") != "pytorch" and r.get("backend")})
    return f"zeroplan: {', '.join(ours) or 'gloo'}; PyTorch: gloo"


def report(a, params, results):
    main_table, phase_table = tables(results)
    header = (f"gpt (zeroplan's model) L={a.layers} h={a.hidden} heads={a.heads} seq={a.seq} vocab={a.vocab}, "
              f"{params:,} parameters, Adam lr 1e-3, micro batch {a.micro_batch} per rank, {a.nproc} ranks "
              f"on 127.0.0.1 ({transports(results)}), {a.threads} thread(s) per rank, median of {a.steps - a.warmup} steps after "
              f"{a.warmup} warm-up; stage 3 / FSDP2 reshard_after_forward={'on' if a.reshard_after_forward else 'off'}")
    return (f"{header}\n\n{main_table}\n\n(zeroplan / this: the matching zeroplan config's median over this "
            f"row's; / own compute: a zeroplan step over its forward, backward, optimizer and zero_grad spans; other load: CPU time of processes outside the benchmark while the config ran, as a share of all "
            f"cores)\n\nPer-phase medians (s/step). zeroplan: compute spans per phase, collectives on their own lane "
            f"(overlapping compute), comm_wait = time the step blocked on them. PyTorch: wall time of the model call "
            f"(forward), loss.backward() (with DDP's/FSDP's hooks and waits) and optimizer step + zero_grad.\n\n"
            f"{phase_table}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=12)  # gpt2-small
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--micro-batch", type=int, default=1, help="samples per rank per step")
    ap.add_argument("--nproc", type=int, default=2, help="ranks of the distributed configs")
    ap.add_argument("--steps", type=int, default=8, help="steps per config, warm-up included")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per rank")
    ap.add_argument("--adam", choices=["default", "foreach", "fused"], default="default",
                    help="torch.optim.Adam implementation in the PyTorch runs (default: torch's choice on CPU, "
                         "the per-tensor for-loop); others are named pt-<config>-<adam>")
    ap.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
                    help="stage 3 and FSDP2 (fully_shard's default: on)")
    ap.add_argument("--only", help="comma-separated subset of: " + ",".join(c[0] for c in CONFIGS))
    ap.add_argument("--zeroplan", default=os.path.join(ROOT, "build", "zeroplan"))
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python"))
    ap.add_argument("--torchrun", default=os.path.join(ROOT, ".venv", "bin", "torchrun"))
    ap.add_argument("--port", type=int, default=29561, help="torchrun master port")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per config")
    ap.add_argument("--max-others", type=float, default=0.10,
                    help="before each config, wait while other processes use more than this share of the cores")
    ap.add_argument("--max-wait", type=float, default=600, help="seconds to wait for the machine to be quiet")
    ap.add_argument("--retries", type=int, default=2,
                    help="re-run a config whose run other processes disturbed (used > 1.5 x --max-others)")
    ap.add_argument("--from", dest="merge", action="append", default=[], metavar="DIR",
                    help="run nothing: print the tables of earlier runs' out-dirs (repeatable; later ones win)")
    ap.add_argument("--out-dir", default="executor-bench")
    a = ap.parse_args()

    if a.merge:
        results, params = [], 0
        for d in a.merge:
            with open(os.path.join(d, "summary.json")) as f:
                summary = json.load(f)
            params = summary["parameters"]
            for r in summary["results"]:
                r.setdefault("out_dir", d)
                results = [x for x in results if x["name"] != r["name"]] + [r]
        for k in ("layers", "hidden", "heads", "seq", "vocab", "micro_batch", "nproc", "steps", "warmup", "threads",
                  "reshard_after_forward"):
            setattr(a, k, summary["args"][k])
        print(report(a, params, results))
        return 0

    os.makedirs(a.out_dir, exist_ok=True)
    selected = [c for c in CONFIGS if not a.only or c[0] in a.only.split(",")]
    params = int(subprocess.run([a.python, os.path.join(ROOT, "bench", "pytorch_baselines.py"), "--count-only",
                                 "--layers", str(a.layers), "--hidden", str(a.hidden), "--heads", str(a.heads),
                                 "--seq", str(a.seq), "--vocab", str(a.vocab)],
                                capture_output=True, text=True, check=True).stdout.strip())
    print(f"gpt L={a.layers} h={a.hidden} heads={a.heads} seq={a.seq} vocab={a.vocab}: {params:,} parameters; "
          f"micro batch {a.micro_batch} per rank, {a.steps} steps ({a.warmup} warm-up), {a.threads} thread(s) per "
          f"rank, load average {load1():.2f}", file=sys.stderr)
    t0 = time.time()
    results = []
    for base, _, kind, what, ranks in selected:
        name = config_name(base, kind, a.adam)
        for attempt in range(a.retries + 1):
            wait_for_quiet(a.max_others, a.max_wait)
            r = run_one(a, name, kind, what, ranks or a.nproc)
            r["attempt"] = attempt + 1
            r["out_dir"] = a.out_dir
            if "median_s" not in r or r["others_cpu_share"] <= 1.5 * a.max_others:
                break
            if attempt < a.retries:
                print(f"[{name}] disturbed by other processes: again", file=sys.stderr, flush=True)
        results.append(r)
    text = report(a, params, results)
    print(text)
    with open(os.path.join(a.out_dir, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out_dir, "summary.json"), "w") as f:
        json.dump({"args": vars(a), "parameters": params, "results": results,
                   "total_wall_s": time.time() - t0}, f, indent=2)
    print(f"total {time.time() - t0:.0f} s; documents in {a.out_dir}/", file=sys.stderr)
    return 0 if all("median_s" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

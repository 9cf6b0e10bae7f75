"""zeroplan.profile: any nn.Module profiled unit by unit by the C++ profiler, through capture and replay."""
from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from typing import Callable, Iterable, Sequence

import torch
from torch import nn

from . import _C
from ._capture import Replays, capture, first_tensor, loss_of, map_tensors, root_split, split_batch
from ._errors import ZeroplanError, first_line
from ._units import Unit, format_units, units as choose_units


def _call_make_batch(make_batch, b: int):
    try:
        return make_batch(b)
    except Exception as e:  # noqa: BLE001
        raise ZeroplanError("bad_input", f"make_batch({b}) failed: {first_line(e)}") from e


_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _step_seconds(model, cap, loss_fn, device: str, context) -> float:
    """One real training step's compute (forward, loss, backward) of the whole model, in seconds."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    with context():
        out = model(*cap.args, **cap.kwargs)
        loss = loss_of(loss_fn, out, cap.batch)
    loss.backward()
    sync()
    seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    return seconds


def _add_glue(doc: dict, model, captured, loss_fn, batches, repeats: int, device: str, context) -> None:
    """The model's own code outside the units (masks, position tables, skips, what runs between blocks),
    as a unit of its own without parameters, just before root:post: per batch, a whole training step's
    compute (median of `repeats`) minus the units' forward and backward at that batch (never below 0).
    The simulator charges its time like a unit's; it holds no memory of its own (what it allocates is in
    the units' activations). Fitted over the batches like every figure."""
    units = doc["units"]
    ys = []
    for b in batches:
        whole = statistics.median(_step_seconds(model, captured[b], loss_fn, device, context) for _ in range(repeats))
        parts = sum(_at(u["time_fwd_s"], b) + _at(u["time_bwd_s"], b) for u in units)
        ys.append(max(0.0, whole - parts))
    ref = doc["batch"]
    n = len(batches)
    mean_x, mean_y = sum(batches) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in batches)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(batches, ys)) / sxx if sxx > 0 else 0.0
    intercept = mean_y - slope * mean_x if sxx > 0 else 0.0
    if sxx == 0:
        slope = mean_y / mean_x
    fitted = [intercept + slope * x for x in batches]
    ss_res = sum((y - f) ** 2 for y, f in zip(ys, fitted))
    ss_tot = sum((y - mean_y) ** 2 for y in ys)

    def figure(values, fit=True):
        value = values[batches.index(ref)]
        if not fit:
            return {"value": value, "intercept": value, "per_sample": 0.0, "r2": 1.0, "points": n,
                    "measured": [[x, v] for x, v in zip(batches, values)]}
        return {"value": value, "intercept": intercept, "per_sample": slope,
                "r2": 1.0 if ss_tot == 0 else max(-1e9, 1 - ss_res / ss_tot), "points": n,
                "measured": [[x, y] for x, y in zip(batches, ys)]}

    zero = [0.0] * n
    post = units[-1]
    glue = {"name": "glue", "type": "Glue", "count": 1, "params": 0, "bytes_param": 0, "bytes_buffer": 0,
            "input_shape": post["input_shape"], "output_shape": post["input_shape"],
            "bytes_saved": figure(zero, False), "bytes_output": figure(zero, False),
            "time_fwd_s": figure(ys), "time_bwd_s": figure(zero, False),
            "bytes_peak_fwd": figure(zero, False), "bytes_peak_bwd": figure(zero, False),
            "flops_fwd": figure(zero, False), "flops_bwd": figure(zero, False)}
    units.insert(len(units) - 1, glue)
    # the borrowed indices of later units are unchanged: only root:post (after it) borrows, from unit 0
    total = sum(_at(u["time_fwd_s"], ref) + _at(u["time_bwd_s"], ref) for u in units)
    doc.setdefault("notes", []).append(
        f"glue: the model's own code outside the units takes {1e3 * glue['time_fwd_s']['value']:.3f} ms of a "
        f"{1e3 * total:.3f} ms step at batch {ref} (a whole step's compute minus its units')")


def _at(figure: dict, batch: int) -> float:
    for x, y in figure.get("measured", []):
        if x == batch:
            return y
    return figure.get("intercept", figure["value"]) + figure.get("per_sample", 0.0) * batch


def _training_mode(model: nn.Module) -> None:
    model.train()
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        config.use_cache = False  # a training step keeps no key/value cache (Hugging Face models)


def profile(model: nn.Module, make_batch: Callable[[int], object], loss_fn: Callable, *,
            batches: Sequence[int] = (1, 2), batch: int | None = None, policy: str | Iterable = "auto",
            name: str | None = None, source: str | None = None, repeats: int = 3, warmup: int = 1,
            threads: int = 0, device: str = "cpu", dtype: str = "fp32", dtypes: Sequence[str] = (),
            concurrent_ranks: int = 1, progress: bool = False, print_units: bool = False,
            trace: str | None = None) -> dict:
    """Profiles `model` unit by unit; returns the ModelProfile document (a dict; json.dump it for the CLI).

    make_batch(n) returns a batch of n samples (a tensor, a tuple of arguments, a dict of keyword
    arguments, or (tuple, dict)); loss_fn(output, batch) returns the scalar loss. The figures' `value`s
    are at `batch` (default: the smallest of `batches`), fitted over `batches`.
    dtype: "bf16" or "fp16" profiles a copy of the model in that dtype, its floating inputs cast (what
    zeroplan.wrap runs under a plan with 16-bit parameters): memory and times measured, not scaled.
    dtypes: 16-bit dtypes ("bf16", "fp16") whose unit times are measured too, with the units computing
    under torch.autocast on their fp32 parameters (mixed precision), and recorded in each unit's
    times_at_dtype, which simulate and tune use for plans computing in that dtype.
    trace: a path for the profiling run as a Chrome trace (the fp32 pass), as `profile --trace` writes.
    """
    for d in dtypes:
        if d not in ("bf16", "fp16"):
            raise ZeroplanError("bad_input", f"profile: dtypes has {d!r}; expected bf16 or fp16")
    if not isinstance(model, nn.Module):
        raise ZeroplanError("bad_input", f"profile: expected an nn.Module, got {type(model).__name__}")
    if dtype != "fp32":
        if dtype not in _TORCH_DTYPES:
            raise ZeroplanError("bad_input", f"profile: dtype {dtype!r} is not one of fp32, bf16, fp16")
        if dtypes:
            raise ZeroplanError("bad_input", f"profile: dtypes={list(dtypes)} are times under autocast of the fp32 "
                                f"model; dtype={dtype!r} profiles the model itself in {dtype}: give one of them")
        # The model in 16 bits, as zeroplan.wrap runs a plan whose parameters are 16-bit (param_dtype):
        # a copy (the caller's model keeps its fp32 weights), its floating inputs cast as wrap casts them,
        # so every saved tensor, output and temporary is measured at the dtype the run has (the model's own
        # fp32 upcasts, the loss's, included) instead of scaled from fp32.
        t16 = _TORCH_DTYPES[dtype]
        model = copy.deepcopy(model).to(t16)
        fp_make_batch = make_batch

        def make_batch(n, __make=fp_make_batch, __t=t16):  # noqa: ANN001
            return map_tensors(__make(n), lambda t: t.to(__t) if t.is_floating_point() else t)
    batches = sorted({int(b) for b in batches})
    if not batches or batches[0] < 1:
        raise ZeroplanError("bad_input", f"profile: batches {list(batches)} must be positive")
    ref = batches[0] if batch is None else int(batch)
    if ref not in batches:
        batches = sorted(set(batches) | {ref})
    _training_mode(model)
    chosen = choose_units(model, policy)
    if print_units:
        print(format_units(chosen), file=sys.stderr)
    if len(chosen) < 2:
        raise ZeroplanError("bad_input", "profile: no units besides the root")
    blocks = [u for u in chosen if not u.is_root]
    captured = {}
    for b in batches:
        captured[b] = capture(model, chosen, _call_make_batch(make_batch, b), loss_fn)
    first = captured[ref]
    x0 = first_tensor(first.args + tuple(first.kwargs.values()))
    if x0 is None:
        raise ZeroplanError("bad_input", "profile: make_batch's batch holds no tensor")
    replays = Replays(model, chosen, loss_fn, captured)
    pre, post, borrowed = root_split(model, chosen, first)
    root_type = type(model).__name__

    def named(items, kind):
        return [(n, t) for k, n, t in items if k == kind]

    entries = [{"name": "root:pre", "type": root_type, "replay": replays.pre,
                "params": named(pre, "param"), "buffers": named(pre, "buffer"), "borrowed": []}]
    for i, u in enumerate(blocks):
        entries.append({"name": u.name, "type": u.type, "replay": replays.block(i),
                        "params": list(u.module.named_parameters()), "buffers": list(u.module.named_buffers()),
                        "borrowed": []})
    entries.append({"name": "root:post", "type": root_type, "replay": replays.post,
                    "params": named(post, "param"), "buffers": named(post, "buffer"),
                    "borrowed": [(0, n) for n in borrowed]})
    options = {"batch": ref, "batches": batches, "warmup": warmup, "repeats": repeats, "threads": threads,
               "device": device, "dtype": dtype, "progress": progress, "concurrent_ranks": concurrent_ranks}
    label = name or type(model).__name__
    src = source or f"python:{type(model).__qualname__}"

    def measure(reps: Replays, trace_path: str = "") -> dict:
        replay = {"root:pre": reps.pre, "root:post": reps.post}
        units_at = [dict(e, replay=replay.get(e["name"]) or reps.block(i - 1)) for i, e in enumerate(entries)]
        try:
            text = _C.profile_units(label, src, units_at, reps.make_input, list(x0.shape[1:]), options,
                                    trace_path)
        except _C.BadInput as e:
            raise ZeroplanError("bad_input", str(e)) from None
        d = json.loads(text)
        _add_glue(d, model, captured, loss_fn, batches, repeats=max(3, repeats), device=device,
                  context=reps._context)
        return d

    doc = measure(replays, trace or "")
    for d16 in dtypes:
        other = measure(Replays(model, chosen, loss_fn, captured, autocast=_TORCH_DTYPES[d16],
                                device_type=device.split(":")[0]))
        other["dtype"] = d16
        try:
            doc = json.loads(_C.add_times_at_dtype(json.dumps(doc), json.dumps(other)))
        except _C.BadInput as e:
            raise ZeroplanError("bad_input", str(e)) from None
        doc.setdefault("notes", []).append(
            f"times_at_dtype {d16}: the units computing under torch.autocast({d16}) on their fp32 parameters")
    if concurrent_ranks > 1:
        doc.setdefault("notes", []).append(
            f"timed with {concurrent_ranks} ranks' worth of each unit at once, but the units' Python code runs one "
            "replay at a time (the GIL and the replays' lock): the contention between ranks is underestimated")
    for u in doc["units"]:
        # Not modules of their own: zeroplan.wrap cannot recompute them, so checkpointing passes over them.
        if u["name"] in ("root:pre", "root:post", "glue"):
            u["recomputable"] = False
    total = sum(p.numel() for p in model.parameters())
    counted = sum(u["params"] * u.get("count", 1) for u in doc["units"])
    if counted != total:
        raise ZeroplanError("bad_input", f"profile: the units hold {counted:,} parameters but the model has "
                            f"{total:,} (a parameter outside every unit and the root?)")
    doc.setdefault("notes", []).append(
        "units chosen by policy " + (policy if isinstance(policy, str) else repr(list(policy))) + ": " +
        "; ".join(f"{u.name or '(root)'} {u.type} {u.params}" for u in chosen))
    return doc

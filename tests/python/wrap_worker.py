"""One rank of the zeroplan.wrap parity runs (test_wrap.py starts it under torchrun, or calls run_case in a
world of one): each case wraps a model from tests/python/models.py under a plan, trains STEPS steps on this
rank's share of the global batch in the user's own loop, and writes its losses, peaks and (rank 0) full
state dict to OUT/<case>-rank<R>.pt."""
from __future__ import annotations

import json
import os
import sys

import faulthandler
import torch

faulthandler.enable()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import zeroplan  # noqa: E402
from zeroplan._train import call, chunk  # noqa: E402,F401 - the rank's loop, as `run --python` splits a batch

STEPS = 3


def build(name: str):
    model, make_batch, loss_fn = getattr(models, name)()
    for m in model.modules():  # the reference draws no dropout masks: the runs must agree
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model, make_batch, loss_fn


def plan_for(case: dict, world: int) -> dict:
    mb, m = case.get("micro_batch", 2), case.get("microbatches", 1)
    plan = json.loads(zeroplan._C.default_plan(world, world * mb * m))
    plan["micro_batch"], plan["microbatches"] = mb, m
    plan["optimizer"].update(name=case.get("optimizer", "adam"), lr=case.get("lr", 1e-3))
    for k, v in case.get("sets", {}).items():
        if isinstance(v, dict):
            plan.setdefault(k, {}).update(v)
        else:
            plan[k] = v
    return plan


def run_case(case: dict, rank: int, world: int, ckpt_dir: str = "") -> dict:
    """resume_at k: after k steps a checkpoint, then a fresh model (other weights) wrapped and resumed from it."""
    model, make_batch, loss_fn = build(case["model"])
    plan = plan_for(case, world)
    mb, m = plan["micro_batch"], plan["microbatches"]
    engine = zeroplan.wrap(model, plan, optimizer=case.get("optimizer", "adam"), lr=case.get("lr", 1e-3),
                           ranks_per_node=case.get("ranks_per_node", 0))
    losses, stats = [], []
    for step in range(STEPS):
        if step == case.get("resume_at", -1):
            engine.save_checkpoint(ckpt_dir)
            engine.close()
            torch.manual_seed(123)
            model, _, _ = build(case["model"])
            for p in model.parameters():  # not the weights it had: the checkpoint must bring them back
                torch.nn.init.normal_(p)
            engine = zeroplan.wrap(model, plan, optimizer="adam", lr=1e-3)
            assert engine.load_checkpoint(ckpt_dir) == step, "resumed at another step"
        batch = make_batch(world * mb * m + step)
        for k in range(m):
            part = chunk(batch, (rank * m + k) * mb, mb)
            loss = loss_fn(call(engine, part), part)
            engine.backward(loss)
            losses.append(loss.item())
        stats.append(engine.step())
    out = {"losses": losses, "peak": engine.peak_bytes(), "host_peak": engine.host_peak_bytes(),
           "skipped": [s["skipped"] for s in stats], "gains": [s["lr_gain"] for s in stats], "views_valid": engine.driver.views_valid()}
    state = engine.state_dict()
    if rank == 0:
        out["state"] = state
    out["sharded"] = {k: tuple(v) for k, v in engine.state_dict(sharded=True).items()
                      if isinstance(v, zeroplan.LocalShard)}
    engine.close()
    return out


def main() -> None:
    out_dir, cases_path = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    with open(cases_path) as f:
        cases = json.load(f)
    for case in cases:
        try:
            result = run_case(case, rank, world, os.path.join(out_dir, f"ckpt-{case['id']}"))
        except zeroplan.ZeroplanError as e:
            result = {"error": f"{e.kind}: {e}"}
        torch.save(result, os.path.join(out_dir, f"{case['id']}-rank{rank}.pt"))


if __name__ == "__main__":
    main()

"""What zeroplan.wrap's Engine is built from and hands back: this process's session in its job (one per
process), the plan as validated JSON, and the entries of a sharded state dict (LocalShard)."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, NamedTuple

import torch

from . import _C
from ._errors import ZeroplanError

_SESSION: Any = None


def session(device: str = "cpu", timeout_s: float = 0.0):
    """This process's rank in its job (torchrun's RANK/WORLD_SIZE, Slurm's, or a world of one); one per process."""
    global _SESSION
    if _SESSION is None:
        try:
            _SESSION = _C.Session(device, timeout_s)
        except (_C.RendezvousError, _C.CommError) as e:
            raise ZeroplanError("run_failed", f"rendezvous: {e}") from None
    return _SESSION


def _plan_json(plan, optimizer: str | None, lr: float | None, weight_decay: float | None) -> str:
    if isinstance(plan, (str, os.PathLike)) and os.path.exists(plan):
        with open(plan) as f:
            plan = f.read()
    if isinstance(plan, str):
        try:
            plan = json.loads(plan)
        except json.JSONDecodeError as e:
            raise ZeroplanError("bad_input", f"wrap: the plan is neither a file nor JSON ({e})") from None
    if not isinstance(plan, dict):
        raise ZeroplanError("bad_input", f"wrap: expected a plan (dict, JSON text or file), got {type(plan).__name__}")
    plan = json.loads(json.dumps(plan))
    opt = plan.setdefault("optimizer", {})
    if optimizer is not None:
        opt["name"] = optimizer
    if lr is not None:
        opt["lr"] = lr
    if weight_decay is not None:
        opt["weight_decay"] = weight_decay
    text = json.dumps(plan)
    try:
        return _C.validate_document("plan", text)
    except _C.BadInput as e:
        raise ZeroplanError("bad_input", str(e)) from None


class LocalShard(NamedTuple):
    """This rank's share of a parameter (Engine.state_dict(sharded=True)): the elements
    [offset, offset + local.numel()) of the parameter flattened, whose shape is `shape`."""
    local: torch.Tensor
    offset: int
    shape: torch.Size

    @staticmethod
    def join(shards: Iterable["LocalShard"]) -> torch.Tensor:
        """The whole parameter from every rank's LocalShard of it."""
        shards = list(shards)
        flat = torch.empty(shards[0].shape.numel(), dtype=shards[0].local.dtype)
        for s in shards:
            flat[s.offset:s.offset + s.local.numel()] = s.local
        return flat.view(shards[0].shape)

"""zeroplan.simulate: one training step of a plan, by the C++ simulator."""
from __future__ import annotations

import json
from typing import Mapping

from . import _C
from ._errors import ZeroplanError


def _text(doc) -> str:
    if isinstance(doc, (str, bytes)):
        return doc if isinstance(doc, str) else doc.decode()
    return json.dumps(doc)


def simulate(profile, *, cluster: str = "local", world_size: int = 1, global_batch: int | None = None,
             plan=None, set: Mapping[str, object] | None = None) -> dict:  # noqa: A002 - the CLI's --set
    """The Prediction document (a dict) of one step of `plan` (a Plan dict; default: plain data parallel
    over world_size ranks at global_batch, the profile's batch per rank), with `set` applied as `--set`
    does (knob name -> value). cluster: a shipped name, "local" (this machine's probe) or a file."""
    prof = profile if isinstance(profile, dict) else json.loads(_text(profile))
    if global_batch is None:
        global_batch = int(prof.get("batch", 1)) * world_size
    sets = []
    for k, v in (set or {}).items():
        sets.append((k, json.dumps(v) if isinstance(v, (list, dict)) else
                     (str(v).lower() if isinstance(v, bool) else str(v))))
    try:
        text = _C.simulate(_text(prof), cluster, "" if plan is None else _text(plan), int(world_size),
                           int(global_batch), sets)
    except _C.BadInput as e:
        raise ZeroplanError("bad_input", str(e)) from None
    return json.loads(text)

"""FILE.py:FACTORY, the CLI's way to name a Python model: FACTORY() returns (model, make_batch, loss_fn), or
a dict with those keys."""
from __future__ import annotations

import importlib.util
import os
import sys

from torch import nn

from ._errors import ZeroplanError, first_line


def load_factory(spec: str):
    if ":" not in spec:
        raise ZeroplanError("bad_input", f"--python {spec}: expected FILE.py:FACTORY")
    path, factory = spec.rsplit(":", 1)
    if not os.path.isfile(path):
        raise ZeroplanError("bad_input", f"--python {spec}: no file {path}")
    name = "zeroplan_user_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001
        raise ZeroplanError("bad_input", f"--python {spec}: importing {path} failed: {first_line(e)}") from e
    fn = getattr(module, factory, None)
    if not callable(fn):
        raise ZeroplanError("bad_input", f"--python {spec}: {path} has no function {factory}")
    try:
        made = fn()
    except Exception as e:  # noqa: BLE001
        raise ZeroplanError("bad_input", f"--python {spec}: {factory}() failed: {first_line(e)}") from e
    if isinstance(made, dict):
        made = tuple(made.get(k) for k in ("model", "make_batch", "loss_fn"))
    if not isinstance(made, (tuple, list)) or len(made) != 3:
        raise ZeroplanError("bad_input", f"--python {spec}: {factory}() returned a {type(made).__name__}; expected "
                            "(model, make_batch, loss_fn)")
    model, make_batch, loss_fn = made
    if not isinstance(model, nn.Module):
        raise ZeroplanError("bad_input", f"--python {spec}: {factory}()'s model is a {type(model).__name__}, "
                            "not an nn.Module")
    for what, f in (("make_batch", make_batch), ("loss_fn", loss_fn)):
        if not callable(f):
            raise ZeroplanError("bad_input", f"--python {spec}: {factory}()'s {what} is not callable")
    return model, make_batch, loss_fn

"""zeroplan for Python: any nn.Module's units, profiled by capture and replay, simulated, and any training
loop recorded, through zeroplan's C++ core (zeroplan._C). The documents are the CLI's: what this package
writes, `zeroplan simulate / tune / compare` read, and the reverse.

    import zeroplan
    chosen = zeroplan.units(model)                       # the repeated blocks + the root, FSDP-style
    prof = zeroplan.profile(model, make_batch, loss_fn, batches=[1, 2, 4])
    pred = zeroplan.simulate(prof, cluster="local", world_size=2, global_batch=8, set={"zero_stage": 3})
    with zeroplan.record("run.json", optimizer=opt) as rec:  # around your own loop
        ...
    engine = zeroplan.wrap(model, plan)                  # train under a plan in the model's own forward
    loss = loss_fn(engine(**batch), batch); engine.backward(loss); engine.step()
"""
from __future__ import annotations

import os as _os
import pathlib as _pathlib

import torch as _torch  # loads libtorch before the extension that links it

_root = _pathlib.Path(__file__).resolve().parents[2]
_build = _pathlib.Path(_os.environ.get("ZEROPLAN_BUILD_DIR") or "build")
if not _build.is_absolute():
    _build = _root / _build
__path__.append(str(_build / "python" / "zeroplan"))  # noqa: F821 - the package's own __path__

try:
    from . import _C  # noqa: E402
except ImportError as _e:  # one line saying what to do
    raise ImportError(f"zeroplan: the C++ extension is not built in {_build / 'python' / 'zeroplan'} "
                      f"({_e}); run scripts/setup.sh") from None

from ._errors import EXIT_CODES, ZeroplanError  # noqa: E402
from ._units import Unit, format_units, print_units, units  # noqa: E402
from ._profile import profile  # noqa: E402
from ._simulate import simulate  # noqa: E402
from ._record import record  # noqa: E402
from ._engine import Engine, LocalShard, wrap  # noqa: E402

__version__ = _C.__version__
__all__ = ["units", "Unit", "format_units", "print_units", "profile", "simulate", "record", "ZeroplanError",
           "EXIT_CODES", "load_factory", "wrap", "Engine", "LocalShard"]

from ._factory import load_factory  # noqa: E402

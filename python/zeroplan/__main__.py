"""python -m zeroplan profile --python FILE.py:FACTORY [...]: the Python side of `zeroplan profile --python`
(the CLI runs this; it can also be run by hand). Errors: one line on stderr (and in --error-file), the
CLI's exit codes; a Python traceback only with --verbose."""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zeroplan")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile", help="profile FILE.py:FACTORY's model -> ModelProfile")
    p.add_argument("--python", required=True, metavar="FILE.py:FACTORY")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--error-file", default="")
    p.add_argument("--units", default="auto", help="auto, or comma-separated unit classes or module names")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--batches", default="")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--concurrent-ranks", type=int, default=1)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--trace", default="")
    p.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    try:
        import zeroplan
        model, make_batch, loss_fn = zeroplan.load_factory(a.python)
        batches = [int(b) for b in a.batches.split(",") if b] if a.batches else []
        ref = a.batch if a.batch is not None else (min(batches) if batches else 1)
        if not batches:
            batches = [ref, 2 * ref]
        policy = "auto" if a.units == "auto" else [u for u in a.units.split(",") if u]
        path = os.path.abspath(a.python.rsplit(":", 1)[0])
        # --dtype bf16|fp16: the fp32 profile with the units' times at that dtype (torch.autocast) recorded
        dtypes = [] if a.dtype == "fp32" else [a.dtype]
        doc = zeroplan.profile(model, make_batch, loss_fn, batches=batches, batch=ref, policy=policy, dtypes=dtypes,
                               name=a.python.rsplit(":", 1)[1], source=f"python:{path}:{a.python.rsplit(':', 1)[1]}",
                               repeats=a.repeats, warmup=a.warmup, threads=a.threads, device=a.device,
                               concurrent_ranks=a.concurrent_ranks, progress=a.progress, trace=a.trace or None,
                               print_units=True)
        with open(a.output, "w") as f:
            json.dump(doc, f, indent=2)
        return 0
    except Exception as e:  # noqa: BLE001 - one line and the kind's exit code
        from zeroplan._errors import ZeroplanError
        code = e.exit_code if isinstance(e, ZeroplanError) else 3
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if not isinstance(e, ZeroplanError):
            line = f"{type(e).__name__}: {line}"
        if a.verbose:
            traceback.print_exc()
        if a.error_file:
            with open(a.error_file, "w") as f:
                f.write(line + "\n")
        else:
            print(f"zeroplan profile: {line}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())

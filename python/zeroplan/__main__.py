"""python -m zeroplan profile|train --python FILE.py:FACTORY [...]: the Python side of `zeroplan profile
--python` and of each rank of `zeroplan run --python` (the CLI runs these; they can also be run by hand, train
under torchrun). Errors: one line on stderr (and in --error-file, or for a rank its launcher's error file),
the CLI's exit codes; a Python traceback only with --verbose."""
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
    t = sub.add_parser("train", help="one rank of a synthetic-data run of FILE.py:FACTORY's model under a plan")
    t.add_argument("--python", required=True, metavar="FILE.py:FACTORY")
    t.add_argument("--plan", required=True)
    t.add_argument("--steps", type=int, default=5)
    t.add_argument("--warmup", type=int, default=1)
    t.add_argument("--threads", type=int, default=0)
    t.add_argument("--device", default="cpu")
    t.add_argument("--checkpoint-dir", default="")
    t.add_argument("--checkpoint-every", type=int, default=0)
    t.add_argument("--checkpoint-keep", type=int, default=0)
    t.add_argument("--resume", default="")
    t.add_argument("--resume-other-run", action="store_true")
    t.add_argument("--device-memory-limit", type=int, default=0)
    t.add_argument("-o", "--output", default="", help="the rank's RunResult (default: the launcher's folder)")
    t.add_argument("--error-file", default="")
    t.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    if a.command == "train":
        return _guarded(a, lambda: _train(a))
    return _guarded(a, lambda: _profile(a))


def _die_with_launcher() -> None:
    """A rank dies with its launcher (`zeroplan run --python`, torchrun): SIGKILL when the parent goes, as the
    C++ ranks do; a launcher already gone (killed while this rank started) ends it at once."""
    if "RANK" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal
    expected = int(os.environ.get("ZEROPLAN_LAUNCHER_PID", os.getppid()))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        return
    if os.getppid() != expected or os.getppid() == 1:
        os._exit(128 + int(signal.SIGKILL))


def _train(a) -> int:
    _die_with_launcher()
    from zeroplan._train import train
    result = train(a.python, a.plan, a.steps, a.warmup, device=a.device, threads=a.threads,
                   checkpoint_dir=a.checkpoint_dir, checkpoint_every=a.checkpoint_every, checkpoint_keep=a.checkpoint_keep, resume=a.resume,
                   resume_other_run=a.resume_other_run,
                   memory_limit=a.device_memory_limit)
    out = a.output
    if not out and os.environ.get("ZEROPLAN_OUTPUT_DIR"):
        out = os.path.join(os.environ["ZEROPLAN_OUTPUT_DIR"], f"rank{result['rank']}.json")
    if out:
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, out)
    else:
        print(json.dumps(result))
    from zeroplan import _session
    if _session._SESSION is not None:
        _session._SESSION.finish()
    return 0


def _guarded(a, body) -> int:
    try:
        return body()
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
            print(f"zeroplan {a.command}: {line}", file=sys.stderr)
        if a.command == "train":
            from zeroplan import _session
            if _session._SESSION is not None:
                _session._SESSION.fail(line)  # the store and the launcher's error file name this rank's line
        return code


def _profile(a) -> int:
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


if __name__ == "__main__":
    sys.exit(main())

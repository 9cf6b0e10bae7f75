// A plain-PyTorch training script for the plan (exports.h): FSDP2's fully_shard per unit class (stages 2-3),
// DDP (stage 0) or DDP with ZeroRedundancyOptimizer (stage 1), MixedPrecisionPolicy, CPUOffloadPolicy,
// checkpoint_wrapper and the optimizer, run under torchrun with the user's model factory.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "export_common.h"
#include "zeroplan/profiles/json_io.h"
#include "zeroplan/tuner/exports.h"

namespace zeroplan::tuner {
namespace {

// The script's body: everything but the plan's constants (written above it). Plain Python, no zeroplan
// unless --record is given.
constexpr const char* kBody = R"PY(

def load_factory(spec):
    """FILE.py:FACTORY -> the factory function (zeroplan profile --python's contract)."""
    path, _, name = spec.rpartition(":")
    if not path or not name:
        sys.exit(f"train_fsdp2.py: --model {spec}: expected FILE.py:FACTORY")
    module_spec = importlib.util.spec_from_file_location("user_model", path)
    if module_spec is None:
        sys.exit(f"train_fsdp2.py: --model {spec}: cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    module_spec.loader.exec_module(module)
    return getattr(module, name)


def call(model, batch):
    """model(batch) as make_batch means it: keyword arguments, (args, kwargs), a tuple of arguments, a tensor."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, tuple) and len(batch) >= 2 and isinstance(batch[0], tuple) and isinstance(batch[1], dict):
        return model(*batch[0], **batch[1])
    if isinstance(batch, tuple):
        return model(*batch)
    return model(batch)


def take(batch, first, count, device):
    """Samples [first, first + count) of every tensor of the batch, on the device."""
    if isinstance(batch, torch.Tensor):
        return batch[first:first + count].to(device)
    if isinstance(batch, dict):
        return {k: take(v, first, count, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(take(v, first, count, device) for v in batch)
    return batch


def optimizer_for(params):
    kind = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[OPTIMIZER["name"]]
    kw = {k: v for k, v in OPTIMIZER.items() if k != "name"}
    if ZERO_STAGE == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(params, optimizer_class=kind, **kw)
    return kind(params, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="FILE.py:FACTORY returning (model, make_batch, loss_fn)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: torch's default)")
    ap.add_argument("--record", help="write a zeroplan RunRecord of the run (zeroplan.record), for zeroplan compare")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=5))
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != WORLD_SIZE:
        sys.exit(f"train_fsdp2.py: the plan is for {WORLD_SIZE} ranks; torchrun started {world}")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    model, make_batch, loss_fn = load_factory(a.model)()
    model.to(device)
    is_unit = lambda m: type(m).__name__ in UNIT_CLASSES
    if not any(is_unit(m) for m in model.modules()):
        sys.exit(f"train_fsdp2.py: the model has no module of class {', '.join(UNIT_CLASSES)} (the profile's units)")
    if CHECKPOINT:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=is_unit)
        units = [m for m in model.modules() if is_unit(getattr(m, "_checkpoint_wrapped_module", None))]
    else:
        units = [m for m in model.modules() if is_unit(m)]
    if ZERO_STAGE >= 2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        kw = {"mesh": init_device_mesh(device.type, (world,)), "reshard_after_forward": RESHARD_AFTER_FORWARD}
        if PARAM_DTYPE is not None:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=PARAM_DTYPE, reduce_dtype=REDUCE_DTYPE)
        if OFFLOAD:
            kw["offload_policy"] = CPUOffloadPolicy()
        for m in units:
            fully_shard(m, **kw)
        fully_shard(model, **kw)
        if ZERO_STAGE == 3 and PREFETCH_DEPTH > 1:  # the plan gathers more than the next unit ahead
            for i, m in enumerate(units):
                m.set_modules_to_forward_prefetch(units[i + 1:i + 1 + PREFETCH_DEPTH])
                m.set_modules_to_backward_prefetch(units[max(0, i - PREFETCH_DEPTH):i][::-1])
        wrapped = model
    else:
        from torch.nn.parallel import DistributedDataParallel
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = optimizer_for(wrapped.parameters())
    recording = contextlib.nullcontext(None)
    if a.record:
        import zeroplan
        recording = zeroplan.record(a.record, model=model, optimizer=opt, plan=PLAN, name=MODEL_NAME)
    per_rank = MICRO_BATCH * MICROBATCHES
    with recording as rec:
        for step in range(a.steps):
            # The step's global batch; rank r trains samples [r x per_rank, (r + 1) x per_rank), in microbatches.
            batch = make_batch(per_rank * world)
            total = 0.0
            for k in range(MICROBATCHES):
                mb = take(batch, rank * per_rank + k * MICRO_BATCH, MICRO_BATCH, device)
                last = k == MICROBATCHES - 1
                sync = contextlib.nullcontext() if last or ZERO_STAGE >= 2 else wrapped.no_sync()
                with sync:
                    loss = loss_fn(call(wrapped, mb), mb) / MICROBATCHES
                    loss.backward()
                total += loss.item()
            if MAX_GRAD_NORM > 0:  # the global norm over every shard (DTensor gradients under fully_shard)
                torch.nn.utils.clip_grad_norm_(wrapped.parameters(), MAX_GRAD_NORM)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if rec is not None:
                rec.loss(total)
            if rank == 0:
                print(f"step {step} loss {total:.6f}", flush=True)
    dist.barrier()
    del wrapped, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
)PY";

std::string py_dtype(const std::string& d) {
  if (d == "bf16") return "torch.bfloat16";
  if (d == "fp16") return "torch.float16";
  return "None";
}

std::string py_bool(bool b) { return b ? "True" : "False"; }

}  // namespace

std::vector<std::string> repeated_unit_classes(const ModelProfile& model) {
  // The root's pieces (root:pre, root:post, glue: not recomputable) share the model's class: not a layer.
  std::map<std::string, int> seen;
  for (const UnitProfile& u : model.units)
    if (u.recomputable) seen[u.type] += u.count;
  std::vector<std::string> out;
  for (const UnitProfile& u : model.units)
    if (u.recomputable && seen[u.type] > 1 && std::find(out.begin(), out.end(), u.type) == out.end())
      out.push_back(u.type);
  if (out.empty()) out.push_back(wrap_class(model));
  return out;
}

Export export_fsdp2_script(const Plan& p, const ModelProfile& model) {
  Export e{"FSDP2 training script", "train_fsdp2.py", "", {}, {}};
  const std::vector<std::string> classes = repeated_unit_classes(model);
  auto& no = e.unsupported;
  if (p.offload_model.enabled) no.emplace_back("fairscale OffloadModel (layer-by-layer slices) has no FSDP2 equivalent");
  if (p.localsgd()) no.emplace_back("LocalSGD / SlowMo: the script reduces gradients every step");
  if (p.adascale) no.emplace_back("AdaScale has no PyTorch implementation");
  if (p.pipeline_stages > 1) no.emplace_back("pipeline parallelism (GPipe / 1F1B stages) is not in the script");
  if (p.offload.activations_ratio > 0)
    no.push_back(fmt::format("partial activation offload (ratio {}) has no FSDP2 setting", p.offload.activations_ratio));
  if (p.checkpoint_offload) no.emplace_back("checkpoint_offload: checkpoint_wrapper keeps checkpointed inputs on the device");
  if (p.precision.broadcast_fp16) no.emplace_back("broadcast_fp16 (fairscale OSS) has no FSDP2 equivalent");
  const bool any = p.offload.params || p.offload.grads || p.offload.optimizer;
  const bool all = p.offload.params && p.offload.grads && p.offload.optimizer;
  if (any && (!all || p.zero_stage < 2))
    no.emplace_back("FSDP2's CPUOffloadPolicy moves parameters, gradients and the optimizer step to the host together, at "
                    "ZeRO stages 2-3; the plan offloads only some of them or shards less");
  const bool sixteen = p.precision.param_dtype != "fp32";
  if (sixteen && p.zero_stage < 2)
    no.push_back(fmt::format("{} parameters at ZeRO stage {}: the script's mixed precision is FSDP2's MixedPrecisionPolicy "
                             "(stages 2-3)", p.precision.param_dtype, p.zero_stage));
  if (p.precision.param_dtype != p.precision.compute_dtype)
    no.push_back(fmt::format("parameters in {} with compute in {}: FSDP2 computes in its parameter dtype",
                             p.precision.param_dtype, p.precision.compute_dtype));
  if (sixteen && !p.precision.master_fp32)
    no.emplace_back("16-bit parameters without an fp32 master copy: FSDP2 keeps fp32 sharded parameters");
  if (p.precision.param_dtype == "fp16")
    no.emplace_back("fp16 needs a gradient scaler (torch.amp.GradScaler with FSDP2): the script trains bf16 or fp32");
  if (p.checkpointing.mode != Checkpointing::Mode::none) {
    for (int i = 0; i < static_cast<int>(model.units.size()); ++i) {
      const UnitProfile& u = model.units[static_cast<std::size_t>(i)];
      if (!u.recomputable) continue;  // the root's pieces: never recomputed
      const bool is_class = u.recomputable && std::find(classes.begin(), classes.end(), u.type) != classes.end();
      if (p.checkpointing.applies_to(i) != is_class) {
        no.push_back(fmt::format("checkpointing {}: the script checkpoints exactly the {} modules",
                                 exports::checkpointing_text(p.checkpointing), fmt::join(classes, ", ")));
        break;
      }
    }
  }
  if (!e.expressible()) return e;

  const Optimizer& o = p.optimizer;
  std::string opt = fmt::format("{{\"name\": \"{}\", \"lr\": {}", o.name, o.lr);
  if (o.name == "sgd") {
    opt += fmt::format(", \"momentum\": {}", o.momentum);
  } else {
    opt += fmt::format(", \"betas\": ({}, {}), \"eps\": {}", o.betas[0], o.betas[1], o.eps);
  }
  opt += fmt::format(", \"weight_decay\": {}}}", o.weight_decay);
  std::vector<std::string> quoted;
  for (const auto& c : classes) quoted.push_back(fmt::format("\"{}\"", c));
  const std::string plan_json = to_json_string(p);
  // FSDP2 reduces in REDUCE_DTYPE (None: the parameter dtype); the plan's reduce dtype, fp32 when it is fp32.
  const std::string reduce = !sixteen ? "None" : p.precision.reduce_dtype == "fp32" ? "torch.float32"
                                                                                    : py_dtype(p.precision.reduce_dtype);
  e.text = fmt::format(
      "#!/usr/bin/env python3\n"
      "\"\"\"FSDP2 training script written by zeroplan tune for: {summary}.\n\n"
      "Plain PyTorch: {how}. Run it under torchrun with the model factory you profiled:\n\n"
      "    torchrun --nproc-per-node {world} train_fsdp2.py --model FILE.py:FACTORY --steps 10 [--record run.json]\n\n"
      "FACTORY() returns (model, make_batch, loss_fn) as for `zeroplan profile --python`: make_batch(n) gives n samples\n"
      "(a dict of keyword arguments, a tuple of arguments or a tensor), loss_fn(output, batch) the loss. --record\n"
      "writes a RunRecord (zeroplan.record) that `zeroplan compare` judges against the plan's prediction.\n"
      "\"\"\"\n"
      "import argparse\nimport contextlib\nimport importlib.util\nimport json\nimport os\nimport sys\n"
      "from datetime import timedelta\n\nimport torch\nimport torch.distributed as dist\n\n"
      "# The plan (zeroplan's Plan document below, for the record).\n"
      "WORLD_SIZE = {world}\nMICRO_BATCH = {micro}\nMICROBATCHES = {microbatches}\nZERO_STAGE = {stage}\n"
      "RESHARD_AFTER_FORWARD = {reshard}\nPREFETCH_DEPTH = {depth}\nPARAM_DTYPE = {param}\nREDUCE_DTYPE = {reduce}\nOFFLOAD = {offload}\n"
      "CHECKPOINT = {ckpt}\nUNIT_CLASSES = ({classes},)\nOPTIMIZER = {opt}\nMAX_GRAD_NORM = {clip}\n"
      "MODEL_NAME = \"{name}\"\nPLAN = {plan}\n",
      fmt::arg("summary", exports::plan_summary(p)),
      fmt::arg("how", p.zero_stage >= 2 ? "fully_shard on each unit, then on the root"
                      : p.zero_stage == 1 ? "DistributedDataParallel with ZeroRedundancyOptimizer"
                                          : "DistributedDataParallel"),
      fmt::arg("world", p.world_size), fmt::arg("micro", p.micro_batch), fmt::arg("microbatches", p.microbatches),
      fmt::arg("stage", p.zero_stage), fmt::arg("reshard", py_bool(p.zero_stage == 3 && p.reshard_after_forward)),
      fmt::arg("depth", std::max(1, p.prefetch_ahead())),  // FSDP2 prefetches one unit at least
      fmt::arg("param", py_dtype(p.precision.param_dtype)),
      fmt::arg("reduce", reduce),
      fmt::arg("offload", py_bool(all)), fmt::arg("ckpt", py_bool(p.checkpointing.mode != Checkpointing::Mode::none)),
      fmt::arg("classes", fmt::join(quoted, ", ")), fmt::arg("opt", opt),
      fmt::arg("clip", fmt::format("{}", p.optimizer.max_grad_norm)), fmt::arg("name", model.name),
      fmt::arg("plan", fmt::format("json.loads(r'''{}''')", plan_json)));
  e.text += kBody;
  e.notes.push_back(fmt::format("torchrun --nproc-per-node {} train_fsdp2.py --model FILE.py:FACTORY: fully_shard per {} "
                                "module as the profile's units",
                                p.world_size, fmt::join(classes, ", ")));
  return e;
}

}  // namespace zeroplan::tuner

// A fairscale snippet: the wrappers and arguments that run the plan, around the user's model and loop.
#include <fmt/format.h>

#include "export_common.h"
#include "zeroplan/profiles/pipeline.h"
#include "text.h"
#include "zeroplan/tuner/exports.h"

namespace zeroplan::tuner {
namespace {

std::string py_bool(bool v) { return v ? "True" : "False"; }
std::string torch_dtype(const std::string& d) {
  return d == "bf16" ? "torch.bfloat16" : d == "fp16" ? "torch.float16" : "torch.float32";
}

// The snippet scales the loss (GradScaler) for fp16 compute or when the plan scales it.
bool scales_loss(const Plan& p) {
  return p.precision.compute_dtype == "fp16" || p.precision.loss_scale.mode != LossScale::Mode::none;
}

std::string optimizer_ctor(const Plan& p) {
  const Optimizer& o = p.optimizer;
  if (o.name == "sgd")
    return fmt::format("torch.optim.SGD, lr={}, momentum={}, weight_decay={}", o.lr, o.momentum, o.weight_decay);
  return fmt::format("torch.optim.{}, lr={}, betas=({}, {}), eps={}, weight_decay={}", o.name == "adamw" ? "AdamW" : "Adam", o.lr,
                     o.betas[0], o.betas[1], o.eps, o.weight_decay);
}

// What fairscale cannot express of the plan (empty: the snippet runs it).
std::vector<std::string> fairscale_gaps(const Plan& p, int devices_per_node) {
  std::vector<std::string> no;
  if (p.offload.activations_ratio > 0)
    no.push_back(fmt::format("partial activation offload (ratio {}) has no fairscale equivalent", p.offload.activations_ratio));
  if (p.zero_stage >= 1 && p.zero_stage <= 2 && (p.offload.optimizer || p.offload.grads))
    no.emplace_back("OSS and ShardedDataParallel keep the optimizer on the device: no optimizer offload at stage 1-2");
  if (p.zero_stage == 3) {
    const bool any = p.offload.params || p.offload.grads || p.offload.optimizer;
    const bool all = p.offload.params && p.offload.grads && p.offload.optimizer;
    if (any && !all)
      no.emplace_back("FullyShardedDataParallel's move_params_to_cpu moves parameters, gradients and the optimizer step together; "
                      "the plan offloads only some of them");
  }
  // Pipelines: fairscale Pipe, one process per pipeline driving its stages on that node's devices.
  const bool pipe = p.pipeline_stages > 1;
  if (pipe) {
    if (p.pipeline.schedule != "gpipe")
      no.emplace_back("fairscale Pipe runs the GPipe schedule only; the plan's schedule is 1f1b (DeepSpeed's PipelineEngine runs it)");
    if (p.pipeline_stages > devices_per_node)
      no.push_back(fmt::format("fairscale Pipe puts a pipeline's stages on one process's devices: {} stages > {} devices per node",
                               p.pipeline_stages, devices_per_node));
    if (p.zero_stage == 2)
      no.emplace_back("ShardedDataParallel wraps a module on one device; around a Pipe the snippet offers DDP (stage 0) and OSS "
                      "(stage 1)");
  }
  if (p.precision.param_dtype != "fp32" && !p.precision.master_fp32)
    no.emplace_back("16-bit parameters without an fp32 master copy: fairscale keeps fp32 parameters");
  if (p.slowmo() && p.precision.param_dtype != "fp32")
    no.push_back(fmt::format("SlowMo with {} parameters: fairscale's slow update asserts fp32 parameters (fp16 needs "
                             "fairseq's fp32_params)", p.precision.param_dtype));
  if (p.adascale && p.zero_stage >= 2)
    no.push_back(fmt::format("AdaScale at stage {}: fairscale's AdaScale reads every full gradient after the reduction "
                             "(DDP and OSS, stages 0-1), which stages 2-3 shard", p.zero_stage));
  if (p.adascale && p.localsgd())
    no.emplace_back("AdaScale with LocalSGD: AdaScale's gain needs the gradients averaged across all ranks every step");
  if (p.adascale && static_cast<std::int64_t>(p.world_size) * p.microbatches <= 1)
    no.emplace_back("AdaScale on 1 rank without accumulation: fairscale's AdaScale needs at least two gradients per step");
  return no;
}

// The snippet's two parts: the imports it needs, and the lines that wrap the model and make the optimizer.
struct Snippet {
  std::string imports;
  std::string wrap;
};

std::string ddp_line(const Plan& p) {
  return fmt::format("model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb={})\n",
                     text::num(static_cast<double>(p.buckets.all_reduce_bucket_bytes) / (1 << 20)));
}

// The plain optimizer over the (wrapped) model's parameters; `opt` is optimizer_ctor's text.
std::string optimizer_line(const std::string& opt) {
  return fmt::format("optimizer = {}(model.parameters(), {})\n", opt.substr(0, opt.find(',')), opt.substr(opt.find(',') + 2));
}

std::string oss_line(const Plan& p, const std::string& opt) {
  return fmt::format("optimizer = OSS(model.parameters(), optim={}, broadcast_fp16={})\n", opt, py_bool(p.precision.broadcast_fp16));
}

void wrap_offload_model(const Plan& p, const ModelProfile& model, const std::string& opt, Snippet& out) {
  std::string& wrap = out.wrap;
  out.imports += "from fairscale.experimental.nn.offload import OffloadModel\n";
  wrap += fmt::format(
      "# `units` is the model as a list of its {} units (an nn.Sequential of them is what OffloadModel slices).\n"
      "model = OffloadModel(\n"
      "    model=torch.nn.Sequential(*units),\n"
      "    device=torch.device(\"cuda\"),\n"
      "    offload_device=torch.device(\"cpu\"),\n"
      "    num_slices={},\n"
      "    checkpoint_activation={},\n"
      "    num_microbatches={},\n"
      ")\n",
      model.expanded_unit_count(), p.offload_model.slices, py_bool(p.offload_model.checkpoint_activation),
      p.offload_model.microbatches);
  wrap += ddp_line(p);
  wrap += optimizer_line(opt);
}

// slowmo_momentum 0 and slowmo_lr 1 turn fairscale's slow update off (plain LocalSGD). The slow buffers are
// kept whole on every rank (slowmo_memory_efficient=False), as the simulator counts them.
void wrap_localsgd(const Plan& p, int devices_per_node, const std::string& opt, Snippet& out) {
  std::string& wrap = out.wrap;
  out.imports += "from fairscale.experimental.nn.data_parallel import SlowMoBaseAlgorithm, SlowMoDistributedDataParallel\n";
  wrap += fmt::format(
      "model = SlowMoDistributedDataParallel(\n"
      "    model,\n"
      "    nprocs_per_node={},\n"
      "    slowmo_base_algorithm=SlowMoBaseAlgorithm.LOCALSGD,\n"
      "    localsgd_frequency={},\n"
      "    slowmo_momentum={},\n"
      "    slowmo_lr={},\n"
      "    slowmo_frequency={},\n"
      "    slowmo_memory_efficient=False,\n"
      "    broadcast_buffers=False,\n"
      ")\n",
      devices_per_node, p.localsgd_frequency, text::num(p.slowmo() ? p.slowmo_momentum : 0.0),
      text::num(p.slowmo() ? p.slowmo_lr : 1.0), p.slowmo_frequency > 0 ? p.slowmo_frequency : p.localsgd_frequency);
  wrap += optimizer_line(opt);
}

// fairscale Pipe: one process per pipeline driving its stages on that node's devices, OSS at stage 1.
void wrap_pipe(const Plan& p, const ModelProfile& model, const std::string& opt, Snippet& out) {
  std::string& wrap = out.wrap;
  out.imports += "from fairscale.nn import Pipe\n";
  const std::vector<int> balance = pipeline_balance(p, model);
  std::vector<std::string> b;
  for (int n : balance) b.push_back(std::to_string(n));
  const char* how = p.pipeline.balance.mode == PipelineBalance::Mode::time     ? "by time (fairscale.nn.pipe.balance.balance_by_time "
                                                                               "measures the same on your devices)"
                    : p.pipeline.balance.mode == PipelineBalance::Mode::memory ? "by memory (fairscale.nn.pipe.balance.balance_by_size "
                                                                               "measures the same on your devices)"
                                                                               : "as the plan gives it";
  wrap += fmt::format(
      "# One process per pipeline: its {} stages on this node's devices; units per stage balanced {}.\n"
      "first = (dist.get_rank() % (torch.cuda.device_count() // {})) * {}\n"
      "model = Pipe(\n"
      "    torch.nn.Sequential(*units),\n"
      "    balance=[{}],\n"
      "    devices=[torch.device(\"cuda\", first + i) for i in range({})],\n"
      "    chunks={},\n"
      "    checkpoint=\"{}\",\n"
      ")\n",
      p.pipeline_stages, how, p.pipeline_stages, p.pipeline_stages, text::join(b, ", "), p.pipeline_stages, p.microbatches,
      p.pipeline.checkpoint);
  if (p.zero_stage == 1) {
    out.imports += "from fairscale.optim.oss import OSS\n";
    wrap += oss_line(p, opt);
  } else {
    wrap += optimizer_line(opt);
  }
  wrap += ddp_line(p);
}

// Stages 0-2: DDP, OSS + DDP, OSS + ShardedDataParallel.
void wrap_data_parallel(const Plan& p, const std::string& opt, Snippet& out) {
  if (p.zero_stage == 0) {
    out.wrap += ddp_line(p) + optimizer_line(opt);
    return;
  }
  out.imports += "from fairscale.optim.oss import OSS\n";
  out.wrap += oss_line(p, opt);
  if (p.zero_stage == 1) {
    out.wrap += ddp_line(p);
  } else {
    out.imports += "from fairscale.nn.data_parallel import ShardedDataParallel\n";
    out.wrap += fmt::format("model = ShardedDataParallel(model, optimizer, reduce_buffer_size={})\n", p.buckets.reduce_buffer_elems);
  }
}

// Stage 3: FullyShardedDataParallel per unit (auto_wrap), the root keeping the rest.
void wrap_fsdp(const Plan& p, const ModelProfile& model, const std::string& opt, Snippet& out) {
  std::string& wrap = out.wrap;
  const bool mixed = p.precision.compute_dtype != "fp32";
  const std::string dtype = torch_dtype(p.precision.compute_dtype);
  out.imports += "from fairscale.nn import auto_wrap, enable_wrap\n";
  out.imports += "from fairscale.nn.data_parallel import FullyShardedDataParallel as FSDP\n";
  const std::string args = fmt::format(
      "reshard_after_forward={}, move_params_to_cpu={}, move_grads_to_cpu={}, mixed_precision={}, compute_dtype={}, "
      "fp32_reduce_scatter={}, flatten_parameters={}",
      py_bool(p.reshard_after_forward), py_bool(p.offload.params), py_bool(p.offload.grads), py_bool(mixed), dtype,
      py_bool(p.precision.fp32_reduce_scatter), py_bool(p.flat_params));
  wrap += fmt::format(
      "# Each {} unit becomes its own FSDP instance; the root keeps the rest.\n"
      "fsdp_args = dict({})\n"
      "with enable_wrap(wrapper_cls=FSDP, **fsdp_args):\n"
      "    for i, unit in enumerate(units):\n"
      "        units[i] = auto_wrap(unit)\n"
      "model = FSDP(model, **fsdp_args)\n",
      wrap_class(model), args);
  wrap += optimizer_line(opt);
}

// The activation checkpointing of the plan's units (checkpoint_wrapper; offload_to_cpu with checkpoint_offload).
std::string checkpoint_lines(const Plan& p) {
  std::string pre;
  if (p.checkpointing.mode != Checkpointing::Mode::none) {
    const std::string args = p.checkpoint_offload ? ", offload_to_cpu=True" : "";
    const std::string where = p.checkpoint_offload ? " its input kept on the host until then" : "";
    if (p.checkpointing.mode == Checkpointing::Mode::all)
      pre += fmt::format("# Checkpoint every unit (recomputed in backward{}).\nunits = [checkpoint_wrapper(u{}) for u in units]\n",
                         p.checkpoint_offload ? "," + where : "", args);
    else {
      std::vector<std::string> idx;
      for (int i : p.checkpointing.units) idx.push_back(std::to_string(i));
      pre += fmt::format(
          "# Checkpoint these profile units (every repetition of each){}: {}.\n"
          "for i in [{}]:\n"
          "    units[i] = checkpoint_wrapper(units[i]{})\n",
          p.checkpoint_offload ? ", each with" + where : "", exports::checkpointing_text(p.checkpointing), text::join(idx), args);
    }
  }
  return pre;
}

// optimizer.max_grad_norm before the step (after unscaling where a scaler scales the loss); `call` has a
// {} for the norm.
std::string clip_lines(const Plan& p, bool fp16, const char* call) {
  if (!(p.optimizer.max_grad_norm > 0)) return "";
  std::string s = fp16 ? "    scaler.unscale_(optimizer)\n" : "";
  return s + "    " + fmt::format(fmt::runtime(call), p.optimizer.max_grad_norm) + "\n";
}

// The step: Pipe splits the batch into its chunks itself (one forward and one backward); otherwise one
// backward per micro batch, under no_sync but the last where the wrapper has one.
std::string train_step(const Plan& p, bool no_sync) {
  const bool mixed = p.precision.compute_dtype != "fp32";
  const bool fp16 = scales_loss(p);
  const std::string dtype = torch_dtype(p.precision.compute_dtype);
  std::string s;
  if (p.pipeline_stages > 1) {
    s += "\n\ndef train_step(x, y):\n";
    s += fmt::format("    # x, y: {} samples (micro batch {} x {} chunks)\n", p.micro_batch * p.microbatches, p.micro_batch,
                     p.microbatches);
    s += "    optimizer.zero_grad(set_to_none=False)\n";
    const std::string fwd = "loss_fn(model(x.to(model.module.devices[0])), y.to(model.module.devices[-1]))";
    if (mixed) s += fmt::format("    with torch.autocast(\"cuda\", dtype={}):\n        loss = {}\n", dtype, fwd);
    else s += "    loss = " + fwd + "\n";
    s += fp16 ? "    scaler.scale(loss).backward()\n" : "    loss.backward()\n";
    s += clip_lines(p, fp16, "torch.nn.utils.clip_grad_norm_(model.parameters(), {})");
    s += fp16 ? "    scaler.step(optimizer)\n    scaler.update()\n" : "    optimizer.step()\n";
    return s;
  }
  s += "\n\ndef train_step(batches):\n";
  s += fmt::format("    # batches: {} micro batches of {} samples\n", p.microbatches, p.micro_batch);
  s += "    optimizer.zero_grad(set_to_none=False)\n";
  s += "    for k, (x, y) in enumerate(batches):\n";
  std::string indent = "        ";
  if (no_sync) {
    s += fmt::format("        ctx = model.no_sync() if k < {} else contextlib.nullcontext()\n", p.microbatches - 1);
    s += "        with ctx:\n";
    indent += "    ";
  }
  if (mixed && p.zero_stage != 3)
    s += indent + fmt::format("with torch.autocast(\"cuda\", dtype={}):\n", dtype) + indent + "    loss = loss_fn(model(x), y)\n";
  else
    s += indent + "loss = loss_fn(model(x), y)\n";
  s += indent + (fp16 ? "scaler.scale(loss).backward()\n" : "loss.backward()\n");
  if (p.adascale) s += "    gain = optimizer.gain()  # add it to the scale-invariant step count the lr schedule follows\n";
  // The norm over every shard: FSDP's own clip_grad_norm_, OSS's clip_grad_norm (stages 1-2), torch's for DDP.
  s += clip_lines(p, fp16,
                  p.zero_stage == 3                             ? "model.clip_grad_norm_({})"
                  : p.zero_stage == 1 || p.zero_stage == 2      ? "optimizer.clip_grad_norm({})"
                                                                : "torch.nn.utils.clip_grad_norm_(model.parameters(), {})");
  s += fp16 ? "    scaler.step(optimizer)\n    scaler.update()\n" : "    optimizer.step()\n";
  if (p.localsgd()) s += "    model.perform_slowmo(optimizer)\n";
  if (p.adascale) s += "    return gain\n";
  return s;
}

// What differs between the snippet and the plan, and what the user supplies.
std::vector<std::string> fairscale_notes(const Plan& p) {
  const std::string dtype = torch_dtype(p.precision.compute_dtype);
  const bool pipe = p.pipeline_stages > 1;
  Export e;
  if (p.zero_stage <= 2 && p.precision.param_dtype != "fp32")
    e.notes.push_back(fmt::format("stages 0-2 use torch.autocast({}): it casts per op instead of keeping the plan's {} "
                                  "compute copy of the parameters (less memory, a little more cast work)",
                                  dtype, p.precision.param_dtype));
  if (p.zero_stage <= 2 && p.flat_params)
    e.notes.emplace_back("OSS / DDP step per tensor: use a foreach or fused optimizer for the plan's flat step");
  if (p.localsgd() && p.microbatches > 1)
    e.notes.push_back(fmt::format("SlowMoDistributedDataParallel all-reduces gradients within the node after each of the {} "
                                  "backward passes (it has no no_sync); the plan reduces once per step",
                                  p.microbatches));
  if (p.localsgd_warmup_steps > 0)
    e.notes.push_back(fmt::format("localsgd_warmup_steps {}: SlowMoDistributedDataParallel has no warm-up; train the first "
                                  "{} steps with DistributedDataParallel (or use torch's PostLocalSGDOptimizer, "
                                  "warmup_steps={}) before wrapping",
                                  p.localsgd_warmup_steps, p.localsgd_warmup_steps, p.localsgd_warmup_steps));
  if (pipe)
    e.notes.push_back(fmt::format("launch {} processes ({} pipelines of {} stages; each process drives {} devices)",
                                  p.data_parallel_size(), p.data_parallel_size(), p.pipeline_stages, p.pipeline_stages));
  e.notes.emplace_back("`model`, `units` (the model's units in order), `loss_fn` are yours; the snippet shows the wrapping");
  return e.notes;
}

}  // namespace

Export export_fairscale(const Plan& p, const ModelProfile& model, int devices_per_node) {
  Export e;
  e.tool = "fairscale";
  e.file = "fairscale.py";
  e.unsupported = fairscale_gaps(p, devices_per_node);
  if (!e.expressible()) return e;

  const bool pipe = p.pipeline_stages > 1;
  const bool fp16 = scales_loss(p);
  std::string s;
  s += fmt::format("# fairscale wrapping written by zeroplan tune for: {}\n", exports::plan_summary(p));
  if (pipe)
    s += fmt::format("# Launch {} processes (torchrun), each driving one pipeline of {} stages on {} samples per step, in {} "
                     "chunks of {}.\n",
                     p.data_parallel_size(), p.pipeline_stages, p.micro_batch * p.microbatches, p.microbatches, p.micro_batch);
  else
    s += fmt::format("# Launch {} ranks (torchrun); each rank trains on micro batches of {} samples, {} per optimizer step.\n",
                     p.world_size, p.micro_batch, p.microbatches);
  s += "import torch\nimport torch.distributed as dist\n";
  Snippet out;
  const std::string opt = optimizer_ctor(p);
  if (p.checkpointing.mode != Checkpointing::Mode::none) out.imports += "from fairscale.nn import checkpoint_wrapper\n";
  if (p.offload_model.enabled) wrap_offload_model(p, model, opt, out);
  else if (p.localsgd()) wrap_localsgd(p, devices_per_node, opt, out);
  else if (pipe) wrap_pipe(p, model, opt, out);
  else if (p.zero_stage <= 2) wrap_data_parallel(p, opt, out);
  else wrap_fsdp(p, model, opt, out);
  if (p.adascale) {
    // The gain scales the SGD learning rate; progress is counted in scale-invariant steps (sum of gains).
    out.imports += "from fairscale.optim import AdaScale\n";
    out.wrap += fmt::format("optimizer = AdaScale(optimizer, world_size={}, num_gradients_to_accumulate={})\n", p.world_size,
                            p.microbatches);
  }
  s += out.imports + "\n" + checkpoint_lines(p) + out.wrap;
  if (fp16) {
    if (p.zero_stage >= 2) {
      s += "from fairscale.optim.grad_scaler import ShardedGradScaler\n";
      s += "scaler = ShardedGradScaler(init_scale=2.0**16, growth_interval=2000)\n";
    } else {
      s += "scaler = torch.cuda.amp.GradScaler(init_scale=2.0**16, growth_interval=2000)\n";
    }
  }
  // SlowMoDistributedDataParallel has no no_sync: it reduces within the node after every backward.
  const bool no_sync = !pipe && p.microbatches > 1 && !p.localsgd() && (p.zero_stage <= 1 || p.offload_model.enabled);
  s += train_step(p, no_sync);
  if (no_sync) s.insert(s.find("import torch\n"), "import contextlib\n");
  e.text = s;
  e.notes = fairscale_notes(p);
  return e;
}

}  // namespace zeroplan::tuner

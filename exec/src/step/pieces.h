// The executor's pieces, named like the simulator's lowering pieces (sim/src/lowering/context.h) where the
// concern is the same. Each owns one concern and decides the zero stage for it once, in its constructor;
// the step driver (executor.cpp) asks them what to do per unit and microbatch:
//   Ctx             the inputs, the units (flat parameters, shard layouts, borrowed weights), the comm
//                   tracker, and the unit/phase an error is reported against             (context.cpp)
//   ParamResidency  where parameters live: one full flat buffer (stages 0-2) or this rank's shard, gathered
//                   and released around each unit's forward and backward (stage 3)   (params_residency.cpp)
//   GradSync        where gradients accumulate and how ranks agree on them: bucketed all-reduce (stages
//                   0-1), per-unit reduce-scatter into this rank's shard (stages 2-3)         (dp_sync.cpp)
//   Activations     one microbatch's activations per unit: kept, or checkpointed and recomputed
//                                                                                       (activations.cpp)
//   ActivationOffload  a ratio of the kept ones' saved tensors to the host on the side lane and back
//                   before their unit's backward                                (activation_offload.cpp)
//   OptimizerStep   the optimizer state and the step on the device or the host, and the updated
//                   parameters back where ParamResidency keeps them                    (optimizer_step.cpp)
//   Precision       the dtype of every copy (Dtypes, in Ctx), the loss scale, and whether the ranks
//                   agree to skip a step with non-finite gradients                          (precision.cpp)
//   ReplicaSync     LocalSGD and SlowMo: which ranks reduce gradients each step, the periodic parameter
//                   average and the slow momentum update                                  (localsgd.cpp)
//   AdaScale        fairscale's AdaScale gain from the gradient variance across ranks       (adascale.cpp)
//   Checkpoint      this rank's shard of the model and optimizer states to disk and back, resharded
//                   when the number of ranks changed                                     (checkpoint.cpp)
//   OffloadModel    fairscale OffloadModel: slices of consecutive units visit the device one at a time,
//                   their gradients carried to the host; the micro batch in chunks, slice-boundary
//                   activations on the host with checkpoint_activation; its own schedule  (offload_model.cpp)
//   Pipeline        pipeline stages: which units this rank runs, the schedule's order, activations and
//                   their gradients to and from the neighbouring stages, tied weights across stages, the
//                   loss from the last stage                                                (pipeline.cpp)
//   Batches         the data loader: this rank's microbatches, the next one made on a worker thread on
//                   CUDA                                                                    (batches.cpp)
// and what every step driver does alike: a unit's backward, the loss, the model's input, the RNG state and
// buffers around a recompute (Recompute)                                              (autograd_step.cpp).
// Each piece has its header in pieces/; this one includes them all, for the step drivers.
#pragma once

#include "pieces/context.h"
#include "pieces/param_residency.h"
#include "pieces/grad_sync.h"
#include "pieces/activation_offload.h"
#include "pieces/activations.h"
#include "pieces/precision.h"
#include "pieces/optimizer_step.h"
#include "pieces/replica_sync.h"
#include "pieces/adascale.h"
#include "pieces/autograd_step.h"
#include "pieces/checkpoint.h"
#include "pieces/offload_model.h"
#include "pieces/pipeline.h"
#include "pieces/batches.h"

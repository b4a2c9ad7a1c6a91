// The description every op of the prism backend starts its OpPlan with: what the schedule, the log
// and the consistency check see of it (kind, c10d type, bytes, dtype, device, async flag, outputs).
// One place, so that every op family (reduce, gather, all-to-all, p2p) fills it alike.
#pragma once

#include <utility>
#include <vector>

#include "backend/backend.h"

namespace prism::backend {

// `like` gives the dtype and device; `outputs` are the tensors Work::result() hands back.
inline OpPlan describe_op(replay::OpKind kind, c10d::OpType op_type, int64_t size_bytes, const at::Tensor& like,
                          bool async_op, std::vector<at::Tensor> outputs) {
  OpPlan plan;
  plan.kind = kind;
  plan.op_type = op_type;
  plan.size_bytes = size_bytes;
  plan.dtype = like.scalar_type();
  plan.device = like.device();
  plan.async_op = async_op;
  plan.outputs = std::move(outputs);
  return plan;
}

}  // namespace prism::backend

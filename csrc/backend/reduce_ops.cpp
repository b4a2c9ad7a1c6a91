// Reductions of the prism backend: all-reduce (and coalesced), reduce, reduce-scatter (list,
// single tensor, coalesced).
//
// Mirror arithmetic: member m contributes x[stand_in(m)], so the reduction over the group equals the
// reduction over the real members where real member r's value counts stand_in_count(r) times. Each
// real member therefore "repeats" its own contribution that many times before the real reduction:
// multiply for sum/avg, power for product, nothing for max/min/and/or, parity for xor. Average is a
// sum divided by the group size afterwards (gloo has no AVG). With this process the only real member
// the repeat is the whole answer (avg: the value itself, untouched).
#include "backend/backend.h"

namespace prism::backend {

namespace {

using RedOp = c10d::ReduceOp::RedOpType;

RedOp checked_op(const c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case RedOp::SUM:
    case RedOp::AVG:
    case RedOp::PRODUCT:
    case RedOp::MIN:
    case RedOp::MAX:
    case RedOp::BAND:
    case RedOp::BOR:
    case RedOp::BXOR:
      return op.op_;
    default:
      TORCH_CHECK(false, "prism: ", what, " supports SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR and BXOR, got reduce op ",
                  static_cast<int>(op.op_));
  }
}

c10d::ReduceOp real_op(RedOp op) { return c10d::ReduceOp(op == RedOp::AVG ? RedOp::SUM : op); }

// In place: what `count` equal contributions of t reduce to.
void repeat_contribution(at::Tensor& t, RedOp op, int64_t count) {
  if (count == 1) {
    return;
  }
  switch (op) {
    case RedOp::SUM:
    case RedOp::AVG:
      t.mul_(count);
      break;
    case RedOp::PRODUCT:
      t.pow_(count);
      break;
    case RedOp::BXOR:
      if (count % 2 == 0) {
        t.zero_();
      }
      break;
    default:  // MIN, MAX, BAND, BOR: idempotent
      break;
  }
}

void finish_average(at::Tensor& t, RedOp op, int64_t group_size) {
  if (op != RedOp::AVG) {
    return;
  }
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) {
    t.div_(group_size);
  } else {
    t.div_(group_size, "trunc");
  }
}

// The local result when this process is the only real member: n equal contributions.
void mirror_alone(at::Tensor& t, RedOp op, int64_t group_size) {
  if (op != RedOp::AVG) {
    repeat_contribution(t, op, group_size);
  }
}

// Chunk i of a flat buffer holding n equal chunks, viewed with `like`'s shape.
at::Tensor chunk_of(const at::Tensor& buffer, int64_t n, int64_t i, const at::Tensor& like) {
  const int64_t chunk = buffer.numel() / n;
  return buffer.view({-1}).narrow(0, i * chunk, chunk).view(like.sizes());
}

// The real members' chunks of a reduce-scatter input, each repeated as this member's contribution.
at::Tensor real_chunks(const GroupLayout& layout, const at::Tensor& input, const at::Tensor& output, RedOp op) {
  std::vector<at::Tensor> chunks;
  for (int64_t r = 0; r < layout.num_real(); ++r) {
    auto chunk = chunk_of(input, layout.size(), layout.real_positions()[r], output).clone();
    repeat_contribution(chunk, op, layout.stand_in_count(layout.self_real_index()));
    chunks.push_back(chunk.view({-1}));
  }
  return at::cat(chunks);
}

void check_scatter_sizes(const at::Tensor& output, const at::Tensor& input, int64_t n, const char* what) {
  TORCH_CHECK(input.numel() == output.numel() * n, "prism: ", what, ": input has ", input.numel(),
              " elements, expected output's ", output.numel(), " times the group size ", n);
  TORCH_CHECK(input.is_contiguous() && output.is_contiguous(), "prism: ", what, " needs contiguous tensors");
}

}  // namespace

c10::intrusive_ptr<c10d::Work> PrismBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "prism: allreduce needs at least one tensor");
  const RedOp op = checked_op(opts.reduceOp, "allreduce");
  OpPlan plan;
  plan.kind = replay::OpKind::kAllReduce;
  plan.op_type = c10d::OpType::ALLREDUCE;
  plan.size_bytes = total_bytes(tensors);
  plan.dtype = tensors[0].scalar_type();
  plan.device = tensors[0].device();
  plan.async_op = opts.asyncOp;
  plan.outputs = tensors;
  const int64_t n = layout_.size();
  if (real_) {
    plan.issue_real = [this, tensors, opts, op]() mutable {
      for (auto& t : tensors) {
        repeat_contribution(t, op, layout_.stand_in_count(layout_.self_real_index()));
      }
      c10d::AllreduceOptions real_opts = opts;
      real_opts.reduceOp = real_op(op);
      return real_->allreduce(tensors, real_opts);
    };
    plan.local = [tensors, op, n]() mutable {
      for (auto& t : tensors) {
        finish_average(t, op, n);
      }
    };
  } else {
    plan.local = [tensors, op, n]() mutable {
      for (auto& t : tensors) {
        mirror_alone(t, op, n);
      }
    };
  }
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "prism: allreduce_coalesced needs at least one tensor");
  const RedOp op = checked_op(opts.reduceOp, "allreduce_coalesced");
  OpPlan plan;
  plan.kind = replay::OpKind::kAllReduce;
  plan.op_type = c10d::OpType::ALLREDUCE_COALESCED;
  plan.size_bytes = total_bytes(tensors);
  plan.dtype = tensors[0].scalar_type();
  plan.device = tensors[0].device();
  plan.async_op = opts.asyncOp;
  plan.outputs = tensors;
  const int64_t n = layout_.size();
  if (real_) {
    plan.issue_real = [this, tensors, opts, op]() mutable {
      for (auto& t : tensors) {
        repeat_contribution(t, op, layout_.stand_in_count(layout_.self_real_index()));
      }
      c10d::AllreduceCoalescedOptions real_opts = opts;
      real_opts.reduceOp = real_op(op);
      return real_->allreduce_coalesced(tensors, real_opts);
    };
    plan.local = [tensors, op, n]() mutable {
      for (auto& t : tensors) {
        finish_average(t, op, n);
      }
    };
  } else {
    plan.local = [tensors, op, n]() mutable {
      for (auto& t : tensors) {
        mirror_alone(t, op, n);
      }
    };
  }
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "prism: reduce takes one tensor, got ", tensors.size());
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < layout_.size(), "prism: reduce root ", opts.rootRank,
              " is not a rank of ", info_->label);
  const RedOp op = checked_op(opts.reduceOp, "reduce");
  OpPlan plan;
  plan.kind = replay::OpKind::kReduce;
  plan.op_type = c10d::OpType::REDUCE;
  plan.size_bytes = total_bytes(tensors);
  plan.dtype = tensors[0].scalar_type();
  plan.device = tensors[0].device();
  plan.async_op = opts.asyncOp;
  plan.outputs = tensors;
  const int64_t n = layout_.size();
  const bool is_root = opts.rootRank == layout_.self_index();
  at::Tensor tensor = tensors[0];
  const int64_t real_root = layout_.real_index_of(opts.rootRank);
  if (real_) {
    // Reduce a copy: a non-root's buffer must stay as it was.
    auto scratch = std::make_shared<at::Tensor>();
    plan.issue_real = [this, tensor, scratch, opts, op, real_root]() -> c10::intrusive_ptr<c10d::Work> {
      if (real_root < 0) {
        return nullptr;  // the root is virtual: no real member receives anything
      }
      *scratch = tensor.clone();
      repeat_contribution(*scratch, op, layout_.stand_in_count(layout_.self_real_index()));
      c10d::ReduceOptions real_opts = opts;
      real_opts.reduceOp = real_op(op);
      real_opts.rootRank = real_root;
      real_opts.rootTensor = 0;
      std::vector<at::Tensor> real_tensors{*scratch};
      return real_->reduce(real_tensors, real_opts);
    };
    plan.local = [tensor, scratch, op, n, is_root]() mutable {
      if (is_root) {
        finish_average(*scratch, op, n);
        tensor.copy_(*scratch);
      }
    };
  } else {
    plan.local = [tensor, op, n, is_root]() mutable {
      if (is_root) {
        mirror_alone(tensor, op, n);
      }
    };
  }
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "prism: reduce_scatter takes one output and one input list");
  const int64_t n = layout_.size();
  TORCH_CHECK(static_cast<int64_t>(inputs[0].size()) == n, "prism: reduce_scatter input list has ", inputs[0].size(),
              " tensors, expected the group size ", n);
  const RedOp op = checked_op(opts.reduceOp, "reduce_scatter");
  OpPlan plan;
  plan.kind = replay::OpKind::kReduceScatter;
  plan.op_type = c10d::OpType::REDUCE_SCATTER;
  plan.size_bytes = total_bytes(inputs[0]);
  plan.dtype = outputs[0].scalar_type();
  plan.device = outputs[0].device();
  plan.async_op = opts.asyncOp;
  plan.outputs = outputs;
  at::Tensor output = outputs[0];
  const std::vector<at::Tensor> input_list = inputs[0];
  if (real_) {
    plan.issue_real = [this, output, input_list, opts, op]() mutable {
      std::vector<at::Tensor> real_inputs;
      for (int64_t r = 0; r < layout_.num_real(); ++r) {
        auto chunk = input_list[layout_.real_positions()[r]].clone();
        repeat_contribution(chunk, op, layout_.stand_in_count(layout_.self_real_index()));
        real_inputs.push_back(chunk);
      }
      std::vector<at::Tensor> real_outputs{output};
      std::vector<std::vector<at::Tensor>> real_input_lists{real_inputs};
      c10d::ReduceScatterOptions real_opts = opts;
      real_opts.reduceOp = real_op(op);
      return real_->reduce_scatter(real_outputs, real_input_lists, real_opts);
    };
    plan.local = [output, op, n]() mutable { finish_average(output, op, n); };
  } else {
    const int64_t self = layout_.self_index();
    plan.local = [output, input_list, op, n, self]() mutable {
      output.copy_(input_list[self]);
      mirror_alone(output, op, n);
    };
  }
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outputs{output};
  std::vector<at::Tensor> inputs{input};
  auto work = reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  return work;
}

c10::intrusive_ptr<c10d::Work> PrismBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(!outputs.empty() && outputs.size() == inputs.size(), "prism: reduce_scatter_tensor needs as many "
              "outputs as inputs (and at least one), got ", outputs.size(), " and ", inputs.size());
  const int64_t n = layout_.size();
  for (size_t i = 0; i < outputs.size(); ++i) {
    check_scatter_sizes(outputs[i], inputs[i], n, "reduce_scatter_tensor");
  }
  const RedOp op = checked_op(opts.reduceOp, "reduce_scatter_tensor");
  OpPlan plan;
  plan.kind = replay::OpKind::kReduceScatter;
  plan.op_type = outputs.size() == 1 ? c10d::OpType::_REDUCE_SCATTER_BASE
                                     : c10d::OpType::COALESCED;  // torch 2.11 has no REDUCE_SCATTER_TENSOR_COALESCED
  plan.size_bytes = total_bytes(inputs);
  plan.dtype = outputs[0].scalar_type();
  plan.device = outputs[0].device();
  plan.async_op = opts.asyncOp;
  plan.outputs = outputs;
  if (real_) {
    plan.issue_real = [this, outputs, inputs, opts, op]() mutable {
      std::vector<at::Tensor> real_inputs;
      for (size_t i = 0; i < inputs.size(); ++i) {
        // All real: the input as it is; mixed: the real members' chunks, repeated.
        real_inputs.push_back(layout_.all_real() ? inputs[i] : real_chunks(layout_, inputs[i], outputs[i], op));
      }
      c10d::ReduceScatterOptions real_opts = opts;
      real_opts.reduceOp = real_op(op);
      if (outputs.size() == 1) {
        return real_->_reduce_scatter_base(outputs[0], real_inputs[0], real_opts);
      }
      return real_->reduce_scatter_tensor_coalesced(outputs, real_inputs, real_opts);
    };
    plan.local = [outputs, op, n]() mutable {
      for (auto& output : outputs) {
        finish_average(output, op, n);
      }
    };
  } else {
    const int64_t self = layout_.self_index();
    plan.local = [outputs, inputs, op, n, self]() mutable {
      for (size_t i = 0; i < outputs.size(); ++i) {
        outputs[i].copy_(chunk_of(inputs[i], n, self, outputs[i]));
        mirror_alone(outputs[i], op, n);
      }
    };
  }
  return launch(std::move(plan));
}

}  // namespace prism::backend

// Reductions of the prism backend: all-reduce (and coalesced), reduce, reduce-scatter (list,
// single tensor, coalesced).
//
// Mirror arithmetic: member m contributes x[stand_in(m)], so the reduction over the group equals the
// reduction over the real members where real member r's value counts stand_in_count(r) times. Each
// real member therefore "repeats" its own contribution that many times before the real reduction:
// multiply for sum/avg, power for product, nothing for max/min/and/or, parity for xor. Average is a
// sum divided by the group size afterwards (gloo has no AVG). With this process the only real member
// the repeat is the whole answer (avg: the value itself, untouched).
#include <functional>

#include "backend/backend.h"
#include "backend/describe_op.h"

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

// Each real member's chunk, cloned and repeated `repeat` times as this member's contribution;
// chunk(m) is member m's chunk of the input. The reduce-scatter variants differ only in chunk().
template <typename ChunkOf>
std::vector<at::Tensor> repeated_real_chunks(const GroupLayout& layout, RedOp op, ChunkOf chunk) {
  const int64_t repeat = layout.stand_in_count(layout.self_real_index());
  std::vector<at::Tensor> chunks;
  for (int64_t r = 0; r < layout.num_real(); ++r) {
    auto repeated = chunk(layout.real_positions()[r]).clone();
    repeat_contribution(repeated, op, repeat);
    chunks.push_back(repeated);
  }
  return chunks;
}

// Issues the real op of a family on the inputs it prepared; null when this process is the only
// real member.
using RealCall = std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&)>;

// The two parts of an all-reduce (plain and coalesced differ only in the real call): with a real
// part, each contribution is repeated before the real reduction and an average divided after it;
// alone, the mirror.
void add_allreduce_parts(OpPlan& plan, const GroupLayout& layout, RedOp op, RealCall real_call) {
  const int64_t n = layout.size();
  std::vector<at::Tensor> tensors = plan.outputs;
  if (!real_call) {
    plan.local = [tensors, op, n]() mutable {
      for (auto& t : tensors) {
        mirror_alone(t, op, n);
      }
    };
    return;
  }
  const int64_t repeat = layout.stand_in_count(layout.self_real_index());
  plan.issue_real = [tensors, op, repeat, real_call]() mutable {
    for (auto& t : tensors) {
      repeat_contribution(t, op, repeat);
    }
    return real_call(tensors);
  };
  plan.local = [tensors, op, n]() mutable {
    for (auto& t : tensors) {
      finish_average(t, op, n);
    }
  };
}

// The local part of a reduce-scatter (list, tensor and coalesced alike): with a real part, an
// average's division; alone, this member's own chunk of each input (own_chunks[i]) repeated.
std::function<void()> reduce_scatter_local(std::vector<at::Tensor> outputs, std::vector<at::Tensor> own_chunks,
                                           RedOp op, int64_t n, bool alone) {
  if (!alone) {
    return [outputs, op, n]() mutable {
      for (auto& output : outputs) {
        finish_average(output, op, n);
      }
    };
  }
  return [outputs, own_chunks, op, n]() mutable {
    for (size_t i = 0; i < outputs.size(); ++i) {
      outputs[i].copy_(own_chunks[i]);
      mirror_alone(outputs[i], op, n);
    }
  };
}

// A reduce-scatter input of the real members' chunks only, each repeated, end to end.
// Stacked along the output's first dimension: the real library checks the input as the output's
// rows times its members (gloo: outputShape[0] * worldSize == inputShape[0]), which a flat input of
// a many-dimensional output (a sequence-parallel [s, b, h] reduce-scatter) fails.
at::Tensor real_chunks(const GroupLayout& layout, const at::Tensor& input, const at::Tensor& output, RedOp op) {
  std::vector<at::Tensor> chunks = repeated_real_chunks(
      layout, op, [&](int64_t m) { return chunk_of(input, layout.size(), m, output); });
  if (output.dim() == 0) {
    for (auto& chunk : chunks) {
      chunk = chunk.view({-1});
    }
  }
  return at::cat(chunks, 0);
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
  OpPlan plan = describe_op(replay::OpKind::kAllReduce, c10d::OpType::ALLREDUCE, total_bytes(tensors), tensors[0],
                            opts.asyncOp, tensors);
  c10d::AllreduceOptions real_opts = opts;
  real_opts.reduceOp = real_op(op);
  RealCall real_call;
  if (real_) {
    real_call = [this, real_opts](std::vector<at::Tensor>& t) { return real_->allreduce(t, real_opts); };
  }
  add_allreduce_parts(plan, layout_, op, std::move(real_call));
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "prism: allreduce_coalesced needs at least one tensor");
  const RedOp op = checked_op(opts.reduceOp, "allreduce_coalesced");
  OpPlan plan = describe_op(replay::OpKind::kAllReduce, c10d::OpType::ALLREDUCE_COALESCED, total_bytes(tensors),
                            tensors[0], opts.asyncOp, tensors);
  c10d::AllreduceCoalescedOptions real_opts = opts;
  real_opts.reduceOp = real_op(op);
  RealCall real_call;
  if (real_ && tensors[0].is_cuda() && real_->getBackendName() != "nccl") {
    // gloo has no coalesced all-reduce of CUDA tensors, and megatron-core's gradient sync issues one
    // on every data-parallel group (torch's coalescing manager). Real members sharing a GPU (gloo)
    // stage the tensors through pinned host memory (the host waits for the issuing stream here, as
    // for a staged p2p send), and the local part copies them back on the backend's stream. Host
    // staging leaves the device's allocator untouched: the rank's device memory stays NCCL's.
    auto staged = std::make_shared<std::vector<at::Tensor>>();
    real_call = [this, real_opts, staged](std::vector<at::Tensor>& t) {
      staged->clear();
      for (const auto& tensor : t) {
        staged->push_back(at::empty(tensor.sizes(), tensor.options().device(at::kCPU).pinned_memory(true)));
        staged->back().copy_(tensor);  // blocking: what the issuing stream produced
      }
      return real_->allreduce_coalesced(*staged, real_opts);
    };
    add_allreduce_parts(plan, layout_, op, std::move(real_call));
    plan.local = [tensors = plan.outputs, staged, finish = std::move(plan.local)]() mutable {
      for (size_t i = 0; i < tensors.size(); ++i) {
        tensors[i].copy_((*staged)[i], /*non_blocking=*/true);
      }
      finish();
    };
    return launch(std::move(plan));
  }
  if (real_) {
    real_call = [this, real_opts](std::vector<at::Tensor>& t) { return real_->allreduce_coalesced(t, real_opts); };
  }
  add_allreduce_parts(plan, layout_, op, std::move(real_call));
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "prism: reduce takes one tensor, got ", tensors.size());
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < layout_.size(), "prism: reduce root ", opts.rootRank,
              " is not a rank of ", info_->label);
  const RedOp op = checked_op(opts.reduceOp, "reduce");
  OpPlan plan = describe_op(replay::OpKind::kReduce, c10d::OpType::REDUCE, total_bytes(tensors), tensors[0],
                            opts.asyncOp, tensors);
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
  OpPlan plan = describe_op(replay::OpKind::kReduceScatter, c10d::OpType::REDUCE_SCATTER, total_bytes(inputs[0]),
                            outputs[0], opts.asyncOp, outputs);
  const std::vector<at::Tensor> input_list = inputs[0];
  if (real_) {
    plan.issue_real = [this, outputs, input_list, opts, op]() mutable {
      std::vector<std::vector<at::Tensor>> real_input_lists{
          repeated_real_chunks(layout_, op, [&](int64_t m) { return input_list[m]; })};
      c10d::ReduceScatterOptions real_opts = opts;
      real_opts.reduceOp = real_op(op);
      return real_->reduce_scatter(outputs, real_input_lists, real_opts);
    };
  }
  plan.local = reduce_scatter_local(outputs, {input_list[layout_.self_index()]}, op, n, !real_);
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outputs{output};
  std::vector<at::Tensor> inputs{input};
  return reduce_scatter_tensor_coalesced(outputs, inputs, opts);
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
  // torch 2.11 has no REDUCE_SCATTER_TENSOR_COALESCED.
  const c10d::OpType op_type = outputs.size() == 1 ? c10d::OpType::_REDUCE_SCATTER_BASE : c10d::OpType::COALESCED;
  OpPlan plan = describe_op(replay::OpKind::kReduceScatter, op_type, total_bytes(inputs), outputs[0], opts.asyncOp,
                            outputs);
  if (real_) {
    plan.issue_real = [this, outputs, inputs, opts, op]() mutable {
      std::vector<at::Tensor> real_inputs;
      for (size_t i = 0; i < inputs.size(); ++i) {
        // All real: the input as it is; mixed: the real members' chunks, repeated, end to end.
        real_inputs.push_back(layout_.all_real() ? inputs[i] : real_chunks(layout_, inputs[i], outputs[i], op));
      }
      c10d::ReduceScatterOptions real_opts = opts;
      real_opts.reduceOp = real_op(op);
      if (outputs.size() == 1) {
        return real_->_reduce_scatter_base(outputs[0], real_inputs[0], real_opts);
      }
      return real_->reduce_scatter_tensor_coalesced(outputs, real_inputs, real_opts);
    };
  }
  std::vector<at::Tensor> own_chunks;  // only read when this process is the only real member
  for (size_t i = 0; i < outputs.size() && !real_; ++i) {
    own_chunks.push_back(chunk_of(inputs[i], n, layout_.self_index(), outputs[i]));
  }
  plan.local = reduce_scatter_local(outputs, std::move(own_chunks), op, n, !real_);
  return launch(std::move(plan));
}

}  // namespace prism::backend

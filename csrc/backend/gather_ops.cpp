// Data movement of the prism backend: broadcast, all-gather (list, single tensor, coalesced),
// gather and scatter.
//
// Mirror rules: a virtual member's slot of a gather holds its stand-in's contribution; a virtual
// source (broadcast or scatter root) sends what the real member holding its role holds, else zeros
// (the deterministic fill: it keeps control flow and arithmetic finite). Real members' slots carry
// the real data moved by the real sub-communicator.
//
// One exception, the in-place all-gather (the input is this rank's own slot of the output, which is
// how the distributed optimizer gathers updated parameter shards): a virtual member's slot keeps
// what it holds. Each slot there is a *different* slice of the model, so copying this rank's shard
// into it would overwrite other parameters with it; the values already in the slot (the parameters
// before this step, which the virtual member would have updated by a small step) are the plausible
// ones.
#include "backend/backend.h"

namespace prism::backend {

namespace {

at::Tensor slot_of(const at::Tensor& buffer, int64_t n, int64_t i, const at::Tensor& like) {
  const int64_t chunk = buffer.numel() / n;
  return buffer.view({-1}).narrow(0, i * chunk, chunk).view(like.sizes());
}

std::vector<at::Tensor> slots_of(const at::Tensor& output, const at::Tensor& input, int64_t n) {
  std::vector<at::Tensor> slots;
  slots.reserve(n);
  for (int64_t m = 0; m < n; ++m) {
    slots.push_back(slot_of(output, n, m, input));
  }
  return slots;
}

// True when every input is the given member's slot of its output (an in-place all-gather).
bool gathers_in_place(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs, int64_t n,
                      int64_t member) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const int64_t chunk_bytes = inputs[i].numel() * inputs[i].element_size();
    const auto* base = static_cast<const char*>(outputs[i].const_data_ptr());
    if (inputs[i].const_data_ptr() != base + member * chunk_bytes || !inputs[i].is_contiguous()) {
      return false;
    }
  }
  return n > 0;
}

std::vector<at::Tensor> real_slots(const GroupLayout& layout, const std::vector<at::Tensor>& slots) {
  std::vector<at::Tensor> real;
  for (int64_t r = 0; r < layout.num_real(); ++r) {
    real.push_back(slots[layout.real_positions()[r]]);
  }
  return real;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> PrismBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "prism: broadcast needs at least one tensor");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < layout_.size(), "prism: broadcast root ", opts.rootRank,
              " is not a rank of ", info_->label);
  OpPlan plan;
  plan.kind = replay::OpKind::kBroadcast;
  plan.op_type = c10d::OpType::BROADCAST;
  plan.size_bytes = total_bytes(tensors);
  plan.dtype = tensors[0].scalar_type();
  plan.device = tensors[0].device();
  plan.async_op = opts.asyncOp;
  plan.outputs = tensors;
  const int64_t source = layout_.source_stand_in(opts.rootRank);
  if (real_ && source >= 0) {
    plan.issue_real = [this, tensors, opts, source]() mutable {
      c10d::BroadcastOptions real_opts = opts;
      real_opts.rootRank = source;
      real_opts.rootTensor = 0;
      return real_->broadcast(tensors, real_opts);
    };
  } else if (source != layout_.self_real_index()) {
    // No real member holds the source's role: every real member fills the same values.
    plan.local = [tensors]() mutable {
      for (auto& t : tensors) {
        fill_deterministic(t);
      }
    };
  }
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "prism: allgather takes one output list and one input");
  TORCH_CHECK(static_cast<int64_t>(outputs[0].size()) == layout_.size(), "prism: allgather output list has ",
              outputs[0].size(), " tensors, expected the group size ", layout_.size());
  OpPlan plan;
  plan.kind = replay::OpKind::kAllGather;
  plan.op_type = c10d::OpType::ALLGATHER;
  plan.size_bytes = total_bytes(outputs[0]);
  plan.dtype = inputs[0].scalar_type();
  plan.device = inputs[0].device();
  plan.async_op = opts.asyncOp;
  plan.outputs = outputs[0];
  std::vector<at::Tensor> slots = outputs[0];
  at::Tensor input = inputs[0];
  if (real_) {
    plan.issue_real = [this, slots, input, opts]() {
      std::vector<std::vector<at::Tensor>> real_outputs{real_slots(layout_, slots)};
      std::vector<at::Tensor> real_inputs{input};
      return real_->allgather(real_outputs, real_inputs, opts);
    };
  }
  // The local part may run after the group is gone: it copies what it needs from the layout.
  const bool alone = !real_;
  std::vector<int64_t> source_slot(layout_.size());
  for (int64_t m = 0; m < layout_.size(); ++m) {
    source_slot[m] = layout_.real_positions()[layout_.stand_in(m)];
  }
  plan.local = [slots, input, alone, source_slot = std::move(source_slot)]() mutable {
    for (size_t m = 0; m < slots.size(); ++m) {
      if (alone) {
        slots[m].copy_(input);
      } else if (source_slot[m] != static_cast<int64_t>(m)) {
        slots[m].copy_(slots[source_slot[m]]);
      }
    }
  };
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outputs{output};
  std::vector<at::Tensor> inputs{input};
  return allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> PrismBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(!outputs.empty() && outputs.size() == inputs.size(), "prism: all_gather_into_tensor needs as many "
              "outputs as inputs (and at least one), got ", outputs.size(), " and ", inputs.size());
  const int64_t n = layout_.size();
  for (size_t i = 0; i < outputs.size(); ++i) {
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * n, "prism: all_gather_into_tensor output has ",
                outputs[i].numel(), " elements, expected the input's ", inputs[i].numel(), " times the group size ", n);
    TORCH_CHECK(outputs[i].is_contiguous(), "prism: all_gather_into_tensor needs a contiguous output");
  }
  OpPlan plan;
  plan.kind = replay::OpKind::kAllGather;
  plan.op_type = outputs.size() == 1 ? c10d::OpType::_ALLGATHER_BASE : c10d::OpType::ALLGATHER_COALESCED;
  plan.size_bytes = total_bytes(outputs);
  plan.dtype = inputs[0].scalar_type();
  plan.device = inputs[0].device();
  plan.async_op = opts.asyncOp;
  plan.outputs = outputs;
  const bool in_place = gathers_in_place(outputs, inputs, n, layout_.self_index());
  if (!real_ && in_place) {
    // This process alone, gathering in place: its own slot already holds its input and every
    // virtual slot keeps its values (see the file comment). Nothing moves.
    return launch(std::move(plan));
  }
  if (!real_) {
    // This process alone: every slot is a copy of the input, one broadcasting copy per op.
    plan.local = [outputs, inputs, n]() mutable {
      for (size_t i = 0; i < outputs.size(); ++i) {
        outputs[i].view({n, -1}).copy_(inputs[i].reshape({1, -1}).expand({n, -1}));
      }
    };
    return launch(std::move(plan));
  }
  std::vector<std::vector<at::Tensor>> slots;  // per op, per member
  for (size_t i = 0; i < outputs.size(); ++i) {
    slots.push_back(slots_of(outputs[i], inputs[i], n));
  }
  plan.issue_real = [this, outputs, inputs, slots, opts]() mutable -> c10::intrusive_ptr<c10d::Work> {
    if (layout_.all_real()) {
      return outputs.size() == 1 ? real_->_allgather_base(outputs[0], inputs[0], opts)
                                 : real_->allgather_into_tensor_coalesced(outputs, inputs, opts);
    }
    if (outputs.size() == 1) {
      std::vector<std::vector<at::Tensor>> real_outputs{real_slots(layout_, slots[0])};
      return real_->allgather(real_outputs, inputs, opts);
    }
    std::vector<std::vector<at::Tensor>> per_rank(layout_.num_real());  // [real rank][op]
    for (auto& op_slots : slots) {
      auto real = real_slots(layout_, op_slots);
      for (int64_t r = 0; r < layout_.num_real(); ++r) {
        per_rank[r].push_back(real[r]);
      }
    }
    return real_->allgather_coalesced(per_rank, inputs, opts);
  };
  if (layout_.all_real() || in_place) {
    return launch(std::move(plan));
  }
  std::vector<int64_t> source_slot(n);
  for (int64_t m = 0; m < n; ++m) {
    source_slot[m] = layout_.real_positions()[layout_.stand_in(m)];
  }
  plan.local = [slots, source_slot = std::move(source_slot)]() mutable {
    for (auto& op_slots : slots) {
      for (size_t m = 0; m < op_slots.size(); ++m) {
        if (source_slot[m] != static_cast<int64_t>(m)) {
          op_slots[m].copy_(op_slots[source_slot[m]]);
        }
      }
    }
  };
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) {
  const int64_t n = layout_.size();
  TORCH_CHECK(static_cast<int64_t>(outputs.size()) == n, "prism: allgather_coalesced needs one output list per "
              "member (", n, "), got ", outputs.size());
  for (const auto& per_member : outputs) {
    TORCH_CHECK(per_member.size() == inputs.size(), "prism: allgather_coalesced output lists must match the inputs");
  }
  OpPlan plan;
  plan.kind = replay::OpKind::kAllGather;
  plan.op_type = c10d::OpType::ALLGATHER_COALESCED;
  plan.size_bytes = total_bytes(inputs) * n;
  plan.dtype = inputs.empty() ? at::kFloat : inputs[0].scalar_type();
  plan.device = inputs.empty() ? at::Device(at::kCPU) : inputs[0].device();
  plan.async_op = opts.asyncOp;
  for (const auto& per_member : outputs) {
    plan.outputs.insert(plan.outputs.end(), per_member.begin(), per_member.end());
  }
  if (real_) {
    plan.issue_real = [this, outputs, inputs, opts]() mutable {
      std::vector<std::vector<at::Tensor>> real_outputs;
      for (int64_t r = 0; r < layout_.num_real(); ++r) {
        real_outputs.push_back(outputs[layout_.real_positions()[r]]);
      }
      return real_->allgather_coalesced(real_outputs, inputs, opts);
    };
  }
  const bool alone = !real_;
  std::vector<int64_t> source_slot(n);
  for (int64_t m = 0; m < n; ++m) {
    source_slot[m] = layout_.real_positions()[layout_.stand_in(m)];
  }
  plan.local = [outputs, inputs, alone, source_slot = std::move(source_slot)]() mutable {
    for (size_t m = 0; m < outputs.size(); ++m) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (alone) {
          outputs[m][i].copy_(inputs[i]);
        } else if (source_slot[m] != static_cast<int64_t>(m)) {
          outputs[m][i].copy_(outputs[source_slot[m]][i]);
        }
      }
    }
  };
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const int64_t n = layout_.size();
  TORCH_CHECK(inputs.size() == 1, "prism: gather takes one input");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < n, "prism: gather root ", opts.rootRank, " is not a rank of ",
              info_->label);
  const bool is_root = opts.rootRank == layout_.self_index();
  TORCH_CHECK(!is_root || (outputs.size() == 1 && static_cast<int64_t>(outputs[0].size()) == n),
              "prism: gather's root needs one output list of ", n, " tensors");
  OpPlan plan;
  plan.kind = replay::OpKind::kGather;
  plan.op_type = c10d::OpType::GATHER;
  plan.size_bytes = total_bytes(inputs) * n;
  plan.dtype = inputs[0].scalar_type();
  plan.device = inputs[0].device();
  plan.async_op = opts.asyncOp;
  if (is_root) {
    plan.outputs = outputs[0];
  }
  const int64_t real_root = layout_.real_index_of(opts.rootRank);
  at::Tensor input = inputs[0];
  std::vector<at::Tensor> slots = is_root ? outputs[0] : std::vector<at::Tensor>();
  if (real_) {
    plan.issue_real = [this, slots, input, opts, real_root, is_root]() -> c10::intrusive_ptr<c10d::Work> {
      if (real_root < 0) {
        return nullptr;  // the root is virtual: nothing reaches a real member
      }
      std::vector<std::vector<at::Tensor>> real_outputs;
      if (is_root) {
        real_outputs.push_back(real_slots(layout_, slots));
      }
      std::vector<at::Tensor> real_inputs{input};
      c10d::GatherOptions real_opts = opts;
      real_opts.rootRank = real_root;
      return real_->gather(real_outputs, real_inputs, real_opts);
    };
  }
  if (is_root) {
    const bool alone = !real_;
    std::vector<int64_t> source_slot(n);
    for (int64_t m = 0; m < n; ++m) {
      source_slot[m] = layout_.real_positions()[layout_.stand_in(m)];
    }
    plan.local = [slots, input, alone, source_slot = std::move(source_slot)]() mutable {
      for (size_t m = 0; m < slots.size(); ++m) {
        if (alone) {
          slots[m].copy_(input);
        } else if (source_slot[m] != static_cast<int64_t>(m)) {
          slots[m].copy_(slots[source_slot[m]]);
        }
      }
    };
  }
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  const int64_t n = layout_.size();
  TORCH_CHECK(outputs.size() == 1, "prism: scatter takes one output");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < n, "prism: scatter root ", opts.rootRank, " is not a rank of ",
              info_->label);
  const bool is_root = opts.rootRank == layout_.self_index();
  TORCH_CHECK(!is_root || (inputs.size() == 1 && static_cast<int64_t>(inputs[0].size()) == n),
              "prism: scatter's root needs one input list of ", n, " tensors");
  OpPlan plan;
  plan.kind = replay::OpKind::kScatter;
  plan.op_type = c10d::OpType::SCATTER;
  plan.size_bytes = total_bytes(outputs) * n;
  plan.dtype = outputs[0].scalar_type();
  plan.device = outputs[0].device();
  plan.async_op = opts.asyncOp;
  plan.outputs = outputs;
  const int64_t real_root = layout_.real_index_of(opts.rootRank);
  at::Tensor output = outputs[0];
  std::vector<at::Tensor> pieces = is_root ? inputs[0] : std::vector<at::Tensor>();
  if (real_ && real_root >= 0) {
    plan.issue_real = [this, output, pieces, opts, real_root, is_root]() {
      std::vector<std::vector<at::Tensor>> real_inputs;
      if (is_root) {
        real_inputs.push_back(real_slots(layout_, pieces));
      }
      std::vector<at::Tensor> real_outputs{output};
      c10d::ScatterOptions real_opts = opts;
      real_opts.rootRank = real_root;
      return real_->scatter(real_outputs, real_inputs, real_opts);
    };
  } else if (is_root) {
    const int64_t self = layout_.self_index();
    plan.local = [output, pieces, self]() mutable { output.copy_(pieces[self]); };
  } else if (real_root < 0) {
    // A virtual root: its pieces exist nowhere, so every real member gets the fill values.
    plan.local = [output]() mutable { fill_deterministic(output); };
  }
  return launch(std::move(plan));
}

}  // namespace prism::backend

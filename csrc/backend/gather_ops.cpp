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
#include <functional>

#include "backend/backend.h"
#include "backend/describe_op.h"

namespace prism::backend {

namespace {

at::Tensor slot_of(const at::Tensor& buffer, int64_t n, int64_t i, const at::Tensor& like) {
  const int64_t chunk = buffer.numel() / n;
  return buffer.view({-1}).narrow(0, i * chunk, chunk).view(like.sizes());
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

// The real members' entries of a per-member list (a slot, or a list of slots, per member).
template <typename Slot>
std::vector<Slot> real_slots(const GroupLayout& layout, const std::vector<Slot>& slots) {
  std::vector<Slot> real;
  for (int64_t r = 0; r < layout.num_real(); ++r) {
    real.push_back(slots[layout.real_positions()[r]]);
  }
  return real;
}

// The local part every gather shares (list, tensor, coalesced; all-gather and gather): slots are
// [member][op]. Alone, every member's slot is a copy of this process's input; else a virtual
// member's slot is a copy of its stand-in's slot. The local part may run after the group is gone,
// so it copies what it needs from the layout now.
std::function<void()> mirror_slots(const GroupLayout& layout, std::vector<std::vector<at::Tensor>> slots,
                                   std::vector<at::Tensor> inputs, bool alone) {
  std::vector<int64_t> source_slot(layout.size());
  for (int64_t m = 0; m < layout.size(); ++m) {
    source_slot[m] = layout.real_positions()[layout.stand_in(m)];
  }
  return [slots, inputs, alone, source_slot = std::move(source_slot)]() mutable {
    for (size_t m = 0; m < slots.size(); ++m) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (alone) {
          slots[m][i].copy_(inputs[i]);
        } else if (source_slot[m] != static_cast<int64_t>(m)) {
          slots[m][i].copy_(slots[source_slot[m]][i]);
        }
      }
    }
  };
}

// One op's slots as [member][op] with a single op.
std::vector<std::vector<at::Tensor>> single_op(const std::vector<at::Tensor>& slots) {
  std::vector<std::vector<at::Tensor>> per_member;
  for (const auto& slot : slots) {
    per_member.push_back({slot});
  }
  return per_member;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> PrismBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "prism: broadcast needs at least one tensor");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < layout_.size(), "prism: broadcast root ", opts.rootRank,
              " is not a rank of ", info_->label);
  OpPlan plan = describe_op(replay::OpKind::kBroadcast, c10d::OpType::BROADCAST, total_bytes(tensors), tensors[0],
                            opts.asyncOp, tensors);
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
  OpPlan plan = describe_op(replay::OpKind::kAllGather, c10d::OpType::ALLGATHER, total_bytes(outputs[0]), inputs[0],
                            opts.asyncOp, outputs[0]);
  std::vector<at::Tensor> slots = outputs[0];
  at::Tensor input = inputs[0];
  if (real_) {
    plan.issue_real = [this, slots, input, opts]() {
      std::vector<std::vector<at::Tensor>> real_outputs{real_slots(layout_, slots)};
      std::vector<at::Tensor> real_inputs{input};
      return real_->allgather(real_outputs, real_inputs, opts);
    };
  }
  plan.local = mirror_slots(layout_, single_op(slots), {input}, !real_);
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
  const c10d::OpType op_type = outputs.size() == 1 ? c10d::OpType::_ALLGATHER_BASE : c10d::OpType::ALLGATHER_COALESCED;
  OpPlan plan =
      describe_op(replay::OpKind::kAllGather, op_type, total_bytes(outputs), inputs[0], opts.asyncOp, outputs);
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
  std::vector<std::vector<at::Tensor>> slots(n);  // [member][op]
  for (int64_t m = 0; m < n; ++m) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      slots[m].push_back(slot_of(outputs[i], n, m, inputs[i]));
    }
  }
  plan.issue_real = [this, outputs, inputs, slots, opts]() mutable -> c10::intrusive_ptr<c10d::Work> {
    if (layout_.all_real()) {
      return outputs.size() == 1 ? real_->_allgather_base(outputs[0], inputs[0], opts)
                                 : real_->allgather_into_tensor_coalesced(outputs, inputs, opts);
    }
    auto per_rank = real_slots(layout_, slots);  // [real rank][op]
    if (outputs.size() == 1) {
      std::vector<std::vector<at::Tensor>> real_outputs(1);
      for (const auto& rank_slots : per_rank) {
        real_outputs[0].push_back(rank_slots[0]);
      }
      return real_->allgather(real_outputs, inputs, opts);
    }
    return real_->allgather_coalesced(per_rank, inputs, opts);
  };
  if (layout_.all_real() || in_place) {
    return launch(std::move(plan));
  }
  plan.local = mirror_slots(layout_, std::move(slots), inputs, /*alone=*/false);
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
  std::vector<at::Tensor> all_outputs;
  for (const auto& per_member : outputs) {
    all_outputs.insert(all_outputs.end(), per_member.begin(), per_member.end());
  }
  // No inputs: a float CPU op of no bytes.
  const at::Tensor like = inputs.empty() ? at::empty({0}, at::kFloat) : inputs[0];
  OpPlan plan = describe_op(replay::OpKind::kAllGather, c10d::OpType::ALLGATHER_COALESCED, total_bytes(inputs) * n,
                            like, opts.asyncOp, std::move(all_outputs));
  if (real_) {
    plan.issue_real = [this, outputs, inputs, opts]() mutable {
      auto real_outputs = real_slots(layout_, outputs);
      return real_->allgather_coalesced(real_outputs, inputs, opts);
    };
  }
  plan.local = mirror_slots(layout_, outputs, inputs, !real_);
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
  OpPlan plan = describe_op(replay::OpKind::kGather, c10d::OpType::GATHER, total_bytes(inputs) * n, inputs[0],
                            opts.asyncOp, is_root ? outputs[0] : std::vector<at::Tensor>());
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
    plan.local = mirror_slots(layout_, single_op(slots), {input}, !real_);
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
  OpPlan plan = describe_op(replay::OpKind::kScatter, c10d::OpType::SCATTER, total_bytes(outputs) * n, outputs[0],
                            opts.asyncOp, outputs);
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

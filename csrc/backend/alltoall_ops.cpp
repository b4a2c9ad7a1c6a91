// All-to-all of the prism backend (single tensor with and without splits, and the list form).
//
// Mirror rule: a virtual member sends this member what this member sends it (the symmetric mirror),
// so the block received from virtual member m is the local block addressed to m. When the sizes
// differ (uneven splits), the received block is filled from the start of that local block, repeated
// as needed, or zeros when that block is empty. Blocks from real members carry real data.
#include "backend/backend.h"
#include "backend/describe_op.h"

#include <torch/csrc/distributed/c10d/Utils.hpp>

namespace prism::backend {

namespace {

// Copy src into dst element by element (flat), repeating src when dst is longer; zeros when src is empty.
void fit_block(at::Tensor dst, const at::Tensor& src) {
  const int64_t d = dst.numel();
  const int64_t s = src.numel();
  if (d == 0) {
    return;
  }
  if (s == 0) {
    dst.zero_();
    return;
  }
  const auto src_flat = src.reshape({-1});
  if (s == d) {
    dst.copy_(src_flat.reshape(dst.sizes()));
    return;
  }
  auto flat = at::empty({d}, dst.options());
  for (int64_t offset = 0; offset < d; offset += s) {
    const int64_t count = std::min(s, d - offset);
    flat.narrow(0, offset, count).copy_(src_flat.narrow(0, 0, count));
  }
  dst.copy_(flat.view(dst.sizes()));
}

// Row counts of the n blocks of a tensor split along dim 0 (even split when splits are empty).
std::vector<int64_t> block_rows(const std::vector<int64_t>& splits, const at::Tensor& tensor, int64_t n) {
  if (!splits.empty()) {
    return splits;
  }
  return std::vector<int64_t>(n, n == 0 ? 0 : tensor.size(0) / n);
}

std::vector<at::Tensor> blocks_of(const at::Tensor& tensor, const std::vector<int64_t>& rows) {
  std::vector<at::Tensor> blocks;
  int64_t offset = 0;
  for (int64_t r : rows) {
    blocks.push_back(tensor.narrow(0, offset, r));
    offset += r;
  }
  return blocks;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> PrismBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_split_sizes,
                                                           std::vector<int64_t>& input_split_sizes,
                                                           const c10d::AllToAllOptions& opts) {
  const int64_t n = layout_.size();
  c10d::checkSplitSizes(input_split_sizes, input, static_cast<int>(n));
  c10d::checkSplitSizes(output_split_sizes, output, static_cast<int>(n));
  OpPlan plan = describe_op(replay::OpKind::kAllToAll, c10d::OpType::ALLTOALL_BASE,
                            static_cast<int64_t>(input.nbytes()), input, opts.asyncOp, {output});
  plan.size_varies = !input_split_sizes.empty() || !output_split_sizes.empty();
  if (!real_ && input_split_sizes == output_split_sizes && input.numel() == output.numel()) {
    // This process alone and every block the size of the local one: the output is the input.
    plan.local = [output, input]() mutable { output.copy_(input.reshape(output.sizes())); };
    return launch(std::move(plan));
  }
  const auto in_blocks = blocks_of(input, block_rows(input_split_sizes, input, n));
  const auto out_rows = block_rows(output_split_sizes, output, n);
  const auto out_blocks = blocks_of(output, out_rows);
  if (real_ && layout_.all_real()) {
    plan.issue_real = [this, output, input, output_split_sizes, input_split_sizes, opts]() mutable {
      return real_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts);
    };
    return launch(std::move(plan));
  }
  auto received = std::make_shared<at::Tensor>();  // the real members' blocks, packed
  std::vector<int64_t> real_out_rows;
  if (real_) {
    for (int64_t r = 0; r < layout_.num_real(); ++r) {
      real_out_rows.push_back(out_rows[layout_.real_positions()[r]]);
    }
    plan.issue_real = [this, in_blocks, output, received, real_out_rows, opts]() mutable {
      std::vector<at::Tensor> sent;
      std::vector<int64_t> real_in_rows;
      for (int64_t r = 0; r < layout_.num_real(); ++r) {
        const auto& block = in_blocks[layout_.real_positions()[r]];
        sent.push_back(block);
        real_in_rows.push_back(block.size(0));
      }
      auto packed_in = at::cat(sent);
      auto shape = output.sizes().vec();
      shape[0] = c10::sum_integers(real_out_rows);
      *received = at::empty(shape, output.options());
      return real_->alltoall_base(*received, packed_in, real_out_rows, real_in_rows, opts);
    };
  }
  std::vector<int64_t> real_index(n);
  for (int64_t m = 0; m < n; ++m) {
    real_index[m] = layout_.real_index_of(m);
  }
  const int64_t self = layout_.self_index();
  const bool alone = !real_;
  plan.local = [in_blocks, out_blocks, received, real_out_rows, real_index, self, alone]() {
    const auto from_real = alone ? std::vector<at::Tensor>() : blocks_of(*received, real_out_rows);
    for (size_t m = 0; m < out_blocks.size(); ++m) {
      if (alone && static_cast<int64_t>(m) == self) {
        fit_block(out_blocks[m], in_blocks[m]);
      } else if (!alone && real_index[m] >= 0) {
        out_blocks[m].copy_(from_real[real_index[m]]);
      } else {
        fit_block(out_blocks[m], in_blocks[m]);
      }
    }
  };
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  const int64_t n = layout_.size();
  TORCH_CHECK(static_cast<int64_t>(outputs.size()) == n && static_cast<int64_t>(inputs.size()) == n,
              "prism: alltoall needs one input and one output tensor per member (", n, "), got ", inputs.size(),
              " and ", outputs.size());
  OpPlan plan = describe_op(replay::OpKind::kAllToAll, c10d::OpType::ALLTOALL, total_bytes(inputs), inputs[0],
                            opts.asyncOp, outputs);
  plan.size_varies = true;  // the list form allows a different size per peer
  if (real_) {
    plan.issue_real = [this, outputs, inputs, opts]() mutable {
      if (layout_.all_real()) {
        return real_->alltoall(outputs, inputs, opts);
      }
      std::vector<at::Tensor> real_outputs;
      std::vector<at::Tensor> real_inputs;
      for (int64_t r = 0; r < layout_.num_real(); ++r) {
        real_outputs.push_back(outputs[layout_.real_positions()[r]]);
        real_inputs.push_back(inputs[layout_.real_positions()[r]]);
      }
      return real_->alltoall(real_outputs, real_inputs, opts);
    };
  }
  std::vector<bool> is_real(n);
  for (int64_t m = 0; m < n; ++m) {
    is_real[m] = real_ ? layout_.is_real(m) : false;
  }
  plan.local = [outputs, inputs, is_real]() {
    for (size_t m = 0; m < outputs.size(); ++m) {
      if (!is_real[m]) {
        fit_block(outputs[m], inputs[m]);
      }
    }
  };
  return launch(std::move(plan));
}

}  // namespace prism::backend

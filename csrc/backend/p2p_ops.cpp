// Point-to-point ops of the prism backend.
//
// A real peer: the real sub-communicator moves the data. A virtual peer: a send's data go nowhere;
// a recv gets the deterministic fill (zeros), since no real process sends it anything. Both complete
// when the replay engine says the virtual peer's matching op completes (its p2p schedule for that
// peer and direction). Megatron's pipeline traffic does not come here: a P2PCommunicator subclass
// intercepts it with the shapes and plausible values it needs.
#include "backend/backend.h"
#include "backend/describe_op.h"

namespace prism::backend {

namespace {

void check_peer(const GroupLayout& layout, int peer_index, const char* what) {
  TORCH_CHECK(peer_index >= 0 && peer_index < layout.size(), "prism: ", what, " peer ", peer_index,
              " is not a rank of this group of ", layout.size());
  TORCH_CHECK(peer_index != layout.self_index(), "prism: ", what, " to itself (group rank ", peer_index, ")");
}

}  // namespace

c10::intrusive_ptr<c10d::Work> PrismBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  check_peer(layout_, dst_rank, "send");
  TORCH_CHECK(!tensors.empty(), "prism: send needs a tensor");
  // Async: the backend cannot tell send from isend; both return a Work.
  OpPlan plan = describe_op(replay::OpKind::kSend, c10d::OpType::SEND, total_bytes(tensors), tensors[0],
                            /*async_op=*/true, {});
  plan.peer_index = dst_rank;
  const int64_t real_peer = layout_.real_index_of(dst_rank);
  if (real_peer >= 0) {
    plan.issue_real = [this, tensors, real_peer, tag]() mutable {
      return real_->send(tensors, static_cast<int>(real_peer), tag);
    };
    plan.p2p_tensors = tensors;
    plan.real_peer = real_peer;
    plan.tag = tag;
  }
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  check_peer(layout_, src_rank, "recv");
  TORCH_CHECK(!tensors.empty(), "prism: recv needs a tensor");
  OpPlan plan = describe_op(replay::OpKind::kRecv, c10d::OpType::RECV, total_bytes(tensors), tensors[0],
                            /*async_op=*/true, tensors);
  plan.peer_index = src_rank;
  const int64_t real_peer = layout_.real_index_of(src_rank);
  if (real_peer >= 0) {
    plan.issue_real = [this, tensors, real_peer, tag]() mutable {
      return real_->recv(tensors, static_cast<int>(real_peer), tag);
    };
    plan.p2p_tensors = tensors;
    plan.real_peer = real_peer;
    plan.tag = tag;
  } else {
    plan.local = [tensors]() mutable {
      for (auto& t : tensors) {
        fill_deterministic(t);
      }
    };
  }
  return launch(std::move(plan));
}

c10::intrusive_ptr<c10d::Work> PrismBackend::recvAnysource(std::vector<at::Tensor>& /*tensors*/, int /*tag*/) {
  TORCH_CHECK(false, "prism: recv from any source is not supported (virtual peers have no arrival order); "
              "name the source rank");
}

}  // namespace prism::backend

// Who is real in a group, and which real member speaks for each virtual one (the mirror policy).
//
// The mirror data policy: a virtual member contributes what its *stand-in* contributes, a real
// member of the same group chosen so that every real member of the group computes the same answer:
//   - with a role table: the first real member (group order) that has the virtual member's role;
//   - otherwise, or when no real member has that role: the real member nearest in group index
//     (ties: the lower index).
// With one real member (this process) every virtual member mirrors it. A virtual *source*
// (broadcast root, recv peer) has a stand-in only when a real member holds its role; otherwise its
// data are deterministic fill values (zeros).
//
// Light headers only; process-wide facts come from BackendContext.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "abi_probe.h"

namespace prism::backend {

// Facts of the activation, the same for every group of this process.
struct BackendContext {
  int64_t world_size = 0;
  int64_t virtual_rank = -1;
  int64_t physical_rank = -1;
  std::vector<uint8_t> is_real;  // per virtual rank
  std::vector<int64_t> roles;    // per virtual rank; empty: roles unknown
  int64_t timeout_ns = 300'000'000'000;
  bool check_consistency = true;
};

// The process's context; set at activation (configure) and cleared at deactivation.
std::shared_ptr<const BackendContext> context();
void configure(std::shared_ptr<const BackendContext> ctx);
void clear_context();

class GroupLayout {
 public:
  // The layout of a group, built only after its arguments are checked (a bad member would index
  // the real-rank table out of bounds): members are distinct virtual ranks in [0, world_size) in
  // group order, self_index (this process's group rank) lies in [0, members.size()) and its member
  // is this process's virtual rank, so the group has at least one real member. Throws
  // std::invalid_argument (ValueError in Python) naming `what` (the group), the argument, the value
  // and the valid range.
  static GroupLayout checked(std::vector<int64_t> members, int64_t self_index, const BackendContext& ctx,
                             const std::string& what);

  int64_t size() const { return static_cast<int64_t>(members_.size()); }
  int64_t num_real() const { return static_cast<int64_t>(real_positions_.size()); }
  bool has_virtual() const { return num_real() < size(); }
  bool all_real() const { return !has_virtual(); }
  int64_t self_index() const { return self_index_; }
  int64_t self_real_index() const { return self_real_index_; }
  const std::vector<int64_t>& members() const { return members_; }
  // Group indices of the real members, ascending; real index i is real_positions()[i].
  const std::vector<int64_t>& real_positions() const { return real_positions_; }
  bool is_real(int64_t member_index) const;
  // Real index of a real member's group index; -1 for a virtual member.
  int64_t real_index_of(int64_t member_index) const;

  // Real index of the real member that speaks for member_index (itself when it is real).
  int64_t stand_in(int64_t member_index) const;
  // How many members (itself included) the real member with this real index speaks for.
  int64_t stand_in_count(int64_t real_index) const { return counts_[real_index]; }
  // Real index whose data a virtual source's receivers get, or -1: deterministic fill values.
  int64_t source_stand_in(int64_t member_index) const;

 private:
  // Trusts its arguments: use checked().
  GroupLayout(std::vector<int64_t> members, int64_t self_index, const BackendContext& ctx);

  std::vector<int64_t> members_;
  int64_t self_index_;
  int64_t self_real_index_ = -1;
  std::vector<int64_t> real_positions_;
  std::vector<int32_t> stand_in_;      // per member; empty when there is one real member
  std::vector<int64_t> counts_;        // per real member
  std::vector<int64_t> role_holder_;   // per member: real index with its role, or -1; empty without roles
};

// "group <name> [0, 8, ..., 8184] (1024 ranks)" for logs and errors.
std::string group_label(const std::string& group_name, const std::vector<int64_t>& members);

}  // namespace prism::backend

PRISM_ABI_PROBE(BackendContext, ::prism::backend::BackendContext)
PRISM_ABI_PROBE(GroupLayout, ::prism::backend::GroupLayout)

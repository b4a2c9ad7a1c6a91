// Group layout and the mirror policy's stand-ins (contract in layout.h).
#include "backend/layout.h"

#include <algorithm>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace prism::backend {

namespace {

std::mutex context_mu;
std::shared_ptr<const BackendContext> current_context;

}  // namespace

std::shared_ptr<const BackendContext> context() {
  std::lock_guard<std::mutex> lock(context_mu);
  return current_context;
}

void configure(std::shared_ptr<const BackendContext> ctx) {
  std::lock_guard<std::mutex> lock(context_mu);
  current_context = std::move(ctx);
}

void clear_context() {
  std::lock_guard<std::mutex> lock(context_mu);
  current_context.reset();
}

GroupLayout GroupLayout::checked(std::vector<int64_t> members, int64_t self_index, const BackendContext& ctx,
                                 const std::string& what) {
  const auto n = static_cast<int64_t>(members.size());
  auto fail = [&](const std::string& message) {
    throw std::invalid_argument("prism: " + what + ": " + message);
  };
  if (n == 0) {
    fail("members is empty; a group has at least one member (this process's virtual rank)");
  }
  if (self_index < 0 || self_index >= n) {
    fail("self_index (this process's group rank) " + std::to_string(self_index) + " must lie in [0, " +
         std::to_string(n) + ") (one per member)");
  }
  for (int64_t m = 0; m < n; ++m) {
    if (members[m] < 0 || members[m] >= ctx.world_size) {
      fail("members[" + std::to_string(m) + "] = " + std::to_string(members[m]) +
           " is not a virtual rank: members must lie in [0, " + std::to_string(ctx.world_size) +
           ") (the world size given at activation)");
    }
  }
  std::vector<int64_t> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  const auto repeated = std::adjacent_find(sorted.begin(), sorted.end());
  if (repeated != sorted.end()) {
    fail("virtual rank " + std::to_string(*repeated) + " appears more than once in members; members must be distinct");
  }
  if (members[self_index] != ctx.virtual_rank) {
    fail("members[" + std::to_string(self_index) + "] = " + std::to_string(members[self_index]) +
         " at this process's group rank " + std::to_string(self_index) + " must be this process's virtual rank " +
         std::to_string(ctx.virtual_rank));
  }
  // Internal invariant: activation made this process's virtual rank real, so the group has a real
  // member; a context built any other way must not reach the layout.
  if (ctx.is_real.size() != static_cast<size_t>(ctx.world_size) || ctx.is_real[ctx.virtual_rank] == 0) {
    throw std::logic_error("prism: the activation context does not make its own virtual rank real");
  }
  if (!ctx.roles.empty() && ctx.roles.size() != static_cast<size_t>(ctx.world_size)) {
    throw std::logic_error("prism: the activation context's role table does not cover the world");
  }
  return GroupLayout(std::move(members), self_index, ctx);
}

GroupLayout::GroupLayout(std::vector<int64_t> members, int64_t self_index, const BackendContext& ctx)
    : members_(std::move(members)), self_index_(self_index) {
  const auto n = static_cast<int64_t>(members_.size());
  for (int64_t m = 0; m < n; ++m) {
    if (ctx.is_real[members_[m]] != 0) {
      if (m == self_index_) {
        self_real_index_ = static_cast<int64_t>(real_positions_.size());
      }
      real_positions_.push_back(m);
    }
  }
  const int64_t k = num_real();  // >= 1: checked() made sure this process's own member is real

  if (!ctx.roles.empty()) {
    std::unordered_map<int64_t, int64_t> holder_of_role;
    for (int64_t r = 0; r < k; ++r) {
      holder_of_role.emplace(ctx.roles[members_[real_positions_[r]]], r);  // first holder wins
    }
    role_holder_.resize(n, -1);
    for (int64_t m = 0; m < n; ++m) {
      auto found = holder_of_role.find(ctx.roles[members_[m]]);
      if (found != holder_of_role.end()) {
        role_holder_[m] = found->second;
      }
    }
  }

  counts_.assign(k, 0);
  if (k == 1) {
    counts_[0] = n;
    return;
  }
  stand_in_.resize(n);
  int64_t next = 0;  // first real index whose position is >= m
  for (int64_t m = 0; m < n; ++m) {
    while (next < k && real_positions_[next] < m) {
      ++next;
    }
    int64_t chosen;
    if (next < k && real_positions_[next] == m) {
      chosen = next;
    } else if (!role_holder_.empty() && role_holder_[m] >= 0) {
      chosen = role_holder_[m];
    } else if (next == 0) {
      chosen = 0;
    } else if (next == k) {
      chosen = k - 1;
    } else {
      const int64_t below = m - real_positions_[next - 1];
      const int64_t above = real_positions_[next] - m;
      chosen = above < below ? next : next - 1;
    }
    stand_in_[m] = static_cast<int32_t>(chosen);
    ++counts_[chosen];
  }
}

bool GroupLayout::is_real(int64_t member_index) const { return real_index_of(member_index) >= 0; }

int64_t GroupLayout::real_index_of(int64_t member_index) const {
  // k is small (the real ranks of one group); a binary search keeps this O(log k) regardless.
  int64_t lo = 0;
  int64_t hi = num_real();
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (real_positions_[mid] < member_index) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return (lo < num_real() && real_positions_[lo] == member_index) ? lo : -1;
}

int64_t GroupLayout::stand_in(int64_t member_index) const {
  return stand_in_.empty() ? 0 : stand_in_[member_index];
}

int64_t GroupLayout::source_stand_in(int64_t member_index) const {
  const int64_t real_index = real_index_of(member_index);
  if (real_index >= 0) {
    return real_index;
  }
  return role_holder_.empty() ? -1 : role_holder_[member_index];
}

std::string group_label(const std::string& group_name, const std::vector<int64_t>& members) {
  std::ostringstream out;
  out << "group " << (group_name.empty() ? "?" : group_name) << " [";
  const size_t n = members.size();
  const size_t shown = n <= 6 ? n : 3;
  for (size_t i = 0; i < shown; ++i) {
    out << (i ? ", " : "") << members[i];
  }
  if (n > 6) {
    out << ", ..., " << members[n - 1];
  }
  out << "] (" << n << (n == 1 ? " rank)" : " ranks)");
  return out.str();
}

}  // namespace prism::backend

"""The Python reference of the C++ simulator core (csrc/sim/des.cpp): same arrays in, same dict out.

Slow and plain on purpose; tests hold the core to it on random and hand-made graphs. The semantics
are those of csrc/sim/des.h. Completion times do not depend on the order in which simultaneous
events are handled (a collective ends at its last arrival plus its cost, a p2p pair at the later
post plus its cost), so this loop need not copy the core's tie-breaking to agree with it.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from prism_megatron.graph.schema import NodeType


def llround(x: float) -> int:
    """Round half away from zero like C++ std::llround, for x >= 0 (Python's round() halves to even)."""
    whole = math.floor(x)
    return int(whole) + (1 if x - whole >= 0.5 else 0)


def run(arrays: dict[str, np.ndarray], num_nodes: int, num_roles: int, num_streams: int) -> dict:
    """Simulate like `prism_megatron._C.sim.run`."""
    return _Reference(arrays, num_nodes, num_streams).run()


class _Reference:
    def __init__(self, a: dict, num_nodes: int, num_streams: int) -> None:
        self.a, self.n, self.S = a, num_nodes, num_streams
        role, begin = a["node_role"], a["stream_begin"]
        self.base = np.zeros(num_nodes + 1, dtype=np.int64)
        for node in range(num_nodes):
            r = int(role[node])
            self.base[node + 1] = self.base[node] + begin[(r + 1) * num_streams] - begin[r * num_streams]
        total = int(self.base[-1])
        self.start, self.ready, self.end = (np.full(total, -1, dtype=np.int64) for _ in range(3))
        self.done = np.zeros((num_nodes, num_streams), dtype=np.int64)
        self.batch_end = np.zeros((num_nodes, num_streams), dtype=np.int64)
        self.outstanding = {}
        self.heap: list = []
        self.pushes = 0
        self.coll: dict = {}
        self.p2p: dict = {}
        self.fault = ("", -1, -1, -1, -1)
        self.events = 0

    def first(self, node, s):
        return int(self.a["stream_begin"][int(self.a["node_role"][node]) * self.S + s])

    def length(self, node, s):
        return int(self.a["stream_begin"][int(self.a["node_role"][node]) * self.S + s + 1]) - self.first(
            node, s
        )

    def role_base(self, node):
        return self.first(node, 0)

    def run(self) -> dict:
        for node in range(self.n):
            for s in range(self.S):
                self.try_post(node, s, 0)
        while self.heap and not self.fault[0]:
            t, _, node, s = heapq.heappop(self.heap)
            self.events += 1
            self.done[node, s] = self.batch_end[node, s]
            for other in [s] + [o for o in range(self.S) if o != s]:
                self.try_post(node, other, t)
        stuck = [] if self.fault[0] else self.stuck()
        return {
            "makespan_ns": int(self.end.max(initial=0)),
            "num_events": self.events,
            "node_op_base": self.base,
            "timeline": np.stack([self.start, self.ready, self.end], axis=1),
            "fault": self.fault,
            "stuck": stuck,
        }

    def deps_met(self, node, op):
        a = self.a
        return all(
            self.done[node, a["dep_stream"][d]] > a["dep_index"][d]
            for d in range(a["op_dep_begin"][op], a["op_dep_begin"][op + 1])
        )

    def try_post(self, node, s, now):
        done, length, first = int(self.done[node, s]), self.length(node, s), self.first(node, s)
        if done >= length or self.batch_end[node, s] > done:
            return
        end = done
        while end < length and self.a["op_coalesced"][first + end]:
            end += 1
        end = min(end + 1, length)
        if not all(self.deps_met(node, first + i) for i in range(done, end)):
            at = int(self.base[node]) + first + done - self.role_base(node)
            if self.a["op_type"][first + done] == NodeType.WAIT and self.start[at] < 0:
                self.start[at] = now  # a wait's span starts where the stream reached it
            return
        self.batch_end[node, s] = end
        self.outstanding[node, s] = [1, now]
        for i in range(done, end):
            if not self.fault[0]:
                self.post(node, s, first + i, now)
        self.complete(node, s, now)

    def complete(self, node, s, end_ns):
        entry = self.outstanding[node, s]
        entry[1] = max(entry[1], end_ns)
        entry[0] -= 1
        if entry[0] == 0:
            heapq.heappush(self.heap, (entry[1], self.pushes, node, s))
            self.pushes += 1

    def post(self, node, s, op, now):
        a, local = self.a, op - self.role_base(node)
        at = int(self.base[node]) + local
        kind = int(a["op_type"][op])
        if kind != NodeType.WAIT or self.start[at] < 0:
            self.start[at] = now
        if kind == NodeType.COMPUTE:
            self.ready[at] = now
            duration = int(a["op_duration_ns"][op])
            overhead = min(int(a["op_overhead_ns"][op]), duration)
            scaled = float(duration - overhead) * float(a["compute_factor"][node])
            if a["op_expert"][op]:
                scaled *= float(a["expert_factor"][node])
            self.end[at] = now + overhead + llround(scaled)
            self.outstanding[node, s][1] = max(self.outstanding[node, s][1], int(self.end[at]))
        elif kind == NodeType.WAIT:
            self.ready[at] = self.end[at] = now
        else:
            self.outstanding[node, s][0] += 1
            (self.arrive_collective if kind == NodeType.COLLECTIVE else self.arrive_p2p)(
                node, s, op, local, now
            )

    def same(self, node_a, op_a, node_b, op_b):
        a = self.a
        x, y = self.role_base(node_a) + op_a, self.role_base(node_b) + op_b
        if a["op_comm"][x] == a["op_comm"][y] and a["op_size_bytes"][x] == a["op_size_bytes"][y]:
            return True
        self.fault = ("mismatch", node_a, op_a, node_b, op_b)
        return False

    def finish(self, node, s, local, ready, end):
        at = int(self.base[node]) + local
        self.ready[at], self.end[at] = ready, end
        self.complete(node, s, end)

    def arrive_collective(self, node, s, op, local, now):
        a = self.a
        instance = int(a["coll_instance"][int(a["op_spec"][op]) * self.n + node])
        if not 0 <= instance < len(a["instance_size"]):
            self.fault = ("no_group", node, local, -1, -1)
            return
        key = (instance, int(a["op_seq"][op]))
        pending = self.coll.setdefault(key, {"waiters": [], "last": 0, "cost": 0, "nic": 1.0})
        if pending["waiters"]:
            first = pending["waiters"][0]
            if not self.same(first[0], first[2], node, local):
                return
        pending["waiters"].append((node, s, local))
        pending["last"] = max(pending["last"], now)
        pending["cost"] = max(pending["cost"], int(a["op_cost_ns"][op]))
        pending["nic"] = max(pending["nic"], float(a["nic_factor"][node]))
        if len(pending["waiters"]) == a["instance_size"][instance]:
            del self.coll[key]
            end = pending["last"] + llround(pending["cost"] * pending["nic"])
            for w_node, w_s, w_local in pending["waiters"]:
                self.finish(w_node, w_s, w_local, pending["last"], end)

    def arrive_p2p(self, node, s, op, local, now):
        a = self.a
        spec = int(a["op_spec"][op])
        peer = int(a["p2p_peer"][spec * self.n + node])
        if not 0 <= peer < self.n:
            self.fault = ("no_peer", node, local, -1, -1)
            return
        for waiter in self.p2p.pop((node, local), []):
            self.meet(waiter, (node, s, local))
        partner_type = NodeType.RECV if a["op_type"][op] == NodeType.SEND else NodeType.SEND
        key = (partner_type, int(a["p2p_partner"][spec]), int(a["op_seq"][op]))
        partner = self.p2p_index(peer).get(key)
        if partner is None:
            return  # never completes: reported as stuck
        if self.start[int(self.base[peer]) + partner] >= 0:
            self.meet((node, s, local), (peer, -1, partner))
        else:
            self.p2p.setdefault((peer, partner), []).append((node, s, local))

    def p2p_index(self, node):
        a, first = self.a, self.role_base(node)
        last = self.first(node, self.S - 1) + self.length(node, self.S - 1)
        return {
            (int(a["op_type"][op]), int(a["op_spec"][op]), int(a["op_seq"][op])): op - first
            for op in range(first, last)
            if a["op_type"][op] in (NodeType.SEND, NodeType.RECV)
        }

    def meet(self, waiter, other):
        a = self.a
        (node, s, local), (o_node, _, o_local) = waiter, other
        if self.fault[0] or not self.same(o_node, o_local, node, local):
            return
        ready = max(self.start[int(self.base[node]) + local], self.start[int(self.base[o_node]) + o_local])
        cost = max(
            int(a["op_cost_ns"][self.role_base(node) + local]),
            int(a["op_cost_ns"][self.role_base(o_node) + o_local]),
        )
        nic = max(float(a["nic_factor"][node]), float(a["nic_factor"][o_node]))
        self.finish(node, s, local, int(ready), int(ready) + llround(cost * nic))

    def stuck(self):
        out = []
        for node in range(self.n):
            for s in range(self.S):
                done, first = int(self.done[node, s]), self.first(node, s)
                if done >= self.length(node, s):
                    continue
                waiting, why = done, "deps"
                if self.batch_end[node, s] > done:
                    for i in range(done, int(self.batch_end[node, s])):
                        if self.end[int(self.base[node]) + first + i - self.role_base(node)] < 0:
                            waiting = i
                            break
                    kind = self.a["op_type"][first + waiting]
                    why = "collective" if kind == NodeType.COLLECTIVE else "p2p"
                out.append((node, s, first + waiting - self.role_base(node), why))
        return out

"""The target job's layout: world size, parallel sizes and rank order, and every Megatron group.

A `Layout` answers, for any virtual rank of the target job, what megatron-core 0.16.1's
`initialize_model_parallel` would give that rank: its coordinates and the members of each of its
process groups (see `GROUP_KINDS`). It computes them arithmetically (see `grid.py`), so one rank
of a 131072-rank job costs microseconds to milliseconds and nothing ever enumerates the world
unless asked to (`groups(kind)`).

megatron-core builds two rank generators and so do we:
* the decoder grid (tp, cp, ep=1, dp, pp) for the dense part: tp, pp, dp, dp_cp, cp, mp, tp_dp,
  tp_cp, tp_dp_cp, and the embedding groups drawn from each pp group;
* the expert grid (etp, cp=1, ep, edp, pp) for MoE layers: ep, expt_tp, expt_dp, tp_ep, tp_ep_pp.
Both share the pipeline groups (megatron-core asserts it), which is why CP and EP may both exceed 1
for the job while neither grid holds both.

Not modelled: hierarchical CP groups, hybrid DP x CP groups, partial distributed-optimizer
instances (`num_distributed_optimizer_instances > 1`) and multi-token-prediction embedding ranks.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from prism_megatron.topology import roles as _roles
from prism_megatron.topology.grid import MAX_WORLD_SIZE, RankGrid
from prism_megatron.topology.roles import Role

ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")
"""Rank orders Megatron-LM uses: the default, and the one `--use-tp-pp-dp-mapping` selects."""

GROUP_KINDS = (
    "tp",
    "pp",
    "dp",
    "dp_cp",
    "cp",
    "mp",
    "tp_dp",
    "tp_cp",
    "tp_dp_cp",
    "ep",
    "expt_tp",
    "expt_dp",
    "tp_ep",
    "tp_ep_pp",
    "embd",
    "pos_embd",
)
"""Every process-group kind `initialize_model_parallel` gives a rank, named as megatron-core's
`ProcessGroupCollection` names them."""

# kind -> (grid, dimensions that vary inside the group). The embedding kinds come from pp groups.
_GRID_TOKENS = {
    "tp": ("decoder", "tp"),
    "pp": ("decoder", "pp"),
    "dp": ("decoder", "dp"),
    "dp_cp": ("decoder", "cp-dp"),
    "cp": ("decoder", "cp"),
    "mp": ("decoder", "tp-pp"),
    "tp_dp": ("decoder", "tp-dp"),
    "tp_cp": ("decoder", "tp-cp"),
    "tp_dp_cp": ("decoder", "tp-cp-dp"),
    "ep": ("expert", "ep"),
    "expt_tp": ("expert", "etp"),
    "expt_dp": ("expert", "edp"),
    "tp_ep": ("expert", "etp-ep"),
    "tp_ep_pp": ("expert", "etp-ep-pp"),
    "embd": ("decoder", "pp"),
    "pos_embd": ("decoder", "pp"),
}
assert tuple(_GRID_TOKENS) == GROUP_KINDS

_FLAGS = {
    "world_size": "--world-size",
    "tp": "--tensor-model-parallel-size",
    "pp": "--pipeline-model-parallel-size",
    "cp": "--context-parallel-size",
    "ep": "--expert-model-parallel-size",
    "etp": "--expert-tensor-parallel-size",
    "vpp": "--virtual-pipeline-model-parallel-size",
}


@dataclass(frozen=True)
class Coords:
    """Where one virtual rank sits in the target job: dense coordinates, then expert coordinates."""

    tp: int
    """Tensor-parallel rank (decoder grid)."""
    cp: int
    """Context-parallel rank."""
    dp: int
    """Data-parallel rank (without CP)."""
    pp: int
    """Pipeline stage; the same in both grids."""
    etp: int
    """Expert-tensor-parallel rank (expert grid)."""
    ep: int
    """Expert-parallel rank: which shard of the experts this rank holds."""
    edp: int
    """Expert-data-parallel rank."""

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COORD_NAMES}


COORD_NAMES = ("tp", "cp", "dp", "pp", "etp", "ep", "edp")
"""Field names of `Coords`, which are also the coordinate filters of the selection language."""


def embedding_ranks(pp_group: Sequence[int], *, untie_embeddings: bool, mtp: bool) -> tuple[int, ...]:
    """The members of a pipeline group's word-embedding group, as Megatron-LM's `pretrain_gpt.py` chooses
    them (`get_embedding_ranks`): the first stage; the last too when it holds the output layer's tied
    weight or multi-token-prediction layers (which use the embedding)."""
    if len(pp_group) > 1 and (not untie_embeddings or mtp):
        return (pp_group[0], pp_group[-1])
    return (pp_group[0],)


def _is_count(value) -> bool:
    """An integer, not a boolean (True is an int to Python, never a size to a user)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The target job's world and parallel sizes; raises ValueError for a job Megatron would refuse."""

    world_size: int
    """Number of ranks in the target job (W)."""
    tp: int = 1
    """Tensor-parallel size (`--tensor-model-parallel-size`)."""
    pp: int = 1
    """Pipeline-parallel size (`--pipeline-model-parallel-size`)."""
    cp: int = 1
    """Context-parallel size (`--context-parallel-size`)."""
    ep: int = 1
    """Expert-parallel size (`--expert-model-parallel-size`)."""
    etp: int | None = None
    """Expert-tensor-parallel size (`--expert-tensor-parallel-size`); None means the same as tp."""
    vpp: int | None = None
    """Virtual pipeline stages (model chunks) per pipeline rank; None when not interleaved."""
    order: str = "tp-cp-ep-dp-pp"
    """Rank order, fastest dimension first; one of `ORDERS`."""
    untie_embeddings: bool = False
    """`--untie-embeddings-and-output-weights`: the last stage then leaves the embedding group..."""
    mtp: bool = False
    """...unless it holds multi-token-prediction layers (`--mtp-num-layers`), which use the embedding:
    Megatron-LM's `get_embedding_ranks` adds the MTP stage (the last one) back."""

    dp: int = field(init=False)
    """Data-parallel size, derived: W / (tp * pp * cp)."""
    edp: int = field(init=False)
    """Expert-data-parallel size, derived: W / (etp * ep * pp)."""
    decoder: RankGrid = field(init=False, repr=False, compare=False)
    expert: RankGrid = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        self._validate_sizes()
        object.__setattr__(self, "dp", self.world_size // (self.tp * self.pp * self.cp))
        object.__setattr__(self, "edp", self.world_size // (self.etp * self.ep * self.pp))
        if self.order.endswith("dp") and self.pp > 1 and self.edp != self.dp:
            raise ValueError(
                f"--use-tp-pp-dp-mapping needs the same data-parallel size for dense and expert layers, "
                f"but DP={self.dp} and expert DP={self.edp}; choose --expert-tensor-parallel-size x "
                f"--expert-model-parallel-size = --tensor-model-parallel-size x --context-parallel-size "
                f"({self.tp * self.cp})"
            )
        decoder_sizes = {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}
        expert_sizes = {"tp": self.etp, "cp": 1, "ep": self.ep, "dp": self.edp, "pp": self.pp}
        expert_names = {"tp": "etp", "cp": "cp", "ep": "ep", "dp": "edp", "pp": "pp"}
        tokens = self.order.split("-")
        object.__setattr__(self, "decoder", RankGrid(tuple(tokens), tuple(decoder_sizes[t] for t in tokens)))
        object.__setattr__(
            self,
            "expert",
            RankGrid(tuple(expert_names[t] for t in tokens), tuple(expert_sizes[t] for t in tokens)),
        )

    def _validate_sizes(self) -> None:
        if not _is_count(self.world_size) or self.world_size < 1:
            raise ValueError(f"--world-size must be a positive integer, got {self.world_size!r}")
        if self.world_size > MAX_WORLD_SIZE:
            raise ValueError(
                f"--world-size {self.world_size} is above the largest supported world, {MAX_WORLD_SIZE} "
                "ranks (2^20)"
            )
        for name in ("tp", "pp", "cp", "ep", "etp"):
            value = getattr(self, name)
            if not _is_count(value) or value < 1:
                raise ValueError(f"{_FLAGS[name]} must be a positive integer, got {value!r}")
        if self.order not in ORDERS:
            raise ValueError(f"rank order {self.order!r} is not supported; valid orders: {', '.join(ORDERS)}")
        model_size = self.tp * self.pp * self.cp
        if self.world_size % model_size:
            raise ValueError(
                f"--world-size {self.world_size} is not divisible by --tensor-model-parallel-size x "
                f"--pipeline-model-parallel-size x --context-parallel-size = {self.tp}x{self.pp}x{self.cp} "
                f"= {model_size}; choose sizes whose product divides the world size"
            )
        expert_size = self.etp * self.ep * self.pp
        if self.world_size % expert_size:
            raise ValueError(
                f"--world-size {self.world_size} is not divisible by --expert-tensor-parallel-size x "
                f"--expert-model-parallel-size x --pipeline-model-parallel-size = "
                f"{self.etp}x{self.ep}x{self.pp} = {expert_size}; choose expert sizes whose product "
                f"divides the world size"
            )
        if self.vpp is not None:
            if not _is_count(self.vpp) or self.vpp < 1:
                raise ValueError(f"{_FLAGS['vpp']} must be a positive integer, got {self.vpp!r}")
            if self.pp == 1:
                raise ValueError(
                    f"{_FLAGS['vpp']} {self.vpp} (interleaved pipeline) needs "
                    f"--pipeline-model-parallel-size > 1, got 1"
                )

    # ---- coordinates -------------------------------------------------------------------------

    def check_rank(self, virtual_rank: int) -> int:
        """`virtual_rank` as a Python int; ValueError unless it is a rank of this world."""
        if not isinstance(virtual_rank, numbers.Integral) or not 0 <= virtual_rank < self.world_size:
            raise ValueError(f"virtual rank {virtual_rank!r} is outside the world (0..{self.world_size - 1})")
        return int(virtual_rank)

    def coords(self, virtual_rank: int) -> Coords:
        """Coordinates of `virtual_rank` in the decoder and expert grids."""
        virtual_rank = self.check_rank(virtual_rank)
        dense = self.decoder.coords(virtual_rank)
        expert = self.expert.coords(virtual_rank)
        return Coords(
            tp=dense["tp"],
            cp=dense["cp"],
            dp=dense["dp"],
            pp=dense["pp"],
            etp=expert["etp"],
            ep=expert["ep"],
            edp=expert["edp"],
        )

    # ---- groups ------------------------------------------------------------------------------

    def _grid(self, kind: str) -> tuple[RankGrid, str]:
        if kind not in _GRID_TOKENS:
            raise ValueError(f"unknown group kind {kind!r}; valid kinds: {', '.join(GROUP_KINDS)}")
        grid_name, token = _GRID_TOKENS[kind]
        return (self.decoder if grid_name == "decoder" else self.expert), token

    def kwargs(self) -> dict[str, object]:
        """The keyword arguments that rebuild this layout, as a graph's metadata stores them (`mtp` only
        when set, so that a graph of a job without MTP reads as it did before the field existed)."""
        names = ("world_size", "tp", "pp", "cp", "ep", "etp", "vpp", "order", "untie_embeddings")
        return {name: getattr(self, name) for name in names} | ({"mtp": True} if self.mtp else {})

    def _embedding_members(self, kind: str, pp_group: tuple[int, ...]) -> tuple[int, ...]:
        if kind == "pos_embd":
            return (pp_group[0],)
        return embedding_ranks(pp_group, untie_embeddings=self.untie_embeddings, mtp=self.mtp)

    def has_group(self, kind: str, virtual_rank: int) -> bool:
        """Whether the rank belongs to a group of this kind (only embd and pos_embd leave some out)."""
        self._grid(kind)
        virtual_rank = self.check_rank(virtual_rank)
        if kind not in ("embd", "pos_embd"):
            return True
        stage = self.decoder.coord("pp", virtual_rank)
        return stage in self._embedding_members(kind, (0, self.pp - 1) if self.pp > 1 else (0,))

    def group(self, kind: str, virtual_rank: int) -> tuple[int, ...]:
        """Members of the rank's group of this kind, in Megatron's order; () when it has none."""
        grid, token = self._grid(kind)
        virtual_rank = self.check_rank(virtual_rank)
        if kind in ("embd", "pos_embd"):
            if not self.has_group(kind, virtual_rank):
                return ()
            return self._embedding_members(kind, grid.group(token, virtual_rank))
        return grid.group(token, virtual_rank)

    def group_index(self, kind: str, virtual_rank: int) -> int:
        """Which group of this kind holds the rank (0..num_groups-1, in Megatron's creation order).

        Raises ValueError for an embedding kind the rank is not in (see `has_group`).
        """
        grid, token = self._grid(kind)
        virtual_rank = self.check_rank(virtual_rank)
        if not self.has_group(kind, virtual_rank):
            raise ValueError(
                f"virtual rank {virtual_rank} is in no {kind} group (pipeline stage "
                f"{self.decoder.coord('pp', virtual_rank)} holds no embedding)"
            )
        return grid.group_index(token, virtual_rank)

    def rank_in_group(self, kind: str, virtual_rank: int) -> int:
        """The rank's position inside its group of this kind (its group-local rank)."""
        if kind in ("embd", "pos_embd"):
            self.group_index(kind, virtual_rank)  # raises ValueError when the rank has no such group
            return self.group(kind, virtual_rank).index(virtual_rank)
        grid, token = self._grid(kind)
        virtual_rank = self.check_rank(virtual_rank)
        return grid.rank_in_group(token, virtual_rank)

    def group_size(self, kind: str) -> int:
        """Members per group of this kind (embedding kinds: of the groups with the most members)."""
        grid, token = self._grid(kind)
        if kind in ("embd", "pos_embd"):
            return len(self._embedding_members(kind, tuple(range(self.pp))))
        return grid.group_size(token)

    def num_groups(self, kind: str) -> int:
        """How many groups of this kind Megatron creates (embedding kinds: one per pp group)."""
        grid, token = self._grid(kind)
        return grid.num_groups(token)

    def groups(self, kind: str) -> Iterator[tuple[int, ...]]:
        """Every group of this kind, in the order megatron-core creates them. O(world size)."""
        grid, token = self._grid(kind)
        if kind in ("embd", "pos_embd"):
            return (self._embedding_members(kind, members) for members in grid.groups(token))
        return grid.groups(token)

    # ---- roles (see roles.py for the rule) ---------------------------------------------------

    def role_of(self, virtual_rank: int) -> Role:
        """The role of one virtual rank."""
        virtual_rank = self.check_rank(virtual_rank)
        return _roles.role_of(self, virtual_rank)

    def roles(self) -> list[Role]:
        """Every role of the job, ordered by pipeline stage, data source first, then expert shard."""
        return _roles.all_roles(self)

    def role_members(self, role: Role) -> Iterator[int]:
        """The virtual ranks of one role, ascending."""
        return _roles.role_members(self, role)

    def role_count(self, role: Role) -> int:
        """How many virtual ranks share the role."""
        return _roles.role_count(self, role)

    def representative(self, role: Role) -> int:
        """The virtual rank the default slice runs for this role: its smallest member."""
        return next(_roles.role_members(self, role))

    def default_slice(self) -> list[int]:
        """The smallest set of virtual ranks covering every role (one per role), sorted."""
        return sorted(self.representative(role) for role in self.roles())

"""The proposer contract: what the MCTS asks of templates and of an LLM. Pure Python, no torch.

The search calls ``proposer.propose(request)`` for a node it wants to expand and gets back a list
of ``Move``s (each a child candidate and the label of the edge). An empty list means the node has
no more children to offer. Proposers never evaluate anything; they may be slow (an LLM call), so
the search calls them from worker threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from forge_pack.core.candidate import Candidate
from forge_pack.core.hotspot import Hotspot
from forge_pack.core.verdict import Baseline, Evaluation


@dataclass(frozen=True)
class Move:
    candidate: Candidate
    label: str  # edge label shown in the tree, e.g. "block_threads 256->512" or "llm rewrite"
    kind: str = "template"  # root | template | llm | repair


@dataclass(frozen=True)
class NodeView:
    """What a proposer may know about a node: its candidate and how it fared."""

    node_id: int
    candidate: Candidate
    evaluation: Evaluation | None
    depth: int


@dataclass(frozen=True)
class ProposeRequest:
    hotspot: Hotspot
    backend: str  # cuda | cpu
    parent: NodeView | None  # None: propose root candidates (starting points)
    baseline: Baseline | None = None
    siblings: tuple[NodeView, ...] = ()  # the parent's existing children (avoid duplicates, learn from failures)
    tried_hashes: frozenset[str] = frozenset()  # content hashes already in the tree
    max_moves: int = 4
    gpu: dict = field(default_factory=dict)  # name, compute capability, copy bandwidth, smem, regs


class Proposer(Protocol):
    name: str

    def propose(self, request: ProposeRequest) -> list[Move]: ...

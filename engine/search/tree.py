"""Search trees as plain data, and the strategies that pick which node to revise next.

Everything here is a pure function of the tree (no GPU, no store, no clock), so selection, widening
and backup are tested on hand-built trees. Nodes are candidates; the root is the card itself (eager).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

ROOT = "root"


@dataclass
class Node:
    """One candidate in a card's tree. `raw` is log(t_eager / t) once verified; failures are dead."""

    id: str
    parent: str | None
    children: list[str] = field(default_factory=list)
    visits: int = 0
    raw: float | None = None       # log speedup of this node's own candidate (None: pending or failed)
    best_raw: float | None = None  # best raw reward in this node's subtree (max backup)
    dead: bool = False             # failed: scores 0, never expanded
    pending: int = 0               # proposals in flight below this node (virtual loss)
    closed: bool = False           # the proposer has nothing new to offer from here


@dataclass
class Tree:
    nodes: dict[str, Node]

    @classmethod
    def new(cls) -> Tree:
        return cls({ROOT: Node(ROOT, None)})

    def add(self, node_id: str, parent: str) -> Node:
        """Attach a new (pending) child; the proposal for it is in flight."""
        node = Node(node_id, parent)
        self.nodes[node_id] = node
        self.nodes[parent].children.append(node_id)
        for n in self.path(parent):
            n.pending += 1
        return node

    def path(self, node_id: str) -> list[Node]:
        """The node and its ancestors up to the root."""
        out, cur = [], node_id
        while cur is not None:
            n = self.nodes[cur]
            out.append(n)
            cur = n.parent
        return out

    def verified(self) -> Iterable[Node]:
        return (n for n in self.nodes.values() if n.raw is not None)

    def best(self) -> Node | None:
        """The node with the highest speedup so far."""
        return max(self.verified(), key=lambda n: n.raw, default=None)


@dataclass(frozen=True)
class SearchParams:
    """DESIGN.md defaults: UCT exploration c, progressive widening k·N^alpha."""

    c: float = 1.4
    k: float = 1.0
    alpha: float = 0.5
    beam_width: int = 4


def backup(tree: Tree, node_id: str, raw: float | None) -> None:
    """Record an evaluation: a speedup (raw = log(t_eager/t)) or a failure (None, node dies).

    Every ancestor gains a visit and keeps the best raw reward of its subtree.
    """
    node = tree.nodes[node_id]
    node.raw = raw
    node.dead = raw is None
    for n in tree.path(node_id):
        n.visits += 1
        n.pending = max(0, n.pending - 1)
        if raw is not None and (n.best_raw is None or raw > n.best_raw):
            n.best_raw = raw


def normalizer(tree: Tree):
    """Map raw rewards to [0.1, 1] over the tree's verified nodes; failures and unknowns score 0.

    Normalising keeps UCT's exploration constant meaningful whether speedups are 1.02× or 30×.
    """
    raws = [n.raw for n in tree.verified()]
    if not raws:
        return lambda r: 0.0
    lo, hi = min(raws), max(raws)

    def norm(r: float | None) -> float:
        if r is None:
            return 0.0
        if hi - lo < 1e-12:
            return 1.0
        return 0.1 + 0.9 * (r - lo) / (hi - lo)
    return norm


def may_widen(node: Node, p: SearchParams) -> bool:
    """Progressive widening: a new child while children < ceil(k · N^alpha) (N: visits incl. pending)."""
    n = max(1, node.visits + node.pending)
    return len(node.children) < math.ceil(p.k * n ** p.alpha)


def uct(child: Node, parent: Node, norm, p: SearchParams) -> float:
    """Upper confidence bound of a child: its subtree's best normalised reward plus exploration."""
    visits = child.visits + child.pending  # virtual loss: in-flight work counts as a visit
    if visits == 0:
        return math.inf
    n_parent = max(1, parent.visits + parent.pending)
    return norm(child.best_raw) + p.c * math.sqrt(math.log(n_parent + 1) / visits)


def select_mcts(tree: Tree, p: SearchParams = SearchParams()) -> str | None:
    """The node to expand next (its new child revises it; the root means a fresh kernel), or None
    when every path ends in work still in flight (wait for a result before proposing more)."""
    norm = normalizer(tree)
    cur = tree.nodes[ROOT]
    while True:
        # A failed node whose repair verified is alive through its repaired descendants.
        alive = [tree.nodes[c] for c in cur.children if not tree.nodes[c].dead or _open(tree, tree.nodes[c])]
        expandable = (cur.id == ROOT or cur.raw is not None) and not cur.closed
        if expandable and (may_widen(cur, p) or not alive):
            return cur.id
        # Descend only into subtrees that hold a node which can still be revised.
        candidates = [c for c in alive if _open(tree, c)]
        if not candidates:
            return None  # the alive children are all still being evaluated
        cur = max(candidates, key=lambda c: (uct(c, cur, norm, p), c.id))


def _open(tree: Tree, node: Node) -> bool:
    if node.dead:
        return any(_open(tree, tree.nodes[c]) for c in node.children)
    if node.raw is not None and not node.closed:
        return True
    return any(_open(tree, tree.nodes[c]) for c in node.children)


def select_greedy(tree: Tree, p: SearchParams = SearchParams()) -> str | None:
    """Linear refinement: always revise the best verified node (fresh kernels until one verifies)."""
    best = max((n for n in tree.verified() if not n.closed), key=lambda n: n.raw, default=None)
    if best is not None:
        return best.id
    return None if tree.nodes[ROOT].closed else ROOT


def select_beam(tree: Tree, p: SearchParams = SearchParams()) -> str | None:
    """Beam: among the top `beam_width` verified nodes, revise the one with the fewest children."""
    top = sorted((n for n in tree.verified() if not n.closed), key=lambda n: (-n.raw, n.id))[: p.beam_width]
    root = tree.nodes[ROOT]
    if len(top) < p.beam_width and len(root.children) < p.beam_width and not root.closed:
        return ROOT  # fill the beam with fresh kernels first
    if not top:
        return None if root.closed else ROOT
    return min(top, key=lambda n: (len(n.children) + n.pending, -n.raw, n.id)).id


STRATEGIES = {"mcts": select_mcts, "greedy": select_greedy, "beam": select_beam}

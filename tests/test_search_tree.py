"""MCTS selection, progressive widening and backup on hand-built trees; greedy and beam."""

import math

from engine.search.tree import (
    ROOT,
    SearchParams,
    Tree,
    backup,
    may_widen,
    normalizer,
    select_beam,
    select_greedy,
    select_mcts,
)


def grow(tree, node_id, parent, speedup):
    tree.add(node_id, parent)
    backup(tree, node_id, None if speedup is None else math.log(speedup))


def test_fresh_tree_asks_for_a_fresh_kernel():
    assert select_mcts(Tree.new()) == ROOT


def test_backup_counts_visits_and_keeps_the_best_of_the_subtree():
    t = Tree.new()
    grow(t, "a", ROOT, 1.5)
    grow(t, "b", "a", 3.0)
    grow(t, "c", "a", 1.1)
    grow(t, "d", "b", None)
    a, b, d = t.nodes["a"], t.nodes["b"], t.nodes["d"]
    assert t.nodes[ROOT].visits == 4 and a.visits == 4 and b.visits == 2
    assert math.isclose(a.best_raw, math.log(3.0)) and math.isclose(t.nodes[ROOT].best_raw, math.log(3.0))
    assert d.dead and d.raw is None and b.best_raw == math.log(3.0)  # a failure never lowers the best
    assert t.nodes[ROOT].pending == 0


def test_progressive_widening_follows_k_n_alpha():
    t = Tree.new()
    p = SearchParams(k=1.0, alpha=0.5)
    grow(t, "a", ROOT, 1.2)
    root = t.nodes[ROOT]
    assert root.visits == 1 and not may_widen(root, p)  # ceil(1 * 1^0.5) = 1 child
    assert select_mcts(t, p) == "a"                     # so revise the only child
    grow(t, "a1", "a", 1.3)
    grow(t, "a2", "a", 1.1)
    assert root.visits == 3 and may_widen(root, p)      # ceil(sqrt(3)) = 2 > 1 child
    assert select_mcts(t, p) == ROOT
    wide = SearchParams(k=3.0, alpha=0.5)
    assert may_widen(t.nodes["a"], wide)


def test_uct_prefers_the_better_subtree_at_equal_visits():
    t = Tree.new()
    p = SearchParams(k=0.5)  # little widening, so selection descends
    grow(t, "slow", ROOT, 1.1)
    grow(t, "fast", ROOT, 2.5)
    assert select_mcts(t, p) == "fast"


def test_uct_explores_the_less_visited_child_when_values_tie():
    t = Tree.new()
    p = SearchParams(k=0.5, c=1.4)
    grow(t, "a", ROOT, 2.0)
    grow(t, "b", ROOT, 2.0)
    for i in range(6):
        grow(t, f"a{i}", "a", 2.0)
    assert select_mcts(t, p) in ("b",)


def test_failures_score_zero_and_dead_children_are_skipped():
    t = Tree.new()
    grow(t, "bad", ROOT, None)
    assert select_mcts(t) == ROOT  # only a dead child: a fresh kernel
    grow(t, "good", ROOT, 1.4)
    norm = normalizer(t)
    assert norm(None) == 0.0 and norm(t.nodes["good"].raw) == 1.0


def test_in_flight_work_counts_as_a_visit_and_none_means_wait():
    t = Tree.new()
    t.add("p1", ROOT)  # a fresh kernel being evaluated
    assert t.nodes[ROOT].pending == 1
    assert select_mcts(t) is None  # widening allows 1 child at N=1 and it is still pending
    backup(t, "p1", math.log(1.3))
    assert t.nodes[ROOT].pending == 0 and select_mcts(t) == "p1"


def test_normalised_rewards_are_scale_free():
    t = Tree.new()
    grow(t, "a", ROOT, 1.01)
    grow(t, "b", ROOT, 1.02)
    n = normalizer(t)
    assert math.isclose(n(t.nodes["a"].raw), 0.1) and math.isclose(n(t.nodes["b"].raw), 1.0)


def test_greedy_and_beam():
    t = Tree.new()
    assert select_greedy(t) == ROOT and select_beam(t, SearchParams(beam_width=2)) == ROOT
    grow(t, "a", ROOT, 1.2)
    grow(t, "b", ROOT, 1.8)
    grow(t, "c", ROOT, 1.5)
    assert select_greedy(t) == "b"
    p = SearchParams(beam_width=2)
    assert select_beam(t, p) == "b"
    grow(t, "b1", "b", 1.0)
    assert select_beam(t, p) == "c"  # top-2 are b and c; c has fewer children


def test_closed_nodes_are_not_expanded():
    t = Tree.new()
    grow(t, "a", ROOT, 1.5)
    t.nodes["a"].closed = True
    t.nodes[ROOT].closed = True
    assert select_mcts(t) is None and select_greedy(t) is None


def test_selection_goes_around_a_closed_best_leaf():
    t = Tree.new()
    p = SearchParams(k=0.5)
    grow(t, "best", ROOT, 3.0)
    grow(t, "other", ROOT, 1.5)
    t.nodes["best"].closed = True
    assert select_mcts(t, p) == "other"

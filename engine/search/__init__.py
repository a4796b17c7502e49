"""Search over candidate revisions per card: MCTS (default), greedy and beam, as pure functions."""

"""Search stage: MCTS over kernel candidates from the template and LLM proposers."""

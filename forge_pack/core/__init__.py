"""The torch-free vocabulary every stage shares: errors, signatures, hotspots, candidates, verdicts."""

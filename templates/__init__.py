"""Data shipped with forge-pack: kernel families, package files, prompts (not code)."""

"""The forge-pack command line: one module per command."""

"""forge-pack: turn an unmodified PyTorch model into a pip-installable accelerator package."""

__version__ = "0.1.0"

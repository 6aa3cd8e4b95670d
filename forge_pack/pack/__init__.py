"""Pack stage: turn a finished run into a pip-installable accelerator package."""

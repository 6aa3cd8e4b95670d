"""Faster kernels for one model, found, verified and packaged by forge-pack.

    import torch, PACKAGE_NAME
    PACKAGE_NAME.apply(model)          # or PACKAGE_NAME.apply() for function-level targets only
    with torch.inference_mode():
        out = model(*inputs)
    PACKAGE_NAME.revert()

    compiled = PACKAGE_NAME.compile(model)       # torch.compile with the kernels that win compiled
    compiled = torch.compile(model, backend=PACKAGE_NAME.backend)   # the same
    PACKAGE_NAME.export(model, inputs, path="model.pt2")   # AOTInductor; PACKAGE_NAME.load_exported(path)

    with PACKAGE_NAME.patched(model):  # the same, as a context manager
        ...

What is accelerated, and by how much, is in ``manifest`` (manifest.json) and the README.
``python -m PACKAGE_NAME verify | bench | info`` checks the kernels on this machine; ``export`` writes a .pt2.
Set FORGE_PACK_DISABLE=1 (or true, yes, on) to turn the package off without touching code; 0, false,
no, off or empty leave it on, and any other value leaves it on with a warning.
"""

from pathlib import Path as _Path

from . import _compile, _patch

_PATCHER = _patch.for_package(__name__, _Path(__file__).resolve().parent)
manifest: dict = _PATCHER.manifest
__version__: str = manifest["package"]["version"]
_COMPILE = _compile.CompileMode(_PATCHER)


def apply(model=None) -> bool:
    """Patch every call path of the verified targets (and RMSNorm-like modules inside `model`).

    Calls that differ from what was verified (device, GPU, dtype, shape, strides, arguments,
    autograd) run the original op. Returns False, and warns once why, when nothing was patched.
    """
    return _PATCHER.apply(model)


def revert() -> None:
    """Undo apply(): every patched function, class and module gets back the very object it had."""
    _PATCHER.revert()


def patched(model=None):
    """Context manager: apply(model) on entry, revert() on exit (if it was not applied before)."""
    return _PATCHER.patched(model)


def status() -> dict:
    """Whether the extension loaded (and why not), what is patched, kernel and fallback call counts."""
    return _PATCHER.status()


def load() -> bool:
    """Load the compiled kernels without patching anything; False (see status()) if they cannot load."""
    return _PATCHER.load()


def compile(model, **torch_compile_kwargs):
    """torch.compile(model, backend=backend, **torch_compile_kwargs): Inductor compiles the model, and
    each call the package verified, and the build measured faster compiled with it (the manifest's
    ``compile.use``), runs the package's kernel. No global patching; apply() is not needed."""
    return _COMPILE.compile(model, **torch_compile_kwargs)


def backend(gm, example_inputs, **kwargs):
    """A torch.compile backend: torch.compile(model, backend=PACKAGE_NAME.backend, mode=...)."""
    return _COMPILE.backend(gm, example_inputs, **kwargs)


def export(model, args, kwargs=None, path="model.pt2") -> dict:
    """An AOTInductor .pt2 of `model` on these example inputs, with the kernels compile mode uses in it
    (the model's code is not needed to run it: load_exported(path))."""
    return _COMPILE.export(model, args, kwargs, path)


def load_exported(path):
    """The callable model of a .pt2 written by export(): needs torch and this package, nothing else."""
    return _compile.load_exported(_PATCHER, path)

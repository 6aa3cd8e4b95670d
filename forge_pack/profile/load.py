"""Load a user's model file into a Target: the module, its real inputs, device and dtype.

Two forms are accepted (the user's code is imported as is, never edited):
- ``get_model() -> nn.Module`` and ``get_inputs() -> tuple | list | dict``;
- KernelBench: class ``Model``, ``get_init_inputs() -> list`` and ``get_inputs() -> list``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from forge_pack.core.errors import ForgeError
from forge_pack.targets import dtypes

# --dtype: any spelling of forge_pack.targets.dtypes (the one alias table) naming a castable dtype
DTYPES = {alias: dtypes.torch_dtype(name) for alias, name in dtypes.ALIASES.items() if name in dtypes.CASTABLE}


@dataclass
class Target:
    module: torch.nn.Module
    args: tuple
    kwargs: dict
    device: str
    dtype: str | None  # the --dtype cast, None when the model's own dtypes are kept
    path: str
    model_hash: str
    form: str  # "get_model" | "kernelbench"
    extra: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return Path(self.path).stem

    def forward(self) -> Any:
        return self.module(*self.args, **self.kwargs)


def resolve_device(device: str | None) -> str:
    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ForgeError(f"unknown device {device!r}", "use --device cpu or --device cuda")
    if device == "cuda" and not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ForgeError(f"--device cuda was asked for, but {why}",
                         "run on a machine with an NVIDIA GPU, or use --device cpu")
    return device


def resolve_dtype(dtype: str | None) -> torch.dtype | None:
    if dtype in (None, "", "keep"):
        return None
    if dtype not in DTYPES:
        raise ForgeError(f"unknown dtype {dtype!r}", "use float32, bfloat16 or float16")
    return DTYPES[dtype]


def file_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def import_model_file(path: str | Path):
    p = Path(path)
    if not p.exists():
        raise ForgeError(f"model file not found: {path}", "pass the path of a Python file that defines the model")
    if p.is_dir() or p.suffix != ".py":
        raise ForgeError(f"{path} is not a Python file", "pass a .py file with get_model()/get_inputs() or Model")
    digest = hashlib.sha256(str(p.resolve()).encode()).hexdigest()[:8]
    name = f"forge_user_model_{p.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise ForgeError(f"cannot import {path}", "check that it is a readable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent = str(p.resolve().parent)
    sys.path.insert(0, parent)  # so the model file can import its sibling modules
    try:
        spec.loader.exec_module(module)
    except SystemExit as e:  # BaseException: it would end forge-pack with the model's status and no word
        sys.modules.pop(name, None)
        raise exit_error(e, f"{path} called sys.exit({e.code!r}) while being imported", path) from None
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise ForgeError(f"syntax error in {path}, line {e.lineno}: {e.msg}", "fix the model file and run again")
    except ImportError as e:
        sys.modules.pop(name, None)
        raise ForgeError(f"{path} failed to import: {type(e).__name__}: {e}",
                         "install the missing package in this environment, or fix the import")
    except Exception as e:  # the user's module-level code raised
        sys.modules.pop(name, None)
        raise ForgeError(f"{path} raised while being imported: {type(e).__name__}: {e}",
                         "run `python " + str(path) + "` to see the full error, or use --debug")
    finally:
        try:
            sys.path.remove(parent)
        except ValueError:
            pass
    return module


def exit_error(e: SystemExit, message: str, path: str) -> ForgeError:
    """A model that called sys.exit() (or exit(), or raised SystemExit): where, and what to change."""
    return ForgeError(f"{message} ({_where(e, path)})",
                      "a model file must not exit: forge-pack imports it and calls get_model()/get_inputs() and "
                      "forward(); move script code under `if __name__ == \"__main__\":`")


def _call(fn, what: str, path: str):
    try:
        return fn()
    except ForgeError:
        raise
    except SystemExit as e:
        raise exit_error(e, f"{what} in {path} called sys.exit({e.code!r})", path) from None
    except Exception as e:
        raise ForgeError(f"{what} in {path} raised {type(e).__name__}: {e}",
                         "fix the model file; --debug shows the traceback")


def load(path: str | Path, device: str | None = None, dtype: str | None = None) -> Target:
    path = str(path)
    dev = resolve_device(device)
    cast = resolve_dtype(dtype)
    mod = import_model_file(path)
    if callable(getattr(mod, "get_model", None)) and callable(getattr(mod, "get_inputs", None)):
        form = "get_model"
        module = _call(mod.get_model, "get_model()", path)
    elif isinstance(getattr(mod, "Model", None), type) and callable(getattr(mod, "get_inputs", None)):
        form = "kernelbench"
        init = _call(mod.get_init_inputs, "get_init_inputs()", path) if hasattr(mod, "get_init_inputs") else []
        if not isinstance(init, (list, tuple)):
            raise ForgeError(f"get_init_inputs() in {path} returned {type(init).__name__}, not a list",
                             "return the Model constructor's arguments as a list")
        module = _call(lambda: mod.Model(*init), "Model(*get_init_inputs())", path)
    else:
        raise ForgeError(f"{path} defines neither get_model()/get_inputs() nor Model/get_inputs()",
                         "add `def get_model(): ...` returning an nn.Module and `def get_inputs(): ...` "
                         "returning its forward arguments")
    if not isinstance(module, torch.nn.Module):
        raise ForgeError(f"the model from {path} is a {type(module).__name__}, not a torch.nn.Module",
                         "get_model() must return an nn.Module instance")
    inputs = _call(mod.get_inputs, "get_inputs()", path)
    if isinstance(inputs, dict):
        args, kwargs = (), dict(inputs)
    elif isinstance(inputs, (list, tuple)):
        args, kwargs = tuple(inputs), {}
    elif isinstance(inputs, torch.Tensor):
        args, kwargs = (inputs,), {}
    else:
        raise ForgeError(f"get_inputs() in {path} returned {type(inputs).__name__}",
                         "return a tuple or list of forward arguments, or a dict of keyword arguments")
    module = module.to(dev)
    if cast is not None:
        module = module.to(cast)  # casts floating parameters and buffers only
    module.eval()
    args = _move(args, dev, cast)
    kwargs = _move(kwargs, dev, cast)
    return Target(module, args, kwargs, dev, str(cast).replace("torch.", "") if cast else None, path,
                  file_hash(path), form)


def _move(obj: Any, device: str, cast: torch.dtype | None) -> Any:
    if isinstance(obj, torch.Tensor):
        obj = obj.to(device)
        if cast is not None and obj.is_floating_point():
            obj = obj.to(cast)
        return obj
    if isinstance(obj, tuple):
        return tuple(_move(o, device, cast) for o in obj)
    if isinstance(obj, list):
        return [_move(o, device, cast) for o in obj]
    if isinstance(obj, dict):
        return {k: _move(v, device, cast) for k, v in obj.items()}
    return obj


def run_forward(target: Target) -> Any:
    """One forward pass; a forward that raises becomes a ForgeError naming the model file."""
    try:
        with torch.no_grad():
            return target.forward()
    except ForgeError:
        raise
    except SystemExit as e:
        raise exit_error(e, f"the model's forward called sys.exit({e.code!r})", target.path) from None
    except Exception as e:
        if isinstance(e, TypeError) and not _binds(target):
            raise ForgeError(f"the model's forward rejected the inputs from get_inputs(): {e}",
                             "get_inputs() must return what forward() takes, in order (or a dict of keywords)")
        raise ForgeError(f"the model's forward raised {type(e).__name__}: {e} ({_where(e, target.path)})",
                         f"run the model from {target.path} by itself to debug it; --debug shows the traceback")


def _binds(target: Target) -> bool:
    """Whether forward() takes get_inputs()'s arguments. Only a failed binding is the inputs' fault:
    a TypeError raised inside the forward (torch.cat(x, x)) is the model's own error."""
    try:
        sig = inspect.signature(target.module.forward)
    except (TypeError, ValueError):  # no signature to check (a builtin, a scripted module): not the inputs
        return True
    try:
        sig.bind(*target.args, **target.kwargs)
    except TypeError:
        return False
    return True


def _where(e: BaseException, path: str) -> str:
    """Where the error was raised: the innermost frame in the model file, else the innermost one."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return "no traceback"
    mine = Path(path).resolve()
    ours = [f for f in frames if Path(f.filename).resolve() == mine]
    f = (ours or frames)[-1]
    return f"{f.filename}, line {f.lineno}, in {f.name}"

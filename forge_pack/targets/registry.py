"""Every target kind, in one place: the stages iterate ``SPECS`` or look a kind up with ``get``.

Adding a kind is one module here that defines ``SPECS`` (see ``spec.TargetSpec``), listed in
``KIND_MODULES``. ``RUNTIME_MODULES`` are the files every package ships verbatim as
``<pkg>/_targets/`` (forge_pack.pack.packager copies them and records their sha256): the binder
the profiler runs is the one the package runs.
"""

from __future__ import annotations

from . import attention, avg_pool, batch_norm, dtypes, group_norm, layer_norm, rms_norm, softmax  # noqa: F401  (dtypes: for the package)
from .spec import CallPath, TargetSpec

KIND_MODULES = (softmax, layer_norm, rms_norm, group_norm, batch_norm, avg_pool, attention)
# The shipped runtime: this registry, what it imports, and __init__ (the package's _targets/).
RUNTIME_MODULES = ("__init__", "registry", "spec", "lazy_torch", "dtypes", "call_args", "inputs", "norm_common",
                   "layouts", "region_target", "region_sensitivity") + tuple(
                       m.__name__.rpartition(".")[2] for m in KIND_MODULES)

SPECS: dict[str, TargetSpec] = {s.name: s for m in KIND_MODULES for s in m.SPECS}
NAMES: tuple[str, ...] = tuple(SPECS)


def get(name: str) -> TargetSpec:
    """The kind named ``name``; KeyError (naming the known ones) for anything else."""
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"unknown target kind {name!r}; known: {', '.join(NAMES)}") from None


def spec_for(target) -> TargetSpec:
    """The spec of a target: an op kind's by name (a ``Signature`` or its op), or, for a region
    signature (op "region"), one built from the region's canonical form (forge_pack.targets.region_target,
    shipped in packages too, where ``spec_for_entry`` reaches it)."""
    op = target if isinstance(target, str) else target.op
    if op == "region" and not isinstance(target, str):
        from .region_target import spec_for as region_spec

        return region_spec(target)
    return get(op)


def spec_for_entry(op: str, params: dict) -> TargetSpec:
    """The spec of a package's manifest target: its op kind's, or for a region one built from the form
    in its parameters (the package verifies a region against the subgraph rebuilt from that form)."""
    if op == "region":
        from .region_target import spec_for_params

        return spec_for_params(params)
    return get(op)


def function_call_paths() -> list[tuple[TargetSpec, CallPath]]:
    """Every patchable function path (not module classes) of every kind."""
    return [(s, p) for s in SPECS.values() for p in s.call_paths if p.style != "module"]


def module_call_paths() -> list[tuple[TargetSpec, CallPath]]:
    """Every module-class path (nn.Softmax ...) of every kind: its forward calls a function path."""
    return [(s, p) for s in SPECS.values() for p in s.call_paths if p.style == "module"]

"""What this torch's export writes where versions differ, for tests that name the regions it finds.

torch 2.11 and 2.13 export eval dropout as aten.clone of its input (2.14 drops it): in the Llama block of
tests/models/regions/llama_regions.py the clone follows the softmax's cast and joins its region."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def eval_dropout_is_a_clone() -> bool:
    import torch
    import torch.nn as nn

    from forge_pack.graph.capture import capture

    g = capture(nn.Sequential(nn.Dropout(0.0)).eval(), (torch.randn(2, 3),), profile=False, routes=("export",))
    return any(n.op == "call_function" and "clone" in str(n.target) for n in g.gm.graph.nodes)


def llama_softmax() -> tuple[str, tuple[str, ...]]:
    """(pattern, compute ops) of the Llama block's mask + softmax region on the export route."""
    if eval_dropout_is_a_clone():
        return "div+add+softmax+cast+clone", ("div", "add", "softmax", "_to_copy", "clone")
    return "div+add+softmax+cast", ("div", "add", "softmax", "_to_copy")


LLAMA_SOFTMAX = llama_softmax()[0]

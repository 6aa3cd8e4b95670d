"""Target kinds: everything forge-pack knows about each op it replaces, one module per kind.

``registry`` lists them; ``spec`` defines what a kind provides. The modules named in
``registry.RUNTIME_MODULES`` import only the standard library, torch (on first use, through
``lazy_torch``) and each other, because every package ships them verbatim as ``<pkg>/_targets/``.
``abi``, ``ops`` and ``sigparse`` are forge-pack's own views of the registry (they use
``forge_pack.core``) and are not shipped. This file imports nothing: it is shipped too.
"""

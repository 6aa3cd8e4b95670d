"""The model as an ATen graph, and the regions of it that one kernel can compute.

- ``capture``: the forward on its real inputs as an ATen-level FX graph (torch.export, else
  make_fx, else dynamo + AOT), every node with its tensors' dtypes, shapes and strides;
- ``timing``: per-node time from the eager model's profile, else an estimate from bytes moved;
- ``opclass``: what kind of work each ATen op is (pointwise, reduction, view, matmul, ...);
- ``regions``: maximal fusable chains of memory-bound ops, the ``Region`` value type;
- ``canonical``: a region's self-contained signature and the subgraph rebuilt from it;
- ``report``: the region table that ``forge-pack profile --regions`` prints.
See docs/regions.md.
"""

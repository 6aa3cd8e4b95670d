"""The model as an ATen graph, and the regions of it that one kernel can compute.

- ``capture``: the forward on its real inputs as an ATen-level FX graph (torch.export, else
  make_fx, else dynamo + AOT), every node with its tensors' dtypes, shapes, strides and a time;
- ``opclass``: what kind of work each ATen op is (pointwise, reduction, view, matmul, ...);
- ``regions``: maximal fusable chains of memory-bound ops, each with a canonical signature and
  eager / float64 references built from the subgraph;
- ``report``: the region table that ``forge-pack profile --regions`` prints.
"""

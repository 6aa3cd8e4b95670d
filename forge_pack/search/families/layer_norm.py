"""layer_norm over the last dimension (optional affine): the row-normalisation families of
rownorm.py for this op. No reference kernel: the template families are the starting points."""

from __future__ import annotations

from forge_pack.search.families.rownorm import cpu_families, cuda_families

OPS = ("layer_norm",)
CUDA = cuda_families("layer_norm")
CPU = cpu_families("layer_norm")
REFERENCES = ()

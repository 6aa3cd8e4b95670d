"""rms_norm over the last dimension (optional weight, Gemma's `weight_offset`): the
row-normalisation families of rownorm.py for this op. No reference kernel: the template families
are the starting points."""

from __future__ import annotations

from forge_pack.search.families.rownorm import cpu_families, cuda_families

OPS = ("rms_norm",)
CUDA = cuda_families("rms_norm")
CPU = cpu_families("rms_norm")
REFERENCES = ()

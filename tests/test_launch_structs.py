"""The ctypes side of the CUDA driver binding, checked against cuda.h without a GPU.

A C program built with the CUDA headers prints the layout of the structures that launch.py
passes to the virtual-memory calls, the enum values it hard-codes and the symbol each API name
resolves to; the ctypes definitions must agree byte for byte. Also the placement arithmetic of
the guarded buffers (pure Python).
"""

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from forge_pack.evaluate import launch
from forge_pack.evaluate.launch import VECTOR_ALIGN, guard_offset

CUDA_INCLUDE = next((p for p in (Path("/usr/local/cuda/include"), *sorted(Path("/usr/local").glob("cuda-*/include")))
                     if (p / "cuda.h").is_file()), None)

PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include <cuda.h>
#define STR(x) #x
#define NAME(x) STR(x)
#define FIELD(T, f) printf("offset " #T "." #f " %zu\n", offsetof(T, f))
int main(void) {
  printf("size CUmemLocation %zu\n", sizeof(CUmemLocation));
  printf("size CUmemAllocationProp %zu\n", sizeof(CUmemAllocationProp));
  printf("size CUmemAccessDesc %zu\n", sizeof(CUmemAccessDesc));
  printf("size allocFlags %zu\n", sizeof(((CUmemAllocationProp*)0)->allocFlags));
  FIELD(CUmemLocation, type); FIELD(CUmemLocation, id);
  FIELD(CUmemAllocationProp, type); FIELD(CUmemAllocationProp, requestedHandleTypes);
  FIELD(CUmemAllocationProp, location); FIELD(CUmemAllocationProp, win32HandleMetaData);
  FIELD(CUmemAllocationProp, allocFlags);
  FIELD(CUmemAllocationProp, allocFlags.compressionType); FIELD(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable);
  FIELD(CUmemAllocationProp, allocFlags.usage); FIELD(CUmemAllocationProp, allocFlags.reserved);
  FIELD(CUmemAccessDesc, location); FIELD(CUmemAccessDesc, flags);
  printf("enum MEM_ALLOCATION_TYPE_PINNED %d\n", (int)CU_MEM_ALLOCATION_TYPE_PINNED);
  printf("enum MEM_HANDLE_TYPE_NONE %d\n", (int)CU_MEM_HANDLE_TYPE_NONE);
  printf("enum MEM_LOCATION_TYPE_DEVICE %d\n", (int)CU_MEM_LOCATION_TYPE_DEVICE);
  printf("enum MEM_ACCESS_FLAGS_PROT_READWRITE %d\n", (int)CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  printf("enum MEM_ALLOC_GRANULARITY_MINIMUM %d\n", (int)CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  printf("enum DEV_VMM_SUPPORTED %d\n", (int)CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
  printf("enum ILLEGAL_ADDRESS %d\n", (int)CUDA_ERROR_ILLEGAL_ADDRESS);
  printf("symbol cuMemGetAllocationGranularity %s\n", NAME(cuMemGetAllocationGranularity));
  printf("symbol cuMemAddressReserve %s\n", NAME(cuMemAddressReserve));
  printf("symbol cuMemAddressFree %s\n", NAME(cuMemAddressFree));
  printf("symbol cuMemCreate %s\n", NAME(cuMemCreate));
  printf("symbol cuMemRelease %s\n", NAME(cuMemRelease));
  printf("symbol cuMemMap %s\n", NAME(cuMemMap));
  printf("symbol cuMemUnmap %s\n", NAME(cuMemUnmap));
  printf("symbol cuMemSetAccess %s\n", NAME(cuMemSetAccess));
  printf("symbol cuMemsetD8 %s\n", NAME(cuMemsetD8));
  printf("symbol cuMemcpyDtoDAsync %s\n", NAME(cuMemcpyDtoDAsync));
  return 0;
}
"""


@pytest.fixture(scope="module")
def header_facts(tmp_path_factory):
    if CUDA_INCLUDE is None:
        pytest.skip("no cuda.h under /usr/local/cuda*/include")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (gcc or cc)")
    folder = tmp_path_factory.mktemp("cuda_h")
    (folder / "layout.c").write_text(PROGRAM)
    exe = folder / "layout"
    build = subprocess.run([cc, f"-I{CUDA_INCLUDE}", "-o", str(exe), str(folder / "layout.c")],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    facts: dict[str, dict[str, str]] = {"size": {}, "offset": {}, "enum": {}, "symbol": {}}
    for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines():
        kind, key, value = line.split()
        facts[kind][key] = value
    return facts


def test_ctypes_struct_sizes_match_cuda_h(header_facts):
    size = {k: int(v) for k, v in header_facts["size"].items()}
    assert size == {"CUmemLocation": ctypes.sizeof(launch.MemLocation),
                    "CUmemAllocationProp": ctypes.sizeof(launch.MemAllocationProp),
                    "CUmemAccessDesc": ctypes.sizeof(launch.MemAccessDesc),
                    "allocFlags": ctypes.sizeof(launch.MemAllocFlags)}


def test_ctypes_field_offsets_match_cuda_h(header_facts):
    P, F = launch.MemAllocationProp, launch.MemAllocFlags
    mine = {
        "CUmemLocation.type": launch.MemLocation.type.offset, "CUmemLocation.id": launch.MemLocation.id.offset,
        "CUmemAllocationProp.type": P.type.offset, "CUmemAllocationProp.requestedHandleTypes":
            P.requestedHandleTypes.offset,
        "CUmemAllocationProp.location": P.location.offset,
        "CUmemAllocationProp.win32HandleMetaData": P.win32HandleMetaData.offset,
        "CUmemAllocationProp.allocFlags": P.allocFlags.offset,
        "CUmemAllocationProp.allocFlags.compressionType": P.allocFlags.offset + F.compressionType.offset,
        "CUmemAllocationProp.allocFlags.gpuDirectRDMACapable": P.allocFlags.offset + F.gpuDirectRDMACapable.offset,
        "CUmemAllocationProp.allocFlags.usage": P.allocFlags.offset + F.usage.offset,
        "CUmemAllocationProp.allocFlags.reserved": P.allocFlags.offset + F.reserved.offset,
        "CUmemAccessDesc.location": launch.MemAccessDesc.location.offset,
        "CUmemAccessDesc.flags": launch.MemAccessDesc.flags.offset,
    }
    assert {k: int(v) for k, v in header_facts["offset"].items()} == mine


def test_hard_coded_enum_values_match_cuda_h(header_facts):
    enums = {k: int(v) for k, v in header_facts["enum"].items()}
    assert enums == {
        "MEM_ALLOCATION_TYPE_PINNED": launch.MEM_ALLOCATION_TYPE_PINNED,
        "MEM_HANDLE_TYPE_NONE": launch.MEM_HANDLE_TYPE_NONE,
        "MEM_LOCATION_TYPE_DEVICE": launch.MEM_LOCATION_TYPE_DEVICE,
        "MEM_ACCESS_FLAGS_PROT_READWRITE": launch.MEM_ACCESS_FLAGS_PROT_READWRITE,
        "MEM_ALLOC_GRANULARITY_MINIMUM": launch.MEM_ALLOC_GRANULARITY_MINIMUM,
        "DEV_VMM_SUPPORTED": launch.DEV_VMM_SUPPORTED,
        "ILLEGAL_ADDRESS": 700,
    }
    assert 700 in launch._STICKY  # an access outside the mapping must count as context-poisoning


def test_bound_symbols_are_the_ones_cuda_h_maps_each_api_name_to(header_facts):
    # e.g. cuMemcpyDtoDAsync is the 64-bit cuMemcpyDtoDAsync_v2; binding the bare name would take the
    # old 32-bit-size ABI
    assert header_facts["symbol"] == launch.VMM_SYMBOLS


@pytest.mark.parametrize("nbytes", [1, 4, 15, 16, 4000, 4096, 2 << 20, (2 << 20) - 4, (2 << 20) + 4, 3 * (2 << 20)])
@pytest.mark.parametrize("phase", [0, 4, 8, 12])
def test_end_guard_puts_the_payload_within_16_bytes_of_the_mapping_end_at_the_original_alignment(nbytes, phase):
    gran = 2 << 20
    mapped = max(gran, -(-(nbytes + phase) // gran) * gran)
    off = guard_offset(nbytes, mapped, "end", phase)
    assert off >= 0 and off % VECTOR_ALIGN == phase
    slack = mapped - off - nbytes
    assert 0 <= slack < VECTOR_ALIGN
    if phase == 0 and nbytes % 16 == 0:
        assert slack == 0  # flush: one byte past the last element is unmapped


@pytest.mark.parametrize("phase", [0, 4, 8, 12])
def test_start_guard_puts_the_payload_at_the_mapping_start_at_the_original_alignment(phase):
    assert guard_offset(1000, 2 << 20, "start", phase) == phase
    assert guard_offset(1000, 2 << 20, "start", phase + 512) == phase  # only the address modulo 16 is kept


def test_a_4_mib_tensor_fills_its_two_granules_exactly():
    # the honest fixture's shape, f32[512,2048]: the first and the last byte both touch unmapped memory
    assert guard_offset(4 << 20, 4 << 20, "end") == 0
    assert guard_offset(4 << 20, 4 << 20, "start") == 0


def test_an_empty_tensor_points_at_the_guarded_edge():
    assert guard_offset(0, 2 << 20, "end") == 2 << 20
    assert guard_offset(0, 2 << 20, "start") == 0

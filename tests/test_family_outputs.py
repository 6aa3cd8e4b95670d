"""The template families and reference kernels produce exactly what tests/fixtures/family_outputs.json
records: applicability, defaults, scores, launch specs and defines at the defaults and one notch from
them, the instantiated candidates (source and spec), the proposer's root and child moves, for 55
signatures on the default (H200) GPU and four GPU reports. The fixture was captured from the
families before they moved into one module per target kind; a diff here is a behaviour change.
After an intended change, regenerate it with `python tests/family_snapshot.py` and review the diff."""

from __future__ import annotations

import json

import pytest

from family_snapshot import FIXTURE, GPUS, SIGNATURES, RegistryApi, snapshot


@pytest.fixture(scope="module")
def outputs():
    return json.loads(json.dumps(snapshot(RegistryApi()))), json.loads(FIXTURE.read_text())


def test_family_metadata_is_unchanged(outputs):
    new, old = outputs
    assert new["families"] == old["families"]


def test_fixture_covers_every_op_backend_and_gpu(outputs):
    _, old = outputs
    assert len(old["cases"]) == sum(map(len, SIGNATURES.values())) * (len(GPUS) + 1)
    for op in SIGNATURES:
        assert old["families"][f"cuda|{op}"] and old["families"][f"cpu|{op}"], op


@pytest.mark.parametrize("backend", ["cuda", "cpu"])
@pytest.mark.parametrize("op", list(SIGNATURES))
def test_every_family_output_is_unchanged(outputs, backend, op):
    new, old = outputs
    keys = [k for k in old["cases"] if k.startswith(f"{backend}|") and k.split("|")[2] == op]
    assert keys
    for key in keys:
        for part, want in old["cases"][key].items():
            got = new["cases"][key].get(part)
            if part == "families":
                for name in want:
                    assert got.get(name) == want[name], (key, name)
                assert set(got) == set(want), key
            else:
                assert got == want, (key, part)

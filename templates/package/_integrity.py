"""The manifest's integrity digest: were its figures edited after the build?

forge-pack writes ``integrity.digest``, a sha256 over canonical JSON of the manifest's measured
content (each target's timings, speedups, errors, tolerance, share of the forward and what it was
measured for; the whole-model result; the dropped kernels; where it was measured), when it packs.
The package's ``info``/``bench`` and forge-pack's own readers recompute it: a mismatch means the
figures shown are not the ones measured. A manifest from before digests were recorded has none:
its figures are "not checked", which is not an error.

It also defines the digest of shipped source files (``files_digest``): the target registry the
package runs (``_targets/``, a verbatim copy of forge_pack/targets) is recorded in the manifest's
``targets_runtime`` and checked by ``verify``.

Plain Python, no torch: forge-pack loads this same file from its templates to write the digests,
so writer and readers cannot disagree on what is covered.
"""

from __future__ import annotations

import hashlib
import json
import math

ALGORITHM = "sha256"
# What a target's figures are about and what they are: editing any of these changes what the
# package claims to have measured.
TARGET_FIELDS = ("id", "hotspot_id", "op", "signature", "kernel", "tolerance", "errors", "timing", "speedup",
                 "time_share", "calls_per_forward", "search", "confirmed")
DOCUMENT_FIELDS = ("model", "environment", "backend", "dropped", "model_result")
# Covered where present (schema 3, compile mode): a manifest written before them hashes as it did.
OPTIONAL_TARGET_FIELDS = ("compile",)
OPTIONAL_DOCUMENT_FIELDS = ("compile_result", "regions")

OK, NOT_CHECKED, EDITED = "ok", "not checked", "edited"
EDITED_MESSAGE = ("the manifest's figures were edited after the build: the speedups, timings and errors it holds "
                  "are not the ones forge-pack measured")
NOT_CHECKED_MESSAGE = ("the manifest carries no integrity digest (written before forge-pack recorded one), "
                       "so its figures are not checked")
OK_MESSAGE = "the manifest's figures are the ones measured at build time (integrity digest matches)"


def _finite(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def measured_content(doc: dict) -> dict:
    targets = [{**{k: t.get(k) for k in TARGET_FIELDS}, **{k: t[k] for k in OPTIONAL_TARGET_FIELDS if k in t}}
               for t in doc.get("targets") or []]
    return {"targets": targets, **{k: doc.get(k) for k in DOCUMENT_FIELDS},
            **{k: doc[k] for k in OPTIONAL_DOCUMENT_FIELDS if k in doc}}


def digest(doc: dict) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces, ASCII) of the measured content. Floats
    are written by repr, which a JSON round trip gives back exactly, so a reread manifest hashes alike."""
    text = json.dumps(_finite(measured_content(doc)), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def file_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files_digest(hashes: dict) -> str:
    """One sha256 over {file name: its sha256}: lines "<name> <sha256>" in name order."""
    text = "".join(f"{name} {hashes[name]}\n" for name in sorted(hashes))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def seal(doc: dict) -> dict:
    """The document with its integrity record (written by forge-pack at pack time)."""
    out = {k: v for k, v in doc.items() if k != "integrity"}
    out["integrity"] = {"algorithm": ALGORITHM, "digest": digest(out)}
    return out


def status(doc: dict) -> tuple[str, str]:
    """(OK | NOT_CHECKED | EDITED, one sentence for the user)."""
    rec = doc.get("integrity")
    if not isinstance(rec, dict) or not rec.get("digest"):
        return NOT_CHECKED, NOT_CHECKED_MESSAGE
    if rec.get("algorithm") != ALGORITHM or rec.get("digest") != digest(doc):
        return EDITED, EDITED_MESSAGE
    return OK, OK_MESSAGE

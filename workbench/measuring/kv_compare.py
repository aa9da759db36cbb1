"""The KV probe's workbench side: D's blocks against P's and against the baseline's.

The servers' workers (``knobs/kv_probe.py``) hand back one digest per (layer, slot) for each
request they captured, with vLLM's request id and the prompt's key; each is matched to the
run's request by the id the client sent (``by_role``). Here the digests are compared
position by position (block = position // block_size, slot = position % block_size, over the
prompt's positions), the blocks whose digests differ are fetched from both sides, and their
largest absolute difference is computed. Only those blocks ever leave the servers.

"Identical" is bit-identical (equal digests). Against P that is the right test: NIXL copies
bytes. Against the baseline it is the measured noise floor on the CPU: with every fix in place
D's KV equalled the baseline's bit for bit in every layer (docs/kv-probe.md).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

import numpy as np

DIGEST_CHARS = 24  # hex characters per slot digest (knobs/kv_probe.digest)
GROUPS = ("target", "drafter")
REFERENCES = {"vs_p": "p", "vs_baseline": "baseline"}

Ask = Callable[[dict], list[dict]]  # a request to every server's workers -> their replies


def slot_digests(layer: dict) -> list[str]:
    s = layer["digests"]
    return [s[i:i + DIGEST_CHARS] for i in range(0, len(s), DIGEST_CHARS)]


def differing_positions(d_layer: dict, ref_layer: dict | None, n: int) -> list[int]:
    """Prompt positions < n whose slot digests differ (all of them if the ref lacks it)."""
    if ref_layer is None:
        return list(range(n))
    a, b = slot_digests(d_layer), slot_digests(ref_layer)
    return [p for p in range(n) if p >= len(a) or p >= len(b) or a[p] != b[p]]


def compare(d: dict, ref: dict | None) -> dict[str, Any]:
    """D's record against one reference record (same prompt), digests only."""
    n, bs = d["num_prompt_tokens"], d["block_size"]
    out: dict[str, Any] = {"identical": ref is not None, "max_abs_diff": 0.0 if ref else None,
                           "layers_differing": [], "groups_differing": [],
                           "first_differing": None, "blocks_differing": {},
                           "positions_differing": {}}
    if ref is None:
        out["missing"] = "no capture of this prompt on the reference server"
        return out
    first = None
    for name, layer in d["layers"].items():
        pos = differing_positions(layer, ref["layers"].get(name), n)
        if not pos:
            continue
        out["identical"] = False
        out["layers_differing"].append(name)
        if layer["group"] not in out["groups_differing"]:
            out["groups_differing"].append(layer["group"])
        out["blocks_differing"][name] = sorted({p // bs for p in pos})
        out["positions_differing"][name] = ranges(pos)
        if first is None or pos[0] < first["position"]:
            first = {"block": pos[0] // bs, "block_id": d["block_ids"][0][pos[0] // bs],
                     "slot": pos[0] % bs, "position": pos[0], "layer": name}
    out["first_differing"] = first
    return out


def ranges(positions: list[int]) -> list[list[int]]:
    """Sorted positions as inclusive ``[first, last]`` runs: [3, 4, 5, 9] -> [[3, 5], [9, 9]]."""
    out: list[list[int]] = []
    for p in positions:
        if out and p == out[-1][1] + 1:
            out[-1][1] = p
        else:
            out.append([p, p])
    return out


def expand(runs: list[list[int]]) -> list[int]:
    """``ranges`` undone: [[3, 5], [9, 9]] -> [3, 4, 5, 9]."""
    return [p for a, b in runs for p in range(a, b + 1)]


def block_shift(d: dict, p: dict | None, max_shift: int = 2) -> int | None:
    """The offset s > 0 for which D's block j equals P's block j + s in every layer (the
    legacy hand-off's signature: D kept the tail of P's block list), else None."""
    if p is None:
        return None
    bs = d["block_size"]
    nd = -(-d["num_prompt_tokens"] // bs)
    for s in range(1, max_shift + 1):
        if all(_blocks_equal(layer, p["layers"].get(name), nd, s, bs)
               for name, layer in d["layers"].items()):
            return s
    return None


def _blocks_equal(d_layer: dict, p_layer: dict | None, nd: int, s: int, bs: int) -> bool:
    if p_layer is None:
        return False
    a, b = slot_digests(d_layer), slot_digests(p_layer)
    return len(b) >= (nd + s) * bs and all(
        a[j * bs:(j + 1) * bs] == b[(j + s) * bs:(j + s + 1) * bs] for j in range(nd))


# --------------------------------------------------------------------- differences --
def fetch_items(req_id: str, cmp: dict) -> list[dict]:
    """The blocks of one server's record of a request (``req_id``) that ``cmp`` found
    differing; the workers keep their snapshots by request."""
    return [{"key": req_id, "layer": name, "blocks": blocks}
            for name, blocks in cmp["blocks_differing"].items()]


def decode(item: dict) -> np.ndarray | None:
    if "data" not in item:
        return None
    return np.frombuffer(base64.b64decode(item["data"]), dtype=np.float32).reshape(item["shape"])


def block_diffs(d_items: list[dict], ref_items: list[dict], n: int, bs: int) -> dict:
    """{layer: {block: max |D - ref|}} over the prompt's positions of the fetched blocks (one
    request's items on each side)."""
    ref = {it["layer"]: it for it in ref_items}
    out: dict[str, dict[int, float | None]] = {}
    for it in d_items:
        a, r = decode(it), ref.get(it["layer"])
        b = decode(r) if r is not None else None
        per = out.setdefault(it["layer"], {})
        for i, blk in enumerate(it.get("blocks", [])):
            if a is None or b is None or i >= len(b):
                per[blk] = None
                continue
            valid = max(0, min(bs, n - blk * bs))
            per[blk] = float(np.max(np.abs(a[i, :valid] - b[i, :valid]))) if valid else 0.0
    return out


def add_magnitudes(cmp: dict, diffs: dict) -> None:
    cmp["max_abs_diff_per_block"] = {layer: {str(b): v for b, v in per.items()}
                                     for layer, per in diffs.items()}
    vals = [v for per in diffs.values() for v in per.values()]
    if cmp["identical"]:
        cmp["max_abs_diff"] = 0.0
    elif vals and all(v is not None for v in vals):
        cmp["max_abs_diff"] = max(vals)
    else:
        cmp["max_abs_diff"] = None


# ----------------------------------------------------------------------- one run --
# The part of vLLM's request id (``cmpl-<X-Request-Id>-<n>-<random>``) the workbench's
# client names per server: P and D serve a request as ``<tag>-pd-<row id>``, the baseline as
# ``<tag>-base-<row id>`` (``measuring/measure.py``); D's priming request is neither.
SIDE = {"p": "pd", "d": "pd", "baseline": "base"}
Rows = list[tuple[str, str]]  # (row id, prompt key) per request, in the run's order


def rows_of(rec: dict, role: str, rows: Rows) -> list[str]:
    """The rows a capture belongs to: the one its request id names (none for D's priming
    request), or, for a client that named none, every row with the capture's prompt."""
    req_id = str(rec.get("req_id", ""))
    named = [i for i, _ in rows if f"-{SIDE.get(role)}-{i}-" in f"{req_id}-"]
    if named or any(f"-{side}-" in req_id for side in (*SIDE.values(), "prime")):
        return named
    return [i for i, k in rows if k == rec["key"]]


def by_role(replies: list[dict], rows: Rows) -> dict[str, dict[str, dict]]:
    """{role: {row id: record}}: each request's own capture, so two requests with one prompt
    are compared each."""
    out: dict[str, dict[str, dict]] = {}
    for reply in replies:
        for rec in reply.get("records", []):
            for i in rows_of(rec, reply["role"], rows) if "key" in rec else ():
                out.setdefault(reply["role"], {})[i] = rec
    return out


def collect(ask: Ask, rows: Rows) -> tuple[list[dict | None], dict[str, Any]]:
    """Each request's ``kv_probe`` (in ``rows`` order; None where D captured nothing) and the
    probe's cost. Asks for records, then the differing blocks, then clears the servers."""
    t0 = time.monotonic()
    replies = ask({"op": "records"})
    recs = by_role(replies, rows)
    errors = [r["error"] for reply in replies for r in reply.get("records", []) if "error" in r]
    ids = [i for i, _ in rows]
    probes = [_request(i, recs) for i in ids]
    _magnitudes(ask, ids, probes, recs)
    ask({"op": "clear"})
    cost = {"capture_s": {reply["role"]: reply.get("capture_s") for reply in replies},
            "captured": {role: len(v) for role, v in recs.items()},
            "collect_s": round(time.monotonic() - t0, 3), "errors": errors}
    return probes, cost


def _request(rid: str, recs: dict) -> dict | None:
    d = recs.get("d", {}).get(rid)
    if d is None:
        return None
    of = {role: recs.get(role, {}).get(rid) or {} for role in ("d", "p", "baseline")}
    out: dict[str, Any] = {"positions_compared": d["num_prompt_tokens"],
                           "layers": {name: layer["group"] for name, layer in d["layers"].items()},
                           "block_ids_d": d["block_ids"][0],
                           "capture_s": {role: r.get("capture_s") for role, r in of.items()},
                           # tokens per step of P's and the baseline's prefill (several:
                           # chunked, which moves the drafter's KV; docs/kv-probe.md)
                           "prefill_chunks": {role: of[role].get("prefill_chunks")
                                              for role in ("p", "baseline")},
                           # P's allocation as its prefill went: the block ids each step
                           # gave the request first, its blocks, and where its prefill began
                           # (a prefix hit before it)
                           "prefill_p": {"new_blocks": of["p"].get("prefill_new_blocks"),
                                         "block_ids": (of["p"].get("block_ids") or [[]])[0],
                                         "start": of["p"].get("num_computed_tokens")},
                           # how each server mapped a block's slots to tokens (slot_order)
                           "slot_order": {role: r.get("slot_order") for role, r in of.items()}}
    for name, role in REFERENCES.items():
        out[name] = compare(d, recs.get(role, {}).get(rid))
    out["vs_p"]["block_shift"] = block_shift(d, recs.get("p", {}).get(rid))
    return out


def _magnitudes(ask: Ask, ids: list[str], probes: list[dict | None], recs: dict) -> None:
    """Fetch the differing blocks of each request from D and each reference (one request to
    every server, each answering for its own captures), and fill in the magnitudes."""
    def rec(role: str, rid: str) -> dict:
        return recs.get(role, {}).get(rid) or {}

    items = [it for rid, pr in zip(ids, probes, strict=True) if pr
             for name, role in REFERENCES.items() for who in ("d", role)
             if rec(who, rid).get("req_id")
             for it in fetch_items(rec(who, rid)["req_id"], pr[name])]
    fetched: dict[tuple[str, str, str], dict] = {}  # (role, req_id, layer) -> item
    for reply in ask({"op": "fetch", "items": _unique(items)}) if items else []:
        for it in reply.get("items", []):
            if "missing" not in it:
                fetched[(reply["role"], it["key"], it["layer"])] = it
    for rid, pr in zip(ids, probes, strict=True):
        if pr is None:
            continue
        d = recs["d"][rid]
        for name, role in REFERENCES.items():
            diffs = {}
            for layer, blocks in pr[name]["blocks_differing"].items():
                mine = fetched.get(("d", d.get("req_id"), layer))
                theirs = fetched.get((role, rec(role, rid).get("req_id"), layer))
                per = block_diffs([mine] if mine else [], [theirs] if theirs else [],
                                  d["num_prompt_tokens"], d["block_size"]).get(layer, {})
                diffs[layer] = {b: per.get(b) for b in blocks}
            add_magnitudes(pr[name], diffs)


def _unique(items: list[dict]) -> list[dict]:
    """One fetch item per (key, layer) with the union of its blocks."""
    merged: dict[tuple, set] = {}
    for it in items:
        merged.setdefault((it["key"], it["layer"]), set()).update(it["blocks"])
    return [{"key": k, "layer": layer, "blocks": sorted(b)} for (k, layer), b in merged.items()]


def summary(rows: list[dict], layer_groups: dict[str, str] | None = None) -> dict[str, Any]:
    """Per layer group and reference, the share of requests whose KV differs, split by the
    rows' ``affected`` column."""
    out: dict[str, Any] = {}
    probed = [r for r in rows if r.get("kv_probe")]
    for group in GROUPS:
        out[group] = {}
        for name in REFERENCES:
            out[group][name] = {}
            for label, flag in (("affected", True), ("unaffected", False)):
                sel = [r for r in probed if bool(r.get("affected")) == flag]
                n_diff = sum(group in r["kv_probe"][name]["groups_differing"] for r in sel)
                out[group][name][label] = {"requests": len(sel), "differing": n_diff,
                                           "share": (n_diff / len(sel)) if sel else None}
    out["requests_probed"] = len(probed)
    out["capture_s_median"] = {role: _median([r["kv_probe"].get("capture_s", {}).get(role)
                                              for r in probed])
                               for role in ("d", "p", "baseline")}
    out["noise_floor"] = NOISE_FLOOR
    return out


NOISE_FLOOR = ("bit-identical (equal digests). Measured on the CPU with every fix in place: D "
               "equals P and the baseline bit for bit in every layer, except the EAGLE3 "
               "drafter's KV at one position of a request whose prefill was chunked on P or "
               "on the baseline (kv_probe.prefill_chunks), and at the last slot of a block "
               "reused from a prefix cache after another prompt parted from it there "
               "(docs/kv-probe.md)")


def _median(values: list) -> float | None:
    vals = sorted(v for v in values if v is not None)
    return vals[len(vals) // 2] if vals else None


def table(rows: list[dict]) -> list[dict]:
    """One line per probed request: where D's KV first differs, against P and the baseline."""
    out = []
    for r in rows:
        pr = r.get("kv_probe")
        if not pr:
            continue
        line = {"id": r["id"], "prompt_len": r["prompt_len"], "affected": r.get("affected")}
        for name in REFERENCES:
            c = pr[name]
            first = c["first_differing"] or {}
            line |= {f"{name}_identical": c["identical"],
                     f"{name}_groups": ",".join(c["groups_differing"]),
                     f"{name}_first_position": first.get("position"),
                     f"{name}_max_abs_diff": c["max_abs_diff"]}
        line["vs_p_block_shift"] = pr["vs_p"].get("block_shift")
        out.append(line)
    return out

"""Human-readable verdicts: short, the decisive lines first, readable at a glance in a terminal."""

from __future__ import annotations


def _who(e: dict) -> str:
    parts = [e.get("node") or "?"]
    if e.get("rank") is not None:
        parts.append(f"r{e['rank']}")
    return "/".join(parts)


def render(d: dict, color: bool = False) -> str:
    def c(text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if color else text

    head = f"{d['outcome'].upper()}" + (" (ambiguous)" if d["ambiguous"] else "")
    lines = [f"{c(head, '1;31' if d['outcome'] not in ('healthy',) else '1;32')}  "
             f"domain {d['domain']} · confidence {d['confidence']}   [{d['cluster']}/{d['job_id']}]",
             f"  {d['root_cause']}"]
    cul = d["culprit"]
    if cul["nodes"] or cul["ranks"] or cul["gpus"] or cul.get("gpu_pci") or cul.get("local_ranks"):
        bits = []
        if cul["nodes"]:
            bits.append("node " + ", ".join(cul["nodes"]))
        if cul["ranks"]:
            bits.append("rank " + ", ".join(map(str, cul["ranks"])))
        if cul["gpus"]:
            bits.append("gpu " + ", ".join(map(str, cul["gpus"])))
        if cul.get("local_ranks"):
            bits.append("local rank " + ", ".join(map(str, cul["local_ranks"])))
        if cul.get("gpu_pci"):
            bits.append("GPU at PCI " + ", ".join(cul["gpu_pci"]))
        lines.append(f"  culprit   {'; '.join(bits)}")
    aff = d["affected"]
    if aff["nodes"] or aff["ranks"]:
        shown = aff["nodes"][:8]
        more = f" (+{len(aff['nodes']) - 8})" if len(aff["nodes"]) > 8 else ""
        lines.append(f"  affected  {len(aff['nodes'])} node(s) {', '.join(shown)}{more}; {len(aff['ranks'])} rank(s)")
    for cand in d.get("candidates") or []:
        where = ", ".join(cand["culprit"]["nodes"]) or ", ".join(map(str, cand["culprit"]["ranks"])) or "-"
        lines.append(f"  candidate {cand['outcome']} ({where})")
    act = d["recommended_action"]
    tgt = f" -> {', '.join(act['targets'])}" if act["targets"] else ""
    lines.append(f"  action    {act['action']}{tgt}: {act['reason']}")
    lines.append(f"  why       {d['confidence_reason']}")
    if d["evidence"]:
        lines.append("  evidence")
        for e in d["evidence"]:
            ts = (e["ts"] or "")[:19].replace("T", " ")
            text = e["line"] if len(e["line"]) <= 160 else e["line"][:157] + "..."
            lines.append(f"    {ts:19} {_who(e):14} {e['role']:12} {text}")
    cov = " · ".join(f"{x['source']} {x['status']}" + (f" ({x['rows']})" if x["rows"] else "")
                     for x in d["coverage"])
    lines.append(f"  coverage  {cov}")
    for x in d["coverage"]:
        if x["reason"] and x["status"] != "not_configured":
            lines.append(f"            {x['source']}: {x['reason'][:200]}")
    return "\n".join(lines)

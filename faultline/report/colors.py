"""Colours of the report, fixed by the taxonomy: a colour means the same outcome in every report."""

from __future__ import annotations

from faultline.taxonomy import OUTCOMES

# Paul Tol's "muted" qualitative palette, then his "bright" and "light" ones: distinguishable with the
# common colour-vision deficiencies. Each outcome of the taxonomy has its own colour, fixed by its place
# in faultline.taxonomy.OUTCOMES, so a colour means the same outcome in every report; healthy and
# unknown verdicts have fixed greys.
PALETTE = ("#332288", "#88CCEE", "#117733", "#DDCC77", "#CC6677", "#44AA99", "#882255", "#EE8866", "#4477AA",
           "#999933", "#AA4499", "#66CCEE", "#228833", "#CCBB44", "#EE6677", "#AA3377", "#BBCC33")
OTHER = "#8F8F8F"
FIXED = {"healthy": "#D4D4D4", "unknown": "#5E5E5E"}
OUTCOME_COLORS = {**dict(zip([o for o in OUTCOMES if o not in FIXED], PALETTE, strict=True)), **FIXED}
STATUS_COLORS = {"ok": "#117733", "empty": "#DDCC77", "error": "#CC6677", "not_configured": "#BBBBBB"}
ACCENT = "#332288"
# swatches light enough to need dark text on a chip
LIGHT = {"#88CCEE", "#44AA99", "#999933", "#DDCC77", "#BBBBBB", "#EE8866", "#D4D4D4"}

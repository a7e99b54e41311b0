"""How a cost in US dollars is shown to people: one rule everywhere (tables, status lines, summaries, pages)."""
from __future__ import annotations

import math


def format_cost(usd: float | None) -> str:
    """USD, never a misleading $0.00: cents from $0.01 up, two significant digits below ($0.00042); "-" for none."""
    if usd is None:
        return "-"
    if usd == 0:
        return "$0"
    if not 0 < usd < math.inf:   # (no endpoint's usage makes one now; an older record may hold one)
        return f"${usd:g}"
    if usd >= 0.01:
        return f"${usd:,.2f}"
    decimals = 1 - math.floor(math.log10(usd))   # two significant digits
    return f"${usd:.{decimals}f}"

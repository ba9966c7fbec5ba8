"""Small checks shared by the sweep's YAML and REST parsers: each refusal one line naming the field and the fix."""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

from amlemu.errors import ConfigError

# ISO-8601 durations as Azure ML's REST API carries limits (azure-ai-ml writes them with isodate:
# "PT2H", "P60D", "PT1M30S"). Years and months have no fixed length, so they are refused.
_DURATION_RE = re.compile(r"P(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?")


def mapping(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(field, f"must be a mapping, got {type(value).__name__}")
    return dict(value)


def check_fields(data: Mapping[str, Any], known: set[str], where: str,
                 hints: Mapping[str, str] | None = None) -> None:
    """Refuse the first unknown key, as az ml's schemas do ("Unknown field.")."""
    unknown = sorted(set(data) - known)
    if unknown:
        fix = (hints or {}).get(unknown[0]) or f"known fields: {', '.join(sorted(known))}"
        raise ConfigError(f"{where}.{unknown[0]}", "unknown field", fix)


def integer(value: Any, field: str, low: int | None = None, high: int | None = None) -> int:
    """An int (not a bool, not 2.0) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, f"must be an integer, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"between {low} and {high}" if high is not None else f"{low} or more"
        raise ConfigError(field, f"must be {span}, got {value}")
    return value


def number(value: Any, field: str, low: float | None = None) -> float:
    """A finite int or float, at least low."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(field, f"must be a number, got {value!r}")
    if low is not None and value < low:
        raise ConfigError(field, f"must be {low:g} or more, got {value:g}")
    return float(value)


def text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(field, f"must be a non-empty string, got {value!r}")
    return value


def parse_duration(value: Any, field: str) -> int:
    """Seconds from an ISO-8601 duration ("PT2H", "P1DT30M", "PT90S"); a bare int is taken as seconds."""
    if isinstance(value, int) and not isinstance(value, bool):
        return integer(value, field, low=0)
    match = _DURATION_RE.fullmatch(value.strip().upper()) if isinstance(value, str) else None
    if match is None or not any(match.groups()) or value.strip().upper().endswith("T"):
        raise ConfigError(field, f"not an ISO-8601 duration: {value!r}",
                          "give days, hours, minutes and seconds, e.g. PT2H or P1DT30M")
    weeks, days, hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    # Azure ML keeps durations to the second ("precision as low as Seconds"): fractions are dropped.
    return int(((weeks * 7 + days) * 24 + hours) * 3600 + minutes * 60 + seconds)


def format_duration(seconds: int) -> str:
    """The ISO-8601 form azure-ai-ml sends (isodate's spelling): 7200 -> PT2H, 5184000 -> P60D."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = "".join(f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M"), (secs, "S")) if n)
    out = "P" + (f"{days}D" if days else "") + (f"T{clock}" if clock else "")
    return out if out != "P" else "PT0S"

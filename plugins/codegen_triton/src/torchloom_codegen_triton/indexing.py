"""Index math in Triton source: the core's shared index math
(:mod:`torchloom.api.indexing`) with Triton's integer division (``//``); sizes are the
group's static ints (a kernel taking symbolic sizes builds its own
``indexing.IndexMath(indexing.TRITON, names)``)."""

from __future__ import annotations

from torchloom.api import indexing

Coords = indexing.Coords
Known = indexing.Known
Unsupported = indexing.Unsupported

_MATH = indexing.IndexMath(indexing.TRITON)
linear = _MATH.linear
delinear = _MATH.delinear
address = _MATH.address
broadcast = _MATH.broadcast
reshape = _MATH.reshape
view_coords = _MATH.view_coords

__all__ = ["Coords", "Known", "Unsupported", "linear", "delinear", "address", "broadcast",
           "reshape", "view_coords"]

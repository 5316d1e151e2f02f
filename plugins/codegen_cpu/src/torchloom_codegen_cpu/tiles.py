"""Tiles for pointwise walks that read an input across its rows (``a.t() + b``).

A pointwise nest walks its first output in memory order: row ``x``, then ``j`` along the
row. An input read transposed against that walk (``a.t()``, a permute of the last dims)
steps over a whole row of its own per ``j``: each element of an output row lies on another
cache line and, for rows of 4 KB or more, on another page, so the walk misses the TLB at
nearly every element (``a.t() + b`` over 2048 x 2048 f32: 37 ms, eager's 38). Walked in
tiles of :data:`TILE` x :data:`TILE` (the tile's rows, each a SIMD loop over the tile's
columns), the lines and pages a tile touches are reused by its next rows: 10.1-10.4 ms in a
C harness (RESULTS.md, session 19).

Taken where a static walk of at least 2 :data:`TILE` rows and columns (one row per chunk:
rows up to 8192 elements) has the core's tile plan (``torchloom.codegen.tiles.Tiles``: an
input, of any size, laid out innermost along another dim than the walk's) and an input
read across the walk steps over :data:`STRIDED` elements or more per ``j``; the
tile's rows stay in order, so each output element is computed exactly as before.

A walk whose rows are too short for tiles or a vector (:data:`SHORT` elements or fewer: an
NCHW image copied to channels-last, rows of 3 channels each read from another plane) is
turned instead (the core's :func:`tiles.turned`, in ``WalkNest.planned_walk``): the dim
the input is laid out along becomes the walk's innermost, its reads contiguous and the
output's stores strided (a row of 224 pixels of one channel, where the row walk read 3
elements from 3 planes per pixel).
"""

from __future__ import annotations

from torchloom.api import tiles

TILE, STRIDED, SHORT = tiles.TILE, tiles.STRIDED, tiles.SHORT

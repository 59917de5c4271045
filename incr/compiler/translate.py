"""From a parsed SELECT to the relational IR, refusing what incr cannot maintain.

The work is done by the front-end steps in :mod:`incr.compiler.frontend` (refusals,
decorrelation, stage splitting, joins, name resolution, lowering to IR); this module is the
entry the rest of the compiler calls, and keeps the names it has always exported.
"""

from __future__ import annotations

from incr.compiler.frontend import translate
from incr.compiler.frontend.query import UNION, StageTranslation, Translation
from incr.compiler.frontend.refuse_unsupported import NON_DETERMINISTIC

__all__ = ["NON_DETERMINISTIC", "UNION", "StageTranslation", "Translation", "translate"]

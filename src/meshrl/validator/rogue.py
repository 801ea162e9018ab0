"""A rogue validator (`validator.rogue`), for tests and demos of disputes only: it judges like
an honest one, then turns the verdict of an honest file of its own share into a hard
invalidation, up to `accusations` of them. It posts the bond and signs the accusation like any
verdict, so what it costs is what the protocol makes it cost: another validator re-judges the
file, votes to overturn, and the rogue's locked bond goes to the wronged provider
(docs/protocol.md, *Verdicts and disputes*). Off the honest path: `ValidatorNode` calls it only
when `rogue.mode` is set, and the count lives in memory (a restarted rogue starts over).
"""

from __future__ import annotations

from meshrl.pool import Check, Decision
from meshrl.validator.config import RogueConfig
from meshrl.wire.models import VerdictKind

__all__ = ["Rogue"]


class Rogue:
    def __init__(self, cfg: RogueConfig) -> None:
        self.cfg = cfg
        self.accused = 0

    def __call__(self, d: Decision) -> Decision:
        """The rogue's verdict on a file of its share that it judged `d`."""
        if self.cfg.mode != "accuse-honest" or not d.accepted \
                or self.accused >= self.cfg.accusations:
            return d
        self.accused += 1
        return Decision(VerdictKind.HARD_INVALID, "rogue validator: an honest file accused "
                        f"({self.accused} of {self.cfg.accusations})", (Check.SAMPLING,),
                        d.stats)

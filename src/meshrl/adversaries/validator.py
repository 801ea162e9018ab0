"""A rogue validator (`meshrl adversary validator`, its config's `rogue`), for tests and demos of
disputes only: it judges like an honest one, then turns the verdict of an honest file of its own
share into a hard invalidation, up to `accusations` of them. It posts the bond and signs the
accusation like any verdict, so what it costs is what the protocol makes it cost: another
validator re-judges the file, votes to overturn, and the rogue's locked bond goes to the
wronged provider (docs/protocol.md, *Verdicts and disputes*). Off the honest path:
`ValidatorNode` is handed it as its verdict hook (`amend`) by `meshrl adversary validator`, and
the count lives in memory (a restarted rogue starts over).
"""

from __future__ import annotations

from meshrl.pool import Check, Decision
from meshrl.validator.config import RogueConfig, ShareConfig
from meshrl.wire.models import VerdictKind

__all__ = ["Rogue"]


class Rogue:
    def __init__(self, cfg: RogueConfig, share: ShareConfig | None = None) -> None:
        self.cfg, self.share = cfg, share or ShareConfig()
        self.accused = 0

    def __call__(self, work_id: bytes, d: Decision) -> Decision:
        """The rogue's verdict on the file `work_id` that it judged `d` (files of its own share
        only: another validator's are judged honestly)."""
        if self.cfg.mode != "accuse-honest" or not d.accepted \
                or self.accused >= self.cfg.accusations or not self.share.mine(work_id):
            return d
        self.accused += 1
        return Decision(VerdictKind.HARD_INVALID, "rogue validator: an honest file accused "
                        f"({self.accused} of {self.cfg.accusations})", (Check.SAMPLING,),
                        d.stats)

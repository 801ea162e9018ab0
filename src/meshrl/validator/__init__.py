"""The validator: verification of every submitted rollout file, and slashing (`meshrl validator`).

Names are imported lazily (PEP 562) so `meshrl validator --help` and the configs load without
torch.
"""

from __future__ import annotations

from meshrl.lazy import lazy_getattr

_EXPORTS = {
    "ValidatorConfig": "config",
    "ChainClaim": "verify",
    "verify_file": "verify",
    "verify_files": "verify",
    "ReplayConfig": "replay",
    "profile_thresholds": "replay",
    "Judge": "judge",
    "Unjudged": "judge",
    "ValidatorState": "state",
    "ValidatorNode": "node",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("meshrl.validator", _EXPORTS)


def __dir__() -> list[str]:
    return __all__

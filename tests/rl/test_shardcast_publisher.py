"""The trainer's publisher signs every policy version it puts in the origin's store with its key:
the manifest relays and workers will believe (signed by the rules' policy_signer), and only
that one."""

from __future__ import annotations

import pytest

from meshrl.model import CharTokenizer, build_model
from meshrl.rl.network_source import ShardcastPublisher
from meshrl.shardcast import ManifestRefused, RefusalReason, verify_manifest
from meshrl.shardcast.store import VersionStore
from meshrl.wire.signing import address_of

KEY = "0x" + "7e" * 32


class _Reader:
    """The orchestrator's step, as the publisher moves it."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.demands: list[tuple[int | None, int | None]] = []

    def set_step(self, step: int, taken_through: int | None = None,
                 ahead: int | None = None) -> int:
        self.steps.append(step)
        self.demands.append((taken_through, ahead))
        return step


def test_each_published_version_is_signed_by_the_trainer(tmp_path):
    tok = CharTokenizer()
    model = build_model("qwen2-tiny", tok.vocab_size, seed=1)
    reader = _Reader()
    demand = iter([(0, 8), (5, 8)])
    pub = ShardcastPublisher(tmp_path / "origin", reader, model, tok, KEY,  # type: ignore[arg-type]
                             lambda: next(demand))
    pub.publish(1, model.state_dict())
    pub.publish(1, model.state_dict())  # again after a crash: the published one is kept
    m = VersionStore(tmp_path / "origin", publisher=address_of(KEY)).manifest(1)
    assert m is not None and reader.steps == [1, 1]
    assert reader.demands == [(0, 8), (5, 8)]  # each move restates what the trainer takes
    verify_manifest(m, address_of(KEY), 1)
    with pytest.raises(ManifestRefused) as e:
        verify_manifest(m, address_of("0x" + "66" * 32), 1)
    assert e.value.reason == RefusalReason.WRONG_SIGNER

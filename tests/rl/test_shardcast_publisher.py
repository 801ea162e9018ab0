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
RUN = "pool-1"  # the pool's run id, named in every manifest the trainer signs


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
                             run=RUN, demand=lambda: next(demand))
    pub.publish(1, model.state_dict())
    pub.publish(1, model.state_dict())  # again after a crash: the published one is kept
    m = VersionStore(tmp_path / "origin", publisher=address_of(KEY), run=RUN).manifest(1)
    assert m is not None and reader.steps == [1, 1] and m.run == RUN
    assert reader.demands == [(0, 8), (5, 8)]  # each move restates what the trainer takes
    verify_manifest(m, address_of(KEY), 1, run=RUN)
    with pytest.raises(ManifestRefused) as e:
        verify_manifest(m, address_of("0x" + "66" * 32), 1, run=RUN)
    assert e.value.reason == RefusalReason.WRONG_SIGNER


def test_delta_broadcast_publishes_each_later_version_as_a_signed_rebuildable_delta(tmp_path):
    import torch

    from meshrl.shardcast.delta import reconstruct
    from meshrl.shardcast.manifest import FULL_DIR, sha256_file

    tok = CharTokenizer()
    model = build_model("qwen2-tiny", tok.vocab_size, seed=1)
    pub = ShardcastPublisher(tmp_path / "origin", _Reader(), model, tok, KEY,  # type: ignore[arg-type]
                             run=RUN, broadcast="delta")
    pub.publish(1, model.state_dict())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-4 * torch.sign(torch.randn_like(p)))
    pub.publish(2, model.state_dict())
    store = VersionStore(tmp_path / "origin", publisher=address_of(KEY), run=RUN)
    m1, m2 = store.manifest(1), store.manifest(2)
    assert m1 is not None and m2 is not None
    assert (m1.payload, m2.payload, m2.base, m2.base_digest) == ("full", "delta", 1, m1.digest)
    verify_manifest(m2, address_of(KEY), 2, run=RUN)
    assert m2.fetch_size < 0.8 * m2.part_size(FULL_DIR)
    rebuilt = tmp_path / "rebuilt"
    reconstruct(m2, store.version_dir(2) / "data", store.version_dir(1) / "data", rebuilt)
    for i in m2.part(FULL_DIR):
        f = m2.files[i]
        assert sha256_file(rebuilt / f.name.removeprefix("full/")) == f.sha256


def test_bf16_publishing_stores_rounded_weights_and_sparse_deltas(tmp_path):
    """network.publish_dtype = "bfloat16": every version's checkpoint holds the float32 master
    weights rounded to bfloat16, the master untouched; a version one small AdamW step later
    goes out as a sparse value delta of under a tenth of the checkpoint."""
    import torch
    from safetensors import safe_open

    from meshrl.shardcast.delta import reconstruct
    from meshrl.shardcast.manifest import DELTA_DIR, FULL_DIR, sha256_file
    from meshrl.shardcast.sparse import MAGIC

    tok = CharTokenizer()
    model = build_model("qwen2-tiny", tok.vocab_size, seed=1)
    pub = ShardcastPublisher(tmp_path / "origin", _Reader(), model, tok, KEY,  # type: ignore[arg-type]
                             run=RUN, broadcast="delta", dtype="bfloat16")
    pub.publish(1, model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.99))
    ids = torch.randint(0, tok.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    master = {k: v.clone() for k, v in model.state_dict().items()}
    assert {v.dtype for v in master.values()} == {torch.float32}
    pub.publish(2, model.state_dict())
    store = VersionStore(tmp_path / "origin", publisher=address_of(KEY), run=RUN)
    m2 = store.manifest(2)
    assert m2 is not None and (m2.payload, m2.base) == ("delta", 1)
    assert m2.part_size(DELTA_DIR) < 0.10 * m2.part_size(FULL_DIR)
    data = store.version_dir(2) / "data"
    assert (data / DELTA_DIR / "model.safetensors.xorz").read_bytes()[:10] == MAGIC
    with safe_open(str(data / FULL_DIR / "model.safetensors"), "pt") as f:
        for k in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            assert torch.equal(f.get_tensor(k), master[k].to(torch.bfloat16)), k
    assert all(torch.equal(v, master[k]) for k, v in model.state_dict().items())
    reconstruct(m2, data, store.version_dir(1) / "data", tmp_path / "rebuilt")
    for i in m2.part(FULL_DIR):
        f = m2.files[i]
        assert sha256_file(tmp_path / "rebuilt" / f.name.removeprefix("full/")) == f.sha256


def test_adapter_broadcast_sends_the_base_once_then_adapters_that_rebuild(tmp_path, monkeypatch):
    """network.broadcast = "adapter": version 0 is the frozen base itself, each later version
    its adapter on that base (rebuilt bit-exactly by the fixed merge rule), and the base's files
    are hashed once for the run, not at every version."""
    import torch

    from meshrl.model import save_model
    from meshrl.rl.config import LoraConfig
    from meshrl.rl.lora import LoraPolicy
    from meshrl.shardcast import manifest as manifest_module
    from meshrl.shardcast.adapter import materialize

    tok = CharTokenizer()
    save_model(build_model("qwen2-tiny", tok.vocab_size, seed=1), tok, tmp_path / "base")
    from meshrl.model import load_model

    lora = LoraPolicy(load_model(tmp_path / "base"), tmp_path / "base",
                      LoraConfig(enabled=True, rank=2), seed=3)
    pub = ShardcastPublisher(tmp_path / "origin", _Reader(), lora.model, tok, KEY,  # type: ignore[arg-type]
                             run=RUN, broadcast="adapter", lora=lora)
    hashed = []
    real = manifest_module.sha256_file
    monkeypatch.setattr(manifest_module, "sha256_file",
                        lambda p, *a: hashed.append(str(p)) or real(p, *a))
    pub.publish(0, {})
    for v in (1, 2):
        with torch.no_grad():
            for name, p in lora.model.named_parameters():
                if "lora_B" in name:
                    p.add_(1e-2 * torch.randn_like(p))
        pub.publish(v, {})
    base_dir = str(tmp_path / "base")
    assert not [p for p in hashed if p.startswith(base_dir)]  # the base hashed at start only
    store = VersionStore(tmp_path / "origin", publisher=address_of(KEY), run=RUN)
    m0, m2 = store.manifest(0), store.manifest(2)
    assert m0 is not None and m2 is not None
    assert (m0.payload, m2.payload, m2.base) == ("full", "adapter", 0)
    verify_manifest(m2, address_of(KEY), 2, run=RUN)
    rebuilt = materialize(store.version_dir(2) / "data", store.version_dir(0) / "data",
                          tmp_path / "rebuilt")
    assert rebuilt == lora.effective_sha256()

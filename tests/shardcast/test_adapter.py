"""Adapter versions: the merge is the documented rule bit for bit, a hostile or wrong adapter
only fails, and clients (directly, through a relay, with or without the base) rebuild exactly
the weights the version states, or keep what they had."""

import json
import logging

import numpy as np
import pytest

from meshrl.shardcast import ClientConfig, OriginConfig, Relay
from meshrl.shardcast.adapter import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    EFFECTIVE,
    AdapterError,
    AdapterSpec,
    materialize,
    merge_weights,
    read_weights,
    weights_sha256,
    write_effective,
)
from meshrl.shardcast.manifest import Manifest, ManifestError
from meshrl.shardcast.store import StoreError, VersionStore

from .conftest import KEY, RUN, SHARD, relay_cfg, run, signed_client, signed_origin

FAST = ClientConfig(poll_interval=0.05, backoff=0.01, wait_timeout=10, fsync=False)
Q, V = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight"
RANK = 4


def _base(root, seed: int = 0):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    tensors = {Q: rng.standard_normal((24, 16), dtype=np.float32),
               V: rng.standard_normal((8, 16), dtype=np.float32),
               "model.layers.0.self_attn.q_proj.bias": rng.standard_normal(24, dtype=np.float32),
               "model.embed_tokens.weight": rng.standard_normal((32, 16), dtype=np.float32)}
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return root


def _pairs(seed: int, scale: float = 0.05):
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal((RANK, 16), dtype=np.float32),
                   scale * rng.standard_normal((rows, RANK), dtype=np.float32))
            for name, rows in ((Q, 24), (V, 8))}


def _adapter(root, base, seed: int = 1, config: dict | None = None, pairs=None):
    """An adapter directory in peft's layout, its effective.json stated from the rule."""
    from safetensors.numpy import save_file

    root.mkdir(parents=True, exist_ok=True)
    pairs = pairs or _pairs(seed)
    tensors = {}
    for name, (a, b) in pairs.items():
        module = name.removesuffix(".weight")
        tensors[f"base_model.model.{module}.lora_A.weight"] = a
        tensors[f"base_model.model.{module}.lora_B.weight"] = b
    save_file(tensors, str(root / ADAPTER_WEIGHTS))
    cfg = {"peft_type": "LORA", "r": RANK, "lora_alpha": 8, "use_rslora": False,
           "target_modules": ["q_proj", "v_proj"], "bias": "none", **(config or {})}
    (root / ADAPTER_CONFIG).write_text(json.dumps(cfg))
    weights = read_weights(base)["model.safetensors"]
    weights.update(merge_weights(weights, AdapterSpec(RANK, 8.0), pairs))
    write_effective(root, weights_sha256(weights))
    return root


def test_the_merge_is_the_documented_rule_bit_for_bit():
    """D = sum_k outer(B[:,k], A[k,:]) in rank order, each op rounded in float32, then
    W + float32(alpha / r) * D: checked against scalar float32 arithmetic."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((3, 5), dtype=np.float32)
    a = rng.standard_normal((RANK, 5), dtype=np.float32)
    b = rng.standard_normal((3, RANK), dtype=np.float32)
    got = merge_weights({"w": w}, AdapterSpec(RANK, 8.0), {"w": (a, b)})["w"]
    f = np.float32
    for i in range(3):
        for j in range(5):
            d = f(0)
            for k in range(RANK):
                d = f(d + f(b[i, k] * a[k, j]))
            assert got[i, j].tobytes() == f(w[i, j] + f(f(2.0) * d)).tobytes()
    np.testing.assert_allclose(got, w + 2.0 * (b @ a), rtol=1e-5, atol=1e-6)
    # rsLoRA scales by alpha / sqrt(r); a zero B changes nothing
    assert AdapterSpec(4, 8.0, rslora=True).scale == np.float32(4.0)
    zero = merge_weights({"w": w}, AdapterSpec(RANK, 8.0), {"w": (a, np.zeros_like(b))})
    assert np.array_equal(zero["w"], w)


def test_materialize_writes_the_stated_weights_and_the_adapter_beside_them(tmp_path):
    base = _base(tmp_path / "base")
    adapter = _adapter(tmp_path / "ad", base)
    out = tmp_path / "out"
    digest = materialize(adapter, base, out)
    merged = read_weights(out)["model.safetensors"]
    assert weights_sha256(merged) == digest == json.loads(
        (adapter / EFFECTIVE).read_text())["effective_sha256"]
    original = read_weights(base)["model.safetensors"]
    assert not np.array_equal(merged[Q], original[Q])  # merged
    assert np.array_equal(merged["model.embed_tokens.weight"],
                          original["model.embed_tokens.weight"])  # not a target: untouched
    assert (out / "config.json").read_text() == (base / "config.json").read_text()
    assert sorted(p.name for p in (out / "adapter").iterdir()) == sorted(
        [ADAPTER_CONFIG, ADAPTER_WEIGHTS, EFFECTIVE])


@pytest.mark.parametrize("break_it, why", [
    (lambda d: (d / EFFECTIVE).write_text(json.dumps(
        {"merge": "meshrl-lora-merge-1", "effective_sha256": "0" * 64})), "not the trainer's"),
    (lambda d: (d / EFFECTIVE).write_text("{}"), "merge rule"),
    (lambda d: (d / ADAPTER_CONFIG).write_text(json.dumps(
        {"peft_type": "LORA", "r": RANK, "lora_alpha": 8, "use_dora": True})), "use_dora"),
    (lambda d: (d / ADAPTER_CONFIG).write_text(json.dumps(
        {"peft_type": "LORA", "r": 0, "lora_alpha": 8})), "r must be"),
    (lambda d: (d / ADAPTER_CONFIG).write_text(json.dumps(
        {"peft_type": "LORA", "r": RANK, "lora_alpha": float("inf")})), "lora_alpha"),
    (lambda d: (d / ADAPTER_CONFIG).write_text("[" * 100_000), "bytes"),
    (lambda d: (d / ADAPTER_CONFIG).write_text("{not json"), "not JSON"),
    (lambda d: (d / ADAPTER_WEIGHTS).write_bytes(b"\xff" * 64), "unreadable"),
    (lambda d: (d / ADAPTER_CONFIG).write_text(json.dumps(
        {"peft_type": "LORA", "r": 2, "lora_alpha": 8})), "rank 2"),
])
def test_a_hostile_or_wrong_adapter_only_fails(tmp_path, break_it, why):
    base = _base(tmp_path / "base")
    adapter = _adapter(tmp_path / "ad", base)
    break_it(adapter)
    with pytest.raises(AdapterError, match=why):
        materialize(adapter, base, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


@pytest.mark.parametrize("pairs, why", [
    ({Q: (np.full((RANK, 16), np.nan, np.float32), np.zeros((24, RANK), np.float32))},
     "non-finite"),
    ({Q: (np.zeros((RANK, 16), np.float32), np.zeros((23, RANK), np.float32))}, "do not fit"),
    ({"model.nope.weight": (np.zeros((RANK, 16), np.float32),
                            np.zeros((24, RANK), np.float32))}, "the base lacks"),
])
def test_an_adapter_that_does_not_fit_its_base_is_refused(tmp_path, pairs, why):
    from safetensors.numpy import save_file

    base = _base(tmp_path / "base")
    adapter = _adapter(tmp_path / "ad", base)
    tensors = {}
    for name, (a, b) in pairs.items():
        module = name.removesuffix(".weight")
        tensors[f"base_model.model.{module}.lora_A.weight"] = a
        tensors[f"base_model.model.{module}.lora_B.weight"] = b
    save_file(tensors, str(adapter / ADAPTER_WEIGHTS))
    with pytest.raises(AdapterError, match=why):
        materialize(adapter, base, tmp_path / "out")


def test_an_adapter_version_names_a_full_base_and_keeps_it_from_pruning(tmp_path):
    base = _base(tmp_path / "base")
    store = VersionStore(tmp_path / "o", run=RUN, keep=2)
    m0 = store.publish(base, 0, SHARD, key=KEY)
    with pytest.raises(StoreError, match="needs full version 7"):
        store.publish_adapter(_adapter(tmp_path / "a1", base), 1, 7, SHARD, key=KEY)
    for v in (1, 2, 3):
        m = store.publish_adapter(_adapter(tmp_path / f"a{v}", base, seed=v), v, 0, SHARD,
                                  key=KEY)
        assert (m.payload, m.base, m.base_digest) == ("adapter", 0, m0.digest)
    assert sorted(store.complete) == [0, 2, 3]  # the newest 2, and the base they need
    # the manifest holds the adapter's three files and nothing else, and names its base
    body = json.loads(m.to_json())
    extra = {**body, "files": [*body["files"], {**body["files"][0], "name": "x.bin"}]}
    with pytest.raises(ManifestError):
        Manifest.from_json(json.dumps(extra))
    with pytest.raises(ManifestError, match="needs an older base"):
        Manifest.from_json(json.dumps({**body, "base": None, "base_digest": None}))


def test_clients_merge_adapters_through_a_relay_fetching_the_base_once(tmp_path, caplog):
    base = _base(tmp_path / "base")
    a1, a2 = _adapter(tmp_path / "a1", base, 1), _adapter(tmp_path / "a2", base, 2)
    stated = {v: json.loads((a / EFFECTIVE).read_text())["effective_sha256"]
              for v, a in ((1, a1), (2, a2))}
    held = tmp_path / "client"

    async def main():
        origin = signed_origin(OriginConfig(root=str(tmp_path / "o")))
        ourl = await origin.start()
        m0 = await origin.publish(base, 0, SHARD)
        m1 = await origin.publish(a1, 1, SHARD, adapter_of=0)
        # a relay that starts after the base: it mirrors the base first, then the adapter
        relay = Relay(relay_cfg(root=str(tmp_path / "r"), upstreams=[ourl], client=FAST))
        rurl = await relay.start()
        async with signed_client([rurl], FAST) as c:
            r1 = await c.fetch(held / "v1", 1, held=held)  # no base held: fetched first
            assert (r1.payload, r1.fetched_bytes) == ("adapter", m1.total_size + m0.total_size)
            assert weights_sha256(read_weights(held / "v1")["model.safetensors"]) == stated[1]
            m2 = await origin.publish(a2, 2, SHARD, adapter_of=0)
            r2 = await c.fetch(held / "v2", 2, held=held)  # base held: the adapter alone
            assert (r2.payload, r2.fetched_bytes) == ("adapter", m2.total_size)
            assert weights_sha256(read_weights(held / "v2")["model.safetensors"]) == stated[2]
            assert m2.total_size < 0.5 * m0.total_size
            # a base changed on disk since it was fetched: the merge misses the stated hash,
            # the base is fetched again once, and the weights are the trainer's
            w = bytearray((held / "v0" / "model.safetensors").read_bytes())
            w[-7] ^= 1
            (held / "v0" / "model.safetensors").write_bytes(bytes(w))
            r = await c.fetch(tmp_path / "again" / "v2", 2, held=held)
            assert weights_sha256(read_weights(r.path)["model.safetensors"]) == stated[2]
        assert 0 in relay.store.complete
        await relay.stop()
        await origin.stop()

    with caplog.at_level(logging.WARNING, logger="meshrl.shardcast.client"):
        run(main(), 60)
    unusable = [r for r in caplog.records if r.getMessage() == "adapter unusable"]
    assert len(unusable) == 1 and "not the trainer's weights" in unusable[0].fields["why"]


def test_a_signed_adapter_that_misses_its_weights_or_base_loads_nothing(tmp_path, caplog):
    """A publisher bug (effective.json of other weights) or a base no server holds: the fetch
    fails with one line saying why, and nothing appears at the output."""
    base = _base(tmp_path / "base")
    bad = _adapter(tmp_path / "bad", base)
    write_effective(bad, "ab" * 32)

    async def main():
        origin = signed_origin(OriginConfig(root=str(tmp_path / "o")))
        url = await origin.start()
        await origin.publish(base, 0, SHARD)
        await origin.publish(bad, 1, SHARD, adapter_of=0)
        await origin.publish(_adapter(tmp_path / "good", base, 3), 2, SHARD, adapter_of=0)
        async with signed_client([url], FAST) as c:
            with pytest.raises(AdapterError, match="not the trainer's weights"):
                await c.fetch(tmp_path / "c" / "v1", 1, held=tmp_path / "c")
            assert not (tmp_path / "c" / "v1").exists()
            # the base lost (the origin's store is the only source): a clear refusal
            origin.store._delete(0)
            origin.store.scan()
            origin.server.notify()
            quick = ClientConfig(poll_interval=0.05, backoff=0.01, wait_timeout=1, fsync=False)
            async with signed_client([url], quick) as c2:
                with pytest.raises(Exception, match="version 0"):
                    await c2.fetch(tmp_path / "d" / "v2", 2, held=tmp_path / "d")
            assert not (tmp_path / "d" / "v2").exists()
        await origin.stop()

    with caplog.at_level(logging.WARNING, logger="meshrl.shardcast.client"):
        run(main(), 60)
    assert [r.fields["attempt"] for r in caplog.records
            if r.getMessage() == "adapter unusable"] == [1, 2]

"""The sampler's fast paths at real vocabulary sizes: the native noise, the nucleus from each
row's candidates, and the engine against the reference backend on a large-vocabulary model."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.inference import CPUEngine, EngineConfig, SamplingParams
from meshrl.inference import native as nat
from meshrl.inference.reference import ReferenceBackend
from meshrl.inference.sampling import (
    BatchSampler,
    _nucleus_by_candidates,
    _nucleus_by_sort,
    _nucleus_from_top,
    gumbel_noise,
    sample_tokens,
    top_p_mask,
)
from meshrl.model import build_model


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> nat.NativeKernels:
    return nat.NativeKernels.load(tmp_path_factory.mktemp("kernels"))


def _definition(logits, seed, seq_ids, position, temperature, top_p) -> torch.Tensor:
    """sample_tokens spelled out from docs/sampling.md: full noise, nucleus by a full sort."""
    scaled = logits.double() / temperature
    scores = scaled + gumbel_noise(seed, seq_ids, [position] * len(seq_ids), logits.shape[-1])
    if top_p < 1.0:
        nucleus = _nucleus_by_sort(torch.softmax(scaled.float(), dim=-1), top_p)
        scores = scores.masked_fill(~nucleus, float("-inf"))
    return scores.argmax(-1)


@pytest.mark.parametrize("vocab", [49152, 50257, 7])
def test_native_noise_is_the_normative_noise_bit_for_bit(kernels, vocab) -> None:
    seq = [0, 1, 2**32 - 1, 2**32 + 5, 123456789]
    seed = 2**40 + 17
    sampler = BatchSampler(seed, seq, vocab, 0.8, native=kernels)
    for position in (0, 1, 31, 2**31 + 7, 2**32 + 3):
        assert torch.equal(sampler.noise(position),
                           gumbel_noise(seed, seq, [position] * len(seq), vocab))
    sampler.keep(torch.tensor([3, 0]))  # rows leaving the batch
    assert torch.equal(sampler.noise(9), gumbel_noise(seed, [seq[3], seq[0]], [9, 9], vocab))


def test_native_noise_refuses_tensors_it_would_misread(kernels) -> None:
    vocab = torch.arange(10, dtype=torch.int64)
    with pytest.raises(ValueError, match="base"):
        kernels.gumbel_u(torch.arange(4, dtype=torch.int32), 0, vocab)
    with pytest.raises(ValueError, match="vocab_hash"):
        kernels.gumbel_u(torch.arange(4), 0, torch.arange(20)[::2])


def test_nucleus_from_candidates_hand_computed() -> None:
    top = torch.tensor([[0.5, 0.3, 0.1, 0.1, 0.0],    # keeps 0.5, 0.3 (0.8 before the third)
                        [0.4, 0.3, 0.3, 0.0, 0.0],    # tie across the cut: cannot tell which
                        [0.4, 0.15, 0.0, 0.0, 0.0],   # candidates hold only 0.55 < top_p
                        [0.9, 0.1, 0.0, 0.0, 0.0]])   # the first token alone crosses 0.6
    done, last = _nucleus_from_top(top, 0.6)
    assert done.tolist() == [True, False, False, True]
    assert last[0] == pytest.approx(0.3) and last[3] == pytest.approx(0.9)


def test_language_model_like_rows_are_settled_without_a_sort() -> None:
    # peaked rows like a language model's: a few likely tokens over a long, thin tail
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 49152, generator=g)
    logits[:, :5] = torch.tensor([16.0, 15.0, 14.5, 13.0, 11.0])
    probs = torch.softmax(logits, -1)
    for top_p in (0.5, 0.9, 0.99):  # the tail holds ~0.5%
        mask, unsettled = _nucleus_by_candidates(probs, top_p)
        assert unsettled.numel() == 0
        assert torch.equal(mask, _nucleus_by_sort(probs, top_p))
        assert torch.equal(top_p_mask(logits, top_p), mask)


_rows = st.lists(st.floats(-30, 30, allow_nan=False, width=32), min_size=1, max_size=40)


@settings(max_examples=80, deadline=None)
@given(
    base=st.lists(_rows, min_size=1, max_size=4),
    vocab=st.integers(2, 700),
    levels=st.sampled_from([0, 2, 5, 1000]),  # 0: every token tied; few levels: many ties
    neg_inf=st.floats(0, 0.9),
    scale=st.sampled_from([1e-3, 1.0, 40.0, 1e4]),
    top_p=st.sampled_from([1e-6, 0.1, 0.5, 0.9, 0.95, 0.999, 0.9999999]),
    seed=st.integers(0, 2**63 - 1),
)
def test_fast_nucleus_and_sampler_equal_the_definition(
    kernels, base, vocab, levels, neg_inf, scale, top_p, seed
) -> None:
    g = torch.Generator().manual_seed(seed % 2**32)
    n = len(base)
    logits = torch.randn(n, vocab, generator=g, dtype=torch.float64)
    if levels:
        logits = (logits * levels).round() / levels
    else:
        logits.zero_()
    for i, row in enumerate(base):  # hypothesis' values on the first tokens (extremes, ties)
        k = min(len(row), vocab)
        logits[i, :k] = torch.tensor(row[:k], dtype=torch.float64)
    logits = (logits * scale).float()
    logits.masked_fill_(torch.rand(n, vocab, generator=g) < neg_inf, float("-inf"))
    logits[:, seed % vocab] = logits[:, seed % vocab].nan_to_num(0.0, neginf=0.0)  # one finite
    for temperature in (1e-3, 0.7, 1.0, 50.0):
        scaled = logits.double() / temperature
        assert torch.equal(top_p_mask(scaled, top_p),
                           _nucleus_by_sort(torch.softmax(scaled.float(), -1), top_p))
        seq = [seed % 1000 + i for i in range(n)]
        want = _definition(logits, seed, seq, 3, temperature, top_p)
        sampler = BatchSampler(seed, seq, vocab, temperature, top_p, native=kernels)
        assert torch.equal(sampler.sample(logits, 3), want)
        assert torch.equal(sample_tokens(logits, seed, seq, [3] * n, temperature, top_p), want)


@pytest.fixture(scope="module")
def big_vocab_model():
    """Llama, hidden 64, 16,384 tokens; embeddings scaled so logits spread over several units
    (random init leaves them within ~0.1, where float32 summation order decides argmaxes)."""
    model = build_model("llama-tiny", 16384, seed=4, hidden_size=64, intermediate_size=128,
                        num_attention_heads=4, num_key_value_heads=2, eos_token_id=2)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(5)
    return model


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9),
                                                    (1.3, 0.95)])
def test_engine_equals_reference_on_a_large_vocabulary(big_vocab_model, temperature,
                                                       top_p) -> None:
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 16384, (int(n),), generator=g).tolist()
               for n in torch.randint(3, 30, (6,), generator=g)]
    params = SamplingParams(max_new_tokens=16, temperature=temperature, top_p=top_p, seed=99,
                            ignore_eos=True)
    seq_ids = [7, 3, 11, 2**33, 0, 5]
    ref = ReferenceBackend(big_vocab_model).generate(prompts, params, seq_ids)
    for kind in ("native", "torch"):
        engine = CPUEngine(big_vocab_model, None, EngineConfig(decode_kernels=kind))
        outs = engine.generate(prompts, params, seq_ids)
        for o, r in zip(outs, ref, strict=True):
            assert o.token_ids == r.token_ids
            assert o.logprobs == pytest.approx(r.logprobs, abs=1e-4)
    if temperature > 0:  # the noise matters: other seeds give other tokens
        other = engine.generate(prompts, params.model_copy(update={"seed": 100}), seq_ids)
        assert [o.token_ids for o in other] != [r.token_ids for r in ref]

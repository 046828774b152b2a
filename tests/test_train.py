"""The training recipe's pieces at a tiny scale: corpus split, tokenizer, target steps, distillation."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from dflash2rt.backend import TorchOpsBackend
from dflash2rt.errors import InvalidInputError
from dflash2rt.models.config import TargetConfig
from dflash2rt.models.draft import DraftModel
from dflash2rt.models.pair import ModelPair
from dflash2rt.models.target import TargetModel
from dflash2rt.ops.batch import SamplingBatch
from dflash2rt.ops.selector import SelectorParams, select
from dflash2rt.train import corpus, distill, generate
from dflash2rt.train import target as target_mod
from dflash2rt.train.draft_init import DraftShape, draft_config, init_draft
from dflash2rt.train.recipe_config import GEN_MIX, mix_settings
from dflash2rt.train.tokenizer import MASK_TOKEN, train_tokenizer

from tiny_models import tiny_pair

BACKEND = TorchOpsBackend("cpu", "cpu", (torch.float32, torch.float64))
TINY_TARGET = target_mod.TargetShape(hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16,
                                     intermediate=48, max_position=128)
TINY_DRAFT = DraftShape(layers=1, intermediate=48, block_size=4, target_layer_ids=(0, 1),
                        conv_kernel_size=2, conv_group_size=8, selector_rank=4, selector_top_k=4)


@functools.lru_cache(maxsize=None)
def _texts(n: int = 4) -> list[str]:
    root = corpus.stdlib_root()
    return [(root / rel).read_text(encoding="utf-8") for rel in corpus.list_files(root)[:n]]


def test_corpus_skips_tests_and_splits_by_file():
    files = corpus.list_files(corpus.stdlib_root())
    assert files == sorted(files) and len(files) > 100
    assert not any(set(f.split("/")[:-1]) & {"test", "tests", "idle_test", "site-packages"}
                   for f in files)
    held = [f for f in files if corpus.is_heldout(f)]
    assert 0.02 < len(held) / len(files) < 0.2
    assert [corpus.is_heldout(f) for f in files] == [corpus.is_heldout(f) for f in files]


def test_cut_prompts_are_whole_lines_and_seeded():
    files = (("a.py", "".join(f"x{i} = {i} + {i}\n" for i in range(200))),)
    enc = lambda s: list(s.encode())  # noqa: E731
    a = corpus.cut_prompts(files, enc, 5, 20, 60, seed=3)
    assert a == corpus.cut_prompts(files, enc, 5, 20, 60, seed=3)
    for p in a:
        assert p["prompt"].endswith("\n") and 20 <= len(p["prompt_ids"]) <= 60
        assert p["prompt"] in files[0][1]


def test_tokenizer_mask_never_encoded_and_deterministic():
    texts = _texts()
    tok = train_tokenizer(texts, 400)
    assert tok.vocab_size == tok.mask_id + 1 <= 400 and tok.eos_id == 0
    ids = tok.encode(f"x = 1 {MASK_TOKEN} <|endoftext|>\n" + texts[0][:500])
    assert tok.mask_id not in ids
    assert tok.decode(tok.encode(texts[0][:500])) == texts[0][:500]
    assert train_tokenizer(texts, 400).backend.to_str() == tok.backend.to_str()


def _tiny_target(vocab: int, seed: int) -> TargetModel:
    cfg = TargetConfig.from_dict(target_mod.target_config_dict(TINY_TARGET, vocab, 0))
    model = TargetModel(cfg, TINY_DRAFT.target_layer_ids)
    target_mod.init_weights(model, torch.Generator().manual_seed(seed), residual_layers=2)
    return model


def _tiny_run(seed: int) -> tuple[TargetModel, DraftModel, list[float]]:
    """Target steps → engine continuations → taps → draft steps, all from ``seed``."""
    torch.manual_seed(seed)
    tok = train_tokenizer(_texts(3), 320)
    stream = target_mod.token_stream(tok.encode_batch(_texts(3)), tok.eos_id)
    target = _tiny_target(tok.vocab_size, seed)
    losses = target_mod.train_target(target, stream, 3, 2, 32, 3e-3, seed, every=100)
    prompts = [stream[i * 50:i * 50 + 12].tolist() for i in range(4)]
    temps, top_ps = mix_settings(GEN_MIX, len(prompts), seed)
    data = generate.build_distill_data(ModelPair(target, None), BACKEND, prompts, 10,
                                       temps, 4, seed, top_ps=top_ps, soft_top=8)
    draft = DraftModel(draft_config(target.cfg, TINY_DRAFT, tok.mask_id))
    init_draft(draft, torch.Generator().manual_seed(seed))
    hist = distill.train_draft(draft, target, data, 3, 2, 4, 1e-3, seed, every=100,
                               soft_weight=1.0, hard_weight=0.2)
    return target, draft, losses + [h["ce"] + h["sel"] + h["kl"] + h["selkl"] for h in hist]


@pytest.mark.slow                       # trains the tiny target and draft
def test_tiny_run_is_bit_reproducible_from_its_seed(one_thread):
    t1, d1, l1 = _tiny_run(0)
    t2, d2, l2 = _tiny_run(0)
    assert l1 == l2 and all(map(lambda x: x == x, l1))
    for a, b in ((t1, t2), (d1, d2)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(d1.candidate_selector.successor_codebook, torch.zeros(1))


def test_draft_init_is_dflash_v1_with_flat_lattice():
    target = _tiny_target(64, 0)
    draft = DraftModel(draft_config(target.cfg, TINY_DRAFT, 63))
    init_draft(draft, torch.Generator().manual_seed(0))
    conv = draft.layers[0].attention_conv
    assert torch.equal(conv.base_kernel[:, 0], torch.ones_like(conv.base_kernel[:, 0]))
    assert not conv.base_kernel[:, 1:].any() and not conv.kernel_projection.weight.any()
    assert not draft.candidate_selector.successor_codebook.any()
    assert draft.candidate_selector.predecessor_codebook.abs().sum() > 0


def _context(pair, seq):
    """Taps of a whole sequence [1, L, n_taps, H] from one causal target forward."""
    return target_mod.lm_taps(pair.target, [seq])


def test_training_forward_equals_runtime_draft_forward():
    pair = tiny_pair("dflash2", block=8, seed=3)
    pair.draft.layers[0].attention_conv.kernel_projection.weight.data.normal_(0, 0.3)
    seq = [(7 * i + 3) % 59 for i in range(40)]
    taps = _context(pair, seq)                                             # [1, L, n_taps, H]
    anchors = torch.tensor([[5, 17, 30]])
    b, mask_id = 8, pair.draft.cfg.mask_token_id
    ids = torch.full((1, 3, b), mask_id)
    ids[..., 0] = torch.tensor(seq)[anchors]
    batch = distill.Batch(taps, torch.tensor([40]), anchors, ids, ids[..., 1:])
    got = distill.draft_hidden(pair.draft, pair.target, batch, BACKEND)    # [1, 3, B, H]
    for j, a in enumerate(anchors[0].tolist()):
        cache = pair.draft.empty_cache(1, 48, pair.dtype, "cpu")
        pos = torch.arange(a).view(1, a)
        cache.commit(pair.draft.context_kv(taps[:, :a], pos), torch.zeros(1, dtype=torch.long),
                     torch.tensor([a]))
        block_pos = (a + torch.arange(b)).view(1, b)
        ref = pair.draft(pair.target.embed(ids[:, j]), block_pos, cache, torch.tensor([a]), BACKEND)
        torch.testing.assert_close(got[0, j], ref[0], rtol=1e-10, atol=1e-10)


def test_selector_scores_follow_the_runtime_walk():
    pair = tiny_pair("dflash2", block=8, seed=5)
    sel = pair.draft.candidate_selector
    sel.successor_codebook.data.normal_(0, 2.0)
    h = torch.randn(1, 7, pair.target.cfg.hidden_size, dtype=pair.dtype)
    logits = pair.target.lm_head(h)
    anchor = torch.tensor([11])
    params = SelectorParams(pair.draft.cfg.selector_top_k, pair.draft.cfg.output_multiplier,
                            pair.draft.cfg.final_logit_softcapping)
    out = select(logits, sel.hidden_projection(h), anchor, sel.predecessor_codebook,
                 sel.successor_codebook, params, SamplingBatch.greedy_batch(1), torch.zeros(1, 7))
    prev = torch.cat([anchor.view(1, 1), out.draft[:, :-1]], dim=1)      # the walk's own path
    scores, cand = distill.selector_scores(pair.draft, h, logits, prev, params.top_k)
    assert torch.equal(cand, out.candidates)
    assert torch.equal(cand.gather(-1, scores.argmax(-1, keepdim=True))[..., 0], out.draft)


def test_block_mask_sees_own_block_and_earlier_context():
    m = distill.block_mask(torch.tensor([[2, 5]]), 6, 3)                   # [1, 6, 6 + 6]
    assert m[0, 0, :6].tolist() == [True, True, False, False, False, False]
    assert m[0, 4, :6].tolist() == [True] * 5 + [False]
    assert m[0, 0, 6:].tolist() == [True] * 3 + [False] * 3
    assert m[0, 5, 6:].tolist() == [False] * 3 + [True] * 3


def test_train_parser_is_registered():
    from dflash2rt.cli import build_parser

    args = build_parser().parse_args(["train", "--out", "x", "--seed", "3", "--minutes", "10"])
    assert args.seed == 3 and args.minutes == 10 and callable(args.func)


def test_train_cli_sets_the_draft_shape_it_is_given(monkeypatch):
    """--selector-top-k and --block-size reach the recipe's draft shape; the rest stays the
    recipe's."""
    from dflash2rt.cli import build_parser
    from dflash2rt.train import recipe
    from dflash2rt.train.recipe_config import RecipeConfig

    seen = {}

    def stop(out, cfg):
        seen["cfg"] = cfg
        raise SystemExit(0)
    monkeypatch.setattr(recipe, "run_recipe", stop)
    args = build_parser().parse_args(["train", "--out", "x", "--selector-top-k", "64",
                                      "--block-size", "4"])
    with pytest.raises(SystemExit):
        args.func(args)
    got, base = seen["cfg"].draft, RecipeConfig().draft
    assert (got.selector_top_k, got.block_size) == (64, 4) and base.selector_top_k == 16
    assert dataclasses.replace(got, selector_top_k=16, block_size=base.block_size) == base


def test_scaled_recipe_scales_counts_only():
    from dflash2rt.train.recipe_config import DEFAULT_MINUTES, RecipeConfig

    base = RecipeConfig()
    half = base.scaled(DEFAULT_MINUTES / 2)
    assert half.target_steps == round(base.target_steps / 2) and half.seed == base.seed
    assert half.draft == base.draft and half.target == base.target


def test_validation_tau_walks_like_the_engine(one_thread):
    """The recipe's held-out τ (train/validate.py): within [1, B]; per-anchor accept lengths
    within [0, γ]; the draft's train/eval mode is restored."""
    from dflash2rt.train import validate

    torch.manual_seed(0)
    tok = train_tokenizer(_texts(3), 320)
    stream = target_mod.token_stream(tok.encode_batch(_texts(3)), tok.eos_id)
    target = _tiny_target(tok.vocab_size, 0)
    prompts = [stream[i * 50:i * 50 + 12].tolist() for i in range(3)]
    data = generate.build_distill_data(ModelPair(target, None), BACKEND, prompts, 20,
                                       [0.0, 0.0, 0.0], 4, 0)
    draft = DraftModel(draft_config(target.cfg, TINY_DRAFT, tok.mask_id))
    init_draft(draft, torch.Generator().manual_seed(0))
    tau = validate.engine_tau(draft, target, data)
    assert 1.0 <= tau <= draft.cfg.block_size and draft.training
    lens = validate.accept_lengths(draft, target, data, 0, BACKEND)
    assert lens and all(0 <= a <= draft.cfg.block_size - 1 for a in lens)


def _soft_data(seed: int, temps: list[float], soft_top: int = 8, new_tokens: int = 12):
    """A tiny trained target and distillation data with its top-M law (``soft_top``)."""
    torch.manual_seed(seed)
    tok = train_tokenizer(_texts(3), 320)
    stream = target_mod.token_stream(tok.encode_batch(_texts(3)), tok.eos_id)
    target = _tiny_target(tok.vocab_size, seed)
    target_mod.train_target(target, stream, 2, 2, 32, 3e-3, seed, every=100)
    prompts = [stream[i * 50:i * 50 + 10].tolist() for i in range(len(temps))]
    data = generate.build_distill_data(ModelPair(target, None), BACKEND, prompts, new_tokens,
                                       temps, 4, seed, soft_top=soft_top)
    return tok, target, data


@pytest.mark.slow                       # trains the tiny target
def test_soft_targets_are_the_targets_law_of_the_next_token(one_thread):
    """Row i holds the target's top-M law (T=1) of token i+1: on greedy continuations its top id
    is the next token; the probabilities are the full softmax's, descending."""
    _, target, data = _soft_data(0, [0.0, 0.0, 1.0])
    assert data.soft_ids.shape == data.soft_p.shape == (data.tokens.numel(), 8)
    assert (data.soft_p[:, :-1] >= data.soft_p[:, 1:]).all() and (data.soft_p.sum(-1) <= 1 + 1e-5).all()
    for s in range(2):                                                    # the greedy ones
        st, n, p = (int(x[s]) for x in (data.starts, data.lengths, data.prompt_lens))
        assert torch.equal(data.soft_ids[st + p - 1:st + n - 1, 0], data.tokens[st + p:st + n])
    st, n = int(data.starts[2]), int(data.lengths[2])
    seq = data.tokens[st:st + n].tolist()
    probs = torch.softmax(target_mod.lm_forward(target, [seq]).logits[0], dim=-1)
    torch.testing.assert_close(probs.gather(-1, data.soft_ids[st:st + n]), data.soft_p[st:st + n])
    sub = data.subset([2])
    assert torch.equal(sub.soft_ids, data.soft_ids[st:st + n])


@pytest.mark.slow                       # trains the tiny target
def test_soft_loss_metrics_are_acceptance_bounds(one_thread):
    """sample_batch aligns each label with its row's law; acceptance Σ min(p, q) ≤ the target's
    mass on the K candidates ≤ 1; the soft part trains the selector's codebooks too."""
    tok, target, data = _soft_data(1, [1.0, 0.7, 0.0, 1.0])
    draft = DraftModel(draft_config(target.cfg, TINY_DRAFT, tok.mask_id))
    init_draft(draft, torch.Generator().manual_seed(1))
    batch = distill.sample_batch(data, [0, 1, 2, 3], 5, 4, tok.mask_id, torch.Generator().manual_seed(0))
    assert batch.soft_ids.shape[:3] == batch.labels.shape
    # sequence 2 is greedy: each label is the top token of its row's law
    assert torch.equal(batch.soft_ids[2, ..., 0], batch.labels[2])
    loss, m = distill.distill_loss(draft, target, batch, BACKEND, 7.0, 1.0, soft_weight=1.0,
                                   hard_weight=0.0)
    assert 0.0 <= m["acc1"] <= m["mass"] + 1e-6 <= 1 + 1e-6
    assert 1.0 <= m["tau1"] <= 4.0 and m["kl"] > 0
    loss.backward()
    assert draft.candidate_selector.successor_codebook.grad.abs().sum() > 0
    cand = torch.tensor([[3, 5]])
    assert distill.candidate_mass(cand, torch.tensor([[5, 7, 3]]),
                                  torch.tensor([[0.5, 0.25, 0.125]])).tolist() == [[0.125, 0.5]]


@pytest.mark.slow                       # trains the tiny target
def test_hard_argmax_targets_are_the_targets_argmax_on_every_continuation(one_thread):
    """hard_argmax: the hard CE's target is the top id of each row's law (the token a greedy
    verifier accepts), not the continuation's token; on greedy continuations the two agree."""
    import dataclasses

    tok, target, data = _soft_data(2, [1.0, 1.0, 0.0, 1.0])
    draft = DraftModel(draft_config(target.cfg, TINY_DRAFT, tok.mask_id))
    init_draft(draft, torch.Generator().manual_seed(2))
    batch = distill.sample_batch(data, [0, 1, 2, 3], 5, 4, tok.mask_id,
                                 torch.Generator().manual_seed(0))
    top = batch.soft_ids[..., 0]
    assert not torch.equal(top, batch.labels)          # sampled labels that are not the argmax

    def loss(b, argmax, sel=0.0):
        return distill.distill_loss(draft, target, b, BACKEND, 7.0, sel, soft_weight=0.0,
                                    hard_weight=1.0, hard_argmax=argmax)[0].item()

    # the slot CE alone (no selector term, which also reads the labels as the walk's path)
    assert loss(batch, True) == loss(dataclasses.replace(batch, labels=top), False)
    assert loss(batch, True) != loss(batch, False)
    greedy = distill.sample_batch(data, [2], 5, 4, tok.mask_id, torch.Generator().manual_seed(0))
    assert torch.equal(greedy.soft_ids[..., 0], greedy.labels)
    assert loss(greedy, True, 1.0) == loss(greedy, False, 1.0)
    with pytest.raises(InvalidInputError, match="soft_top"):    # no law: no argmax to teach
        loss(dataclasses.replace(batch, soft_ids=None, soft_p=None), True)


@pytest.mark.slow                       # trains the tiny target
def test_topk_mass_is_one_when_the_selector_offers_the_whole_vocabulary(one_thread):
    from dflash2rt.train import evaluate, validate

    tok, target, data = _soft_data(2, [1.0, 1.0])
    v = target.cfg.vocab_size
    shape = DraftShape(layers=1, intermediate=48, block_size=4, target_layer_ids=(0, 1),
                       conv_kernel_size=2, conv_group_size=8, selector_rank=4, selector_top_k=v)
    pair = ModelPair(target, DraftModel(draft_config(target.cfg, shape, tok.mask_id)))
    init_draft(pair.draft, torch.Generator().manual_seed(2))
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    outs = [[12, 13, 14, 15, 16, 17], [18, 19, 20, 21, 22]]
    for temp, top_p in ((0.0, 1.0), (0.7, 0.95), (1.0, 1.0)):
        m = evaluate.topk_mass(pair, prompts, outs, temp, top_p)
        assert len(m["topk_mass_per_slot"]) == 3
        assert abs(m["topk_mass"] - 1.0) < 1e-5
    small = DraftModel(draft_config(target.cfg, TINY_DRAFT, tok.mask_id))
    init_draft(small, torch.Generator().manual_seed(2))
    m = evaluate.topk_mass(ModelPair(target, small), prompts, outs, 1.0)
    assert 0.0 < m["topk_mass"] < 1.0
    vm = validate.soft_metrics(small, target, data)
    assert 0.0 <= vm["acc1"] <= vm["mass"] + 1e-6 <= 1 + 1e-6 and vm["tau1"] >= 1.0


def test_gen_mix_is_seeded_and_follows_its_shares():
    temps, top_ps = mix_settings(GEN_MIX, 2000, 3)
    assert (temps, top_ps) == mix_settings(GEN_MIX, 2000, 3)
    for t, p, share in GEN_MIX:
        got = sum(1 for a, b in zip(temps, top_ps) if (a, b) == (t, p)) / 2000
        assert abs(got - share / sum(w for _, _, w in GEN_MIX)) < 0.05


def test_given_target_is_loaded_only_with_the_recipes_tokenizer(tmp_path):
    """``--target DIR``: the draft is distilled for an existing target, loaded in float32 with
    the draft's taps; a target whose tokenizer is not the one the recipe trains (ids would mean
    other text) or that has none is refused, naming what to fix."""
    import dataclasses

    from dflash2rt.models.hf_loader import save_target
    from dflash2rt.train.recipe import RecipeConfig, given_target, target_dir

    tok = train_tokenizer(_texts(3), 320)
    cfg = dataclasses.replace(RecipeConfig(), vocab_size=320, target=TINY_TARGET, draft=TINY_DRAFT)
    tcfg = TargetConfig.from_dict(target_mod.target_config_dict(TINY_TARGET, tok.vocab_size,
                                                                tok.eos_id))
    model = TargetModel(tcfg, ())
    target_mod.init_weights(model, torch.Generator().manual_seed(0), residual_layers=2)
    save_target(model, None, tmp_path / "t")
    with pytest.raises(InvalidInputError, match="no tokenizer.json"):
        given_target(tmp_path / "t", tok, cfg)
    tok.save(tmp_path / "t")
    got = given_target(target_dir(str(tmp_path / "t")), tok, cfg)
    assert got.cfg == tcfg and tuple(got.tap_layer_ids) == TINY_DRAFT.target_layer_ids
    for a, b in zip(got.parameters(), model.parameters()):
        assert torch.equal(a, b) and a.dtype == torch.float32
    train_tokenizer(_texts(2), 320).save(tmp_path / "t")
    with pytest.raises(InvalidInputError, match="not the one this recipe trains"):
        given_target(tmp_path / "t", tok, cfg)
    with pytest.raises(InvalidInputError, match="no-such-pair"):
        target_dir("no-such-pair")
    assert target_dir("stdlib-code").name == "target" and target_dir("stdlib-code").is_dir()

"""training/model.py: GPT-2's structure and forward pass against transformers' GPT2LMHeadModel."""
from dataclasses import asdict, fields

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from training.model import GPT, GPTConfig, model_config


def test_lab_parameter_count_matches_transformers_gpt2():
    cfg = model_config(vocab_size=50257, eot_id=50256)  # the lab shape: GPT2Config's defaults
    assert cfg.vocab_size == 50304 and (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_positions) == (12, 12, 768, 1024)
    ours = sum(p.numel() for p in GPT(cfg).parameters())
    theirs = sum(p.numel() for p in GPT2LMHeadModel(GPT2Config(**asdict(cfg))).parameters())
    assert ours == theirs == 124_439_808 + 47 * 768  # GPT-2 small (124.4M), plus 47 padding rows


def test_the_config_is_gpt2configs_fields_with_its_defaults():
    """GPTConfig stands in for transformers' GPT2Config (whose import is a second of every job's start-up):
    the same names, the same defaults but dropout (0 here), and transformers opens what it writes."""
    theirs = GPT2Config()
    for f in fields(GPTConfig):
        if f.name not in ("vocab_size", "resid_pdrop", "embd_pdrop", "attn_pdrop", "bos_token_id", "eos_token_id"):
            assert getattr(theirs, f.name) == f.default, f.name
    cfg = model_config(50257, 50256, n_layer=2)
    assert GPT2Config(**cfg.to_transformers()).to_dict()["n_layer"] == 2
    assert {k: getattr(GPT2Config(**cfg.to_transformers()), k) for k in asdict(cfg)} == asdict(cfg)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_forward_equals_transformers_gpt2_with_the_same_weights(attention):
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = GPT2LMHeadModel(cfg).eval()
    ours = GPT(cfg, attention).eval()
    state = {}
    for name, tensor in hf.state_dict().items():
        if name.endswith((".attn.bias", ".attn.masked_bias")) or name == "lm_head.weight":  # causal-mask buffers
            continue
        key = name.removeprefix("transformer.")  # the same names, one to one
        is_conv1d = any(part in name for part in ("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        state[key] = tensor.t() if is_conv1d else tensor  # HF's Conv1D stores (in, out)
    missing, unexpected = ours.load_state_dict(state, strict=False)
    assert missing == ["lm_head.weight"] and unexpected == []  # tied to wte
    idx = torch.randint(0, 128, (3, 32))
    with torch.no_grad():
        expected = hf(idx, labels=idx).loss  # HF shifts the labels itself
        got = ours(idx[:, :-1], idx[:, 1:])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)

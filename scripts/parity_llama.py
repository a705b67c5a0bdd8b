#!/usr/bin/env python3
"""parity_llama.py -- write a Llama parity fixture for `ember verify --fixture DIR`,
computed with Hugging Face `transformers.LlamaForCausalLM`.

What it writes into --out DIR (the format of `gpt_ref.py parity`):
  init.safetensors  the initial model.state_dict() under HF names, PyTorch Linear
                    layout [out, in]: model.embed_tokens.weight,
                    model.layers.{i}.input_layernorm.weight,
                    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
                    model.layers.{i}.post_attention_layernorm.weight,
                    model.layers.{i}.mlp.{gate,up,down}_proj.weight,
                    model.norm.weight, lm_head.weight (untied unless
                    --tie-word-embeddings).  No rotary inv_freq buffer (HF keeps it
                    non-persistent).
  batch.json        tokens, input_ids, targets (-100 = ignored), micro_batches
  expected.json     config ("arch": "llama" + HF LlamaConfig names), optimizer,
                    n_scored, initial_loss, initial_grad_norm, train_full_batch{...},
                    grad_accum{...} -- the fields of the GPT-2 fixtures -- plus '_f64'
                    numbers and a "cross_check" block (see below)
  (--debug-files adds init_grads.safetensors, after_step1/after_step10.safetensors)

Model: LlamaConfig(attn_implementation="eager", float32, no biases, dropout 0,
rope_parameters {"rope_type": "default", "rope_theta": ...}), HF's own init
(torch.manual_seed(--seed); N(0, initializer_range=0.02) for embeddings and
Linear weights, RMSNorm weights 1).  The loss is computed here, NOT by HF's
`labels=` path (which shifts labels by one): logits = model(input_ids).logits,
loss = F.cross_entropy(logits, targets, ignore_index=-100) -- batch.json's
targets are already the next tokens.  Scenarios, AdamW (decay on every tensor
with dim >= 2: embeddings, Linear weights, lm_head; none on RMSNorm weights),
clipping and the JSON layout come from the shared reference gpt_ref.py
(imported from $EMBER_SHARED/peers, default <repo>/../shared/peers), via
scripts/parity_common.py.

Cross-check / float64: HF's Llama casts to float32 inside RMSNorm, the rotary
tables and the attention softmax, so it cannot run in true float64.  This
script therefore also carries a small independent re-implementation (class
RefLlama: same parameter names, rotate_half RoPE, GQA by repeating kv heads,
SwiGLU) which must agree with HF in float32 (checked, recorded under
"cross_check"), and whose float64 run gives the '_f64' fields.

Run (from the repo root), the committed fixture:
  python3 scripts/parity_llama.py --out tests/fixtures/llama-tiny-gqa
(defaults: vocab 64, hidden 32, 2 layers, 4 heads / 2 kv heads, intermediate 88,
16 positions, 4 sequences, micro-batches "0;1,2,3", ignore "0:3,1:0-5,2:15,3:8-11").
Re-check a fixture from its files with HF:  python3 scripts/parity_llama.py --check DIR

Dependencies: python3 with torch, safetensors, numpy, transformers (tested with
transformers 5.24.0, torch 2.15 CPU): pip install torch safetensors numpy transformers;
and the shared gpt_ref.py.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from parity_common import (add_common_flags, check_fixture, load_gpt_ref, make_batch,
                           parse_ignore, parse_micro, set_parity_opt, write_fixture)

IGNORE_INDEX = -100


def nll(logits, targets, reduction):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction=reduction)


# --------------------------------------------------------------------------
# Hugging Face model, behind gpt_ref.GPT's calling convention
# --------------------------------------------------------------------------
def hf_config(c: dict):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
        intermediate_size=c["intermediate_size"], num_hidden_layers=c["num_hidden_layers"],
        num_attention_heads=c["num_attention_heads"], num_key_value_heads=c["num_key_value_heads"],
        max_position_embeddings=c["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": float(c["rope_theta"])},
        rms_norm_eps=c["rms_norm_eps"], tie_word_embeddings=c["tie_word_embeddings"],
        hidden_act="silu", attention_bias=False, mlp_bias=False, attention_dropout=0.0,
        initializer_range=c.get("initializer_range", 0.02), pad_token_id=None,
        use_cache=False, attn_implementation="eager", dtype="float32")


class HFLoss(nn.Module):
    """LlamaForCausalLM with gpt_ref's interface: forward(idx, targets, reduction)
    -> (logits, loss).  Registers the HF model's own submodules `model` and
    `lm_head`, so named_parameters() / state_dict() carry exactly HF's names."""

    def __init__(self, lm):
        super().__init__()
        self.model = lm.model
        self.lm_head = lm.lm_head
        object.__setattr__(self, "_lm", lm)  # not a registered submodule (no name prefix)

    def forward(self, idx, targets=None, reduction="mean"):
        logits = self._lm(input_ids=idx, use_cache=False).logits
        return logits, (None if targets is None else nll(logits, targets, reduction))


def hf_model(c: dict, sd=None):
    from transformers import LlamaForCausalLM
    lm = LlamaForCausalLM(hf_config(c)).to(torch.float32)
    assert lm.config._attn_implementation == "eager", lm.config._attn_implementation
    if c["tie_word_embeddings"]:
        assert lm.lm_head.weight is lm.model.embed_tokens.weight, "lm_head not tied"
    if sd is not None:
        if c["tie_word_embeddings"] and "lm_head.weight" not in sd:
            sd = {**sd, "lm_head.weight": sd["model.embed_tokens.weight"]}
        lm.load_state_dict(sd, strict=True)
    m = HFLoss(lm)
    m.train()
    return m


# --------------------------------------------------------------------------
# independent re-implementation (cross-check, float64)
# --------------------------------------------------------------------------
class _Lin(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))  # PyTorch / HF layout [out, in]

    def forward(self, x):
        return x @ self.weight.t()


class _Norm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):  # RMSNorm: x / sqrt(mean(x^2) + eps) * w
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class _Attn(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, H, K = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.H, self.K, self.hd = H, K, C // H
        self.q_proj, self.k_proj = _Lin(C, H * self.hd), _Lin(C, K * self.hd)
        self.v_proj, self.o_proj = _Lin(C, K * self.hd), _Lin(H * self.hd, C)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.K, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.K, self.hd).transpose(1, 2)

        def rope(t):  # rotate_half over the two halves of each head
            h = self.hd // 2
            return t * cos + torch.cat((-t[..., h:], t[..., :h]), dim=-1) * sin
        q, k = rope(q), rope(k)
        rep = self.H // self.K  # query head j reads kv head j // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        return self.o_proj((att @ v).transpose(1, 2).reshape(B, T, self.H * self.hd))


class _MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj, self.up_proj, self.down_proj = _Lin(C, I), _Lin(C, I), _Lin(I, C)

    def forward(self, x):  # SwiGLU
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        # HF's registration order (named_parameters order = AdamW group order)
        self.self_attn = _Attn(c)
        self.mlp = _MLP(c)
        self.input_layernorm = _Norm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = _Norm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([_Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = _Norm(c["hidden_size"], c["rms_norm_eps"])


class RefLlama(nn.Module):
    """Plain-PyTorch Llama with HF parameter names; computes everything (RoPE tables
    included) in the parameters' dtype."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = _Body(c)
        self.lm_head = None if c["tie_word_embeddings"] else _Lin(c["hidden_size"], c["vocab_size"])

    def forward(self, idx, targets=None, reduction="mean"):
        c, dt = self.c, self.model.embed_tokens.weight.dtype
        T, hd = idx.shape[1], c["hidden_size"] // c["num_attention_heads"]
        inv_freq = 1.0 / (float(c["rope_theta"]) ** (torch.arange(0, hd, 2, dtype=dt) / hd))
        ang = torch.arange(T, dtype=dt)[:, None] * inv_freq[None, :]
        ang = torch.cat((ang, ang), dim=-1)
        cos, sin = ang.cos(), ang.sin()
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = x @ w.t()
        return logits, (None if targets is None else nll(logits, targets, reduction))


def ref_model(c, sd, dtype):
    m = RefLlama(c)
    m.load_state_dict(sd, strict=True)
    return m.to(dtype)


# --------------------------------------------------------------------------
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--hidden-size", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=2, help="num_hidden_layers")
    p.add_argument("--n-head", type=int, default=4, help="num_attention_heads")
    p.add_argument("--n-kv-head", type=int, default=2, help="num_key_value_heads")
    p.add_argument("--intermediate-size", type=int, default=88)
    p.add_argument("--block-size", type=int, default=16, help="max_position_embeddings")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--rms-norm-eps", type=float, default=1e-5)
    p.add_argument("--tie-word-embeddings", action="store_true")
    add_common_flags(p, n_seq=4, micro="0;1,2,3", ignore="0:3,1:0-5,2:15,3:8-11")
    a = p.parse_args(argv)
    if not a.out and not a.check:
        p.error("--out DIR (write) or --check DIR (re-check) is required")

    gr = load_gpt_ref()
    import transformers
    torch.set_num_threads(1)

    if a.check:
        sys.exit(0 if check_fixture(gr, a.check, hf_model) else 1)

    set_parity_opt(gr, a)
    seq_len = a.seq_len or a.block_size
    if seq_len > a.block_size:
        p.error(f"--seq-len {seq_len} > --block-size {a.block_size}")
    ignored = parse_ignore(a.ignore, a.batch_size, seq_len)
    micro = parse_micro(a.micro_batches, a.batch_size)

    config = {
        "arch": "llama",
        "vocab_size": a.vocab, "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size, "num_hidden_layers": a.n_layer,
        "num_attention_heads": a.n_head, "num_key_value_heads": a.n_kv_head,
        "head_dim": a.hidden_size // a.n_head,
        "max_position_embeddings": a.block_size, "rope_theta": a.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": a.rope_theta},
        "rms_norm_eps": a.rms_norm_eps, "tie_word_embeddings": a.tie_word_embeddings,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "initializer_range": 0.02,
    }

    torch.manual_seed(a.seed)
    m0 = hf_model(config)
    init_sd = {k: v.detach().to(torch.float32).contiguous().clone()
               for k, v in m0.state_dict().items()}
    buffers = [n for n, _ in m0.named_buffers()]
    saved_buffers = sorted(set(init_sd) - {n for n, _ in m0.named_parameters()})
    if a.tie_word_embeddings:
        init_sd.pop("lm_head.weight", None)  # shared storage; Ember ties it itself
    tokens, x, y = make_batch(torch, a.vocab, a.batch_size, seq_len, ignored, a.data_seed)

    def fresh():
        return hf_model(config, init_sd)

    ref_sd = dict(init_sd)

    # cross-check: HF vs the independent re-implementation, float32
    mh, mr = fresh(), ref_model(config, ref_sd, torch.float32)
    lh, lr_ = mh(x, y)[1], mr(x, y)[1]
    lh.backward()
    lr_.backward()
    gh, grf = gr.global_grad_norm(mh), gr.global_grad_norm(mr)
    names = [n for n, _ in mh.named_parameters()]
    assert names == [n for n, _ in mr.named_parameters()], "parameter order differs"
    pr = dict(mr.named_parameters())
    max_grad_diff = max((ph.grad - pr[n].grad).abs().max().item() for n, ph in mh.named_parameters())
    set_parity_opt(gr, a)
    _, _, la_h = gr.run_parity(fresh(), x, y, steps=a.steps)
    _, _, la_r = gr.run_parity(ref_model(config, ref_sd, torch.float32), x, y, steps=a.steps)
    cross = {
        "what": "HF LlamaForCausalLM (eager, float32) vs this script's independent RefLlama "
                "(float32) on the same weights and batch",
        "initial_loss_abs_diff": abs(lh.item() - lr_.item()),
        "initial_grad_norm_abs_diff": abs(gh - grf),
        "max_abs_grad_diff": max_grad_diff,
        "loss_after_step_max_abs_diff": max(abs(u - v) for u, v in zip(la_h, la_r)),
    }
    print("cross-check HF vs RefLlama (f32):", json.dumps(cross))
    if not (cross["initial_loss_abs_diff"] < 1e-5 and cross["initial_grad_norm_abs_diff"] < 1e-5
            and cross["loss_after_step_max_abs_diff"] < 1e-4):
        sys.exit("error: HF and the re-implementation disagree; not writing a fixture")

    hd = config["head_dim"]
    write_fixture(
        gr, a,
        fresh=fresh, fresh64=lambda: ref_model(config, ref_sd, torch.float64),
        state_dict=lambda m: {k: v.detach().contiguous().clone() for k, v in m.state_dict().items()},
        init_sd=init_sd,
        init_metadata={"format": "pt", "config": json.dumps(config),
                       "layout": "HF LlamaForCausalLM names; Linear weights [out, in] (y = x @ W^T); "
                                 + ("lm_head tied to model.embed_tokens.weight (no lm_head.weight)"
                                    if a.tie_word_embeddings else "untied lm_head.weight [vocab, hidden]")},
        tokens=tokens, x=x, y=y, ignored=ignored, micro=micro, config=config,
        model_notes={
            "reference": f"transformers {transformers.__version__} LlamaForCausalLM, "
                         "attn_implementation eager, float32",
            "weight_layout": "torch.nn.Linear [out, in], y = x @ W^T, no biases; q_proj "
                             f"[{a.n_head}*{hd}, {a.hidden_size}], k_proj/v_proj "
                             f"[{a.n_kv_head}*{hd}, {a.hidden_size}], o_proj [{a.hidden_size}, "
                             f"{a.n_head}*{hd}]; head h = rows h*head_dim..(h+1)*head_dim",
            "block": "x = x + o_proj(attn(input_layernorm(x))); "
                     "x = x + down_proj(silu(gate_proj(h)) * up_proj(h)), h = post_attention_layernorm(x); "
                     "final model.norm, then lm_head",
            "rms_norm": "w * x / sqrt(mean(x^2) + rms_norm_eps) (computed in float32)",
            "rope": "HF rotate_half layout: inv_freq[j] = 1/theta^(2j/head_dim), j < head_dim/2; "
                    "angle = pos * inv_freq (positions 0..T-1 of each sequence), cos/sin = "
                    "cat(angles, angles); q' = q*cos + rotate_half(q)*sin, rotate_half([a, b]) = "
                    "[-b, a] over the two halves of the head (NOT interleaved pairs); same for k",
            "attention": "grouped-query: query head j uses key/value head j // (n_head / n_kv_head) "
                         "(repeat_kv); softmax(q k^T / sqrt(head_dim)) causal",
            "lm_head": "tied to model.embed_tokens.weight" if a.tie_word_embeddings
                       else "untied: logits = norm(x) @ lm_head.weight^T",
            "loss": "F.cross_entropy(logits, targets, ignore_index=-100) on batch.json's targets "
                    "(already shifted; HF's labels= shift is not used)",
            "init": f"torch.manual_seed({a.seed}); LlamaForCausalLM(config) (HF _init_weights: "
                    "N(0, 0.02) for embed_tokens and every Linear, RMSNorm weights 1)",
            "buffers": f"model buffers {buffers}; saved in init.safetensors: {saved_buffers or 'none'}",
            "f64": "'_f64' fields come from this script's RefLlama in float64 (HF Llama computes "
                   "RMSNorm, RoPE tables and softmax in float32 whatever the dtype)",
        },
        what=f"a tiny Llama ({a.n_layer} layers, {a.n_head} query / {a.n_kv_head} kv heads, hidden "
             f"{a.hidden_size}, intermediate {a.intermediate_size}, vocab {a.vocab}, context "
             f"{a.block_size}) written by scripts/parity_llama.py with transformers "
             f"{transformers.__version__} LlamaForCausalLM",
        extra={"cross_check": cross,
               "generator": {"script": "scripts/parity_llama.py",
                             "argv": sys.argv[1:] if argv is None else list(argv),
                             "transformers": transformers.__version__}},
    )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""parity_gpt2.py -- write a GPT-2 parity fixture for `ember verify --fixture DIR`,
with other settings than the shared one (shared/parity/gpt2-tiny).

What it writes into --out DIR (the format of `gpt_ref.py parity`):
  init.safetensors  initial weights, Hugging Face GPT-2 names and layouts (Conv1D
                    weights [in, out]; LM head tied to transformer.wte.weight)
  batch.json        tokens, input_ids, targets (-100 = ignored), micro_batches
  expected.json     config, optimizer (incl. decay_params / no_decay_params,
                    grad_clip.max_norm), n_scored, initial_loss, initial_grad_norm,
                    train_full_batch{steps, loss_after_step, loss_before_step,
                    grad_norm_before_clip}, grad_accum{micro_batches,
                    n_scored_per_micro_batch, n_scored_total, token_weighted{loss,
                    grad_norm, loss_after_step}, wrong_mean_per_micro_batch{...}},
                    and the same numbers in float64 as '_f64' fields
  (--debug-files adds init_grads.safetensors, after_step1/after_step10.safetensors)

The model, its init, the loss, AdamW, the clipping and the scenarios are those of
the shared reference `gpt_ref.py` (imported from $EMBER_SHARED/peers, default
<repo>/../shared/peers: GPT, GPTConfig, hf_state_dict, run_parity,
make_optimizer, param_groups, global_grad_norm); only the sizes, the batch, the
ignored positions and the micro-batches are parameters here.  PyTorch runs on
the CPU, single-threaded, in float32 (the '_f64' re-runs in float64).

Run (from the repo root), e.g. the committed fixture:
  python3 scripts/parity_gpt2.py --out tests/fixtures/gpt2-erf-nobias \
      --vocab 96 --n-layer 3 --n-head 3 --n-embd 48 --block-size 24 --no-bias \
      --gelu erf --batch-size 6 --micro-batches "0;1,2;3,4,5" \
      --ignore "0:1,0:23,1:0-11,2:7,4:20-23,5:0"
Re-check a fixture from its files:  python3 scripts/parity_gpt2.py --check DIR
(or `python3 ../shared/peers/gpt_ref.py check-parity --dir DIR`).

Dependencies: python3 with torch, safetensors, numpy (pip install torch
safetensors numpy), and the shared gpt_ref.py.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from parity_common import (add_common_flags, check_fixture, load_gpt_ref, make_batch,
                           parse_ignore, parse_micro, set_parity_opt, write_fixture)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=96)
    p.add_argument("--n-layer", type=int, default=3)
    p.add_argument("--n-head", type=int, default=3)
    p.add_argument("--n-embd", type=int, default=48)
    p.add_argument("--block-size", type=int, default=24)
    p.add_argument("--no-bias", action="store_true", help="no Linear / LayerNorm biases")
    p.add_argument("--gelu", choices=["tanh", "erf"], default="tanh")
    add_common_flags(p, n_seq=6, micro="0;1,2;3,4,5", ignore="0:1,0:23,1:0-11,2:7,4:20-23,5:0")
    a = p.parse_args(argv)
    if not a.out and not a.check:
        p.error("--out DIR (write) or --check DIR (re-check) is required")

    gr = load_gpt_ref()
    import torch
    torch.set_num_threads(1)

    if a.check:
        def fresh_from(config, sd):
            m = gr.GPT(gr.GPTConfig(**config))
            m.load_state_dict(sd)
            return m
        sys.exit(0 if check_fixture(gr, a.check, fresh_from) else 1)

    set_parity_opt(gr, a)
    seq_len = a.seq_len or a.block_size
    if seq_len > a.block_size:
        p.error(f"--seq-len {seq_len} > --block-size {a.block_size}")
    ignored = parse_ignore(a.ignore, a.batch_size, seq_len)
    micro = parse_micro(a.micro_batches, a.batch_size)

    torch.manual_seed(a.seed)
    cfg = gr.GPTConfig(vocab_size=a.vocab, block_size=a.block_size, n_layer=a.n_layer,
                       n_head=a.n_head, n_embd=a.n_embd, dropout=0.0, bias=not a.no_bias,
                       gelu=a.gelu)
    model = gr.GPT(cfg)
    init_sd = gr.hf_state_dict(model)
    tokens, x, y = make_batch(torch, a.vocab, a.batch_size, seq_len, ignored, a.data_seed)

    def fresh(dtype=torch.float32):
        m = gr.GPT(cfg)
        m.load_state_dict(init_sd)
        return m.to(dtype)

    write_fixture(
        gr, a,
        fresh=fresh, fresh64=lambda: fresh(torch.float64), state_dict=gr.hf_state_dict,
        init_sd=init_sd,
        init_metadata={"format": "pt", "config": json.dumps(asdict(cfg)),
                       "layout": "HF GPT-2 names; Conv1D weights [in, out] (y = x @ W + b); "
                                 "LM head tied to transformer.wte.weight (no lm_head.weight)"},
        tokens=tokens, x=x, y=y, ignored=ignored, micro=micro,
        config=asdict(cfg),
        model_notes={
            "weight_layout": "HF GPT-2 Conv1D: c_attn/c_proj/c_fc weights are [in, out], y = x @ W"
                             + (" + b" if cfg.bias else " (no biases)"),
            "bias": cfg.bias,
            "qkv_split": "c_attn output [.., 3C] split into q | k | v (each C), heads = contiguous "
                         "chunks of head_dim within each",
            "attention": "softmax(q k^T / sqrt(head_dim)) causal",
            "gelu": "tanh approximation 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))" if cfg.gelu == "tanh"
                    else "exact erf GELU 0.5x(1+erf(x/sqrt(2)))",
            "layer_norm_eps": cfg.layer_norm_eps,
            "lm_head": "tied: logits = ln_f(x) @ transformer.wte.weight^T (no lm_head.weight tensor)",
            "init": f"torch.manual_seed({a.seed}); gpt_ref GPT.reset_parameters: N(0,0.02) for "
                    "wte/wpe/c_attn.weight/c_fc.weight, N(0,0.02/sqrt(2*n_layer)) for "
                    "*.c_proj.weight, biases 0, LayerNorm 1/0",
        },
        what=f"a GPT-2 ({cfg.n_layer} layers, {cfg.n_head} heads, n_embd {cfg.n_embd}, vocab "
             f"{cfg.vocab_size}, block {cfg.block_size}, bias {cfg.bias}, gelu {cfg.gelu}) written "
             "by scripts/parity_gpt2.py with the shared gpt_ref.py model",
        extra={"generator": {"script": "scripts/parity_gpt2.py",
                             "argv": sys.argv[1:] if argv is None else list(argv)}},
    )


if __name__ == "__main__":
    main()

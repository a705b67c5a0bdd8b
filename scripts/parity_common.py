"""parity_common.py -- shared plumbing of scripts/parity_gpt2.py and scripts/parity_llama.py.

Not a script.  It loads the shared PyTorch reference `gpt_ref` (from
`$EMBER_SHARED/peers`, default `<repo>/../shared/peers`) and runs the same parity
scenarios as `gpt_ref.py parity` (its `cmd_parity`), but for any model and batch:

  * initial full-batch loss + global gradient norm (before clipping),
  * `steps` AdamW steps on the full batch (gpt_ref.run_parity),
  * gradient accumulation over micro-batches, token-weighted (correct) and
    mean-per-micro-batch (wrong, for contrast), then `steps` accumulated steps,

and writes `init.safetensors`, `batch.json`, `expected.json` with the fields of
gpt_ref's fixtures (`--debug-files` adds init_grads / after_step1 / after_step10).

A "model" here is anything with gpt_ref.GPT's calling convention:
`model(idx, targets, reduction="mean"|"sum") -> (logits, loss)`, where loss is the
cross-entropy over targets != -100.  gpt_ref's run_parity, make_optimizer
(AdamW, decay on every tensor with dim >= 2), global_grad_norm work on it as is.

Dependencies: torch, safetensors (numpy is pulled in by safetensors.torch).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def load_gpt_ref():
    """Import the shared reference gpt_ref.py from $EMBER_SHARED/peers (default
    <repo>/../shared/peers); exit with a clear message if it is not there."""
    shared = Path(os.environ.get("EMBER_SHARED") or (REPO_ROOT.parent / "shared"))
    peers = shared / "peers"
    if not (peers / "gpt_ref.py").is_file():
        sys.exit(f"error: the shared reference {peers / 'gpt_ref.py'} was not found; set "
                 f"EMBER_SHARED to the folder that holds peers/gpt_ref.py")
    if str(peers) not in sys.path:
        sys.path.insert(0, str(peers))
    import gpt_ref  # noqa: E402
    return gpt_ref


# --------------------------------------------------------------------------
# flags
# --------------------------------------------------------------------------
def parse_micro(spec: str, n_seq: int) -> list[list[int]]:
    """'0;1,2;3,4,5' -> [[0], [1, 2], [3, 4, 5]].  Must use every sequence exactly
    once (so that the token-weighted accumulation equals the full batch)."""
    micro = [[int(i) for i in part.split(",") if i.strip() != ""] for part in spec.split(";")]
    if any(not mb for mb in micro):
        raise SystemExit(f"error: --micro-batches {spec!r}: empty micro-batch")
    flat = sorted(i for mb in micro for i in mb)
    if flat != list(range(n_seq)):
        raise SystemExit(f"error: --micro-batches {spec!r} must use each of the {n_seq} "
                         f"sequences 0..{n_seq - 1} exactly once")
    return micro


def parse_ignore(spec: str, n_seq: int, seq_len: int) -> list[tuple[int, int]]:
    """'0:3,1:0-5,2:15' -> [(0,3), (1,0), ..., (1,5), (2,15)]: target positions set
    to -100 (seq:pos, or seq:first-last inclusive).  '' -> []."""
    out: list[tuple[int, int]] = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        try:
            s, p = item.split(":")
            lo, _, hi = p.partition("-")
            s, lo, hi = int(s), int(lo), int(hi or lo)
        except ValueError:
            raise SystemExit(f"error: --ignore item {item!r} is not seq:pos or seq:first-last")
        if not (0 <= s < n_seq and 0 <= lo <= hi < seq_len):
            raise SystemExit(f"error: --ignore item {item!r} out of range ({n_seq} sequences "
                             f"of {seq_len} targets)")
        out.extend((s, t) for t in range(lo, hi + 1) if (s, t) not in out)
    return out


def make_batch(torch, vocab: int, n_seq: int, seq_len: int, ignored, data_seed: int):
    """gpt_ref.parity_batch with parameters: n_seq rows of seq_len+1 uniform token
    ids from torch.Generator().manual_seed(data_seed); inputs = tokens[:, :-1],
    targets = tokens[:, 1:] with the `ignored` (seq, pos) set to -100."""
    g = torch.Generator().manual_seed(data_seed)
    tokens = torch.randint(0, vocab, (n_seq, seq_len + 1), generator=g)
    x = tokens[:, :seq_len].clone()
    y = tokens[:, 1:].clone()
    for b, t in ignored:
        y[b, t] = -100
    for b in range(n_seq):
        if int((y[b] != -100).sum()) == 0:
            raise SystemExit(f"error: sequence {b} has no scored target left")
    return tokens, x, y


def set_parity_opt(gr, a):
    """Point gpt_ref.run_parity at this run's optimizer settings (it reads the
    module-level PARITY_OPT)."""
    gr.PARITY_OPT = dict(gr.PARITY_OPT)
    gr.PARITY_OPT.update(lr=a.lr, weight_decay=a.weight_decay, clip=a.max_norm, steps=a.steps)
    return gr.PARITY_OPT


def add_common_flags(p, *, n_seq: int, micro: str, ignore: str):
    p.add_argument("--out", help="fixture directory to write")
    p.add_argument("--check", metavar="DIR",
                   help="instead of writing: reload DIR's files and recompute its numbers")
    p.add_argument("--batch-size", type=int, default=n_seq, help="number of sequences")
    p.add_argument("--seq-len", type=int, default=None,
                   help="inputs per sequence (default: the model's context length)")
    p.add_argument("--micro-batches", default=micro,
                   help="grad-accumulation split, ';' between micro-batches, ',' between "
                        "sequence indices, e.g. '0;1,2;3,4,5' (default %(default)s)")
    p.add_argument("--ignore", default=ignore,
                   help="target positions set to -100: 'seq:pos' or 'seq:first-last', "
                        "comma-separated (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed before the model init")
    p.add_argument("--data-seed", type=int, default=1234, help="generator seed of the token ids")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--max-norm", type=float, default=1.0, help="grad-clip max norm")
    p.add_argument("--no-f64", action="store_true", help="skip the float64 re-runs")
    p.add_argument("--debug-files", action="store_true",
                   help="also write init_grads.safetensors, after_step1/10.safetensors")


# --------------------------------------------------------------------------
# the scenarios (cmd_parity's orchestration, parameterised)
# --------------------------------------------------------------------------
def write_fixture(gr, a, *, fresh, fresh64, state_dict, init_sd, init_metadata,
                  tokens, x, y, ignored, micro, config, model_notes, what,
                  extra=None):
    """Run gpt_ref's parity scenarios and write the fixture into a.out.

    fresh() -> float32 model loaded with init_sd; fresh64() -> the same in float64
    (or None: no _f64 fields); state_dict(model) -> {HF name: tensor}."""
    import torch
    from safetensors.torch import save_file

    out = a.out
    os.makedirs(out, exist_ok=True)
    opt = gr.PARITY_OPT
    steps = opt["steps"]
    IGN = gr.IGNORE_INDEX
    save_file(init_sd, os.path.join(out, "init.safetensors"), metadata=init_metadata)
    n_seq, seq_len = x.shape
    n_scored_seq = (y != IGN).sum(dim=1).tolist()
    with open(os.path.join(out, "batch.json"), "w") as f:
        json.dump({
            "description": f"{n_seq} sequences of {seq_len + 1} token ids; input_ids = "
                           f"tokens[:, :{seq_len}], targets = tokens[:, 1:] with some positions "
                           "set to ignore_index (not scored). Micro-batches for the "
                           f"grad-accumulation scenario: {json.dumps(micro)} (sequence indices).",
            "vocab_size": int(config["vocab_size"]), "ignore_index": IGN,
            "tokens": tokens.tolist(), "input_ids": x.tolist(), "targets": y.tolist(),
            "ignored_positions": [list(p) for p in ignored],
            "n_scored_per_sequence": n_scored_seq,
            "micro_batches": micro,
        }, f, indent=1)

    # --- scenario 1: full batch ----------------------------------------------
    m = fresh()
    _, loss0 = m(x, y)
    loss0.backward()
    gn0 = gr.global_grad_norm(m)
    if a.debug_files:
        save_file({k: p.grad.detach().contiguous().clone() for k, p in m.named_parameters()},
                  os.path.join(out, "init_grads.safetensors"),
                  metadata={"format": "pt", "what": "gradients of the initial full-batch mean "
                                                    "loss, before clipping, HF names/layouts"})
        m1 = fresh()
        gr.run_parity(m1, x, y, steps=1)
        save_file(state_dict(m1), os.path.join(out, "after_step1.safetensors"), metadata={"format": "pt"})
    m10 = fresh()
    lb, gns, la = gr.run_parity(m10, x, y, steps=steps)
    if a.debug_files:
        save_file(state_dict(m10), os.path.join(out, f"after_step{steps}.safetensors"),
                  metadata={"format": "pt"})

    # --- scenario 2: gradient accumulation ------------------------------------
    n_scored = int((y != IGN).sum())
    n_mb = [int((y[i] != IGN).sum()) for i in micro]
    ma = fresh()
    acc_loss = 0.0
    for idx in micro:  # correct: token-weighted
        _, ls = ma(x[idx], y[idx], reduction="sum")
        ls = ls / n_scored
        ls.backward()
        acc_loss += ls.item()
    gn_acc = gr.global_grad_norm(ma)
    mw = fresh()
    wrong_loss, mb_means = 0.0, []
    for idx in micro:  # WRONG: mean per micro-batch / number of micro-batches
        _, ls = mw(x[idx], y[idx])
        mb_means.append(ls.item())
        ls = ls / len(micro)
        ls.backward()
        wrong_loss += ls.item()
    gn_wrong = gr.global_grad_norm(mw)
    lb_acc, gns_acc, la_acc = gr.run_parity(fresh(), x, y, micro=micro, steps=steps)

    # --- float64 re-runs (tolerance guide) -------------------------------------
    f64 = fresh64 is not None and not a.no_f64
    if f64:
        m64 = fresh64()
        _, l64 = m64(x, y)
        l64.backward()
        gn64 = gr.global_grad_norm(m64)
        _, gns64, la64 = gr.run_parity(fresh64(), x, y, steps=steps)
        ma64 = fresh64()
        acc64 = 0.0
        for idx in micro:
            _, ls = ma64(x[idx], y[idx], reduction="sum")
            ls = ls / n_scored
            ls.backward()
            acc64 += ls.item()
        gn_acc64 = gr.global_grad_norm(ma64)
        _, _, la_acc64 = gr.run_parity(fresh64(), x, y, micro=micro, steps=steps)

    _, dec, nodec = gr.param_groups(fresh(), opt["weight_decay"])
    f64_note = (" '_f64' fields are the same computation in float64 (use them to choose "
                "tolerances).") if f64 else ""
    exp = {
        "description": f"Parity fixtures for {what} (PyTorch {torch.__version__}, CPU, float32, "
                       "1 thread). Weights: init.safetensors; batch: batch.json. All losses are "
                       "mean NLL in nats over scored positions (targets != -100)." + f64_note,
        "config": config,
        "model_notes": model_notes,
        "optimizer": {
            "type": "AdamW (PyTorch torch.optim.AdamW, decoupled weight decay)",
            "lr": opt["lr"], "betas": list(opt["betas"]), "eps": opt["eps"],
            "weight_decay": opt["weight_decay"],
            "decay_params": dec, "no_decay_params": nodec,
            "update": "t += 1; p *= (1 - lr*wd); m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; "
                      "p -= (lr/(1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps)",
            "grad_clip": {"max_norm": opt["clip"],
                          "rule": "total = sqrt(sum g^2 over all params); "
                                  "g *= min(1, max_norm/(total + 1e-6))"},
            "lr_schedule": "constant",
        },
        "n_scored": n_scored,
        "initial_loss": loss0.item(),
        **({"initial_loss_f64": l64.item()} if f64 else {}),
        "initial_grad_norm": gn0,
        **({"initial_grad_norm_f64": gn64} if f64 else {}),
        "train_full_batch": {
            "steps": steps,
            "loss_after_step": la,
            "loss_before_step": lb,
            "grad_norm_before_clip": gns,
            "notes": "loss_after_step[k] = loss on the same batch after k+1 optimizer steps; "
                     "loss_before_step[0] = initial_loss."
                     + (f" Weights after step 1 and step {steps}: after_step1.safetensors, "
                        f"after_step{steps}.safetensors." if a.debug_files else ""),
        },
        "grad_accum": {
            "micro_batches": micro,
            "n_scored_per_micro_batch": n_mb,
            "n_scored_total": n_scored,
            "token_weighted": {
                "rule": "loss_i = sum NLL over micro-batch i / n_scored_total; backward each; "
                        "grads accumulate",
                "loss": acc_loss,
                "grad_norm": gn_acc,
                "abs_diff_vs_full_batch_grad_norm": abs(gn_acc - gn0),
                "loss_after_step": la_acc,
                "loss_before_step": lb_acc,
                "grad_norm_before_clip": gns_acc,
            },
            "wrong_mean_per_micro_batch": {
                "rule": "loss_i = mean NLL over micro-batch i / n_micro_batches (WRONG when "
                        "micro-batches have different numbers of scored tokens)",
                "micro_batch_mean_losses": mb_means,
                "loss": wrong_loss,
                "grad_norm": gn_wrong,
                "abs_diff_vs_full_batch_grad_norm": abs(gn_wrong - gn0),
            },
        },
    }
    if f64:
        exp["train_full_batch"]["loss_after_step_f64"] = la64
        exp["train_full_batch"]["grad_norm_before_clip_f64"] = gns64
        tw = exp["grad_accum"]["token_weighted"]
        tw["loss_f64"] = acc64
        tw["grad_norm_f64"] = gn_acc64
        tw["loss_after_step_f64"] = la_acc64
    if extra:
        exp.update(extra)
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(exp, f, indent=1)

    print(json.dumps({k: exp[k] for k in ("n_scored", "initial_loss", "initial_loss_f64",
                                          "initial_grad_norm", "initial_grad_norm_f64")
                      if k in exp}, indent=1))
    print("loss_after_step       ", [round(v, 6) for v in la])
    if f64:
        print("loss_after_step_f64   ", [round(v, 6) for v in la64])
    print("accum loss_after_step ", [round(v, 6) for v in la_acc])
    print(f"grad_accum {micro} n_scored {n_mb}: token-weighted gn={gn_acc:.8f} "
          f"(full {gn0:.8f}); wrong gn={gn_wrong:.8f}; loss {acc_loss:.6f} vs wrong {wrong_loss:.6f}")
    files = sorted(os.listdir(out))
    print(f"wrote {out}/: " + ", ".join(f"{n} ({os.path.getsize(os.path.join(out, n))} B)" for n in files))
    return exp


def check_fixture(gr, d, fresh_from, tol_loss=1e-6, tol_train=1e-5):
    """Reload d/{init.safetensors,batch.json,expected.json}, recompute the numbers
    Ember checks with `fresh_from(expected_config, state_dict)` models, compare.
    Returns True when all agree."""
    import torch
    from safetensors.torch import load_file

    with open(os.path.join(d, "expected.json")) as f:
        exp = json.load(f)
    with open(os.path.join(d, "batch.json")) as f:
        b = json.load(f)
    sd = load_file(os.path.join(d, "init.safetensors"))
    x, y = torch.tensor(b["input_ids"]), torch.tensor(b["targets"])
    gr.PARITY_OPT = dict(gr.PARITY_OPT)
    o = exp["optimizer"]
    gr.PARITY_OPT.update(lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                         weight_decay=o["weight_decay"], clip=o["grad_clip"]["max_norm"],
                         steps=exp["train_full_batch"]["steps"])
    steps = gr.PARITY_OPT["steps"]

    def fresh():
        return fresh_from(exp["config"], sd)

    ok = True

    def chk(name, got, want, tol):
        nonlocal ok
        good = abs(got - want) <= tol
        ok &= good
        print(f"{'OK ' if good else 'BAD'} {name}: got {got:.8f} want {want:.8f} |d|={abs(got - want):.2e}")

    m = fresh()
    _, l0 = m(x, y)
    l0.backward()
    chk("initial_loss", l0.item(), exp["initial_loss"], tol_loss)
    chk("initial_grad_norm", gr.global_grad_norm(m), exp["initial_grad_norm"], tol_loss)
    n = int((y != gr.IGNORE_INDEX).sum())
    good = n == exp["n_scored"]
    ok &= good
    print(f"{'OK ' if good else 'BAD'} n_scored {n} (want {exp['n_scored']})")
    _, dec, nodec = gr.param_groups(fresh(), 0.1)
    good = dec == o["decay_params"] and nodec == o["no_decay_params"]
    ok &= good
    print(f"{'OK ' if good else 'BAD'} decay groups: {len(dec)} decayed, {len(nodec)} not")
    _, _, la = gr.run_parity(fresh(), x, y, steps=steps)
    for i, (g, w) in enumerate(zip(la, exp["train_full_batch"]["loss_after_step"])):
        chk(f"full batch loss_after_step[{i}]", g, w, tol_train)
    ga = exp["grad_accum"]
    mb = b["micro_batches"]
    good = mb == ga["micro_batches"]
    ok &= good
    print(f"{'OK ' if good else 'BAD'} micro_batches {mb}")
    m = fresh()
    tot = 0.0
    for idx in mb:
        ls = m(x[idx], y[idx], reduction="sum")[1] / n
        ls.backward()
        tot += ls.item()
    chk("grad_accum token-weighted loss", tot, ga["token_weighted"]["loss"], tol_loss)
    chk("grad_accum token-weighted grad_norm", gr.global_grad_norm(m), ga["token_weighted"]["grad_norm"], tol_loss)
    chk("... equals full-batch grad_norm", gr.global_grad_norm(m), exp["initial_grad_norm"], 1e-5)
    _, _, la_acc = gr.run_parity(fresh(), x, y, micro=mb, steps=steps)
    for i, (g, w) in enumerate(zip(la_acc, ga["token_weighted"]["loss_after_step"])):
        chk(f"accum loss_after_step[{i}]", g, w, tol_train)
    sep = abs(ga["wrong_mean_per_micro_batch"]["grad_norm"] - exp["initial_grad_norm"])
    print(f"{'OK ' if sep > 1e-3 else 'BAD'} wrong normalization differs from correct by {sep:.4e}")
    ok &= sep > 1e-3
    print("ALL OK" if ok else "MISMATCH")
    return ok

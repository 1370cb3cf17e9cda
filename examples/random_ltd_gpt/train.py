#!/usr/bin/env python3
"""Random-LTD on tokensel: train a small GPT twice and check the runs agree.

    TOKENSEL_SERVER_BINARY=build/dev/server/tokensel-server \
        .venv-client/bin/python examples/random_ltd_gpt/train.py [--steps 60]

Starts one tokensel server, then trains the same model twice, each time with
two worker processes (torch.distributed, gloo, DistributedDataParallel, one
CPU thread each), each worker with its own tokensel session:
  tokensel:  the middle blocks wrapped by tokensel.torch's RandomLayerTokenDrop
             (gather, merge and their gradients on the sidecar; tensors in a
             shared-memory Arena);
  reference: the same blocks wrapped by ReferenceTokenDrop below, plain
             PyTorch (index_select / index_copy) on the same ids.
Same seeds, deterministic CPU: per-step losses and final weights must be
identical bit for bit. The token-dropping blocks run under activation
recomputation (torch.utils.checkpoint), and every worker checks that the
recomputed forward saw the ids of the forward, step after step.

Prints both loss curves, per-step times (and the ratio), what was staged
inline per step, writes <out>/summary.json and <out>/loss.png (matplotlib),
and exits 1 if the runs differ. The data: sequences from a fixed random
Markov chain, generated here (no downloads).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("tokensel", "reference")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8, help="sequences per worker per step")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--ltd-layers", default="1,2", help="blocks that drop tokens")
    p.add_argument("--min-tokens", type=int, default=16, help="schedule start (R)")
    p.add_argument("--max-tokens", type=int, default=48, help="schedule end (R < seq keeps dropping)")
    p.add_argument("--seq-per-step", type=int, default=8)
    p.add_argument("--require-steps", type=int, default=None, help="default: steps / 2")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--no-recompute", dest="recompute", action="store_false")
    p.add_argument("--server-binary", default=os.environ.get("TOKENSEL_SERVER_BINARY"))
    p.add_argument("--out-dir", default=os.path.join(HERE, "out"))
    # internal: one worker process
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    p.add_argument("--init-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.require_steps is None:
        args.require_steps = max(1, args.steps // 2)
    return args


WORLD = 2

# ------------------------------------------------------------------ worker --


def worker(args):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import tokensel
    import tokensel.torch as tst
    sys.path.insert(0, HERE)
    from model import GPT, Block

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method="file://" + args.init_file, rank=args.rank,
                            world_size=WORLD)
    client = tokensel.Client(args.target, client_name="train-%s-%d" % (args.worker, args.rank))
    arena = tst.Arena(client)
    rpc = time_rpcs(client)
    log = []
    torch.manual_seed(args.seed)  # the same initial weights in both runs and on both ranks
    model = GPT(args.vocab, args.d_model, args.layers, args.heads, log, args.recompute)
    ltd_layers = [int(i) for i in args.ltd_layers.split(",")]
    schedule = tst.FixedLinearSchedule(
        args.min_tokens, args.max_tokens, args.require_steps, args.seq_per_step,
        total_layers=args.layers, ltd_layers=len(ltd_layers),
        global_batch_size=WORLD * args.batch)
    seed = args.seed + args.rank  # data-parallel ranks drop different tokens
    if args.worker == "tokensel":
        ltd = tst.RandomLTD(client, schedule, seed=seed, arena=arena, positions_name="positions")
        tst.convert_to_random_ltd(model, Block, ltd, layer_ids=ltd_layers)
    else:
        ltd = ReferenceLTD(client, schedule, seed)
        for k, i in enumerate(ltd_layers):
            model.blocks[i] = ReferenceTokenDrop(model.blocks[i], ltd, k)
        ltd.num_layers = len(ltd_layers)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)
    chain = markov_chain(args.vocab, args.seed)
    ltd_blocks = {model.blocks[i].random_ltd_layer for i in ltd_layers}

    records, recompute_checks = [], 0
    for step in range(args.steps):
        retained = ltd.update(step)
        tokens = sample_batch(chain, args.batch, args.seq + 1, args.seed, args.rank, step)
        client_before, arena_before = client.stats.snapshot(), arena.stats.snapshot()
        rpc[:] = [0, 0.0]
        del log[:]
        start = time.perf_counter()
        logits = ddp(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab),
                                           tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        # the recomputed forward must have seen the forward's ids
        seen = {}
        for blk, positions in log:
            if blk in ltd_blocks and retained < args.seq:
                seen.setdefault(blk, []).append(positions)
        for blk, calls in seen.items():
            want = 2 if args.recompute else 1
            if len(calls) != want or not all(torch.equal(calls[0], c) for c in calls):
                raise SystemExit("rank %d step %d: the recomputed forward saw other ids"
                                 % (args.rank, step))
            recompute_checks += len(calls) - 1
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        after_c, after_a = client.stats.snapshot(), arena.stats.snapshot()
        records.append({
            "step": step, "retained": retained, "loss": loss.item(),
            "mean_loss": mean_loss.item() / WORLD, "time_s": elapsed,
            "rpcs": rpc[0], "rpc_time_s": rpc[1],
            "ids_digest": [int(c[0].sum()) for c in seen.values()],
            "inline_bytes_sent": after_c["inline_bytes_sent"] - client_before["inline_bytes_sent"],
            "inline_bytes_received": (after_c["inline_bytes_received"]
                                      - client_before["inline_bytes_received"]),
            "copied_in_bytes": after_a["copied_in_bytes"] - arena_before["copied_in_bytes"],
            "arena_allocations": after_a["allocations"] - arena_before["allocations"]})
    result = {"mode": args.worker, "rank": args.rank, "records": records,
              "recompute_checks": recompute_checks, "arena": arena.stats.snapshot(),
              "schedule": schedule.state_dict()}
    with open(os.path.join(args.out_dir, "%s-rank%d.json" % (args.worker, args.rank)), "w") as f:
        json.dump(result, f)
    if args.rank == 0:
        state = {k.replace(".random_ltd_layer.", "."): v for k, v in model.state_dict().items()}
        torch.save(state, os.path.join(args.out_dir, "%s-weights.pt" % args.worker))
    dist.barrier()
    dist.destroy_process_group()
    arena.close()
    client.close()


def time_rpcs(client):
    """Counts the client's RPCs and the seconds spent in them: [calls, seconds]."""
    acc = [0, 0.0]
    call = client.call

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            acc[0] += 1
            acc[1] += time.perf_counter() - start
    client.call = timed
    return acc


def markov_chain(vocab, seed):
    """A fixed random transition matrix: each token has 4 likely successors."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, vocab, generator=gen)
    top = torch.topk(logits, 4, dim=1).indices
    probs = torch.full((vocab, vocab), 0.02 / vocab)
    probs.scatter_(1, top, 0.245)
    return probs / probs.sum(dim=1, keepdim=True)


def sample_batch(chain, batch, length, seed, rank, step):
    gen = torch.Generator().manual_seed(seed * 1000003 + rank * 10007 + step)
    tokens = torch.empty(batch, length, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, chain.shape[0], (batch,), generator=gen)
    for t in range(1, length):
        tokens[:, t] = torch.multinomial(chain[tokens[:, t - 1]], 1, generator=gen).squeeze(1)
    return tokens


class ReferenceLTD:
    """The reference run's Random-LTD state: the same schedule and the same
    ids (SampleTokens at (seed, step): the ids are not what is compared, the
    data movement and its gradients are)."""

    def __init__(self, client, schedule, seed):
        self.client, self.schedule, self.seed = client, schedule, seed
        self.num_layers, self.step, self._ids = 0, None, None

    def update(self, step):
        self.step = step
        return self.schedule.update_seq(step)

    def ids(self, layer_id, batch, seq, retained):
        if layer_id == 0 or self._ids is None or self._ids[0] != (self.step, retained):
            ids = self.client.sample_tokens(self.num_layers, batch, seq, retained, self.seed,
                                            self.step).ids
            self._ids = ((self.step, retained), torch.as_tensor(ids).long())
        return self._ids[1][layer_id]


class ReferenceTokenDrop(nn.Module):
    """DeepSpeed's RandomLayerTokenDrop in plain PyTorch (its utils.py
    bsh_decoder_gather / bsh_decoder_scatter, batch-first): the kept rows
    of x go through the layer, the others skip it."""

    def __init__(self, layer, ltd, ltd_layer_id):
        super().__init__()
        self.random_ltd_layer, self.ltd, self.ltd_layer_id = layer, ltd, ltd_layer_id

    def forward(self, x):
        b, s, c = x.shape
        retained = self.ltd.schedule.get_current_seq()
        if not self.training or retained >= s:
            return self.random_ltd_layer(x)
        ids = self.ltd.ids(self.ltd_layer_id, b, s, retained)
        rows = (torch.arange(b).unsqueeze(1) * s + ids).reshape(-1)
        flat = x.reshape(b * s, c)
        part = flat.index_select(0, rows).reshape(b, retained, c)
        out = self.random_ltd_layer(part, positions=ids.clone())
        return flat.index_copy(0, rows, out.reshape(b * retained, c)).reshape(b, s, c)


# ------------------------------------------------------------------ driver --


def start_server(binary, workdir):
    sock = os.path.join(workdir, "tokensel.sock")
    argv = [binary, "--listen=unix://" + sock, "--metrics_address=", "--threads=2",
            "--shm_prefix=/tokensel-example-%d-" % os.getpid()]
    setpriv = shutil.which("setpriv")  # the server dies with this process
    if setpriv:
        argv = [setpriv, "--pdeathsig", "KILL", "--"] + argv
    log = open(os.path.join(workdir, "server.log"), "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    import tokensel
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise SystemExit("tokensel-server exited with %d (log: %s)"
                             % (proc.returncode, log.name))
        try:
            with tokensel.Client("unix://" + sock, keepalive=False, timeout=1.0) as c:
                c.ping()
            return proc, "unix://" + sock
        except tokensel.TokenselError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("tokensel-server not serving after 30 s")
            time.sleep(0.05)


def run_workers(args, mode, target, workdir):
    init_file = os.path.join(workdir, "dist-init-" + mode)
    base = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--target", target,
            "--init-file", init_file, "--out-dir", args.out_dir]
    passed = ["--steps", args.steps, "--batch", args.batch, "--seq", args.seq,
              "--d-model", args.d_model, "--layers", args.layers, "--heads", args.heads,
              "--vocab", args.vocab, "--ltd-layers", args.ltd_layers,
              "--min-tokens", args.min_tokens, "--max-tokens", args.max_tokens,
              "--seq-per-step", args.seq_per_step, "--require-steps", args.require_steps,
              "--lr", args.lr, "--seed", args.seed]
    base += [str(a) for a in passed] + ([] if args.recompute else ["--no-recompute"])
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    start = time.perf_counter()
    procs = [subprocess.Popen(base + ["--rank", str(r)], env=env) for r in range(WORLD)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit("%s workers exited with %s" % (mode, codes))
    results = []
    for r in range(WORLD):
        with open(os.path.join(args.out_dir, "%s-rank%d.json" % (mode, r))) as f:
            results.append(json.load(f))
    return results, time.perf_counter() - start


def same_weights(a_path, b_path):
    a, b = torch.load(a_path), torch.load(b_path)
    if a.keys() != b.keys():
        return False
    return all(a[k].dtype == b[k].dtype and torch.equal(a[k].view(torch.int32) if
               a[k].dtype == torch.float32 else a[k], b[k].view(torch.int32) if
               b[k].dtype == torch.float32 else b[k]) for k in a)


def steady(records, args):
    """Steps after the schedule reached its end and a warm-up step."""
    return [r for r in records if r["step"] > args.require_steps + 1] or records[-1:]


def plot(path, runs, args):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (scripts/install-deps.sh installs python3-matplotlib)"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, style in (("reference", "-"), ("tokensel", "--")):
        recs = runs[mode][0]["records"]
        ax1.plot([r["step"] for r in recs], [r["mean_loss"] for r in recs], style, label=mode)
        ax2.plot([r["step"] for r in recs], [1000 * r["time_s"] for r in recs], style,
                 label=mode)
    ax1.set(xlabel="step", ylabel="loss (mean of 2 workers)",
            title="Random-LTD GPT: tokensel vs pure PyTorch")
    ax2.set(xlabel="step", ylabel="ms per step (rank 0)", title="step time")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return None


def main(args):
    if not args.server_binary or not os.access(args.server_binary, os.X_OK):
        raise SystemExit("set TOKENSEL_SERVER_BINARY or --server-binary to a built tokensel-server")
    os.makedirs(args.out_dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="tokensel-example-")
    server, target = start_server(args.server_binary, workdir)
    try:
        runs = {}
        for mode in MODES:
            runs[mode] = run_workers(args, mode, target, workdir)[0]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(workdir, ignore_errors=True)

    ours, ref = runs["tokensel"], runs["reference"]
    losses_identical = all(
        [r["loss"] for r in a["records"]] == [r["loss"] for r in b["records"]]
        and [r["mean_loss"] for r in a["records"]] == [r["mean_loss"] for r in b["records"]]
        for a, b in zip(ours, ref))
    ids_identical = all([r["ids_digest"] for r in a["records"]]
                        == [r["ids_digest"] for r in b["records"]] for a, b in zip(ours, ref))
    weights_identical = same_weights(os.path.join(args.out_dir, "tokensel-weights.pt"),
                                     os.path.join(args.out_dir, "reference-weights.pt"))
    print("step    R   loss tokensel     loss reference    ms tokensel (in RPCs)  ms reference")
    for a, b in zip(ours[0]["records"], ref[0]["records"]):
        print("%4d %4d  %.9f  %s %.9f  %11.2f (%3d: %6.2f)  %12.2f" % (
            a["step"], a["retained"], a["mean_loss"], "==" if a["mean_loss"] == b["mean_loss"]
            else "!=", b["mean_loss"], 1000 * a["time_s"], a["rpcs"], 1000 * a["rpc_time_s"],
            1000 * b["time_s"]))
    t_ours = sorted(r["time_s"] for r in ours[0]["records"][2:])
    t_ref = sorted(r["time_s"] for r in ref[0]["records"][2:])
    med = lambda xs: xs[len(xs) // 2] if xs else float("nan")  # noqa: E731
    st = steady(ours[0]["records"], args)
    summary = {
        "steps": args.steps, "losses_identical": losses_identical,
        "weights_identical": weights_identical, "ids_identical": ids_identical,
        "recompute_checks": sum(r["recompute_checks"] for r in ours + ref),
        "median_step_ms": {"tokensel": 1000 * med(t_ours), "reference": 1000 * med(t_ref)},
        "mean_step_ms": {"tokensel": 1000 * sum(t_ours) / max(len(t_ours), 1),
                         "reference": 1000 * sum(t_ref) / max(len(t_ref), 1)},
        "steady_rpcs_per_step": {"tokensel": st[-1]["rpcs"],
                                 "reference": steady(ref[0]["records"], args)[-1]["rpcs"]},
        "steady_rpc_ms_per_step_median": 1000 * med(sorted(r["rpc_time_s"] for r in st)),
        "steady_state_steps": [r["step"] for r in st],
        "steady_inline_bytes_per_step": {
            "sent": max(r["inline_bytes_sent"] for r in st),
            "received": max(r["inline_bytes_received"] for r in st)},
        "steady_copied_in_bytes_per_step": max(r["copied_in_bytes"] for r in st),
        "steady_arena_allocations": sum(r["arena_allocations"] for r in st),
        "arena": ours[0]["arena"], "final_loss": ours[0]["records"][-1]["mean_loss"],
        "first_loss": ours[0]["records"][0]["mean_loss"],
    }
    summary["time_ratio_median"] = (summary["median_step_ms"]["tokensel"]
                                    / summary["median_step_ms"]["reference"])
    note = plot(os.path.join(args.out_dir, "loss.png"), runs, args)
    summary["plot"] = note or os.path.join(args.out_dir, "loss.png")
    with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))
    ok = (losses_identical and weights_identical and ids_identical
          and (summary["recompute_checks"] > 0 or not args.recompute))
    print("IDENTICAL" if ok else "RUNS DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    cli = parse_args()
    if cli.worker:
        worker(cli)
    else:
        sys.exit(main(cli))

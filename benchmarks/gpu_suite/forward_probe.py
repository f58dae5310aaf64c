"""The packed cross-encoder replica alone, no gateway and no HTTP (``benchmarks.gpu_suite.encoders``' forward probe).

Run in a child process by ``encoders.forward_probe`` (``python -m benchmarks.gpu_suite.forward_probe
MODEL_DIR DEVICE LENS_JSON``), so a crash or a CUDA error here costs the probe, not the run; prints
one ``FORWARD {json}`` line. What it times, on the first request's pairs (random ids, the
workload's lengths), the first four requests as one step, and against transformers' padded model:

- one d100 step and one of four (the replica as the engine builds it by default), and the
  logits against transformers in the same dtype and in fp32;
- tokenizing a d100 request with and without Rayon;
- on CUDA: eager against replayed CUDA graphs, the cost of a bucket's padding, captures while a
  step is in flight, and graph replays against eager logits.

Its one-off A/Bs, answered in their reports and removed on 2026-12-04: the GELU epilogue against
two ops (``gelu_epilogue_ab``, gpu-h200-2026-12-02), one layer's GEMMs by token count and the x4
step's padding by dimension (``gemm_by_m_ms``, ``gemm_sweep_ms``, ``padded_x4_by_dimension_ms``,
gpu-h200-2026-12-02-b).
"""

import json
import random
import sys
import time

import torch

from adapters.runtimes.packed.encoder_forward import load_cross_encoder
from adapters.runtimes.packed.encoder_replicas import make_replica


def main() -> None:  # one probe, read top to bottom

    model_dir, device, lens = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    on_gpu = device == "cuda"
    dev = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    model = load_cross_encoder(model_dir, None, torch.bfloat16 if on_gpu else torch.float32)
    vocab, bos, eos = model.config.vocab_size, model.config.bos_token_id, model.config.eos_token_id
    # as the engine builds it by default: on CUDA in bf16, the MLP's GELU in the GEMM's epilogue
    rep = make_replica(model, dev, attention="auto", compile=on_gpu, gelu_epilogue="auto")
    out_epilogue = getattr(rep, "epilogue", None)
    rng = random.Random(0)
    # [CLS]/<s> + random ids + [SEP]/</s>: one special pair less than a real pair, lengths as measured
    reqs = [[[bos] + [rng.randrange(5, vocab - 1) for _ in range(n - 2)] + [eos] for n in req] for req in lens]
    rep.warm_up([(reqs[0][:1], [None]), (reqs[0][:3], [None] * 3), (reqs[0], [None] * len(reqs[0]))])
    out = {
        "attention": rep.attention_name,
        "compiled": rep.compiled,
        "compile_error": rep.compile_error,
        "gelu_epilogue": out_epilogue,
    }
    for k in (1, 4):
        prompts = [p for r in reqs[:k] for p in r]
        for _ in range(3):
            rep.score(prompts)
        times = []
        for _ in range(10):
            if on_gpu:
                torch.cuda.synchronize()
            t = time.perf_counter()
            rep.score(prompts)  # launch + collect: the scores are on the host when it returns
            times.append(time.perf_counter() - t)
        out[f"x{k}"] = {
            "tokens": sum(map(len, prompts)),
            "ms_median": 1e3 * sorted(times)[len(times) // 2],
            "ms_min": 1e3 * min(times),
        }

    def padded(m, prompts):
        """transformers' own forward on the pairs, right-padded batches of 25 (its attention mask hides the pads)."""
        logits = []
        with torch.inference_mode():
            for i in range(0, len(prompts), 25):
                batch = prompts[i : i + 25]
                width = max(map(len, batch))
                ids = torch.tensor([p + [model.config.pad_token_id or 0] * (width - len(p)) for p in batch], device=dev)
                mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in batch], device=dev)
                logits += m(input_ids=ids, attention_mask=mask).logits[:, 0].float().tolist()
        return logits

    def compare(got, want):
        top = lambda xs: sorted(range(len(xs)), key=lambda i: -xs[i])[:10]
        return {
            "max_abs_logit_diff": max(abs(a - b) for a, b in zip(got, want)),
            "top10_shared": len(set(top(got)) & set(top(want))),
            "top10_same_order": top(got) == top(want),
            "logit_spread": max(want) - min(want),
        }

    packed = [x[0] for x in rep.score(reqs[0])]
    same = padded(model, reqs[0])  # the replica shares the model's weights
    out["vs_transformers_same_dtype"] = compare(packed, same)
    fp32_ref = padded(load_cross_encoder(model_dir, None, torch.float32).to(dev), reqs[0])
    out["vs_transformers_fp32"] = compare(packed, fp32_ref)
    out["transformers_same_dtype_vs_fp32"] = compare(same, fp32_ref)  # the precision's own noise, for scale

    def dist(fn, n=40):
        """Wall time of ``fn`` (host prep + device + scores home), p50 / p99 / max over ``n`` runs, ms."""
        for _ in range(3):
            fn()
        ts = []
        for _ in range(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            ts.append(1e3 * (time.perf_counter() - t))
        ts.sort()
        return {"p50": ts[(n - 1) // 2], "p99": ts[-(-99 * n // 100) - 1], "max": ts[-1], "min": ts[0]}

    def tokenize_probe():
        """A d100 request's documents through the gateway's own tokenizer wrapper, Rayon on and off
        (the host's share of an idle request: report gpu-h200-2026-12-01-e measured 5.6 ms in the gateway)."""
        import os

        import msgspec
        from transformers import AutoTokenizer

        from adapters.families.encoder import EncoderTokenizer
        from gateway.bench.workload import WorkloadSpec, build_workload, load_token_counter

        spec = WorkloadSpec(requests=8, documents=100, doc_tokens="60-200", query_tokens="15", seed=11)
        bodies = [msgspec.json.decode(r.body) for r in build_workload(spec, load_token_counter(model_dir))]
        wrap = EncoderTokenizer(AutoTokenizer.from_pretrained(model_dir), window=1024, pair=True)
        res = {"cpus": os.cpu_count()}
        for par in ("true", "false"):
            os.environ["TOKENIZERS_PARALLELISM"] = par
            ts = []
            for _ in range(5):
                for b in bodies:
                    t = time.perf_counter()
                    wrap.encode_documents(b["documents"])
                    ts.append(1e3 * (time.perf_counter() - t))
            ts.sort()
            res[f"parallel_{par}_ms"] = {"p50": ts[len(ts) // 2], "p99": ts[-1]}
        return res

    try:
        out["tokenize_d100"] = tokenize_probe()
    except Exception as exc:  # a diagnostic: never lose the rest  # noqa: BLE001
        out["tokenize_d100"] = {"error": f"{type(exc).__name__}: {exc}"}

    if on_gpu:  # CUDA graphs (adapters/runtimes/packed/graphs.py) against the eager launches, same replica
        from adapters.runtimes.packed.graphs import bucket_key, run_padded, token_bucket

        one, four = reqs[0], [p for r in reqs[:4] for p in r]
        eager = {k: rep.score(reqs[k]) for k in (0, 1)}
        out["eager_x1_ms"] = dist(lambda: rep.score(one))
        out["eager_x4_ms"] = dist(lambda: rep.score(four), 20)
        # what the bucket's shape costs eagerly: the step's own bucket, and 2,048 pairs / 8,192 max length
        lens1 = [len(p) for p in one]
        small = bucket_key(sum(lens1), len(lens1), max(lens1))
        for name, key in (("own_bucket", small), ("pairs2048_len8192", (small[0], 2048, 8192))):
            host, _ = rep._pack(one, [None] * len(one), pad=key[:2])
            d = host.to(dev)
            out[f"padded_{name}_ms"] = {"key": key, **dist(lambda: run_padded(rep._forward, d, key)[:1].tolist())}  # noqa: B023
        t = time.perf_counter()
        rep.use_graphs(token_bucket(65536 + 1), (reqs[0][:3], [None] * 3))
        out["use_graphs_s"] = time.perf_counter() - t
        out["graph_error"] = rep.graph_error
        if rep.graphs is not None:
            got = {k: rep.score(reqs[k]) for k in (0, 1)}
            out["graph_vs_eager_max_abs"] = max(abs(a[0] - b[0]) for k in (0, 1) for a, b in zip(got[k], eager[k]))
            # pipelined as the scheduler runs them: step 2 launched (another bucket) before step 1 is collected
            h0 = rep.launch(reqs[0])
            h1 = rep.launch(reqs[1])
            both = (rep.collect(h0), rep.collect(h1))
            out["graph_pipelined_equal"] = both[0] == got[0] and both[1] == got[1]
            # buckets captured without the eager run first (a class already warmed): each against eager
            graphs_ = rep.graphs
            unwarmed = []
            for m in (70, 80, 90, 99):
                ps = reqs[2][:m]
                rep.graphs = None
                want_m = rep.score(ps)
                rep.graphs = graphs_
                got_m = rep.score(ps)
                unwarmed.append(max(abs(a[0] - b[0]) for a, b in zip(got_m, want_m)))
            out["graph_vs_eager_unwarmed_buckets_max_abs"] = unwarmed
            out["graph_x1_ms"] = dist(lambda: rep.score(one))
            out["graph_x4_ms"] = dist(lambda: rep.score(four), 20)
            # a capture while a replayed x4 step runs (the scheduler's case under load): captures no
            # longer synchronize the device, so their host work should hide behind the step
            during = []
            for m in (41, 53, 67):
                ps = reqs[3][:m]
                rep.graphs = None
                want_m = rep.score(ps)
                rep.graphs = graphs_
                c0, s0 = graphs_.captures, graphs_.capture_s
                torch.cuda.synchronize()
                t = time.perf_counter()
                h = rep.launch(four)
                h2 = rep.launch(ps)  # a new bucket: captured here, behind the x4 step
                _, got_m = rep.collect(h), rep.collect(h2)
                during.append(
                    {
                        "pairs": m,
                        "wall_ms": 1e3 * (time.perf_counter() - t),
                        "captured": graphs_.captures - c0,
                        "capture_ms": 1e3 * (graphs_.capture_s - s0),
                        "max_abs_vs_eager": max(abs(a[0] - b[0]) for a, b in zip(got_m, want_m)),
                    }
                )
            out["capture_during_x4_step"] = during
            out["graph_stats"] = rep.graphs.stats()
    print("FORWARD " + json.dumps(out))


if __name__ == "__main__":
    main()

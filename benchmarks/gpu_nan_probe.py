"""Hunt for non-finite logits in packed steps replayed as CUDA graphs (XLM-R large shape, H200).

Why: in report gpu-h200-2026-12-02-b one request of ~3,400 at 16 clients got a 502 "engine
returned a score outside [0, 1] (NaN?)". This runs the replica alone, no gateway, as the
scheduler does under load: steps of 250-450 pairs (several d100 requests' worth, random lengths
60-220, so new buckets get captured along the way), step k+1 launched before step k is
collected, in two ways -- collected in the launching thread, and collected by a second thread
(the scheduler's launcher / collector split) -- and counts steps with a non-finite logit in a
real pair's row. A step that had one is run again eagerly: non-finite again means the inputs,
finite means the graph or a race.

``python -m benchmarks.gpu_nan_probe MODEL_DIR SECONDS_PER_MODE`` (MODEL_DIR as
``benchmarks.gpu_encoders`` builds it); prints one ``NANPROBE {json}`` line.
"""

import json
import math
import queue
import random
import sys
import threading
import time

import torch

from adapters.runtimes.packed.encoder_forward import load_cross_encoder

from adapters.runtimes.packed.encoder_replicas import make_replica
from adapters.runtimes.packed.graphs import token_bucket


def main() -> None:
    model_dir, seconds = sys.argv[1], float(sys.argv[2])
    dev = torch.device("cuda", 0)
    model = load_cross_encoder(model_dir, None, torch.bfloat16)
    rep = make_replica(model, dev, attention="auto", compile=True, gelu_epilogue="auto")
    vocab, bos, eos = model.config.vocab_size, model.config.bos_token_id, model.config.eos_token_id
    rng = random.Random(0)

    def step() -> list[list[int]]:
        return [[bos] + [rng.randrange(5, vocab - 1) for _ in range(rng.randint(58, 218))] + [eos]
                for _ in range(rng.randint(250, 450))]

    first = step()
    rep.warm_up([(first[:1], [None]), (first[:3], [None] * 3), (first, [None] * len(first))])
    rep.use_graphs(token_bucket(65536 + 1), (first[:3], [None] * 3))
    out = {"graph_error": rep.graph_error}

    def bad_rows(logits: list[list[float]]) -> list[int]:
        return [i for i, row in enumerate(logits) if not all(math.isfinite(x) for x in row)]

    def check(prompts, logits, mode, found):
        bad = bad_rows(logits)
        if bad:  # the eager re-run waits for the mode's end: the replica serves one launcher at a time
            found.append({"mode": mode, "rows": bad[:10], "n_bad": len(bad), "pairs": len(prompts),
                          "tokens": sum(map(len, prompts)), "prompts": prompts})

    def rerun(found):
        saved, rep.graphs = rep.graphs, None
        try:
            for f in found:
                f["eager_again_bad"] = len(bad_rows(rep.score(f.pop("prompts"))))
        finally:
            rep.graphs = saved

    def one_thread(deadline: float) -> dict:
        found, n, prev = [], 0, None
        while time.perf_counter() < deadline:
            prompts = step()
            h = rep.launch(prompts)
            if prev is not None:
                check(prev[0], rep.collect(prev[1]), "one-thread", found)
            prev = (prompts, h)
            n += 1
        if prev is not None:
            check(prev[0], rep.collect(prev[1]), "one-thread", found)
        return {"steps": n, "non_finite_steps": found}

    def collector(deadline: float) -> dict:
        found, n = [], 0
        q: queue.Queue = queue.Queue(maxsize=1)  # one step out beyond the one collecting: the scheduler's depth 1
        done = object()

        def collect_loop():
            while (item := q.get()) is not done:
                check(item[0], rep.collect(item[1]), "collector", found)

        t = threading.Thread(target=collect_loop)
        t.start()
        while time.perf_counter() < deadline:
            prompts = step()
            q.put((prompts, rep.launch(prompts)))
            n += 1
        q.put(done)
        t.join()
        return {"steps": n, "non_finite_steps": found}

    for name, fn in (("one_thread", one_thread), ("collector", collector), ("one_thread_2", one_thread),
                     ("collector_2", collector)):
        t0 = time.perf_counter()
        out[name] = fn(t0 + seconds)
        rerun(out[name]["non_finite_steps"])
        out[name]["wall_s"] = round(time.perf_counter() - t0, 1)
        print(f"{name}: {json.dumps(out[name])}", file=sys.stderr, flush=True)
    out["graph_stats"] = rep.graphs.stats() if rep.graphs is not None else None
    print("NANPROBE " + json.dumps(out))


if __name__ == "__main__":
    main()

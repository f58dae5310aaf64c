"""An OpenVINO engine's start, run in a worker thread before it serves: family, export, compile, parity gate.

The family loads its tokenizer (the gateway keeps tokenizing, truncating, chunking and
deduplicating), the checkpoint is exported to OpenVINO IR or read from the export cache
(``export``), compiled for the configured precision, and -- for bf16 / int8 -- admitted only if
the parity gate (``parity``) finds the fp32 ranking kept; with ``refine_top`` the fp32 model
stays loaded beside the reduced one and the error bound of refinement (``refine``) is calibrated.

A base class of ``engine.OpenVinoEngine``, apart so that the engine module reads as serving: its
methods set the engine's state (``__init__`` there) and call its inference (``_infer_all``,
``_infer``, ``_arrays``, ``_refine``), the same the requests later run, so the gate measures
what is served. ``export_family`` is looked up here (tests patch it on this module).
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import openvino as ov
import structlog

from adapters.base import EngineConfigError, ScoreJob
from adapters.families import create_family
from adapters.families.base import Row
from adapters.families.encoder import EncoderFamily
from adapters.runtimes.cpu.export import (
    ModelCache,
    cache_key,
    checkpoint_digest,
    checkpoint_dir,
    default_cache_dir,
    export_family,
)
from adapters.runtimes.cpu.refine import refine_space
from adapters.runtimes.parity import GoldenQuery, compare_rankings, generate_golden_set, golden_set_or_refuse
from adapters.runtimes.qrels_gate import judge, read_qrels_set

__all__ = ("OpenVinoStart",)

log = structlog.get_logger("adapters.runtimes.cpu")

# One export at a time in this process: torch's tracer keeps global state (two models traced at
# once fail its sanity check), and a second model of the same checkpoint then finds the cache entry.
_EXPORT_LOCK = threading.Lock()

# The int8 recipe (see _compress_int8). Measured on all-MiniLM-L6-v2 with a head (docs/cpu-runtimes.md):
# per-channel int8 weights with activations quantized per 32 values at run time changed logits
# about half as much as NNCF's static quantization (SmoothQuant, calibrated per-tensor
# activations; attention and head kept in fp32) and ran faster; neither kept the strict top-10.
_INT8_RECIPE = "weights-int8-sym-per-channel+dynamic-activations-32"
_INT8_GROUP = 32


class OpenVinoStart:
    """The start half of :class:`adapters.runtimes.cpu.engine.OpenVinoEngine` (``_load``, ``_warm_up``)."""

    def _load(self) -> None:
        cfg = self._config
        family = create_family(cfg, self.runtime)
        if not isinstance(family, EncoderFamily):
            raise EngineConfigError(f"model {cfg.name!r}: the openvino runtime runs encoder families only")
        family.load_tokenizer()
        self._family = family
        qrels = None
        if cfg.precision != "fp32":  # the gate's set, read before an export: a bad file refuses at once
            # The operator's judgements, when given, decide on nDCG@10 (adapters/runtimes/qrels_gate.py).
            qrels = read_qrels_set(cfg.name, cfg.qrels_set, cfg.qrels_split) if cfg.qrels_set else None
            golden = (
                qrels.queries
                if qrels is not None
                else golden_set_or_refuse(
                    cfg.name,
                    cfg.parity_set,
                    lambda: generate_golden_set(
                        family.tokenizer.vocab, queries=cfg.parity_queries, documents=cfg.parity_documents
                    ),
                )
            )
        self._inputs = ["input_ids", "attention_mask", *(["token_type_ids"] if family.typed else [])]
        core = ov.Core()
        cache = ModelCache(Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir())
        digest = checkpoint_digest(checkpoint_dir(cfg.path, cfg.revision))
        options = {
            "family": family.name,
            "inputs": self._inputs,
            "pooling": getattr(family, "pooling", None),
            "num_labels": family.files.num_labels,
        }
        info = {"model": cfg.name, "path": cfg.path, "options": options}
        with _EXPORT_LOCK:
            fp32, self.cache_hit = cache.get_or_build(
                cache_key(digest, {**options, "precision": "fp32"}), core, lambda: export_family(family), info
            )
        log.info("openvino_export", model=cfg.name, cache="hit" if self.cache_hit else "exported", dir=str(cache.root))
        if cfg.precision == "fp32":
            self._use(core, fp32, "f32")
            return
        # Reduced precision: measure it against fp32 on the golden set before serving anything.
        self._use(core, fp32, "f32")
        reference, fp32_s = _timed(self._score_golden, golden)
        fp32_per_doc = fp32_s / _documents(golden)
        if cfg.refine_top:
            # Calibration queries of their own (another seed): the bound is then checked by the
            # gate on golden queries it was not measured on.
            calibration = generate_golden_set(
                family.tokenizer.vocab, queries=max(4, cfg.parity_queries // 4), documents=cfg.parity_documents, seed=21
            )
            calibration_fp32, calibration_s = _timed(self._space_values, calibration)
            # The reduced golden pass below runs after the reduced model's calibration pass, on
            # shapes it has seen: fp32's speed is taken from its second pass too, per document.
            fp32_per_doc = calibration_s / _documents(calibration)
            exact = (self._compiled, self._requests)  # the requests keep their compiled model's reference
        if cfg.precision == "bf16":
            self._use(core, fp32, "bf16")
        else:
            key = cache_key(digest, {**options, "precision": "int8", "recipe": _INT8_RECIPE})
            with _EXPORT_LOCK:
                int8, _ = cache.get_or_build(key, core, lambda: _compress_int8(fp32), info)
            self._use(core, int8, "f32", dynamic_group=_INT8_GROUP)
        if cfg.refine_top:
            calibration_reduced = self._space_values(calibration)
            self._deltas = {
                raw: cfg.refine_margin
                * max(
                    abs(a - b)
                    for ref, red in zip(calibration_fp32[raw], calibration_reduced[raw], strict=True)
                    for a, b in zip(ref, red, strict=True)
                )
                for raw in (False, True)
            }
            self._delta = self._deltas[cfg.raw_scores]
            self._exact_model, self._exact = exact
        reduced, reduced_s = _timed(self._score_golden, golden)
        report = compare_rankings(reference, reduced, tie=cfg.parity_tie)
        self.parity = {
            "queries": report.queries,
            "kept": report.kept,
            "agreement": report.agreement,
            "mean_shared": report.mean_shared,
            "max_delta": report.max_delta,
        }
        mode = cfg.precision
        if self._exact is not None:
            self.parity["refined_share"] = self._refined[0] / max(self._refined[1], 1)
            self.parity["refine_delta"] = self._delta
            mode = f"{cfg.precision}, fp32 refining its top-{cfg.refine_top}"
        # Whether the reduced mode is faster at all here, per document, each model's pass taken at
        # the same warmth (refinement's fp32 re-scoring counted). A reduced
        # precision only pays on CPUs that compute it natively and fast: on an Intel Xeon with
        # AVX512-BF16 and AVX512-FP16 but no AMX, OpenVINO's bf16 and f16 ran at ~0.7x fp32
        # (docs/cpu-runtimes.md), while an AMD EPYC's bf16 ran at ~1.7x.
        self.parity["speed_vs_fp32"] = round(fp32_per_doc / max(reduced_s / _documents(golden), 1e-12), 2)
        verdict = judge(qrels, reference, reduced, tolerance=cfg.qrels_tolerance) if qrels is not None else None
        if verdict is not None:
            self.parity.update(verdict.figures())
        log.info("parity_gate", model=cfg.name, precision=cfg.precision, **self.parity)
        if verdict is not None and not verdict.admitted:
            self._compiled = self._exact_model = self._exact = None
            raise EngineConfigError(
                f'model {cfg.name!r}: {verdict.line(mode)}; refused, use precision = "fp32" or a larger qrels_tolerance'
            )
        if verdict is None and report.agreement < cfg.parity_min_agreement:
            self._compiled = self._exact_model = self._exact = None
            raise EngineConfigError(
                f"model {cfg.name!r}: {report.line(mode)}, below parity_min_agreement "
                f'{cfg.parity_min_agreement:.0%}; refused, use precision = "fp32"'
            )
        if self.parity["speed_vs_fp32"] < 1.0:
            # Served as asked (the ranking is the gate's business), but said: fp32 is exact and faster here.
            log.warning(
                "reduced_precision_slower",
                model=cfg.name,
                precision=mode,
                speed_vs_fp32=self.parity["speed_vs_fp32"],
                hint='this CPU scored the golden set faster in fp32; precision = "fp32" is exact and faster',
            )

    def _use(self, core: ov.Core, model: Any, precision: str, *, dynamic_group: int = 0) -> None:
        """Compile ``model`` with ``streams`` infer requests sharing ``threads`` cores."""
        streams: dict[str, Any] = (
            {"NUM_STREAMS": self._config.streams} if self._config.streams else {"PERFORMANCE_HINT": "THROUGHPUT"}
        )
        compiled = core.compile_model(
            model,
            "CPU",
            {
                **streams,
                "INFERENCE_PRECISION_HINT": precision,
                "INFERENCE_NUM_THREADS": self.threads,
                # 0 (fp32, bf16): activations stay in the inference precision, so the exact mode
                # computes what fp32 torch does. int8: activations quantized per group at run time.
                "DYNAMIC_QUANTIZATION_GROUP_SIZE": dynamic_group,
            },
        )
        self.streams = int(compiled.get_property("NUM_STREAMS"))
        requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(self.streams):
            requests.put(compiled.create_infer_request())
        self._compiled, self._requests = compiled, requests
        self._info = {
            # What the plugin really runs: "bf16" on a CPU without bf16 instructions reads "f32".
            "inference_precision": _type_name(compiled.get_property("INFERENCE_PRECISION_HINT")),
            "threads": str(self.threads),
            "streams": str(self.streams),
        }

    def _warm_up(self) -> None:
        """One small inference on every infer request, one after another, before the workers own them.

        Why: pyopenvino converts a result to numpy through pybind11's numpy API, whose first use
        initialises a function-local static that imports numpy under the GIL. Two workers making
        that first conversion at once can deadlock when the GIL switches during the import: one
        holds the static's guard and waits for the GIL, the other holds the GIL and waits for the
        guard (seen: an fp32 model's first concurrent requests hung, on a loaded machine, in two
        starts of four, one worker waiting for the GIL inside ``infer``, the other on a one-time
        initialisation lock; reduced precisions were spared because the parity gate infers at
        start, one batch at a time). Done here, every such first use is behind us; it also takes
        the plugin's first-inference setup off the first request's latency."""
        assert self._family is not None
        tok = self._family.tokenizer
        shared = tok.encode_shared("warm-up", "")
        job = ScoreJob(query="warm-up", instruction="", shared_ids=shared, item_ids=tok.encode_documents(["warm-up"]))
        arrays = self._arrays(self._family.rows(job))
        for _ in range(self.streams):  # _infer takes the oldest idle request and puts it back last
            self._infer(arrays)

    def _golden_rows(self, golden: list[GoldenQuery]) -> list[tuple[ScoreJob, list[Row]]]:
        assert self._family is not None
        tok = self._family.tokenizer
        out = []
        for g in golden:
            shared = tok.encode_shared(g.query, "")
            room = tok.item_room(shared)
            items = [ids[:room] for ids in tok.encode_documents(g.documents)]
            job = ScoreJob(
                query=g.query, instruction="", shared_ids=shared, item_ids=items, raw_scores=self._config.raw_scores
            )
            out.append((job, self._family.rows(job)))
        return out

    def _space_values(self, golden: list[GoldenQuery]) -> dict[bool, list[list[float]]]:
        """The values refinement orders (refine_space), unrefined, for each golden query: for
        requests with and without raw_scores (the same, but for a softmax head's)."""
        assert self._family is not None
        out: dict[bool, list[list[float]]] = {False: [], True: []}
        for job, rows in self._golden_rows(golden):
            outputs = self._infer_all(rows)
            for raw, values in out.items():
                space = refine_space(self._family, msgspec.structs.replace(job, raw_scores=raw))[0]
                values.append(self._family.scores(space, outputs))
        return out

    def _score_golden(self, golden: list[GoldenQuery]) -> list[list[float]]:
        """Each golden query's scores, as a request gets them (refined when refining)."""
        assert self._family is not None
        scores = []
        for job, rows in self._golden_rows(golden):
            outputs = self._infer_all(rows)
            if self._exact is not None:
                scores.append(self._refine(job, outputs, self._exact))
            else:
                scores.append(self._family.scores(job, outputs))
        return scores


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    """``fn(*args)`` and the seconds it took (one place, so tests can set the clock)."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def _documents(golden: list[GoldenQuery]) -> int:
    return max(1, sum(len(q.documents) for q in golden))


def _type_name(value: Any) -> str:
    to_string = getattr(value, "to_string", None)
    return str(to_string()) if callable(to_string) else str(value)


def _compress_int8(model: Any) -> Any:
    """int8 weights, symmetric per output channel (NNCF); the CPU plugin then quantizes each
    matmul's activations per group of ``_INT8_GROUP`` values as it runs, and computes in int8."""
    import nncf

    return nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_SYM, ratio=1.0)

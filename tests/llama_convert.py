"""llama.cpp's own Hugging Face -> GGUF converter and quantizer, for tests and benchmarks.

``convert_hf_to_gguf.py`` is in no wheel: it ships in llama-cpp-python's source distribution
(``vendor/llama.cpp``, with the ``gguf-py`` it was written against). :func:`fetch_converter`
downloads the sdist of the installed llama-cpp-python from PyPI (``pip download``; pip's cache
makes a rerun cheap) and extracts only the converter, so the GGUF a test serves is written by
the same llama.cpp release that runs it. The converter also needs torch, transformers and numpy
(the test extra has them).

One change to the converter, made from outside: ``get_vocab_base_pre`` recognises a BPE
tokenizer by hashing the ids it gives a probe text, and knows only published tokenizers. A tiny
tokenizer trained for a test has no entry, so when the lookup fails we answer ``"gpt-2"``: the
tiny Qwen3 tokenizer's pre-tokenizer *is* GPT-2's byte-level split (``tests/tiny_qwen3.py``), so
llama.cpp then splits text exactly as the Hugging Face tokenizer does. Everything else (the
Qwen3-reranker detection, the yes/no ``cls.output`` head, rank pooling, the ``rerank`` template,
quantization) is llama.cpp's code as released.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

# Runs the converter with the pre-tokenizer fallback described above (argv: llama.cpp dir, then
# the converter's own arguments).
_RUN = """
import runpy, sys
root = sys.argv.pop(1)
sys.path.insert(0, root)
from conversion import base
lookup = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return lookup(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv[0] = root + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def fetch_converter(dest: str | Path, version: str | None = None) -> Path:
    """Extract ``convert_hf_to_gguf.py``, ``conversion/`` and ``gguf-py/`` of llama-cpp-python's
    sdist (``version``: the installed one by default) under ``dest``; returns that llama.cpp dir."""
    version = version or metadata.version("llama-cpp-python")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    sdist = dest / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python",
             f"llama-cpp-python=={version}", "-d", str(dest)],
            check=True,
        )  # fmt: skip
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    wanted = (prefix + "convert_hf_to_gguf.py", prefix + "conversion/", prefix + "gguf-py/")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(wanted)]
        tar.extractall(dest, members=members, filter="data")
    return dest / prefix


def convert(converter: str | Path, hf_dir: str | Path, out: str | Path, *, outtype: str = "f32") -> Path:
    """``convert_hf_to_gguf.py HF_DIR --outtype OUTTYPE --outfile OUT`` (f32, f16, bf16, q8_0)."""
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(converter), str(hf_dir), "--outtype", outtype, "--outfile", str(out)],
        check=False,  # the error below carries the converter's own message
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(out)


def quantize(src: str | Path, dst: str | Path, ftype: str) -> Path:
    """llama.cpp's quantizer (``llama_model_quantize``, what ``llama-quantize`` calls), e.g. ``Q4_K_M``."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype.upper()}")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({ftype}) failed with {rc}")
    return Path(dst)


def qwen3_reranker_checkpoint(tiny_dir: str | Path, out: str | Path, *, hidden: int = 256, seed: int = 0) -> Path:
    """A random Qwen3 reranker with ``tiny_dir``'s tokenizer (``tests/tiny_qwen3.py``), ``hidden``
    wide (256: every weight row is a whole number of Q4_K's 256-value super-blocks, so a Q4_K_M
    file really holds Q4_K tensors instead of llama.cpp's fallback types), and a README whose
    title makes the converter treat it as Qwen3-Reranker, as the real checkpoint's does."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tiny_dir, out = Path(tiny_dir), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in tiny_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, out / f.name)
    (out / "README.md").write_text("# Qwen3-Reranker (tiny random test model)\n")
    cfg = Qwen3Config.from_pretrained(tiny_dir)
    cfg.hidden_size, cfg.intermediate_size = hidden, 3 * hidden
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = hidden // 64, 1, 64
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    # As tests/tiny_qwen3.py: widen the head so documents' scores differ by ~0.01-0.1.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(out)
    return out

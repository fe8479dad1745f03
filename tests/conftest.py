"""Shared fixtures: tiny random-init transformers models of each supported family."""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _compile_fast_flags() -> str:
    """XLA_FLAGS for the suite. It compiles thousands of small XLA programs and runs each briefly,
    so compiling is most of its time: LLVM at optimisation level 0 compiles them ~25% faster, and
    XLA:CPU's older fusion emitters (--xla_cpu_use_fusion_emitters=false) ~40% faster again (on 2
    cores, tests/test_engine.py + test_verify.py 309 -> 197 s). The latter is taken only where
    this jaxlib knows it (an unknown flag aborts the process): one probe per session. Set before
    JAX starts its backend and inherited by pytest-xdist's workers and the CLI and docs
    subprocesses; benchmarks and users keep XLA's default."""
    import subprocess
    import sys
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()
    emitters = f"{flags} --xla_cpu_use_fusion_emitters=false"
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"], capture_output=True,
                           env={**os.environ, "XLA_FLAGS": emitters, "JAX_PLATFORMS": "cpu"}, check=False)
    return emitters if probe.returncode == 0 else flags


if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = _compile_fast_flags()

# `generate` keeps its compiled programs between runs (specjax/__main__.py): off for the suite, so
# that a test running the CLI in this process leaves no cache on for the tests after it, and the
# CLI and docs subprocesses compile as the suite does (tests/test_cli.py turns it on to test it).
os.environ.setdefault("JAX_ENABLE_COMPILATION_CACHE", "false")

import pytest

from pallas_kernels import ffi

# The CPU kernels, built (by pytest's first process, before pytest-xdist starts its workers) and
# loaded from the user cache now: a test that points SPECJAX_CACHE elsewhere would otherwise have
# its worker build them there (~16 s on 2 cores), as would a subprocess that inherits it.
ffi.available()

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
            pad_token_id=0)

# name -> (config class, extra kwargs). Covers MHA and GQA, tied and untied, llama3 rope
# scaling, a Mistral sliding window shorter than the test sequences, Qwen2 biases, Qwen3 qk-norm.
FAMILIES = {
    "llama-mha-untied": ("LlamaConfig", dict(num_key_value_heads=4, tie_word_embeddings=False)),
    "llama3-gqa-tied-scaled": ("LlamaConfig", dict(
        num_key_value_heads=2, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=16))),
    "mistral-window": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=5)),
    "qwen2-tied": ("Qwen2Config", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3-gqa": ("Qwen3Config", dict(num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)),
}


def make_hf_model(name: str, folder, seed: int = 0):
    """Build, save (save_pretrained) and return a random-init transformers model of a family."""
    cls_name, extra = FAMILIES[name]
    config = getattr(transformers, cls_name)(**{**BASE, **extra})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms start at 1 and biases at 0: randomise them so they are checked
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") or n.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model


def _near_the_mapping_limit() -> bool:
    """Whether this process holds over half the memory mappings the kernel allows it (true where
    /proc cannot tell)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n") > limit // 2
    except OSError:
        return True


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_code():
    """Drop JAX's compiled executables after a test module once the process nears the kernel's
    limit on memory mappings. XLA:CPU maps every executable's code separately, and the suite's
    thousands of compilations otherwise run past vm.max_map_count (65530 by default): the
    compiler then segfaults. Until then, later modules reuse the programs earlier ones compiled."""
    yield
    if _near_the_mapping_limit():
        import jax

        jax.clear_caches()


@pytest.fixture(scope="session")
def hf_family(tmp_path_factory):
    """name -> (transformers model, saved folder), built once per session."""
    cache = {}

    def get(name):
        if name not in cache:
            folder = tmp_path_factory.mktemp(name)
            cache[name] = (make_hf_model(name, folder), folder)
        return cache[name]

    return get


CODE = '''def f{i}(x, y={i}):
    """Return x plus {i}."""
    if x > y:
        return x - {i}
    return [x + k for k in range({i})]

'''


@pytest.fixture(scope="session")
def code_corpus(tmp_path_factory):
    """A tiny training corpus: src/m0..m3.py (m3 held out by the tests' configs), held.py, and
    a 300-token BPE tokenizer trained on src in tok/."""
    from specjax.train.bpe import save_tokenizer, train_tokenizer

    root = tmp_path_factory.mktemp("corpus")
    (root / "src").mkdir()
    for n in range(4):
        (root / "src" / f"m{n}.py").write_text("".join(CODE.format(i=i + 10 * n) for i in range(12)))
    (root / "held.py").write_text("".join(CODE.format(i=i) for i in range(40, 46)))
    save_tokenizer(train_tokenizer([p.read_text() for p in root.rglob("m*.py")], vocab_size=300), root / "tok")
    return root


def tiny_llama_config(vocab: int = 64, max_pos: int = 256):
    """The small random Llama most engine and drafter tests decode with (GQA 4/2, 2 layers)."""
    import specjax as sj
    return sj.ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=32, intermediate_size=64,
                          num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                          max_position_embeddings=max_pos)


@pytest.fixture(scope="session")
def random_target():
    """A random tiny Llama (vocab 64, 256 positions) shared by the drafter tests."""
    import jax

    import specjax as sj
    return sj.Model.init(tiny_llama_config(), jax.random.key(0))

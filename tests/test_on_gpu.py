"""The GPU tier (``make check-gpu``): what the CPU suite proves, proven again on CUDA with TF32 off.

- the reference against PyTorch's modules and Hugging Face's Llama, on the GPU, in float32 and float64;
- every check of every chapter, its visible and hidden cases, passing the reference's answers on the CPU
  and the GPU (``harness.devices`` finds the GPU; each pass line says where it ran);
- one chapter graded through the sandbox with the GPU visible to the kernel (``make grade ARGS=--gpu``).

Where PyTorch sees no GPU the module is skipped, in one line.
"""

import math
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograde_tests import checks, reference, scratch_course
from autograde_tests.chapters import CHAPTERS
from autograde_tests.checks import harness
from autograde_tests.grading import judge
from autograde_tests.reference import (
    GPT,
    DecoderLayer,
    EncoderLayer,
    LayerNorm,
    MultiHeadAttention,
    RMSNorm,
    causal_mask,
    load_hf_llama,
    scaled_dot_product_attention,
    softmax,
    tiled_attention,
)

from .conftest import assert_close

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("GPU tests skipped: PyTorch sees no CUDA device on this machine", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
DTYPES = (torch.float32, torch.float64)


@pytest.fixture(autouse=True)
def strict_numerics():
    """TF32 off, as every check has it: its 10-bit mantissa would fail the float32 tolerance."""
    with harness.strict_numerics():
        yield


def on_gpu(*tensors: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
    """Seeded CPU tensors, the same numbers on every machine, moved to the GPU in ``dtype`` (masks stay bool)."""
    return [t.to("cuda") if t.dtype == torch.bool else t.to("cuda", dtype) for t in tensors]


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ---------------------------------------------------------------------- the reference against PyTorch


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_and_attention_match_torch_on_the_gpu(dtype):
    q, k, v = on_gpu(randn(2, 3, 5, 8, seed=1), randn(2, 3, 7, 8, seed=2), randn(2, 3, 7, 4, seed=3), dtype=dtype)
    mask = torch.rand(5, 7, generator=torch.Generator().manual_seed(4)) < 0.8
    mask[:, 0] = True  # every query may attend to something: torch gives NaN where the course gives zeros
    (mask,) = on_gpu(mask, dtype=dtype)
    assert_close(softmax(q, dim=-1), torch.softmax(q, dim=-1))
    output, weights = scaled_dot_product_attention(q, k, v, mask)
    assert output.device.type == "cuda"
    assert_close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(~mask, float("-inf"))
    assert_close(weights, torch.softmax(scores, dim=-1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_multi_head_attention_matches_nn_multihead_attention_on_the_gpu(dtype):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(16, 4, batch_first=True).to("cuda", dtype).eval()
    x, y = on_gpu(randn(2, 5, 16, seed=1), randn(2, 7, 16, seed=2), dtype=dtype)
    expected, _ = theirs(x, y, y, need_weights=False)
    assert_close(MultiHeadAttention.from_torch(theirs)(x, y)[0], expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_and_rms_norm_match_torch_on_the_gpu(dtype):
    (x,) = on_gpu(randn(3, 5, 16, seed=1), dtype=dtype)
    ours = harness.randomise(LayerNorm(16).to("cuda", dtype), harness.SeededRandom(2))
    theirs = nn.LayerNorm(16, eps=ours.eps).to("cuda", dtype)
    theirs.load_state_dict(ours.state_dict())
    assert_close(ours(x), theirs(x))
    ours = harness.randomise(RMSNorm(16).to("cuda", dtype), harness.SeededRandom(3))
    theirs = nn.RMSNorm(16, eps=ours.eps).to("cuda", dtype)
    theirs.load_state_dict(ours.state_dict())
    assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_encoder_and_decoder_layers_match_torchs_on_the_gpu(dtype):
    torch.manual_seed(0)
    encoder = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).to("cuda", dtype).eval()
    decoder = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True).to("cuda", dtype).eval()
    x, memory = on_gpu(randn(2, 5, 16, seed=1), randn(2, 7, 16, seed=2), dtype=dtype)
    with torch.no_grad():
        assert_close(EncoderLayer.from_torch(encoder)(x), encoder(x))
        blocked = ~causal_mask(5, device="cuda")  # torch's bool masks: True means blocked; the course's, kept
        assert_close(DecoderLayer.from_torch(decoder)(x, memory), decoder(x, memory, tgt_mask=blocked))


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiled_attention_matches_torch_sdpa_on_the_gpu(dtype):
    q, k, v = on_gpu(randn(2, 2, 9, 8, seed=1), randn(2, 2, 11, 8, seed=2), randn(2, 2, 11, 8, seed=3), dtype=dtype)
    for causal in (False, True):
        assert_close(tiled_attention(q, k, v, 4, 3, causal=causal),
                     F.scaled_dot_product_attention(q, k, v, is_causal=causal))


def test_gpt_matches_hugging_faces_llama_on_the_gpu():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, attn_implementation="sdpa")
    torch.manual_seed(0)
    theirs = LlamaForCausalLM(config).to("cuda", torch.float32).eval()
    ours = load_hf_llama(GPT(13, 16, 4, 2, 24, n_kv_heads=2).to("cuda", torch.float32).eval(), theirs.state_dict())
    idx = torch.randint(13, (2, 9), generator=torch.Generator().manual_seed(1)).to("cuda")
    with torch.no_grad():
        assert_close(ours(idx)[0], theirs(idx).logits)


# ------------------------------------------------------------------- every check, on the CPU and the GPU


def check_calls() -> list[tuple[str, judge.CheckCall]]:
    """Every check call of every chapter's graded cells, as the instructor notebooks make them."""
    calls = []
    for chapter in CHAPTERS:
        notebook = nbformat.read(REPO / "solutions" / chapter.id / f"{chapter.id}.ipynb", as_version=4)
        for cell in notebook.cells:
            marks = cell.metadata.get("nbgrader", {})
            if cell.cell_type == "code" and marks.get("grade") and not marks.get("solution"):
                calls += [(f"{chapter.id}/{marks['grade_id']}", call) for call in judge.check_calls(cell.source)]
    return calls


@pytest.mark.parametrize("where, call", check_calls(), ids=lambda value: value if isinstance(value, str) else "")
def test_every_check_passes_the_reference_on_the_gpu(where, call, capsys):
    answers = [getattr(reference, name) for name in call.learner_names]
    getattr(checks, call.check)(*answers, **call.keywords)
    printed = capsys.readouterr().out
    assert "✔" in printed, printed
    # A pass line names where its cases ran: the GPU too, except for a check that takes no tensor (chapter 8's
    # text and ids: no device named) or makes its own on the CPU (``run_cases(cpu_only=True)``: "(cpu; ...").
    for line in printed.splitlines():
        assert "cuda" in line or "(" not in line or "(cpu;" in line, line


def test_the_checks_find_the_gpu():
    assert [device.type for device in harness.devices()] == ["cpu", "cuda"]


# ------------------------------------------------------------------- graded in the sandbox, GPU visible


@pytest.mark.sandbox
def test_a_chapter_graded_in_the_sandbox_with_the_gpu_gets_full_marks(tmp_path):
    """The grader's checks run cases on the GPU and send the kernel CUDA tensors, which only a kernel that sees
    the GPU can take: full marks say it did."""
    root = scratch_course.scratch_course(REPO, tmp_path / "course")
    chapter = "01_attention"
    scratch_course.release(root, chapter)
    scratch_course.submit(root, "solved", chapter, scratch_course.solved(root, chapter))
    run = subprocess.run([sys.executable, "-m", "autograde_tests.grading", "--course", str(root), "--gpu",
                          "--jobs", "1"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert scratch_course.scores(root, "solved", chapter)["total"] == scratch_course.max_score(root, chapter)

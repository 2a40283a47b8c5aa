"""End-to-end losslessness through a real tritonserver (issue 7; ``docs/reliability.md``).

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) must leave the output
distribution unchanged. One server serves the same sharpened tiny target four ways:
``tensorrt_llm_baseline`` (target only), ``tensorrt_llm`` (draft model), ``tensorrt_llm_ngram``
(n-gram proposals) and ``tensorrt_llm_negctl`` (draft model with the TEST-ONLY verifier that skips
the residual distribution, :mod:`tests.helpers.negative_control`).

Test: at temperature 1, N requests per model with distinct seeds; for each of the first M
generated positions a two-sample chi-square test (scipy ``chi2_contingency``, tokens with fewer
than 10 samples in both arms pooled) against the baseline. Threshold: reject when
p < ALPHA / M (Bonferroni, ALPHA = 1e-3). Speculation must not be rejected; the negative control
must be. Greedy (temperature 0) outputs must be token-exact.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.reliability.helpers import Job, copy_llm_model, llm_inputs, run_jobs, scale_lm_head

pytestmark = pytest.mark.server

ALPHA = 1e-3
M = 4  # first M generated tokens
N_FAST = 600  # requests per arm in the always-run test
N_SLOW = 3000  # requests per arm in the @slow test
PROMPT = [10, 11, 12, 13, 10, 11, 12, 13, 10, 11]  # repeats: the n-gram proposer finds matches
TARGET_SCALE, DRAFT_SCALE = 25.0, 100.0  # draft = the target, much sharper: q ~ one-hot on
# the target's top token (skipping the residual then over-samples it: p* -> 2p* - p*^2)


@pytest.fixture(scope="module")
def lossless_server(tiny_ckpt: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import torch

    from specserve.build.builder import build_engine
    from specserve.build.config import BuildConfig
    from specserve.triton.repository import RepoOptions, write_repository
    from specserve.triton.server import TritonServer
    from tests.helpers.negative_control import negative_control_model_py

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lossless")
    target = scale_lm_head(tiny_ckpt.target, root / "target", TARGET_SCALE)
    draft = scale_lm_head(tiny_ckpt.target, root / "draft", DRAFT_SCALE)
    engines = {}
    for mode in ("draft", "ngram"):
        engines[mode] = root / f"engine-{mode}"
        build_engine(BuildConfig(model=str(target), out=str(engines[mode]), spec_mode=mode,
                                 backend="torch", dtype="float32", max_batch_size=8,
                                 draft=str(draft) if mode == "draft" else None,
                                 max_draft_len=3))
    repo = write_repository(engines["draft"], root / "repo", RepoOptions(baseline=True),
                            force=True)
    copy_llm_model(repo, "tensorrt_llm_ngram", engine=engines["ngram"])
    copy_llm_model(repo, "tensorrt_llm_negctl", model_py=negative_control_model_py())
    server = TritonServer(repo, log_path=root / "server.log").start(180)
    try:
        yield server
    finally:
        server.stop()


def _sample(url: str, model: str, n: int, seed0: int) -> list[list[int]]:
    return run_jobs(url, model, [Job(PROMPT, M, 1.0, seed0 + i) for i in range(n)])


def chi_square_pvalues(a: list[list[int]], b: list[list[int]]) -> list[tuple[float, float, int]]:
    """(statistic, p-value, dof) per position of two samples of token sequences."""
    from scipy.stats import chi2_contingency

    out = []
    for pos in range(M):
        ca, cb = Counter(s[pos] for s in a), Counter(s[pos] for s in b)
        big = sorted(t for t in set(ca) | set(cb) if ca[t] + cb[t] >= 10)
        rows = [[ca[t] for t in big], [cb[t] for t in big]]
        rest = (len(a) - sum(rows[0]), len(b) - sum(rows[1]))
        if rest[0] + rest[1] > 0:
            rows[0].append(rest[0])
            rows[1].append(rest[1])
        if len(rows[0]) < 2:
            out.append((0.0, 1.0, 0))
            continue
        res = chi2_contingency(rows, correction=False)
        out.append((float(res.statistic), float(res.pvalue), int(res.dof)))
    return out


def _check(server: Any, n: int, record: Any) -> None:
    url = server.grpc_url
    base = _sample(url, "tensorrt_llm_baseline", n, 0)
    assert all(len(s) == M for s in base)
    results = {}
    for model, seed0 in (("tensorrt_llm", 10**6), ("tensorrt_llm_ngram", 2 * 10**6),
                         ("tensorrt_llm_negctl", 3 * 10**6)):
        results[model] = chi_square_pvalues(base, _sample(url, model, n, seed0))
        record(f"chi2_{model}_n{n}", results[model])
    for model in ("tensorrt_llm", "tensorrt_llm_ngram"):
        assert min(p for _, p, _ in results[model]) >= ALPHA / M, (model, results[model])
    assert min(p for _, p, _ in results["tensorrt_llm_negctl"]) < ALPHA / M, \
        ("negative control not detected: the test has no power", results["tensorrt_llm_negctl"])


def test_sampling_matches_target_only(lossless_server: Any, record_property: Any) -> None:
    _check(lossless_server, N_FAST, record_property)


@pytest.mark.slow
def test_sampling_matches_target_only_large(lossless_server: Any, record_property: Any) -> None:
    _check(lossless_server, N_SLOW, record_property)


def test_greedy_token_exact(lossless_server: Any) -> None:
    prompts = [PROMPT, [20, 21, 22], [5] * 7, list(range(30, 60))]
    jobs = [Job(p, 16, 0.0, 0) for p in prompts]
    url = lossless_server.grpc_url
    base = run_jobs(url, "tensorrt_llm_baseline", jobs)
    assert all(len(s) == 16 for s in base)
    for model in ("tensorrt_llm", "tensorrt_llm_ngram", "tensorrt_llm_negctl"):
        assert run_jobs(url, model, jobs) == base, model


@pytest.mark.parametrize("model", ["tensorrt_llm", "tensorrt_llm_ngram"])
def test_speculation_really_drafts(lossless_server: Any, model: str) -> None:
    """Otherwise the distribution test would compare plain sampling with itself."""
    from tests.helpers.server import grpc_stream, scalar

    arrays = {**llm_inputs(Job(PROMPT, 16, 1.0, 7)),
              "return_perf_metrics": np.array([[True]], dtype=bool)}
    final = grpc_stream(lossless_server.grpc_url, model, arrays)[-1]
    assert scalar(final, "total_draft_tokens") > 0


def test_negative_control_is_test_only(tiny_ckpt: Any, tmp_path: Path) -> None:
    """No repository parameter reaches the biased verifier: the product never imports the test
    helpers, and the repository `specserve repo` writes names none of them (the negative control
    is served only from a model.py that this test file writes)."""
    import specserve
    from specserve.triton.repository import RepoOptions, write_repository
    from tests.helpers.negative_control import install_test_only_verifier
    from tests.helpers.server import make_fake_trtllm_engine, make_tiny_engine

    for source in Path(specserve.__file__).parent.rglob("*.py"):
        text = source.read_text()
        assert "tests.helpers" not in text and "negative_control" not in text, source
        assert "test_only" not in text, source
    engines = [make_fake_trtllm_engine(tmp_path / k, k) for k in ("draft", "medusa")]
    engines.append(make_tiny_engine(tiny_ckpt, tmp_path / "engine-torch", "draft"))
    for i, engine in enumerate(engines):
        repo = write_repository(engine, tmp_path / f"repo-{i}", RepoOptions(baseline=i == 2),
                                force=True)
        written = "".join(p.read_text() for p in sorted(repo.rglob("*")) if p.is_file())
        written = written.replace(str(tmp_path), "")  # the path holds this test's name
        for word in ("test_only", "verifier", "negative_control", "skip_residual", "tests."):
            assert word not in written, (word, repo)
    with pytest.raises(ValueError, match="unknown value"):
        install_test_only_verifier("accept_all")

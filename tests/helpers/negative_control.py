"""TEST-ONLY broken verifier: the negative control of the end-to-end losslessness test
(``tests/reliability/test_lossless_server.py``, ``docs/reliability.md``).

Speculative sampling is lossless only because a rejected draft is replaced by a sample from the
residual ``norm(max(0, p - q))`` (Leviathan et al. 2023, Alg. 1; Chen et al. 2023). The verifier
here skips that step and samples from ``p`` after a rejection, which biases the output towards
the draft's proposals. A statistical test that cannot tell it apart has no power.

Nothing in the ``specserve`` package imports this file and no repository parameter reaches it:
the test writes :func:`negative_control_model_py` as the ``1/model.py`` of a copied
``tensorrt_llm`` model, so the patch lives only in that model's own Python-backend stub process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEST_ONLY_VERIFIERS = ("skip_residual",)


def skip_residual_sample(draft_tokens: Any, draft_probs: Any, target_probs: Any,
                         generator: Any) -> Any:
    """WRONG on purpose: :func:`specserve.spec.verify.rejection_sample` but after a rejection the
    next token is drawn from ``p`` instead of the residual. Shapes as there:
    draft_tokens [B, K], draft_probs [B, K, V] | None, target_probs [B, K+1, V]."""
    import torch

    from specserve.spec.sampling import sample
    from specserve.spec.verify import _accepted_prefix, _assemble, _gather_token_probs

    b, k = draft_tokens.shape
    p = target_probs.float()
    p_x = _gather_token_probs(p[:, :k], draft_tokens)  # [B, K]
    q_x = torch.ones_like(p_x) if draft_probs is None else \
        _gather_token_probs(draft_probs.float(), draft_tokens)
    u = torch.rand((b, k), generator=generator, device=p.device)  # [B, K]
    n_acc = _accepted_prefix(u * q_x < p_x)  # [B]
    rows = torch.arange(b, device=p.device)
    return _assemble(draft_tokens, n_acc, sample(p[rows, n_acc], generator))


def install_test_only_verifier(name: str) -> None:
    """Replace the step executor's rejection sampler (:mod:`specserve.runtime.step`) in THIS
    process (a test's model stub)."""
    if name not in TEST_ONLY_VERIFIERS:
        raise ValueError(f"unknown value {name!r}, expected one of {TEST_ONLY_VERIFIERS}")
    import specserve.runtime.step as step

    setattr(step, "rejection_sample", skip_residual_sample)  # noqa: B010 - this process only


def negative_control_model_py(name: str = "skip_residual") -> str:
    """The text of a Triton ``1/model.py``: this module, the patch, then the product's model."""
    return (Path(__file__).read_text(encoding="utf-8")
            + f"\n\ninstall_test_only_verifier({name!r})\n"
            + "from specserve.triton.models.llm import TritonPythonModel  # noqa: E402,F401\n")

"""A trivial Triton model repository with the ensemble's I/O, for client tests and the client
overhead benchmark (served by the real tritonserver; no model behind it).

Model ``trivial`` streams ``max_tokens`` tokens ("t0 t1 ..."): first the prefill token alone,
then "verify steps" whose sizes cycle through ``tokens_per_step`` (speculation-like multi-token
steps; ``spec_stats_json`` counts steps as the reference decoder does, prefill excluded), with
``num_output_tokens``
per response, the TensorRT-LLM perf outputs (``draft_len`` drafted per step, chunk size - 1
accepted) and ``spec_stats_json`` on the last response, which carries the final flag itself
(as TRT-LLM's ensemble does). ``trivial_baseline`` streams one token per step and ends with an
empty final response (as the BLS model does). ``max_tokens`` above ``max_tokens_limit`` is
rejected with an error response. ``step_delay_ms`` sleeps between steps, plus a uniform random
extra of up to ``step_jitter_ms`` (seeded) so that concurrent streams do not stay in lockstep.
"""

from __future__ import annotations

from pathlib import Path

MODEL_PY = r'''
import json, random, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

def _opt(req, name, default):
    t = pb_utils.get_input_tensor_by_name(req, name)
    return default if t is None else t.as_numpy().reshape(-1)[0].item()

def _t(name, value, dtype):
    return pb_utils.Tensor(name, np.array([[value]], dtype=dtype))

class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        p = {k: v["string_value"] for k, v in params.items()}
        self.sizes = [int(x) for x in p["tokens_per_step"].split(",")]
        self.draft_len = int(p["draft_len"])
        self.delay = float(p["step_delay_ms"]) / 1000.0
        self.jitter = float(p.get("step_jitter_ms", "0")) / 1000.0
        self.rng = random.Random(0)
        self.limit = int(p["max_tokens_limit"])
        self.final_with_data = p["final_with_data"] == "1"

    def _resp(self, toks, done, stats, perf, arrival, first):
        now = time.time_ns()
        text = " ".join("t%d" % t for t in toks) + " "
        out = [_t("text_output", text, np.object_), _t("num_output_tokens", len(toks), np.int32)]
        if perf:
            acc, drafted = stats["accepted_tokens"], stats["draft_tokens"]
            out += [_t("acceptance_rate", acc / drafted if drafted else 0.0, np.float32),
                    _t("total_accepted_draft_tokens", acc, np.int32),
                    _t("total_draft_tokens", drafted, np.int32),
                    _t("arrival_time_ns", arrival, np.int64),
                    _t("first_token_time_ns", first or now, np.int64),
                    _t("last_token_time_ns", now, np.int64)]
            if done:
                out.append(_t("spec_stats_json", json.dumps(stats), np.object_))
        return pb_utils.InferenceResponse(output_tensors=out)

    def _parse(self, req):
        text = pb_utils.get_input_tensor_by_name(req, "text_input").as_numpy().reshape(-1)[0]
        return dict(n=int(_opt(req, "max_tokens", 16)), stream=bool(_opt(req, "stream", False)),
                    perf=bool(_opt(req, "return_perf_metrics", False)), plen=len(text),
                    arrival=time.time_ns())

    def _run(self, sender, p):
        try:
            if p["n"] > self.limit:
                raise ValueError("max_tokens %d exceeds the limit %d" % (p["n"], self.limit))
            stats = {"draft_tokens": 0, "accepted_tokens": 0, "steps": 0, "emitted_tokens": 0,
                     "per_position_drafted": [0] * self.draft_len,
                     "per_position_accepted": [0] * self.draft_len, "accepted_nodes": {}}
            done, step, first, allt = 0, 0, None, []
            while done < p["n"]:
                prefill = done == 0
                k = 1 if prefill else min(self.sizes[step % len(self.sizes)], p["n"] - done)
                toks = list(range(done, done + k))
                done += k; allt += toks
                if not prefill:
                    step += 1
                if not prefill and self.draft_len:
                    stats["draft_tokens"] += self.draft_len
                    stats["accepted_tokens"] += k - 1
                    for i in range(self.draft_len):
                        stats["per_position_drafted"][i] += 1
                        stats["per_position_accepted"][i] += int(i < k - 1)
                    if k > 1:
                        key = "%d,0" % (k - 2)
                        stats["accepted_nodes"][key] = stats["accepted_nodes"].get(key, 0) + 1
                if not prefill:
                    stats["steps"] += 1; stats["emitted_tokens"] += k
                if self.delay or self.jitter:
                    time.sleep(self.delay + self.jitter * self.rng.random())
                first = first or time.time_ns()
                last = done >= p["n"]
                if p["stream"]:
                    r = self._resp(toks, last, stats, p["perf"], p["arrival"], first)
                    if last and self.final_with_data:
                        sender.send(r, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                        return
                    sender.send(r)
            if not p["stream"]:
                sender.send(self._resp(allt, True, stats, p["perf"], p["arrival"], first))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as e:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def execute(self, requests):
        for req in requests:
            threading.Thread(target=self._run, args=(req.get_response_sender(), self._parse(req)),
                             daemon=True).start()
        return None
'''

_INPUTS = (
    ("text_input", "TYPE_STRING", False), ("max_tokens", "TYPE_INT32", False),
    ("stream", "TYPE_BOOL", True), ("temperature", "TYPE_FP32", True),
    ("top_k", "TYPE_INT32", True), ("top_p", "TYPE_FP32", True), ("seed", "TYPE_UINT64", True),
    ("end_id", "TYPE_INT32", True), ("exclude_input_in_output", "TYPE_BOOL", True),
    ("return_perf_metrics", "TYPE_BOOL", True), ("return_num_output_tokens", "TYPE_BOOL", True),
)
_OUTPUTS = (
    ("text_output", "TYPE_STRING"), ("num_output_tokens", "TYPE_INT32"),
    ("acceptance_rate", "TYPE_FP32"), ("total_accepted_draft_tokens", "TYPE_INT32"),
    ("total_draft_tokens", "TYPE_INT32"), ("arrival_time_ns", "TYPE_INT64"),
    ("first_token_time_ns", "TYPE_INT64"), ("last_token_time_ns", "TYPE_INT64"),
    ("spec_stats_json", "TYPE_STRING"),
)


def _config(name: str, params: dict[str, str]) -> str:
    ins = ",\n".join(
        f'  {{ name: "{n}" data_type: {t} dims: [ 1 ]{" optional: true" if opt else ""} }}'
        for n, t, opt in _INPUTS)
    outs = ",\n".join(f'  {{ name: "{n}" data_type: {t} dims: [ 1 ] }}' for n, t in _OUTPUTS)
    ps = "\n".join(f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
                   for k, v in params.items())
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 64\n'
            f"model_transaction_policy {{ decoupled: true }}\n"
            f"input [\n{ins}\n]\noutput [\n{outs}\n]\n{ps}\n"
            f"instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n")


def write_trivial_repo(out: Path, tokens_per_step: str = "1,3,2,4", draft_len: int = 3,
                       step_delay_ms: float = 0.0, max_tokens_limit: int = 4096,
                       step_jitter_ms: float = 0.0) -> Path:
    """Write models ``trivial`` and ``trivial_baseline`` into ``out``; return ``out``."""
    models = {
        "trivial": {"tokens_per_step": tokens_per_step, "draft_len": str(draft_len),
                    "final_with_data": "1"},
        "trivial_baseline": {"tokens_per_step": "1", "draft_len": "0", "final_with_data": "0"},
    }
    for name, params in models.items():
        d = out / name
        (d / "1").mkdir(parents=True, exist_ok=True)
        (d / "1" / "model.py").write_text(MODEL_PY.lstrip())
        full = {**params, "step_delay_ms": f"{step_delay_ms:g}",
                "step_jitter_ms": f"{step_jitter_ms:g}",
                "max_tokens_limit": str(max_tokens_limit)}
        (d / "config.pbtxt").write_text(_config(name, full))
    return out

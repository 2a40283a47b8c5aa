"""Fixtures for Triton tests: the run-wide ``tiny_server`` deployment lives in tests/conftest.py.
Fake TensorRT-LLM engines come from tests.helpers.server.make_fake_trtllm_engine."""

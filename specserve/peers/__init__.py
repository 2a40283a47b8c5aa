"""Peer engines that specserve benchmarks against, launched as separate processes from their own
virtual environments (``make peer-vllm``). Standard library only: importing this package never
imports the peer itself."""

"""End-to-end LLM inference with NCCL or dmacoll collectives (`dmacoll e2e`); config.py states the design."""

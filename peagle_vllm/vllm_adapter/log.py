"""The logger every adapter module writes to: a child of vLLM's own logger, whose handler and level vLLM
sets up in every process (the engine core included); a logger of our own would have no handler there."""

from __future__ import annotations

import logging

LOGGER_NAME = "vllm.peagle_vllm"
logger = logging.getLogger(LOGGER_NAME)

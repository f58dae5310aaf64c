"""Runtimes: where a family's model runs in this process (transformers, vLLM, llama.cpp, ...).

A runtime loads weights, batches items and schedules work off the event loop; the family it
runs decides tokens and scores. A new way to execute models goes here.
"""

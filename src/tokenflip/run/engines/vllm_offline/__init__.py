"""vLLM's offline `LLM` API as an engine: the engine (`engine`), what this build can run
(`support`), and the worker that runs inside vLLM's own environment (`worker`)."""

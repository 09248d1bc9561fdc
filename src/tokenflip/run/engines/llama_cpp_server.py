"""llama.cpp's OpenAI-compatible server (llama-cpp-python's `python -m llama_cpp.server`),
its arguments unchanged, with the models it loads loaded as the llama.cpp engine loads them:
without weight repacking (`llama_cpp_gguf.disable_weight_repack`; AMX CPUs crash with it).

    python -m tokenflip.run.engines.llama_cpp_server --model M.gguf --port 8000 ...
"""

from __future__ import annotations

import sys

from tokenflip.run.engines.llama_cpp_gguf import disable_weight_repack


def main() -> None:
    disable_weight_repack()
    from llama_cpp.server.__main__ import main as serve

    print("tokenflip: llama.cpp's server with weight repacking off (use_extra_bufts = False)", file=sys.stderr)
    serve()


if __name__ == "__main__":
    main()
